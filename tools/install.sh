#!/usr/bin/env bash
# Installs accel's command-line tools as accel-launch, accel-env,
# accel-config, accel-merge-weights, accel-estimate-memory, accel-test and
# accel-plot-metrics in PREFIX/bin (default /usr/local), and the library
# for CMake and pkg-config users:
# PREFIX/lib/libaccel.so, its headers in PREFIX/include/accel,
# PREFIX/lib/cmake/accel/accelConfig.cmake (the target accel::accel) and
# PREFIX/lib/pkgconfig/accel.pc.
#
#   bazel run //tools:install -- [PREFIX]
#   accel-env    # then, from anywhere
#   accel-test   # PASS in seconds: the installation works at 2 processes
#   cmake -DCMAKE_PREFIX_PATH=PREFIX ...   # find_package(accel)
#
# The programs link accel statically and find LibTorch, Gloo, glog and
# gflags in the system's library folders, so the copies run outside Bazel.
set -euo pipefail

prefix=${1:-/usr/local}
if [ $# -gt 1 ] || [ "${prefix#-}" != "$prefix" ]; then
  echo "usage: install [PREFIX]   (default /usr/local)" >&2
  exit 2
fi
# Under `bazel run`, a relative PREFIX is the user's.
if [ -n "${BUILD_WORKING_DIRECTORY:-}" ] && [ "${prefix#/}" = "$prefix" ]; then
  prefix="$BUILD_WORKING_DIRECTORY/$prefix"
fi
# Absolute, whoever runs it: CMake's and pkg-config's files are written
# with it.
[ "${prefix#/}" != "$prefix" ] || prefix="$PWD/$prefix"
runfiles=${RUNFILES_DIR:-$0.runfiles}/accel
if [ ! -d "$runfiles" ]; then
  echo "install: cannot find the built tools in $runfiles; run it with" \
       "bazel run //tools:install" >&2
  exit 1
fi

mkdir -p "$prefix/bin"
install_one() {  # built path, installed name
  local from="$runfiles/$1" to="$prefix/bin/$2"
  if [ ! -f "$from" ]; then
    echo "install: $1 was not built ($from is missing)" >&2
    exit 1
  fi
  # Beside, then renamed: a running copy is never overwritten in place.
  cp -L "$from" "$to.new.$$"
  chmod 755 "$to.new.$$"
  mv -f "$to.new.$$" "$to"
  echo "installed $to"
}
install_one tools/launch accel-launch
install_one tools/env/env accel-env
install_one tools/config accel-config
install_one tools/merge_weights accel-merge-weights
install_one tools/estimate_memory accel-estimate-memory
install_one tools/self_test accel-test
install_one tools/plot_metrics.py accel-plot-metrics

# The library. Each file beside its final name, then renamed into place.
put() {  # from, to, mode
  mkdir -p "$(dirname "$2")"
  cp -L "$1" "$2.new.$$"
  chmod "$3" "$2.new.$$"
  mv -f "$2.new.$$" "$2"
}
version=$(sed -n 's/.*kVersion\[\] = "\([0-9.]*\)".*/\1/p' \
  "$runfiles/accel/runtime/base/version.h")
[ -n "$version" ] || { echo "install: no version in version.h" >&2; exit 1; }
from_template() {  # template, to
  sed -e "s|@VERSION@|$version|g" "$1" >"$2.new.$$"
  chmod 644 "$2.new.$$"
  mv -f "$2.new.$$" "$2"
}
put "$runfiles/tools/cmake/libaccel.so" "$prefix/lib/libaccel.so" 755
headers=0
while IFS= read -r -d '' header; do
  relative=${header#"$runfiles/"}
  # The forwarding headers keep the old paths (accel/zero.h) until 0.2.0.
  relative=${relative#accel/forwarding/}
  put "$header" "$prefix/include/$relative" 644
  headers=$((headers + 1))
done < <(find -L "$runfiles/accel" -name '*.h' -print0)
mkdir -p "$prefix/lib/cmake/accel" "$prefix/lib/pkgconfig"
from_template "$runfiles/tools/cmake/accelConfig.cmake.in" \
  "$prefix/lib/cmake/accel/accelConfig.cmake"
from_template "$runfiles/tools/cmake/accelConfigVersion.cmake.in" \
  "$prefix/lib/cmake/accel/accelConfigVersion.cmake"
from_template "$runfiles/tools/cmake/accel.pc.in" "$prefix/lib/pkgconfig/accel.pc"
echo "installed $prefix/lib/libaccel.so, $headers headers in $prefix/include/accel," \
  "accelConfig.cmake (accel::accel) and accel.pc ($version)"
