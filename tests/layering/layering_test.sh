#!/bin/bash
# accel's layers hold (a test, run by bazel test //tests/layering:all):
#
#   1. accel/runtime/ and backends/ are LibTorch-free: none of their C++
#      rules depends, directly or through anything, on LibTorch
#      (@accel_torch) or on accel's LibTorch layer (//accel:*); each of their
#      BUILD files declares torch_free_package(), whose genquery we read.
#      accel/runtime/ is backend-free too: no dependency on Gloo, MPI, CUDA
#      or NCCL (@accel_gloo, @accel_mpi, @accel_cuda) nor on //backends/.
#   2. None of their sources includes a LibTorch header (the system's
#      /usr/include holds them, so a missing Bazel dependency alone would not
#      stop an include), nor a header of accel's LibTorch layer; none in
#      accel/runtime/ includes a Gloo, MPI, CUDA or NCCL header or one of
#      backends/.
#   3. Inside accel/runtime/, no include runs back up a layer:
#      base < env < store < comm, and launch beside comm: launch may include
#      base, env and store, and neither launch nor comm includes the other.
#      Tests may use any runtime layer.
#   4. accel's LibTorch layer is made of packages (accel/core, accel/parallel,
#      ...; ACCEL_LAYERS in tests/layering/BUILD.bazel says which may use
#      which): a package's libraries depend, and its sources (tests too)
#      include, only itself, the packages it may use and accel/runtime/;
#      never the Accelerator's top package (//accel, accel/*.h), which is the
#      one place that ties them together. Each package under accel/ declares
#      accel_package() and has its line in ACCEL_LAYERS.
#   5. Nothing in the repository (sources of any extension, README.md and
#      docs/*.md) includes a deprecated path that accel/forwarding/ forwards
#      (accel 0.1's flat accel/*.h) or accel/forwarding/ itself, except the
#      workspace that checks the forwarding (tests/forwarding_workspace).
#   0. First, so that the rest can read them: in accel/ and backends/ every
#      #include writes its path from the repository root (no "..", no
#      macro). Sources are .h/.hh/.hpp/.cc/.cpp/.cxx/.inc/.ipp/.tcc files;
#      a marker (torch_free_package(), accel_package()) must be its BUILD
#      file's last line, so that it sees every rule; a package nested in a
#      subsystem belongs to it and needs its own line in ACCEL_LAYERS.
#
# Usage (from the BUILD rule):
#   layering_test.sh GENQUERY_OUTPUT... [--layer=PACKAGE=USES...]
set -u
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# The source tree: this script's runfile resolves into it.
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)
[[ -f "$root/WORKSPACE" ]] || { echo "cannot find the source tree from $0"; exit 2; }

# C++ sources of any extension (an .inc or .ipp file is included as well).
sources() {
  find "$@" \( -name '*.h' -o -name '*.hh' -o -name '*.hpp' -o -name '*.cc' \
    -o -name '*.cpp' -o -name '*.cxx' -o -name '*.inc' -o -name '*.ipp' \
    -o -name '*.tcc' \) | sort
}
# include_lines FILE: "LINE HEADER" for each #include "HEADER" or <HEADER>
# of FILE (after spaces or a /* comment */ too).
include_lines() {
  grep -nE '^[[:space:]]*(/\*.*\*/[[:space:]]*)*#[[:space:]]*include[[:space:]]*[<"]' "$1" |
    sed -E 's/^([0-9]+):[^#]*#[[:space:]]*include[[:space:]]*[<"]([^>"]+)[>"].*/\1 \2/'
}
# last_line_is FILE TEXT: whether TEXT is FILE's last non-blank line.
last_line_is() {
  [[ "$(grep -v '^[[:space:]]*$' "$1" | tail -n 1)" == "$2" ]]
}

