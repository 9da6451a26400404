#!/usr/bin/env python3
"""Fails when a workspace crate whose code has no `unsafe` does not say `#![forbid(unsafe_code)]`
at each of its crate roots (the library and every binary), so that `unsafe` stays where FFI and
region arithmetic need it (the crates that have it: FFI edges, the KV region, raw IO buffers).

Usage: python3 scripts/checks/forbid_unsafe.py   (exit 1 naming each root to fix)"""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from rust_source import ROOT, crates, sources, strip, target_roots, verdict  # noqa: E402

UNSAFE = re.compile(r"\bunsafe\b")
FORBID = re.compile(r"#!\[\s*forbid\s*\([^)]*\bunsafe_code\b[^)]*\)\s*\]")


def main():
    bad, free = [], 0
    for name, d in crates():
        if any(UNSAFE.search(code) for _, code in sources(d, tests=True)):
            continue
        free += 1
        for root in target_roots(d):
            if not FORBID.search(strip(root.read_text())):
                bad.append(
                    f"{root.relative_to(ROOT)}: crate `{name}` has no unsafe code: add "
                    "#![forbid(unsafe_code)]"
                )
    return verdict(bad, f"the {free} crates without unsafe code forbid it")


if __name__ == "__main__":
    sys.exit(main())
