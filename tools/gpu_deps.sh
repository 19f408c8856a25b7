#!/usr/bin/env bash
# Packs what tools/gpu_check.sh needs from this machine but the lent GPU
# machine lacks (gflags and GoogleTest: headers and static libraries; glog:
# headers and its shared library with the two it needs; yaml-cpp: headers
# and its static library) into
# .gpu_deps/, which git ignores. Carry it with the device tool's `carry`.
#
#   tools/gpu_deps.sh && (device run, carry [".gpu_deps"]) tools/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu_deps
mkdir -p .gpu_deps/include .gpu_deps/lib
cp -r /usr/include/gflags /usr/include/gtest /usr/include/gmock \
  /usr/include/glog /usr/include/yaml-cpp .gpu_deps/include/
for lib in libgflags.a libgtest.a libgtest_main.a libgmock.a libyaml-cpp.a; do
  cp "/usr/lib/x86_64-linux-gnu/$lib" .gpu_deps/lib/
done
# glog links libgflags and libunwind dynamically; -lglog finds libglog.so.
for lib in libglog.so.1 libgflags.so.2.2 libunwind.so.8; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" .gpu_deps/lib/
done
# One gflags for the program and glog: the shared one (-lgflags finds it).
ln -sf libglog.so.1 .gpu_deps/lib/libglog.so
ln -sf libgflags.so.2.2 .gpu_deps/lib/libgflags.so
du -sh .gpu_deps
