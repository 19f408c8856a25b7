#!/bin/sh
# Bazel's --workspace_status_command (see .bazelrc): the commit accel is built
# from, for `accel env`. Prints nothing outside a git checkout; never fails.
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || exit 0
if ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit, with uncommitted changes"
fi
echo "STABLE_ACCEL_COMMIT $commit"
