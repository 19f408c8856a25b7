#!/usr/bin/env bash
# Installs accel's command-line tools as accel-launch, accel-env,
# accel-config, accel-merge-weights and accel-plot-metrics in PREFIX/bin
# (default /usr/local).
#
#   bazel run //tools:install -- [PREFIX]
#   accel-env    # then, from anywhere
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
install_one tools/plot_metrics.py accel-plot-metrics
