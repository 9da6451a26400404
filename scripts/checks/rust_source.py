"""What the checks share: the workspace's crates and their Rust sources with comments, strings and
test code removed (python3 standard library only)."""
import os
import pathlib
import re
import tomllib

# The workspace checked: this repository, or HTPKV_CHECK_ROOT (the checks' own tests).
ROOT = pathlib.Path(os.environ.get("HTPKV_CHECK_ROOT") or pathlib.Path(__file__).resolve().parents[2])


def crates():
    """(name, directory) of every workspace member, from the root Cargo.toml."""
    doc = tomllib.loads((ROOT / "Cargo.toml").read_text())
    out = []
    members = list(doc.get("workspace", {}).get("members", []))
    if "package" in doc:
        members.append(".")
    for m in members:
        d = (ROOT / m).resolve()
        name = tomllib.loads((d / "Cargo.toml").read_text())["package"]["name"]
        out.append((name, d))
    return out


def target_roots(crate_dir):
    """The crate roots of a package's library and binaries (each its own crate)."""
    src = crate_dir / "src"
    roots = [src / "lib.rs", src / "main.rs"] + sorted((src / "bin").glob("*.rs"))
    return [r for r in roots if r.is_file()]


def strip(text):
    """`text` with comments, string and char literals blanked (line breaks kept, so line
    numbers stay)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 40]) and not _ident_before(text, i):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _block_end(text, open_at):
    """The index after the brace block opening at `open_at` (a `{`)."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*([{;])")


def without_tests(stripped):
    """`stripped` (see [`strip`]) with its `#[cfg(test)] mod ... { }` blocks blanked."""
    out = stripped
    for m in reversed(list(CFG_TEST.finditer(stripped))):
        if m.group(3) == "{":
            end = _block_end(stripped, m.end() - 1)
            out = out[:m.start()] + re.sub(r"[^\n]", " ", out[m.start():end]) + out[end:]
    return out


def test_module_files(src):
    """Files of modules declared `#[cfg(test)] mod name;` under `src`."""
    files = set()
    for f in src.rglob("*.rs"):
        for m in CFG_TEST.finditer(strip(f.read_text())):
            if m.group(3) != ";":
                continue
            name = re.search(r"mod\s+(\w+)", m.group(0)).group(1)
            base = f.parent if f.name in ("lib.rs", "main.rs", "mod.rs") else f.with_suffix("")
            files.update(p for p in (base / f"{name}.rs", base / name / "mod.rs") if p.exists())
    return files


def sources(crate_dir, tests=False):
    """(path, code) of the crate's `src` files: comments and literals blanked and, unless
    `tests`, test modules removed (inline blocks, and files of `#[cfg(test)] mod x;`)."""
    src = crate_dir / "src"
    skip = set() if tests else test_module_files(src)
    out = []
    for f in sorted(src.rglob("*.rs")):
        if f in skip:
            continue
        code = strip(f.read_text())
        out.append((f, code if tests else without_tests(code)))
    return out


def verdict(bad, ok, hint=None):
    """Prints each problem in `bad` (and `hint` after them) and returns 1, or prints `ok` and
    returns 0: a check's exit status."""
    for b in bad:
        print(b)
    if bad and hint:
        print(hint)
    if not bad:
        print(ok)
    return 1 if bad else 0
