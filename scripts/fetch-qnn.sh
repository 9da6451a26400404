#!/usr/bin/env bash
# Fetches Qualcomm's QNN 2.51 libraries for x86_64 Linux (the HTP backend, which composes, prepares
# and executes graphs in emulation on x86, the system library, the saver, Genie 1.21) from the PyPI
# wheel onnxruntime-qnn==2.7.0, checks the wheel's and every extracted file's sha256 and places them at
#   $HTPKV_QNN_DIR/onnxruntime_qnn/       libQnnHtp.so libHtpPrepare.so libQnnSystem.so libQnnSaver.so
#                                         libGenie.so libQnnHtpNetRunExtensions.so Qualcomm_LICENSE.pdf
#   $HTPKV_QNN_DIR/onnxruntime_qnn.libs/  the libc++, libc++abi and libunwind they need
# (default HTPKV_QNN_DIR: ${XDG_CACHE_HOME:-$HOME/.cache}/htpkv/qnn-2.51). The two folders must stay
# side by side: the libraries find their libc++ through their RPATH `$ORIGIN/../onnxruntime_qnn.libs`.
#
# The wheel is downloaded for manylinux_2_35_x86_64 / CPython 3.11 whatever the local Python is
# (only the native libraries are used, never the Python package). Set HTPKV_QNN_WHEEL to a wheel
# file already on disk to skip the download (its hash is checked all the same).
# Idempotent: when every file is present with its hash, nothing is downloaded. Needs pip (or a
# wheel in HTPKV_QNN_WHEEL), python3 or unzip, and sha256sum. The libraries are Qualcomm's, under
# Qualcomm_LICENSE.pdf: they are the user's download and are never committed.
set -euo pipefail

WHEEL_PKG="onnxruntime-qnn==2.7.0"
WHEEL_NAME="onnxruntime_qnn-2.7.0-cp311-cp311-manylinux_2_35_x86_64.whl"
WHEEL_SHA256="c56c01562b8534fe8980cfea4601408d950c065f8251fb862ce82101c52c9849"

# member of the wheel -> sha256 (QNN 2.51.0, v2.51.0.260929181845; Genie 1.21)
FILES=(
    "onnxruntime_qnn/libQnnHtp.so 66fbcc1a97b3ca186c0170123e03978f2351222d59b2e9ceb0202e4a9b0116c0"
    "onnxruntime_qnn/libHtpPrepare.so 240b3db00f71efdce5f5ad3a69a0cc9ae2e375d6d51408d595b292a2ef560568"
    "onnxruntime_qnn/libQnnSystem.so a5441fe0307cfb10478d18f6de16053f3b111eaa01ff3975a54b10afdfa33a38"
    "onnxruntime_qnn/libQnnSaver.so 21e2470993e2bc2eae5f24ac9735cc914f52f448cb539797c7af71f9dca2477c"
    "onnxruntime_qnn/libGenie.so 3f8bd88c8433d6d90e95883bf7e30839de618571e0403c1552aa4618e4303e5b"
    "onnxruntime_qnn/libQnnHtpNetRunExtensions.so 12e4feae6b00598a56b12539b831eab005e0125b7fd99e12c913d82f014162bd"
    "onnxruntime_qnn/Qualcomm_LICENSE.pdf ec1dccfdcba5c6e64126e84199b8362bf4999107bfa567ebe831dbb4c461692b"
    "onnxruntime_qnn.libs/libc++-71bc274c.so.1.0 46cee8e5f62e9b4a79b863b058879c5e9d4f41841650841df6f6669ebef2e2e2"
    "onnxruntime_qnn.libs/libc++abi-0539aa51.so.1.0 2cb6d3e6acc815575d5a76acb45f99ae4ed5a4fcc04febaa8cd8981e07b89a47"
    "onnxruntime_qnn.libs/libunwind-6b740a46.so.1.0 a00822cc6221850754a491cbafa2b2e2fefac06f61f108cc8e80f0869fe5f724"
)

