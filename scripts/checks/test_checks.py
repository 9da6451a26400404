#!/usr/bin/env python3
"""The checks' own tests: each check passes on a clean toy workspace and fails, naming the
planted mistake, on one with a module cycle, a `Preset` variant named (directly and through a
re-exported alias) or a crate without unsafe code that does not forbid it; test code is exempt.

Usage: python3 scripts/checks/test_checks.py"""
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from rust_source import verdict  # noqa: E402


def write(root, files):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def run(check, root):
    env = dict(os.environ, HTPKV_CHECK_ROOT=str(root))
    o = subprocess.run([sys.executable, str(HERE / check)], env=env, capture_output=True, text=True)
    return o.returncode, o.stdout + o.stderr


CLEAN = {
    "Cargo.toml": '[workspace]\nmembers = ["a", "b", "graph_io"]\n',
    "a/Cargo.toml": '[package]\nname = "a"\n',
    "a/src/lib.rs": "#![forbid(unsafe_code)]\nmod x;\nmod y;\npub use y::Y;\n",
    "a/src/x.rs": "use crate::Y;\n// crate::x is named in a comment only\n",
    "a/src/y.rs": 'pub struct Y;\nconst S: &str = "crate::x";\n'
    "#[cfg(test)]\nmod tests {\n    use crate::x;\n}\n",
    "b/Cargo.toml": '[package]\nname = "b"\n',
    "b/src/lib.rs": "pub fn f(p: *const u8) -> u8 { unsafe { *p } }\n"
    "pub fn g(p: graph_io::Preset) -> bool { p.convention().names_parts() }\n"
    "#[cfg(test)]\nmod tests {\n    fn t() { let _ = graph_io::Preset::AiHub; }\n}\n",
    "b/tests/it.rs": "fn t() { let _ = graph_io::Preset::ExecuTorch; }\n",
    "graph_io/Cargo.toml": '[package]\nname = "graph_io"\n',
    "graph_io/src/lib.rs": "#![forbid(unsafe_code)]\npub use Preset as Naming;\n"
    "pub enum Preset { Htpkv, AiHub }\npub fn own() -> Preset { Preset::AiHub }\n",
}

PLANTED = [
    ("module_cycles.py", {"a/src/y.rs": "pub struct Y;\nuse super::x;\n"}, "a: module cycle x -> y -> x"),
    ("module_cycles.py", {"a/src/y.rs": "pub struct Y;\nuse crate::{z, x::W};\n"}, "module cycle x -> y -> x"),
    ("preset_decisions.py", {"b/src/lib.rs": "fn f(p: graph_io::Preset) -> bool { p == graph_io::Preset::AiHub }\n"}, "b/src/lib.rs:1: `Preset::AiHub`"),
    ("preset_decisions.py", {"b/src/lib.rs": "use graph_io::Naming;\nfn f(p: Naming) -> bool {\n    matches!(p, Naming::Htpkv)\n}\n"}, "b/src/lib.rs:3: `Naming::Htpkv`"),
    ("forbid_unsafe.py", {"a/src/lib.rs": "mod x;\nmod y;\npub use y::Y;\n"}, "a/src/lib.rs: crate `a` has no unsafe code"),
]


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp) / "clean"
        write(root, CLEAN)
        for check in ("module_cycles.py", "preset_decisions.py", "forbid_unsafe.py"):
            rc, out = run(check, root)
            if rc != 0:
                failures.append(f"{check} fails on the clean workspace:\n{out}")
        for i, (check, edit, says) in enumerate(PLANTED):
            root = pathlib.Path(tmp) / f"planted{i}"
            write(root, {**CLEAN, **edit})
            rc, out = run(check, root)
            if rc == 0 or says not in out:
                failures.append(f"{check} on {edit}: expected a failure saying `{says}`, got {rc}:\n{out}")
        for i, (allow, says) in enumerate([
            ("a: x y  # the planted cycle\n", None),
            ("a: x y\nb: p q  # gone\n", "`b: p q  # gone` is no cycle now"),
        ]):
            root = pathlib.Path(tmp) / f"allowed{i}"
            write(root, {**CLEAN, **PLANTED[0][1], "scripts/checks/module_cycles.allow": allow})
            rc, out = run("module_cycles.py", root)
            if (rc == 0) != (says is None) or (says and says not in out):
                failures.append(f"module_cycles.py with allow list {allow!r}: got {rc}:\n{out}")
    ok = f"the checks pass a clean workspace and catch {len(PLANTED)} planted mistakes"
    return verdict(failures, ok)


if __name__ == "__main__":
    sys.exit(main())
