"""Talks to a running `htpkv serve` with the real `openai` Python client.

Usage: python3 openai_client.py BASE_URL MODEL_NAME
(the openai package on PYTHONPATH: scripts/fetch-openai.sh). Checks the models list, a streaming
and a non-streaming chat completion (greedy: the streamed text equals the whole answer), a
completion with max_tokens (finish_reason "length"), and that a json_schema response_format is
refused with a 400 `unsupported` error until constrained decoding is wired in. Prints one line per
check and exits non-zero on the first failure.
"""

import sys

import openai


def check(name, ok, detail=""):
    if not ok:
        raise SystemExit(f"FAILED {name}: {detail}")
    print(f"ok {name}")


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)

    models = client.models.list()
    ids = [m.id for m in models.data]
    check("models.list", ids == [model], ids)

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0
    )
    answer = whole.choices[0].message.content
    check("chat non-stream", bool(answer) and whole.choices[0].message.role == "assistant", whole)
    check("chat usage", whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0, whole.usage)
    print(f"   answer: {answer!r}")

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    streamed = "".join(pieces)
    check("chat stream equals non-stream", streamed == answer, (streamed, answer))
    check("chat stream pieces", len(pieces) > 1, pieces)
    check("chat stream finish", finish == whole.choices[0].finish_reason, finish)
    check("chat stream usage", usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage)

    completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5, temperature=0)
    check("completions length", completion.choices[0].finish_reason == "length", completion)
    check("completions usage", completion.usage.completion_tokens == 5, completion.usage)

    try:
        client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=8,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": {"type": "object"}},
            },
        )
        check("json_schema refused", False, "it was accepted")
    except openai.BadRequestError as e:
        code = e.code or (e.body or {}).get("code")
        check("json_schema refused", e.status_code == 400 and code == "unsupported", e.body)


if __name__ == "__main__":
    main()
