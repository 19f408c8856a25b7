#!/usr/bin/env bash
# accel installed in a temporary prefix, then used as CMake and pkg-config
# users would: examples/cmake_consumer built with find_package(accel) (as
# LibTorch's C++ tutorial builds) and with `pkg-config accel`, each run at 2
# processes outside Bazel.
set -euo pipefail
prefix="$TEST_TMPDIR/prefix"
work="$TEST_TMPDIR/consumer"
fail() { echo "FAIL: $*"; exit 1; }
tools/install "$prefix" >/dev/null
for file in lib/libaccel.so include/accel/accelerator.h \
    include/accel/checkpoint/model_weights.h include/accel/model_weights.h \
    lib/cmake/accel/accelConfig.cmake lib/cmake/accel/accelConfigVersion.cmake \
    lib/pkgconfig/accel.pc; do
  [ -f "$prefix/$file" ] || fail "$file not installed"
done
mkdir -p "$work"
cp examples/cmake_consumer/CMakeLists.txt examples/cmake_consumer/train.cpp "$work/"
cd "$work"
# A bare environment: nothing of Bazel's on the paths.
run() { env -i HOME="$TEST_TMPDIR" PATH=/usr/bin:/bin "$@"; }

run cmake -S . -B build -DCMAKE_PREFIX_PATH="$prefix" >cmake.log 2>&1 ||
  fail "cmake: $(tail -n 20 cmake.log)"
run cmake --build build >build.log 2>&1 || fail "build: $(tail -n 20 build.log)"
out=$(cd build && run ./train --num_processes=2 --main_process_port=0 2>&1) ||
  fail "train (CMake): $out"
grep -qF "cmake consumer: 2 process(es), last epoch 64 of 64 right" <<<"$out" ||
  fail "train (CMake) printed: $out"
[ -f build/trained_model/model.safetensors ] || [ -n "$(ls build/trained_model)" ] ||
  fail "no checkpoint in build/trained_model"

# A version the installed copy is not is refused.
sed 's/find_package(accel 0.1 REQUIRED)/find_package(accel 7.0 REQUIRED)/' \
  CMakeLists.txt >CMakeLists.txt.new && mv CMakeLists.txt.new CMakeLists.txt
if run cmake -S . -B build7 -DCMAKE_PREFIX_PATH="$prefix" >cmake7.log 2>&1; then
  fail "find_package(accel 7.0) took version 0.1"
fi
grep -q "0.1.1" cmake7.log || fail "no version in: $(tail -n 20 cmake7.log)"

flags=$(run env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs accel)
# LibTorch's headers come as system headers (-isystem, as the CMake
# package's): their warnings are not the program's. With -I, -Wextra -Werror
# failed in LibTorch's own headers.
grep -q -- "-isystem /usr/include/torch/csrc/api/include" <<<"$flags" ||
  fail "pkg-config's flags: $flags"
run g++ -o train_pc train.cpp $flags -Wall -Wextra -Werror ||
  fail "g++ -Wall -Wextra -Werror with pkg-config's flags"
out=$(run ./train_pc --num_processes=2 --main_process_port=0 2>&1) ||
  fail "train (pkg-config): $out"
grep -qF "cmake consumer: 2 process(es), last epoch 64 of 64 right" <<<"$out" ||
  fail "train (pkg-config) printed: $out"
echo PASS
