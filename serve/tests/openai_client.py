"""Talks to a running `htpkv serve` with the real `openai` Python client.

Usage: python3 openai_client.py BASE_URL MODEL_NAME QUESTION ANSWER COMPLETION [--no-structured]
(the openai package on PYTHONPATH: scripts/fetch-openai.sh). ANSWER is the text `htpkv generate
--chat QUESTION --steps 24` gives, COMPLETION the text of `htpkv generate "Once upon a time"
--steps 5` (both greedy, the server's model and options). Checks the models list, a streaming
and a non-streaming chat completion (greedy: the whole answer is ANSWER, and the streamed text
equals it), a completion with max_tokens (its text is COMPLETION, finish_reason "length"), a json_schema response that parses and
validates (checked field by field here, independent of the server's grammar), and a required tool
call, whole and streamed, whose arguments validate (those two are left out with --no-structured,
for models whose template takes no tools). Prints one line per check and exits non-zero on the
first failure.
"""

import json
import sys

import openai


def check(name, ok, detail=""):
    if not ok:
        raise SystemExit(f"FAILED {name}: {detail}")
    print(f"ok {name}")


def main():
    base_url, model, question, expected_answer, expected_completion = sys.argv[1:6]
    structured = "--no-structured" not in sys.argv[6:]
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)

    models = client.models.list()
    ids = [m.id for m in models.data]
    check("models.list", ids == [model], ids)

    messages = [{"role": "user", "content": question}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0
    )
    answer = whole.choices[0].message.content
    check("chat non-stream", whole.choices[0].message.role == "assistant", whole)
    check("chat answer is htpkv generate's", answer == expected_answer, (answer, expected_answer))
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
    text = completion.choices[0].text
    check("completion is htpkv generate's", text == expected_completion, (text, expected_completion))
    check("completions usage", completion.usage.completion_tokens == 5, completion.usage)
    if structured:
        check_structured(client, model)


def check_structured(client, model):

    person = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    for who in ["Bob, 42 years old", "Alice, who is 30", "my grandmother, aged 91"]:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Give me a JSON record for {who}."}],
            max_tokens=64,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": True}},
        )
        content = r.choices[0].message.content
        doc = json.loads(content)
        valid = (
            isinstance(doc, dict)
            and set(doc) == {"name", "age"}
            and isinstance(doc["name"], str)
            and len(doc["name"]) <= 20
            and isinstance(doc["age"], int)
            and 0 <= doc["age"] <= 150
        )
        check("json_schema validates", valid and r.choices[0].finish_reason == "stop", content)
        print(f"   {who}: {content}")

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The current weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 32}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=model, messages=ask, tools=tools, tool_choice="required", max_tokens=64, temperature=0
    )
    calls = r.choices[0].message.tool_calls
    check("tool call", r.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather", r)
    args = json.loads(calls[0].function.arguments)
    check("tool call arguments validate", set(args) == {"city"} and isinstance(args["city"], str), args)
    print(f"   get_weather({args})")
    stream = client.chat.completions.create(
        model=model, messages=ask, tools=tools, tool_choice="required", max_tokens=64, temperature=0, stream=True
    )
    streamed = [
        (tc.function.name, tc.function.arguments)
        for chunk in stream
        for choice in chunk.choices
        for tc in (choice.delta.tool_calls or [])
    ]
    check("streamed tool call", streamed == [(calls[0].function.name, calls[0].function.arguments)], streamed)


if __name__ == "__main__":
    main()
