#!/usr/bin/env python3
"""Fails on a module cycle inside a workspace crate that module_cycles.allow does not list, and on
an allow-list line whose cycle is gone (so the list only shrinks).

A crate's modules are its top-level ones (`src/NAME.rs` or `src/NAME/`); module A depends on B
when A's non-test code names `crate::B` (in a `use` or a path, braces `crate::{B, ..}` included),
`super::B` from a top-level file, or an item the crate root re-exports from B (`pub use B::X`,
named as `crate::X`). A cycle is a strongly connected group of two or more modules.

Usage: python3 scripts/checks/module_cycles.py   (exit 1 with the cycles named)"""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from rust_source import ROOT, crates, sources, target_roots, verdict  # noqa: E402

ALLOW = ROOT / "scripts" / "checks" / "module_cycles.allow"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src, path):
    """The top-level module a file belongs to (`None`: a crate root)."""
    rel = path.relative_to(src).parts
    if len(rel) == 1:
        stem = rel[0][:-3]
        return None if stem in ("lib", "main") else stem
    return None if rel[0] == "bin" else rel[0]


def names_after(code, prefix):
    """The first identifiers of every path after `prefix` (`crate::`), braces expanded."""
    out = []
    for m in re.finditer(r"\b" + prefix + r"\s*::\s*", code):
        rest = code[m.end():]
        if rest.startswith("{"):
            depth, j, item, items = 0, 0, "", []
            for j, ch in enumerate(rest):
                depth += ch == "{"
                depth -= ch == "}"
                if depth == 0:
                    break
                if depth == 1 and ch == ",":
                    items.append(item)
                    item = ""
                elif not (depth == 1 and ch == "{"):
                    item += ch
            items.append(item)
            out += [re.match(r"\s*(" + IDENT + ")?", i).group(1) for i in items]
        else:
            found = re.match(IDENT, rest)
            out.append(found.group(0) if found else None)
    return [o for o in out if o and o not in ("self", "super", "crate")]


def pub_uses(code):
    """(path head, item name) of every `pub use HEAD::...` in `code`."""
    out = []
    for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+(" + IDENT + r")\s*::\s*([^;]*);", code):
        head, rest = m.group(1), m.group(2)
        for item in re.findall(r"(" + IDENT + r")(?:\s+as\s+(" + IDENT + r"))?\s*(?=[,}]|$)", rest):
            out.append((head, item[1] or item[0]))
    return out


def reexports(root_code, modules, passed_through):
    """Item name -> module, for the root's `pub use MODULE::...` re-exports; an item the module
    itself only passes through from another crate depends on that crate, not the module."""
    out = {}
    for head, item in pub_uses(root_code):
        if head == "crate":
            continue
        if head in modules and item not in passed_through.get(head, ()):
            out[item] = head
    return out


def graph(crate_dir):
    """module -> the modules it depends on."""
    src = crate_dir / "src"
    files = sources(crate_dir)
    modules = {module_of(src, f) for f, _ in files} - {None}
    roots = {r.resolve() for r in target_roots(crate_dir)}
    root_code = "".join(code for f, code in files if f.resolve() in roots)
    local = modules | {"crate", "self", "super"}
    passed = {}
    for f, code in files:
        me = module_of(src, f)
        if me is not None and len(f.relative_to(src).parts) <= 2 and f.name in (f"{me}.rs", "mod.rs"):
            passed.setdefault(me, set()).update(i for h, i in pub_uses(code) if h not in local)
    items = reexports(root_code, modules, passed)
    edges = {m: set() for m in modules}
    for f, code in files:
        me = module_of(src, f)
        if me is None:
            continue
        named = names_after(code, "crate")
        if len(f.relative_to(src).parts) == 1:
            named += names_after(code, "super")
        for n in named:
            target = n if n in modules else items.get(n)
            if target and target != me:
                edges[me].add(target)
    return edges


def cycles(edges):
    """The strongly connected groups of two or more modules (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def path_through(edges, group):
    """One cycle through the group, as `a -> b -> ... -> a`."""
    start = group[0]
    seen, path = {start}, [start]
    while True:
        nxt = sorted(w for w in edges[path[-1]] if w in group)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return " -> ".join(path + [start])
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            return " -> ".join(path + [nxt[0]])
        seen.add(fresh[0])
        path.append(fresh[0])


def allowed():
    """(crate, frozenset of modules) -> the allow-list line."""
    out = {}
    for line in ALLOW.read_text().splitlines() if ALLOW.exists() else []:
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        crate, _, modules = body.partition(":")
        out[(crate.strip(), frozenset(re.findall(IDENT, modules)))] = line
    return out


def main():
    allow = allowed()
    found, bad = set(), []
    for name, d in crates():
        edges = graph(d)
        for group in cycles(edges):
            key = (name, frozenset(group))
            found.add(key)
            if key not in allow:
                bad.append(
                    f"{name}: module cycle {path_through(edges, group)} (the modules depending "
                    f"on each other: {' '.join(group)})"
                )
    for key, line in allow.items():
        if key not in found:
            bad.append(f"{ALLOW.relative_to(ROOT)}: `{line.strip()}` is no cycle now: remove the line")
    return verdict(bad, f"no module cycle outside the {len(allow)} allowed in {ALLOW.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
