#!/usr/bin/env python3
"""Check the docs without mdBook: links, anchors, the book's table of contents, the README's length.

Checked files: README.md, ARCHITECTURE.md and every docs/**/*.md. For each:
- every relative link (inline `[text](target)`, image, or reference definition `[id]: target`)
  points at a file or folder that exists;
- every `#anchor` (on its own or after a Markdown path) is a heading of the target page, by the slug
  rule GitHub and mdBook share (lowercase; letters, digits, `_` and `-` kept; spaces become `-`;
  everything else dropped; a repeated slug gets `-1`, `-2`, ...), or an explicit `id=`/`name=`;
- docs/SUMMARY.md lists every page under docs/ (mdBook builds only what it lists);
- README.md stays under MAX_README_LINES lines.
Links inside code blocks and code spans are not links. External links (with a scheme) are not
fetched. Each problem is printed as `file:line: message`; the exit status is 1 if there is any.

Usage: python3 scripts/check-docs.py [ROOT]   (ROOT: the workspace, default this script's parent's parent)
"""

import os
import re
import sys
from urllib.parse import unquote

MAX_README_LINES = 500

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"""<[^>]+\b(?:id|name)\s*=\s*["']([^"']+)["']""")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def strip_code_spans(line):
    """Blank out inline code spans (same length, so columns stay put)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            run = len(line[i:]) - len(line[i:].lstrip("`"))
            ticks = line[i : i + run]
            end = line.find(ticks, i + run)
            if end == -1:
                out.append(line[i : i + run])
                i += run
                continue
            out.append(" " * (end + run - i))
            i = end + run
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def prose_lines(text):
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)) :].strip():
                fence = None
            continue
        yield number, line


def heading_text(raw):
    """What a heading renders as: link text instead of links, no code or emphasis markers."""
    raw = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    raw = re.sub(r"<[^>]+>", "", raw)
    return raw.replace("`", "")


def slug(text):
    text = heading_text(text).strip().lower()
    kept = "".join(c for c in text if c.isalnum() or c in "_- ")
    return kept.replace(" ", "-")


def anchors_of(text):
    found, seen = set(), {}
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ID.findall(line))
    return found


def links_of(text):
    """(line number, target) of every link outside code."""
    for number, line in prose_lines(text):
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(1)
            continue
        for m in INLINE_LINK.finditer(strip_code_spans(line)):
            yield number, m.group(1)


class Checker:
    def __init__(self, root):
        self.root = root
        self.problems = []
        self.anchor_cache = {}

    def problem(self, path, line, message):
        self.problems.append(f"{os.path.relpath(path, self.root)}:{line}: {message}")

    def anchors(self, path):
        if path not in self.anchor_cache:
            with open(path, encoding="utf-8") as f:
                self.anchor_cache[path] = anchors_of(f.read())
        return self.anchor_cache[path]

    def check_link(self, path, line, target):
        if not target or SCHEME.match(target) or target.startswith("//"):
            return None
        target_path, _, anchor = target.partition("#")
        target_path = unquote(target_path)
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), target_path)) if target_path else path
        if not os.path.exists(resolved):
            self.problem(path, line, f"link to {target}: {os.path.relpath(resolved, self.root)} does not exist")
            return None
        if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
            if unquote(anchor) not in self.anchors(resolved):
                where = "this page" if resolved == path else os.path.relpath(resolved, self.root)
                self.problem(path, line, f"link to {target}: no heading with anchor #{anchor} in {where}")
        return resolved

    def check_file(self, path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return {resolved for line, target in links_of(text) if (resolved := self.check_link(path, line, target))}

    def check_summary(self, docs, pages):
        summary = os.path.join(docs, "SUMMARY.md")
        if not os.path.isfile(summary):
            self.problem(docs, 0, "docs/SUMMARY.md is missing")
            return
        listed = self.check_file(summary)
        for page in sorted(pages):
            if page != summary and page not in listed:
                self.problem(page, 1, "page is not listed in docs/SUMMARY.md")

    def check_readme_length(self, readme):
        with open(readme, encoding="utf-8") as f:
            lines = f.read().count("\n")
        if lines >= MAX_README_LINES:
            self.problem(readme, lines, f"README.md has {lines} lines; keep it under {MAX_README_LINES} (move detail to docs/)")


def markdown_under(folder):
    for base, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(base, name)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    checker = Checker(root)
    docs = os.path.join(root, "docs")
    pages = set(markdown_under(docs)) if os.path.isdir(docs) else set()
    for name in ("README.md", "ARCHITECTURE.md"):
        path = os.path.join(root, name)
        if os.path.isfile(path):
            checker.check_file(path)
        else:
            checker.problem(path, 0, f"{name} is missing")
    for page in sorted(pages):
        if os.path.basename(page) != "SUMMARY.md":
            checker.check_file(page)
    checker.check_summary(docs, pages)
    readme = os.path.join(root, "README.md")
    if os.path.isfile(readme):
        checker.check_readme_length(readme)
    for problem in checker.problems:
        print(problem)
    checked = len(pages) + 2
    if checker.problems:
        print(f"check-docs: {len(checker.problems)} problem(s) in {checked} files", file=sys.stderr)
        return 1
    print(f"check-docs: {checked} files, every link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
