#!/usr/bin/env bash
# Installs the openai Python client (the one `htpkv serve`'s tests talk to) and its dependencies
# from PyPI, every wheel pinned by version and sha256 in scripts/openai-requirements.txt, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/htpkv/openai-<version>/     (a pip --target directory)
# never into the repository or the system's Python. The tests put that directory on PYTHONPATH
# (cli/tests/it/serve.rs). Idempotent: a complete install is kept. Needs python3 (CPython 3.11
# on x86_64 Linux: the pinned binary wheels are for it) and pip.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$root/scripts/openai-requirements.txt"
version="$(sed -n 's/^openai==\([^ ]*\) .*/\1/p' "$requirements")"
dest="${XDG_CACHE_HOME:-$HOME/.cache}/htpkv/openai-$version"

if [[ -f "$dest/.complete" ]]; then
    echo "present: $dest"
    exit 0
fi

tag="$(python3 -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')"
if [[ "$tag" != "cp311-x86_64" ]]; then
    echo "error: the pinned wheels are for CPython 3.11 on x86_64, this python3 is $tag" >&2
    exit 1
fi

staged="$(mktemp -d "$(dirname "$dest")/.fetch-openai.XXXXXX" 2>/dev/null || { mkdir -p "$(dirname "$dest")"; mktemp -d "$(dirname "$dest")/.fetch-openai.XXXXXX"; })"
trap 'rm -rf "$staged"' EXIT
echo "installing openai==$version and its dependencies (hashes checked) ..." >&2
python3 -m pip install --quiet --require-hashes --no-deps --only-binary=:all: \
    --no-compile --target "$staged" -r "$requirements"
PYTHONPATH="$staged" python3 -c 'import openai; assert openai.__version__ == "'"$version"'", openai.__version__'
touch "$staged/.complete"
rm -rf "$dest"
mv "$staged" "$dest"
trap - EXIT
echo "installed: $dest"
