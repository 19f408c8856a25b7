#!/usr/bin/env bash
# Packs what tools/gpu_check.sh needs from this machine but the lent GPU
# machine lacks (gflags and GoogleTest: headers and static libraries) into
# .gpu_deps/, which git ignores. Carry it with the device tool's `carry`.
#
#   tools/gpu_deps.sh && (device run, carry [".gpu_deps"]) tools/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu_deps
mkdir -p .gpu_deps/include .gpu_deps/lib
cp -r /usr/include/gflags /usr/include/gtest /usr/include/gmock .gpu_deps/include/
for lib in libgflags.a libgtest.a libgtest_main.a libgmock.a; do
  cp "/usr/lib/x86_64-linux-gnu/$lib" .gpu_deps/lib/
done
du -sh .gpu_deps
