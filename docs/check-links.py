#!/usr/bin/env python3
"""Checks the relative links of the user guide, README.md and ARCHITECTURE.md.

For every Markdown file under docs/src/, README.md and ARCHITECTURE.md:

- every relative link target (inline links, images, reference definitions and
  mdBook `{{#include}}` directives) must exist;
- every `#anchor`, in the same file or another Markdown file, must match a
  heading's anchor as GitHub and mdBook make it (lowercase, spaces to `-`,
  punctuation other than `-` and `_` removed, `-1`, `-2`… for repeats);
- `http(s)://` and `mailto:` links are not checked, nor anything inside code
  blocks or inline code.

It also checks that every chapter SUMMARY.md lists exists and that every
`.md` file under docs/src/ is listed in SUMMARY.md.

Prints each broken link as `file:line: target` and exits 1 if there is any,
else exits 0. Standard library only:

    python3 docs/check-links.py
"""

import os
import re
import sys
from urllib.parse import unquote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "docs", "src")
SUMMARY = os.path.join(SRC, "SUMMARY.md")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_HREF = re.compile(r"<a\s[^>]*\bhref=\"([^\"]*)\"", re.IGNORECASE)
HTML_ID = re.compile(r"<[a-z][^>]*\b(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
INCLUDE = re.compile(r"\{\{#(?:include|rustdoc_include)\s+([^}\s]+)\s*\}\}")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HEADING_ID_ATTR = re.compile(r"\s*\{#([^}\s]+)[^}]*\}\s*$")
EXTERNAL = re.compile(r"^(https?://|mailto:)", re.IGNORECASE)


def prose_lines(text):
    """Yields (line number, line) for the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), start=1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                continue
            yield number, line
        elif match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
            if not line.strip()[len(match.group(1)):].strip():
                fence = None


def without_code_spans(line):
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def heading_text(raw):
    """The text a heading renders, for its anchor: links, images and markup reduced."""
    text = HEADING_ID_ATTR.sub("", raw)
    text = re.sub(r"\s+#+\s*$", "", text)  # closing hashes of an ATX heading
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.strip()


def slug(text):
    out = []
    for char in text.lower():
        if char.isalnum() or char in "-_":
            out.append(char)
        elif char.isspace():
            out.append("-")
    return "".join(out)


_anchor_cache = {}


def anchors_of(path):
    """Every anchor the headings (and HTML ids) of a Markdown file define."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    anchors = set()
    counts = {}
    previous = (0, None)
    for number, line in prose_lines(text):
        for match in HTML_ID.finditer(without_code_spans(line)):
            anchors.add(match.group(1))
        heading = None
        explicit = None
        atx = ATX_HEADING.match(line)
        if atx:
            raw = atx.group(2) or ""
            attr = HEADING_ID_ATTR.search(raw)
            explicit = attr.group(1) if attr else None
            heading = raw
        elif SETEXT_UNDERLINE.match(line):
            before_number, before = previous
            if before_number == number - 1 and before and before.strip() and not ATX_HEADING.match(before):
                heading = before.strip()
        previous = (number, line)
        if heading is None:
            continue
        if explicit:
            anchors.add(explicit)
            continue
        base = slug(heading_text(heading))
        n = counts.get(base, 0)
        counts[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")
    _anchor_cache[path] = anchors
    return anchors


def links_of(path):
    """Yields (line number, target) for every link target of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in enumerate(text.split("\n"), start=1):
        for match in INCLUDE.finditer(line):
            # `file.rs:anchor` or `file.rs:2:10` select a part; the file must exist.
            yield number, "include:" + match.group(1).split(":", 1)[0]
    for number, line in prose_lines(text):
        line = without_code_spans(line)
        for pattern in (INLINE_LINK, REFERENCE_DEF, HTML_HREF):
            for match in pattern.finditer(line):
                target = match.group(1).strip()
                if target.startswith("<") and target.endswith(">"):
                    target = target[1:-1].strip()
                yield number, target


def check_file(path, report):
    base = os.path.dirname(path)
    for number, target in links_of(path):
        shown = target
        if target.startswith("include:"):
            target = target[len("include:"):]
            shown = "{{#include " + target + "}}"
            if not os.path.exists(os.path.join(base, unquote(target))):
                report(path, number, shown)
            continue
        if not target or EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part.split("?", 1)[0])
        resolved = os.path.normpath(os.path.join(base, file_part)) if file_part else path
        if not os.path.exists(resolved):
            report(path, number, shown)
            continue
        if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
            if unquote(anchor) not in anchors_of(resolved):
                report(path, number, shown)


def check_summary(report):
    if not os.path.isfile(SUMMARY):
        report(SUMMARY, 0, "SUMMARY.md is missing")
        return
    listed = set()
    with open(SUMMARY, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        for match in INLINE_LINK.finditer(without_code_spans(line)):
            target = match.group(1).strip().strip("<>")
            if not target or EXTERNAL.match(target):
                continue  # a draft chapter, or not a chapter
            chapter = os.path.normpath(os.path.join(SRC, unquote(target.partition("#")[0])))
            listed.add(chapter)
            if not os.path.isfile(chapter):
                report(SUMMARY, number, target)
    for directory, _, files in os.walk(SRC):
        for name in sorted(files):
            path = os.path.normpath(os.path.join(directory, name))
            if name.endswith(".md") and path != SUMMARY and path not in listed:
                report(path, 1, "not listed in SUMMARY.md")


def markdown_files():
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "ARCHITECTURE.md")]
    for directory, _, names in os.walk(SRC):
        files.extend(os.path.join(directory, n) for n in sorted(names) if n.endswith(".md"))
    return sorted(f for f in files if os.path.isfile(f))


def main():
    broken = []

    def report(path, line, target):
        entry = (os.path.relpath(path, ROOT), line, target)
        if entry not in broken:
            broken.append(entry)

    for path in markdown_files():
        check_file(path, report)
    check_summary(report)
    broken.sort(key=lambda e: (e[0], e[1]))
    for path, line, target in broken:
        print(f"{path}:{line}: {target}")
    if broken:
        print(f"{len(broken)} broken link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
