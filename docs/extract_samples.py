#!/usr/bin/python3
"""Writes the C++ samples of docs/*.md as sources (docs/BUILD.bazel's genrule).

A ```cpp block is a whole program: written as it is, with `main` renamed
(docs_<page>_<n>_main) so that every program links into one test binary.
A ```c++ block is a fragment, written after #include "docs/sample_prelude.h"
inside a namespace of its own (nested in `docs`): by default as the body of a
function declared with DOCS_SAMPLE_FUNCTION (whose parameters are
`accelerator`, `model`, `optimizer`, `loader`, `batch`, `loss`, `step`); after
a line "<!-- sample: namespace -->" as it is, at namespace scope. A fragment's
#include lines go to the top of the file. #line directives point compiler
errors at the page's own lines.

Usage: extract_samples.py OUT_DIR PAGE=EXPECTED_COUNT... PAGE...
  Writes OUT_DIR/<page>_<n>.cc (page: the file name without .md, n from 1) and
  fails, naming the page, when a page's number of samples differs from the
  count given for it (0 for a page without one).
"""

import os
import re
import sys

FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*([^\s`]*)")
MARKER = re.compile(r"^<!--\s*sample:\s*(\S+)\s*-->\s*$")
KINDS = {"cpp": "program", "c++": "fragment"}
# Names that look like C++ but would not be compiled: refused, so that a
# sample cannot escape the test by its fence's spelling.
CPP_LIKE = {"cc", "cxx", "c", "h", "hpp", "C++", "CPP", "Cpp", "cplusplus"}


def samples(path, text):
    """(kind, mode, first code line number, lines) of each sample of a page."""
    out = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        j = i + 1
        while j < len(lines) and not (
                lines[j].strip().startswith(fence) and not lines[j].strip().strip(fence[0])):
            j += 1
        if j == len(lines):
            sys.exit("%s:%d: code block never closed" % (path, i + 1))
        if lang in KINDS:
            if indent:
                sys.exit("%s:%d: an indented ```%s block: samples start at column 0" % (
                    path, i + 1, lang))
            mode = "function"
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            marker = MARKER.match(lines[k]) if k >= 0 else None
            if marker:
                mode = marker.group(1)
                if mode not in ("function", "namespace"):
                    sys.exit("%s:%d: unknown sample mode '%s' (function or namespace)" % (
                        path, k + 1, mode))
                if KINDS[lang] == "program":
                    sys.exit("%s:%d: a ```cpp block is a whole program; the mode is for "
                             "```c++ fragments" % (path, k + 1))
            out.append((KINDS[lang], mode, i + 2, lines[i + 1:j]))
        elif lang in CPP_LIKE:
            sys.exit("%s:%d: ```%s: write ```cpp (a whole program) or ```c++ (a fragment), "
                     "which the docs tests compile" % (path, i + 1, lang))
        i = j + 1
    return out


def program_source(name, page, first, lines):
    for n, line in enumerate(lines):
        if re.match(r"^int\s+main\s*\(", line):
            before, after = lines[:n], lines[n:]
            return "\n".join(
                ['#line %d "%s"' % (first, page)] + before +
                ["#define main %s_main" % name, '#line %d "%s"' % (first + n, page)] +
                after) + "\n"
    sys.exit("%s:%d: a ```cpp block must be a whole program, with an `int main(` line "
             "(a fragment is ```c++)" % (page, first - 1))


def fragment_source(name, page, mode, first, lines):
    includes = []
    body = []
    for n, line in enumerate(lines):
        if line.lstrip().startswith("#include"):
            includes += ['#line %d "%s"' % (first + n, page), line]
            body.append("")
        else:
            body.append(line)
    out = ['#include "docs/sample_prelude.h"'] + includes
    out += ["", "namespace docs {", "namespace %s {" % name]
    if mode == "function":
        out += ["DOCS_SAMPLE_FUNCTION(Sample) {"]
    out += ['#line %d "%s"' % (first, page)] + body
    if mode == "function":
        out += ["}"]
    out += ["}  // namespace %s" % name, "}  // namespace docs"]
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    out_dir = argv[1]
    expected = {}
    pages = []
    for arg in argv[2:]:
        if "=" in arg:
            page, count = arg.split("=", 1)
            expected[page] = int(count)
        else:
            pages.append(arg)
    names = {os.path.basename(p)[:-len(".md")]: p for p in pages}
    for page in expected:
        if page not in names:
            sys.exit("docs/BUILD.bazel expects samples in docs/%s.md, which is not a page" % page)
    os.makedirs(out_dir, exist_ok=True)
    failed = False
    for stem, path in sorted(names.items()):
        page = "docs/%s.md" % stem
        with open(path, encoding="utf-8") as f:
            found = samples(page, f.read())
        want = expected.get(stem, 0)
        if len(found) != want:
            sys.stderr.write(
                "%s has %d C++ samples (```cpp and ```c++ blocks); docs/BUILD.bazel's "
                "DOC_SAMPLES expects %d: update DOC_SAMPLES with the page\n" % (
                    page, len(found), want))
            failed = True
            continue
        for n, (kind, mode, first, lines) in enumerate(found, 1):
            name = "%s_%d" % (stem, n)
            if kind == "program":
                source = program_source("docs_" + name, page, first, lines)
            else:
                source = fragment_source(name, page, mode, first, lines)
            header = "// Sample %d of %s (%s), extracted by docs/extract_samples.py.\n" % (
                n, page, kind if kind == "program" else "fragment, %s scope" % mode)
            with open(os.path.join(out_dir, name + ".cc"), "w", encoding="utf-8") as f:
                f.write(header + source)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
