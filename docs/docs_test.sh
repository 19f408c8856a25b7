#!/bin/bash
# //docs:docs_test: check_docs.py's self-test (each kind of broken link is
# reported), then README.md and docs/*.md themselves. The runfiles are links
# into the source tree, which check_docs.py follows to check links to any file
# of the repository.
set -eu
checker=docs/check_docs.py
/usr/bin/python3 "$checker" --self_test
exec /usr/bin/python3 "$checker"
