#!/usr/bin/env bash
# CI's format check: every C++ file git tracks is as clang-format (Google
# style, .clang-format) would write it. Lists the files that are not and how
# to fix them.
#
#   tools/format_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "format_check: clang-format is not installed (tools/setup.sh installs it)" >&2
  exit 2
fi
# Tracked files and new ones git does not ignore.
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
  '*.h' '*.hpp' '*.cc' '*.cpp' | sort -u)
existing=()
for file in "${files[@]}"; do
  if [[ -f "$file" ]]; then existing+=("$file"); fi  # Else deleted, uncommitted.
done
# One clang-format for many files (xargs): one process per file cost 35-56 s
# of CI on 2 cores, nearly all of it starting clang-format 324 times; this
# takes 2. Each difference is a "FILE:LINE:COL: error: ..." line on stderr.
report=$(mktemp)
trap 'rm -f "$report"' EXIT
status=0
printf '%s\0' "${existing[@]}" |
  xargs -0 clang-format --style=file --dry-run --Werror 2>"$report" >/dev/null ||
  status=$?
mapfile -t unformatted < <(
  sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: .*/\1/p' "$report" | sort -u |
    grep -Fx -f <(printf '%s\n' "${existing[@]}"))
if ((status != 0 && ${#unformatted[@]} == 0)); then
  # clang-format failed without naming a difference in one of the files:
  # a bad .clang-format, an unreadable file. Say what it said.
  echo "format_check: clang-format failed (exit $status):" >&2
  head -n 20 "$report" >&2
  exit 1
fi
if ((${#unformatted[@]} > 0)); then
  echo "format_check: ${#unformatted[@]} of ${#files[@]} files differ from clang-format:" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  echo "format_check: fix with: clang-format -i --style=file FILE..." >&2
  exit 1
fi
echo "format_check: ${#existing[@]} C++ files as clang-format writes them"