# 0. Include forms the checks below can read: the path written out, from
# the repository root (no computed #include MACRO, no path on the next
# line, no "..").
while IFS= read -r file; do
  relative=${file#"$root"/}
  while IFS= read -r hit; do
    number=${hit%%:*}
    text=${hit#*:}
    if ! grep -qE '#[[:space:]]*include[[:space:]]*[<"][^>"]+[>"]' <<<"$text"; then
      fail "$relative:$number: a computed #include (a macro, or the path on" \
           "the next line): write the path, so that the layering can be checked"
    elif grep -qE '#[[:space:]]*include[[:space:]]*[<"](\.\.?/|[^>"]*/\.\.?/)' <<<"$text"; then
      fail "$relative:$number: a relative include path ($text): write it from" \
           "the repository root (accel/...)"
    fi
  done < <(grep -nE '^[[:space:]]*(/\*.*\*/[[:space:]]*)*#[[:space:]]*include' "$file")
done < <(sources "$root/accel" "$root/backends")

# 1. Dependencies.
# fail_if_reaches PACKAGE DEPS_FILE PATTERN WHAT WHERE: fails naming the first
# dependencies of PACKAGE (one label a line in DEPS_FILE) that match PATTERN.
fail_if_reaches() {
  local package=$1 output=$2 pattern=$3 what=$4 where=$5 bad
  bad=$(grep -E "$pattern" "$output" | head -5)
  [[ -z "$bad" ]] && return
  fail "//$package depends on $what through:"
  echo "$bad" | sed 's/^/    /'
  echo "  (bazel query 'somepath(//$package:all, LABEL)' shows the path;" \
       "$where)"
}
checked=()
declare -A may_use=()  # accel package -> " itself and what it may use "
accel_outputs=()
outputs=()
for arg in "$@"; do
  case "$arg" in
    --layer=*)
      spec=${arg#--layer=}
      uses=${spec#*=}
      may_use[${spec%%=*}]=" ${spec%%=*} ${uses//,/ } " ;;
    */accel_deps) accel_outputs+=("$arg") ;;
    *) outputs+=("$arg") ;;
  esac
done
for output in "${outputs[@]}"; do
  package=$(dirname "$output")
  if [[ $(basename "$output") == library_deps ]]; then
    # Only the runtime's libraries (not its tests) must not reach a backend.
    [[ "$package" == accel/runtime/* ]] &&
      fail_if_reaches "$package" "$output" '^(@accel_(gloo|mpi|cuda)//|//backends/)' \
        "a backend or its library (the runtime is backend-free)" \
        "backend code belongs in backends/, behind accel::Transport"
    continue
  fi
  checked+=("$package")
  fail_if_reaches "$package" "$output" '^(@accel_torch//:torch|//accel(/[a-z_]+)?:.*)$' \
    "LibTorch or accel's LibTorch layer" "code that needs LibTorch belongs in accel/"
done
declared=0
while IFS= read -r build; do
  declared=$((declared + 1))
  relative=${build#"$root"/}
  if ! last_line_is "$build" 'torch_free_package()'; then
    fail "$relative does not declare torch_free_package(): add" \
         "load(\"//tests/layering:layering.bzl\", \"torch_free_package\")" \
         "at its top and torch_free_package() as its last line"
  fi
  package=$(dirname "$relative")
  if [[ " ${checked[*]} " != *" $package "* ]]; then
    fail "//$package is not checked: add \"//$package\" to" \
         "TORCH_FREE_PACKAGES in tests/layering/BUILD.bazel"
  fi
done < <(find "$root/accel/runtime" "$root/backends" \
           \( -name BUILD.bazel -o -name BUILD \) | sort)

# 4a. The LibTorch layer's packages: dependencies.
# allowed_in ACCEL_PACKAGE HEADER_OR_LABEL_PACKAGE: whether a package of the
# LibTorch layer may use accel/OTHER (OTHER: "runtime/...", a package, or ""
# for the top package).
# A package nested in a subsystem (accel/parallel/mesh) belongs to it.
allowed_in() {
  local mine=$1 theirs=$2
  [[ "$theirs" == runtime || "$theirs" == "${mine%%/*}" ]] && return 0
  [[ -n "$theirs" && "${may_use[$mine]:-}" == *" $theirs "* ]]
}
for output in "${accel_outputs[@]}"; do
  mine=$(dirname "${output#*accel/}")
  bad=()
  # Rules and files alike: a rule may take another package's sources.
  while IFS= read -r label; do
    theirs=$(sed -E 's|^//accel/?([^:/]*).*|\1|' <<<"$label")
    allowed_in "$mine" "$theirs" || bad+=("$label")
  done < <(grep -E '^//accel(/[a-z_0-9/]+)?:' "$output")
  ((${#bad[@]} == 0)) && continue
  fail "//accel/$mine depends on ${bad[*]:0:5}: accel/$mine may use only" \
       "accel/{${may_use[$mine]:-}} and accel/runtime (ACCEL_LAYERS in" \
       "tests/layering/BUILD.bazel); only the Accelerator ties packages together"
  echo "  (bazel query 'somepath(//accel/$mine:all, ${bad[0]})' shows the path)"
done
accel_declared=0
while IFS= read -r build; do
  relative=${build#"$root"/}
  package=$(dirname "${relative#accel/}")
  accel_declared=$((accel_declared + 1))
  last_line_is "$build" 'accel_package()' ||
    fail "$relative does not end with accel_package(): add" \
         "load(\"//tests/layering:layering.bzl\", \"accel_package\")" \
         "at its top and accel_package() as its last line"
  [[ -n "${may_use[$package]:-}" ]] ||
    fail "accel/$package is not in ACCEL_LAYERS (tests/layering/BUILD.bazel):" \
         "say which packages it may use"
done < <(find "$root/accel" \( -path "$root/accel/runtime" -o \
           -path "$root/accel/forwarding" \) -prune -o \
           \( -name BUILD.bazel -o -name BUILD \) -print |
         grep -vE "^$root/accel/BUILD(\.bazel)?$" | sort)

# 4b. The LibTorch layer's packages: includes.
while IFS= read -r file; do
  relative=${file#"$root"/}
  mine=$(cut -d/ -f2 <<<"$relative")
  [[ "$mine" == runtime || "$mine" == forwarding ]] && continue
  while read -r number header; do
    [[ "$header" == accel/* ]] || continue
    theirs=${header#accel/}
    [[ "$theirs" == */* ]] && theirs=${theirs%%/*} || theirs=""
    allowed_in "$mine" "$theirs" && continue
    if [[ -z "$theirs" ]]; then
      fail "$relative:$number includes $header, the Accelerator's top" \
           "package: only accel/*.h ties the packages together (accel/$mine" \
           "may use accel/{${may_use[$mine]:-}} and accel/runtime)"
    else
      fail "$relative:$number includes $header: accel/$mine may use only" \
           "accel/{${may_use[$mine]:-}} and accel/runtime (ACCEL_LAYERS in" \
           "tests/layering/BUILD.bazel)"
    fi
  done < <(include_lines "$file")
done < <(sources "$root/accel" -mindepth 2)

# 2. and 3. Includes.
rank_of() {
  case "$1" in
    base) echo 0 ;; env) echo 1 ;; store) echo 2 ;; comm) echo 3 ;;
    launch) echo 3 ;; *) echo 9 ;;
  esac
}
while IFS= read -r file; do
  relative=${file#"$root"/}
  while read -r number header; do
    case "$header" in
      torch/* | ATen/* | c10/* | caffe2/*)
        fail "$relative includes LibTorch's <$header> (accel/runtime/ and" \
             "backends/ stay LibTorch-free; code that needs it belongs in accel/)" ;;
      accel/runtime/*) ;;
      accel/*) fail "$relative includes accel's LibTorch layer: $header" ;;
    esac
    if [[ "$relative" == accel/runtime/* && "$relative" != *_test.cc ]]; then
      case "$header" in
        gloo/* | mpi.h | mpi/* | nccl.h | cuda* | backends/*)
          fail "$relative includes $header: the runtime is backend-free" \
               "(backend code belongs in backends/, behind accel::Transport)" ;;
      esac
    fi
    [[ "$relative" == accel/runtime/* && "$header" == accel/runtime/* ]] ||
      continue
    [[ "$relative" == *_test.cc ]] && continue
    mine=$(cut -d/ -f3 <<<"$relative")
    theirs=$(cut -d/ -f3 <<<"$header")
    [[ "$mine" == "$theirs" ]] && continue
    if (($(rank_of "$theirs") >= $(rank_of "$mine"))); then
      fail "$relative ($mine) includes $header: runtime/$theirs is not" \
           "below runtime/$mine (base < env < store < comm; launch beside" \
           "comm, above store)"
    fi
  done < <(include_lines "$file")
done < <(sources "$root/accel/runtime" "$root/backends")

# 5. Deprecated paths: the old flat paths accel/forwarding/ forwards, and
# accel/forwarding/ itself, in any source or in the docs' samples.
declare -A forwarded=()
for header in "$root"/accel/forwarding/accel/*.h; do
  forwarded[accel/${header##*/}]=1
done
while IFS= read -r file; do
  relative=${file#"$root"/}
  [[ "$relative" == accel/forwarding/* || "$relative" == tests/forwarding_workspace/* ]] &&
    continue
  while read -r number header; do
    [[ -n "${forwarded[$header]:-}" || "$header" == accel/forwarding/* ]] || continue
    fail "$relative:$number includes $header, a deprecated path: include" \
         "$(sed -n 's/^#include "\(.*\)"$/\1/p' "$root/accel/forwarding/${header#accel/forwarding/}" 2>/dev/null |
            grep . || echo "the new one (accel/forwarding/ names it)")"
  done < <(include_lines "$file")
done < <({ sources "$root/accel" "$root/backends" "$root/examples" "$root/tests" \
             "$root/tools"; ls "$root"/README.md "$root"/docs/*.md; } )

if ((failures > 0)); then
  echo "$failures layering problem(s)"
  exit 1
fi
echo "layering holds: $declared LibTorch-free packages and $accel_declared" \
     "packages of the LibTorch layer, their dependencies and includes checked"