dest="${HTPKV_QNN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/htpkv/qnn-2.51}"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# Checks every pinned file under $1; prints the first problem and fails, or succeeds silently.
verify_tree() {
    local dir="$1" entry member want got
    for entry in "${FILES[@]}"; do
        member="${entry%% *}"
        want="${entry##* }"
        if [[ ! -f "$dir/$member" ]]; then
            echo "missing: $dir/$member"
            return 1
        fi
        got="$(sha_of "$dir/$member")"
        if [[ "$got" != "$want" ]]; then
            echo "sha256 mismatch: $dir/$member: got $got, expected $want"
            return 1
        fi
    done
}

if problem="$(verify_tree "$dest")"; then
    echo "present and verified: $dest (${#FILES[@]} files)"
    exit 0
fi
if [[ -d "$dest" ]]; then
    echo "refetching: $problem" >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [[ -n "${HTPKV_QNN_WHEEL:-}" ]]; then
    wheel="$HTPKV_QNN_WHEEL"
    [[ -f "$wheel" ]] || { echo "error: HTPKV_QNN_WHEEL=$wheel is not a file" >&2; exit 1; }
else
    if command -v pip >/dev/null; then
        pip=(pip)
    elif python3 -m pip --version >/dev/null 2>&1; then
        pip=(python3 -m pip)
    else
        echo "error: pip is needed to download $WHEEL_PKG: install it with" \
            "'python3 -m ensurepip --upgrade' or your system's package (Debian: apt-get install" \
            "python3-pip), or set HTPKV_QNN_WHEEL to a downloaded $WHEEL_NAME" >&2
        exit 1
    fi
    echo "downloading $WHEEL_PKG for manylinux_2_35_x86_64 (about 99 MB) ..." >&2
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_35_x86_64 --python-version 3.11 --dest "$tmp" "$WHEEL_PKG"
    wheel="$tmp/$WHEEL_NAME"
    [[ -f "$wheel" ]] || { echo "error: pip download did not produce $WHEEL_NAME: $(ls "$tmp")" >&2; exit 1; }
fi
got="$(sha_of "$wheel")"
if [[ "$got" != "$WHEEL_SHA256" ]]; then
    echo "error: wheel sha256 mismatch: got $got, expected $WHEEL_SHA256" >&2
    exit 1
fi

members=()
for entry in "${FILES[@]}"; do members+=("${entry%% *}"); done

parent="$(dirname "$dest")"
mkdir -p "$parent"
# Staged on the destination's filesystem, verified there, then renamed into place.
staged="$(mktemp -d "$parent/.fetch-qnn.XXXXXX")"
trap 'rm -rf "$tmp" "$staged"' EXIT
if command -v python3 >/dev/null; then
    python3 - "$wheel" "$staged" "${members[@]}" <<'PY'
import sys, zipfile
wheel, out, *members = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for m in members:
        z.extract(m, out)
PY
elif command -v unzip >/dev/null; then
    unzip -q "$wheel" "${members[@]}" -d "$staged"
else
    echo "error: neither python3 nor unzip is available to unpack the wheel" >&2
    exit 1
fi
if ! problem="$(verify_tree "$staged")"; then
    echo "error: $problem" >&2
    exit 1
fi
chmod 755 "$staged" "$staged/onnxruntime_qnn" "$staged/onnxruntime_qnn.libs"
chmod 644 "$staged"/onnxruntime_qnn/* "$staged"/onnxruntime_qnn.libs/*

# The libraries find libc++ through RPATH $ORIGIN/../onnxruntime_qnn.libs: say so if that changed.
if command -v readelf >/dev/null; then
    rpath="$(readelf -d "$staged/onnxruntime_qnn/libQnnHtp.so" | grep -E 'RPATH|RUNPATH' || true)"
    if [[ "$rpath" != *'$ORIGIN/../onnxruntime_qnn.libs'* ]]; then
        echo "error: libQnnHtp.so no longer has RPATH \$ORIGIN/../onnxruntime_qnn.libs: $rpath" >&2
        exit 1
    fi
fi

rm -rf "$dest"
mv "$staged" "$dest"
echo "fetched and verified: $dest (${#FILES[@]} files)"
echo "  --qnn-backend $dest/onnxruntime_qnn/libQnnHtp.so"
echo "  --qnn-system  $dest/onnxruntime_qnn/libQnnSystem.so"
