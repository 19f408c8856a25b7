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
#   5. Nothing in the repository includes a deprecated path that
#      accel/forwarding/ forwards (accel 0.1's flat accel/*.h), except the
#      workspace that checks the forwarding (tests/forwarding_workspace).
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
  if ! grep -q '^torch_free_package()' "$build"; then
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
allowed_in() {
  local mine=$1 theirs=$2
  [[ "$theirs" == runtime/* || "$theirs" == runtime ]] && return 0
  [[ -n "$theirs" && "${may_use[$mine]}" == *" $theirs "* ]]
}
for output in "${accel_outputs[@]}"; do
  mine=$(basename "$(dirname "$output")")
  bad=()
  while IFS= read -r label; do
    theirs=$(sed -E 's|^//accel/?([^:]*):.*|\1|' <<<"$label")
    allowed_in "$mine" "$theirs" || bad+=("$label")
  done < <(grep -E '^//accel(/[a-z_]+)?:' "$output" | grep -v '^//accel/runtime/' |
           grep -vE '\.(h|cc|proto|py)$')
  ((${#bad[@]} == 0)) && continue
  fail "//accel/$mine depends on ${bad[*]:0:5}: accel/$mine may use only" \
       "accel/{${may_use[$mine]}} and accel/runtime (ACCEL_LAYERS in" \
       "tests/layering/BUILD.bazel); only the Accelerator ties packages together"
  echo "  (bazel query 'somepath(//accel/$mine:all, ${bad[0]})' shows the path)"
done
accel_declared=0
while IFS= read -r build; do
  relative=${build#"$root"/}
  package=$(basename "$(dirname "$relative")")
  [[ "$package" == forwarding ]] && continue
  accel_declared=$((accel_declared + 1))
  grep -q '^accel_package()' "$build" ||
    fail "$relative does not declare accel_package(): add" \
         "load(\"//tests/layering:layering.bzl\", \"accel_package\")" \
         "at its top and accel_package() as its last line"
  [[ -n "${may_use[$package]:-}" ]] ||
    fail "accel/$package is not in ACCEL_LAYERS (tests/layering/BUILD.bazel):" \
         "say which packages it may use"
done < <(find "$root/accel" -mindepth 2 -maxdepth 2 -path "$root/accel/runtime" \
           -prune -o \( -name BUILD.bazel -o -name BUILD \) -print | sort)

# 4b. The LibTorch layer's packages: includes.
while IFS= read -r file; do
  relative=${file#"$root"/}
  mine=$(cut -d/ -f2 <<<"$relative")
  [[ "$mine" == runtime || "$mine" == forwarding ]] && continue
  while IFS= read -r header; do
    [[ "$header" == accel/* ]] || continue
    theirs=$(dirname "${header#accel/}")
    [[ "$theirs" == . ]] && theirs=""
    [[ "$theirs" == runtime/* ]] && theirs=runtime
    allowed_in "$mine" "$theirs" && continue
    if [[ -z "$theirs" ]]; then
      fail "$relative includes $header, the Accelerator's top package: only" \
           "accel/*.h ties the packages together (accel/$mine may use" \
           "accel/{${may_use[$mine]}} and accel/runtime)"
    else
      fail "$relative includes $header: accel/$mine may use only" \
           "accel/{${may_use[$mine]}} and accel/runtime (ACCEL_LAYERS in" \
           "tests/layering/BUILD.bazel)"
    fi
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]' "$file" |
           sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^>"]+)[>"].*/\1/')
done < <(find "$root/accel" -mindepth 2 \( -name '*.h' -o -name '*.cc' \) | sort)

# 2. and 3. Includes.
rank_of() {
  case "$1" in
    base) echo 0 ;; env) echo 1 ;; store) echo 2 ;; comm) echo 3 ;;
    launch) echo 3 ;; *) echo 9 ;;
  esac
}
while IFS= read -r file; do
  relative=${file#"$root"/}
  while IFS= read -r line; do
    header=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^>"]+)[>"].*/\1/' \
      <<<"$line")
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
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]' "$file")
done < <(find "$root/accel/runtime" "$root/backends" \( -name '*.h' -o \
           -name '*.hpp' -o -name '*.cc' -o -name '*.cpp' \) | sort)

# 5. Deprecated paths.
forwarded=$(cd "$root/accel/forwarding" && ls accel/*.h | sed 's/\./\\./g' | paste -sd'|')
if [[ -n "$forwarded" ]]; then
  while IFS= read -r hit; do
    fail "${hit#"$root"/}: includes a deprecated path; include the new one" \
         "(accel/forwarding/ names it)"
  done < <(grep -rnE --include='*.h' --include='*.cc' --include='*.cpp' \
             "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"($forwarded)\"" \
             "$root/accel" "$root/backends" "$root/examples" "$root/tests" "$root/tools" |
           grep -v -e "^$root/accel/forwarding/" -e "^$root/tests/forwarding_workspace/")
fi

if ((failures > 0)); then
  echo "$failures layering problem(s)"
  exit 1
fi
echo "layering holds: $declared LibTorch-free packages and $accel_declared" \
     "packages of the LibTorch layer, their dependencies and includes checked"
