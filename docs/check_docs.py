#!/usr/bin/python3
"""Checks README.md and docs/*.md (run by //docs:docs_test).

- Every relative link (inline, image, reference definition, <a href>, <img src>)
  resolves: the file or folder exists, inside the repository, and its #anchor is
  a heading of the target page, by GitHub's rules (lowercase; punctuation other
  than '-' and '_' removed; spaces to '-'; repeated headings get -1, -2, ...).
  Links inside code (fenced blocks, `code spans`) are not links.
- README.md has at most MAX_README_LINES lines.
- README.md links every page of docs/.

Usage: check_docs.py [ROOT]    (ROOT: the source tree; default: found from the
       README.md beside the working directory, as a test's runfile)
       check_docs.py --self_test   (plants broken links in a temporary tree and
       checks that each is reported)
"""

import os
import re
import sys
import tempfile
import unicodedata

MAX_README_LINES = 300

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]*)(?:\s+[\"'(][^)]*)?\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
HTML_ANCHOR = re.compile(r"<a\b[^>]*?\b(?:name|id)\s*=\s*[\"']([^\"']*)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def prose_lines(text):
    """The page's lines with fenced code blocks blanked (line numbers kept)."""
    out = []
    fence = None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            out.append("")
        elif fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def strip_code_spans(line):
    """Removes `code spans` (any backtick run closed by one of its length)."""
    out = []
    i = 0
    while i < len(line):
        if line[i] == "`":
            j = i
            while j < len(line) and line[j] == "`":
                j += 1
            run = line[i:j]
            end = line.find(run, j)
            while end != -1 and (end + len(run) < len(line) and line[end + len(run)] == "`"):
                end = line.find(run, end + len(run) + 1)
            if end == -1:
                out.append(run)
                i = j
            else:
                out.append(" ")
                i = end + len(run)
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    kept = []
    for ch in text:
        category = unicodedata.category(ch)
        if ch in " -" or category[0] in "LMN" or category == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(text):
    """Every anchor a page defines: its headings' slugs and <a name/id>."""
    found = set()
    seen = {}
    for line in prose_lines(text):
        match = HEADING.match(line)
        if match:
            title = re.sub(r"[ \t]+#+$", "", match.group(2))
            base = slug(title)
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else "%s-%d" % (base, count))
        for name in HTML_ANCHOR.findall(line):
            found.add(name)
    return found


def links(text):
    """(line number, target) of every link in a page's prose."""
    out = []
    for number, line in enumerate(prose_lines(text), 1):
        plain = strip_code_spans(line)
        for match in INLINE_LINK.finditer(plain):
            out.append((number, match.group(1).strip("<>")))
        match = REFERENCE_DEF.match(plain)
        if match:
            out.append((number, match.group(1).strip("<>")))
        for target in HTML_LINK.findall(plain):
            out.append((number, target))
    return out


def check(root):
    """Returns the list of problems found in root's README.md and docs/."""
    problems = []
    root = os.path.realpath(root)
    readme = os.path.join(root, "README.md")
    docs = os.path.join(root, "docs")
    pages = [readme] + sorted(
        os.path.join(docs, name) for name in os.listdir(docs) if name.endswith(".md"))
    texts = {}
    for page in pages:
        with open(page, encoding="utf-8") as f:
            texts[page] = f.read()
    anchor_cache = {}

    def anchors_of(path):
        if path not in anchor_cache:
            if path not in texts:
                with open(path, encoding="utf-8") as f:
                    texts[path] = f.read()
            anchor_cache[path] = anchors(texts[path])
        return anchor_cache[path]

    linked_from_readme = set()
    for page in pages:
        where = os.path.relpath(page, root)
        for number, target in links(texts[page]):
            if not target or SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            if path:
                resolved = os.path.normpath(os.path.join(os.path.dirname(page), path))
                if os.path.relpath(resolved, root).startswith(".."):
                    problems.append("%s:%d: link %s leaves the repository" % (where, number, target))
                    continue
                if not os.path.exists(resolved):
                    problems.append("%s:%d: link %s: %s does not exist" % (
                        where, number, target, os.path.relpath(resolved, root)))
                    continue
            else:
                resolved = page
            if page == readme:
                linked_from_readme.add(resolved)
            if not anchor:
                continue
            if resolved.endswith(".md") and os.path.isfile(resolved):
                if anchor not in anchors_of(resolved):
                    problems.append("%s:%d: link %s: %s has no heading with anchor #%s" % (
                        where, number, target, os.path.relpath(resolved, root), anchor))
            elif not (os.path.isfile(resolved) and LINE_ANCHOR.match(anchor)):
                problems.append("%s:%d: link %s: an anchor #%s on a file that is not a page" % (
                    where, number, target, anchor))

    # The README's C++ blocks are compiled only when fenced ```cpp (whole
    # programs: tests/BUILD.bazel's README_SAMPLES); docs/ has its own rules
    # (extract_samples.py).
    for number, line in enumerate(texts[readme].splitlines(), 1):
        info = re.match(r"\s*(```+|~~~+)\s*([A-Za-z0-9_+-]+)", line)
        if info and info.group(2).lower() in ("c++", "cc", "cxx", "c", "h", "hpp", "cplusplus"):
            problems.append("README.md:%d: ```%s: the README's C++ blocks are whole programs "
                            "fenced ```cpp (tests/BUILD.bazel compiles those); put fragments in "
                            "docs/" % (number, info.group(2)))
    lines = len(texts[readme].splitlines())
    if lines > MAX_README_LINES:
        problems.append("README.md: %d lines, more than %d: move sections into docs/" % (
            lines, MAX_README_LINES))
    for page in pages[1:]:
        if page not in linked_from_readme:
            problems.append("README.md: no link to %s (every docs page must be linked)" % (
                os.path.relpath(page, root)))
    return problems


def self_test():
    """Plants each kind of broken link and checks that check() names it."""
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "docs"))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("# Top\n\n[ok](docs/a.md#a-b_c-d) [missing](docs/nope.md)\n"
                    "[bad anchor](docs/a.md#nope) [self](#top) `[code](docs/nope.md)`\n"
                    "```\n[fenced](docs/nope.md)\n```\n```c++\nint x = nope;\n```\n")
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("# A: b_c (d)\n\n## A: b_c (d)\n\n[up](../README.md#top) "
                    "[dup](#a-b_c-d-1) [out](../../x.md) [lost](#gone)\n")
        with open(os.path.join(root, "docs", "orphan.md"), "w") as f:
            f.write("# Orphan\n")
        problems = check(root)
        expected = [
            "README.md:3: link docs/nope.md: docs/nope.md does not exist",
            "README.md:4: link docs/a.md#nope: docs/a.md has no heading with anchor #nope",
            "docs/a.md:5: link ../../x.md leaves the repository",
            "docs/a.md:5: link #gone: docs/a.md has no heading with anchor #gone",
            "README.md: no link to docs/orphan.md (every docs page must be linked)",
            "README.md:8: ```c++: the README's C++ blocks are whole programs fenced ```cpp "
            "(tests/BUILD.bazel compiles those); put fragments in docs/",
        ]
        if sorted(problems) != sorted(expected):
            print("check_docs.py --self_test: expected problems:\n  %s\nfound:\n  %s" % (
                "\n  ".join(expected), "\n  ".join(problems)))
            return 1
        with open(os.path.join(root, "README.md"), "a") as f:
            f.write("line\n" * MAX_README_LINES)
        if not any("more than %d" % MAX_README_LINES in p for p in check(root)):
            print("check_docs.py --self_test: a long README was not reported")
            return 1
    print("check_docs.py --self_test: every planted problem reported")
    return 0


def main(argv):
    if argv[1:] == ["--self_test"]:
        return self_test()
    if len(argv) > 1:
        root = argv[1]
    else:
        # A test's runfile is a link into the source tree.
        root = os.path.dirname(os.path.realpath("README.md"))
    problems = check(root)
    for problem in problems:
        print("FAIL: " + problem)
    pages = len([n for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md")])
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        lines = len(f.read().splitlines())
    if problems:
        print("check_docs.py: %d problem(s) in README.md and docs/*.md" % len(problems))
        return 1
    print("check_docs.py: README.md (%d lines) and %d docs pages: every link and anchor "
          "resolves, every page is linked from README.md" % (lines, pages))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
