#!/usr/bin/env python3
"""Fails on a decision by a convention's name outside graph_io: code that names a `Preset` variant
(`Preset::AiHub`, or through an alias: `use graph_io::Preset as Naming` then `Naming::AiHub`), or
imports the variants (`Preset::*`).

Where the line is drawn: outside graph_io, code may hold a `Preset` (the identity of a built-in
convention), parse it (`"aihub".parse()`, clap), list them (`Preset::ALL`), print it, store it
(a file's naming byte is its position in `Preset::ALL`), take the default (`Preset::default()`)
and call what reads its declaration (`convention()`, `parts_naming()`, `graph_name()`, ...).
Naming a variant is deciding by identity, and what a convention does is read from its
declaration in graph_io instead. Test code (`tests/`, `#[cfg(test)]` modules) may name variants:
it chooses a convention as a user does, it decides nothing for the code it tests.

Usage: python3 scripts/checks/preset_decisions.py   (exit 1 with file:line of each decision)"""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from rust_source import ROOT, crates, strip, test_module_files, verdict, without_tests  # noqa: E402

EXEMPT = {"graph_io"}
VARIANT = re.compile(r"\b({names})\s*::\s*([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*|\*)")
ALIAS = re.compile(r"\bPreset\s+as\s+([A-Za-z_][A-Za-z0-9_]*)")


def files(crate_dir):
    """The crate's non-test Rust files: `src` and `examples` (a `tests` folder is test code)."""
    for sub in ("src", "examples"):
        yield from sorted((crate_dir / sub).rglob("*.rs"))


def decisions(path, skip, aliases):
    if path in skip:
        return []
    code = without_tests(strip(path.read_text()))
    names = ["Preset"] + sorted(aliases)
    pattern = re.compile(VARIANT.pattern.format(names="|".join(map(re.escape, names))))
    out = []
    for m in pattern.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        out.append(f"{path.relative_to(ROOT)}:{line}: `{m.group(0)}` decides by a convention's name")
    return out


def aliases():
    """Every name `Preset` is imported as anywhere in the workspace (a re-export such as
    `pub use graph_io::Preset as Naming` carries the alias into other crates)."""
    out = set()
    for _, d in crates():
        for f in files(d):
            out.update(ALIAS.findall(strip(f.read_text())))
    return out


def main():
    bad = []
    names = aliases()
    for name, d in crates():
        if name in EXEMPT:
            continue
        skip = test_module_files(d / "src")
        nested = [c for _, c in crates() if c != d and c.is_relative_to(d)]
        for f in files(d):
            if not any(f.is_relative_to(n) for n in nested):
                bad += decisions(f, skip, names)
    hint = (
        "read what the convention declares instead (graph_io::Convention: layout, mask, io, "
        "packaging, split, names_parts(), refusal(), ...); see this script's docs"
    )
    return verdict(bad, "no Preset variant named outside graph_io", hint)


if __name__ == "__main__":
    sys.exit(main())
