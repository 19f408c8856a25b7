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
unformatted=()
for file in "${files[@]}"; do
  [[ -f "$file" ]] || continue  # Deleted but not yet committed.
  if ! clang-format --style=file --dry-run --Werror "$file" >/dev/null 2>&1; then
    unformatted+=("$file")
  fi
done
if ((${#unformatted[@]} > 0)); then
  echo "format_check: ${#unformatted[@]} of ${#files[@]} files differ from clang-format:" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  echo "format_check: fix with: clang-format -i --style=file FILE..." >&2
  exit 1
fi
echo "format_check: ${#files[@]} C++ files as clang-format writes them"
