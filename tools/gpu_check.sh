#!/usr/bin/env bash
# The GPU check: builds accel's core, the nccl backend, the GPU tests,
# train_demo and the bandwidth benchmark without Bazel (the lent GPU machine
# has none), runs them on the GPU, and prints one PASS/FAIL line per check
# with its figures. Meant for one call of a few minutes on a lent machine:
#
#   tools/gpu_deps.sh            # here, once: gflags + GoogleTest for there
#   device run, carry [".gpu_deps"]:  tools/gpu_check.sh
#
# `tools/gpu_check.sh --build-only` tries the build steps anywhere (here it
# builds against Debian's CPU LibTorch and /usr/local/cuda).
# `tools/gpu_check.sh --build-only --quick` (CI) compiles and links the
# CUDA/NCCL programs but only preprocesses the LibTorch units and
# train_demo: that their files exist and their includes resolve with these
# flags is what it adds to `bazel test //...`, which compiles the same files
# against the same LibTorch (compiling them again took 276 s of CI's 2 cores).
#
# It finds: LibTorch in the python torch package (or Debian's in /usr);
# CUDA and NCCL in $CUDA_HOME (default /usr/local/cuda) or in the nvidia
# python packages; gflags and GoogleTest in /usr or in .gpu_deps/.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${ACCEL_GPU_BUILD_DIR:-/tmp/accel_gpu_build}
LOGS=$BUILD/logs
BUILD_ONLY=0
QUICK=0
for argument in "$@"; do
  case "$argument" in
    --build-only) BUILD_ONLY=1 ;;
    --quick) QUICK=1 ;;
    *) echo "gpu_check: unknown argument '$argument' (--build-only, --quick)" >&2
       exit 2 ;;
  esac
done
if [ $QUICK = 1 ] && [ $BUILD_ONLY = 0 ]; then
  echo "gpu_check: --quick goes with --build-only (the checks need train_demo)" >&2
  exit 2
fi
mkdir -p "$BUILD/obj" "$LOGS"
cd "$ROOT"

results=()
record() {  # record NAME STATUS DETAIL
  results+=("$(printf '%-4s %-34s %s' "$2" "$1" "$3")")
  echo "== $2 $1 $3"
}

# --- Locate the dependencies ------------------------------------------------
PY=$(command -v python3 || true)
torch_dir=""
abi=1
if [ -n "$PY" ]; then
  torch_dir=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
  abi=$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
fi
if [ -n "$torch_dir" ] && [ -d "$torch_dir/include/torch" ]; then
  TORCH_INC="-isystem $torch_dir/include -isystem $torch_dir/include/torch/csrc/api/include"
  TORCH_LIB="$torch_dir/lib"
else
  TORCH_INC="-isystem /usr/include/torch/csrc/api/include"
  TORCH_LIB=/usr/lib/x86_64-linux-gnu
fi
TORCH_LIBS="-L$TORCH_LIB -Wl,-rpath,$TORCH_LIB -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10"
[ -e "$TORCH_LIB/libtorch_cuda.so" ] && TORCH_LIBS="$TORCH_LIBS -ltorch_cuda -lc10_cuda"
TORCH_LIBS="$TORCH_LIBS -Wl,--as-needed"

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cuda_inc=""; cuda_lib=""; nccl_inc=""; nccl_lib=""
if [ -e "$CUDA_HOME/include/nccl.h" ]; then
  cuda_inc=$CUDA_HOME/include; nccl_inc=$cuda_inc
  for d in lib64 lib; do [ -e "$CUDA_HOME/$d/libnccl.so.2" ] && cuda_lib=$CUDA_HOME/$d; done
  nccl_lib=$cuda_lib
elif [ -n "$PY" ]; then
  nvidia=$("$PY" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + "/nvidia")' 2>/dev/null || true)
  for d in "$nvidia"/cuda_runtime "$nvidia"/cu13 "$nvidia"/cuda_runtime/*; do
    [ -e "$d/include/cuda_runtime_api.h" ] && { cuda_inc=$d/include; cuda_lib=$d/lib; break; }
  done
  for d in "$nvidia"/nccl "$nvidia"/cu13; do
    [ -e "$d/include/nccl.h" ] && { nccl_inc=$d/include; nccl_lib=$d/lib; break; }
  done
fi
cudart=$(ls "$cuda_lib"/libcudart.so* 2>/dev/null | head -n 1)
nccl=$(ls "$nccl_lib"/libnccl.so* 2>/dev/null | head -n 1)
if [ -z "$cuda_inc" ] || [ -z "$nccl_inc" ] || [ -z "$cudart" ] || [ -z "$nccl" ]; then
  record build FAIL "CUDA/NCCL not found (CUDA_HOME=$CUDA_HOME, python nvidia packages)"
  printf '%s\n' "${results[@]}"; exit 1
fi
CUDA_FLAGS="-isystem $cuda_inc -isystem $nccl_inc"
CUDA_LIBS="$cudart $nccl -Wl,-rpath,$cuda_lib -Wl,-rpath,$nccl_lib"

DEPS_INC=""; DEPS_LIB=""
if [ ! -e /usr/include/gflags/gflags.h ] || [ ! -e /usr/include/gtest/gtest.h ] ||
   [ ! -e /usr/include/glog/logging.h ] || [ ! -e /usr/include/yaml-cpp/yaml.h ]; then
  DEPS_INC="-isystem $ROOT/.gpu_deps/include"
  DEPS_LIB="-L$ROOT/.gpu_deps/lib -Wl,-rpath,$ROOT/.gpu_deps/lib"
fi
# accel logs through glog (shared: Debian's static glog needs libunwind's)
# and reads Accelerate's YAML launch configuration with yaml-cpp.
GLOG_LIBS="-lglog -lgflags -lyaml-cpp"
echo "torch: ${torch_dir:-/usr (Debian)} (cxx11 abi $abi); cuda: $cuda_inc; nccl: $nccl"

# --- Build --------------------------------------------------------------------
CXX=${CXX:-g++}
# --quick checks that the programs compile and link, not how fast they run:
# -O0 compiles the runtime in about half the time of -O2.
OPT=-O2
[ $QUICK = 1 ] && OPT=-O0
CXXFLAGS="-std=c++17 $OPT -fPIC -D_GLIBCXX_USE_CXX11_ABI=$abi -I$ROOT $DEPS_INC $CUDA_FLAGS"
# Every non-test source of the runtime and the LibTorch layer, so that the
# list cannot fall behind (trackers other than the interface need JSON and
# protobuf headers the GPU machine lacks: --report_to is not checked there).
units() { find "$@" -name '*.cc' ! -name '*_test.cc' | sed 's/\.cc$//' | sort; }
CORE="$(units accel/runtime) accel/tracking/tracker accel/tracking/tracker_set
      backends/nccl/nccl_transport"
TORCH_UNITS="$(units accel ! -path 'accel/runtime/*' ! -path 'accel/tracking/*')
             examples/train_demo examples/progress_bar"
# The conformance suite is every tests/conformance*.cc, found like CORE.
CONFORMANCE_UNITS="$(units tests/conformance*.cc) tests/thread_ranks"
TEST_UNITS="$CONFORMANCE_UNITS backends/nccl/nccl_conformance_test
            tools/bench/nccl_bandwidth"
compile() {  # compile UNIT [extra flags]
  local unit=$1; shift
  local obj="$BUILD/obj/${unit//\//_}.o"
  $CXX $CXXFLAGS "$@" -c "$ROOT/$unit.cc" -o "$obj" 2> "$LOGS/${unit//\//_}.log" \
    || { echo "compile failed: $unit"; cat "$LOGS/${unit//\//_}.log" | head -30; return 1; }
}
preprocess() {  # preprocess UNIT [extra flags]: its includes resolve
  local unit=$1; shift
  $CXX $CXXFLAGS "$@" -M "$ROOT/$unit.cc" > /dev/null 2> "$LOGS/${unit//\//_}.log" \
    || { echo "preprocess failed: $unit"; cat "$LOGS/${unit//\//_}.log" | head -30; return 1; }
}
export -f compile preprocess
export CXX CXXFLAGS BUILD ROOT LOGS TORCH_INC
start=$(date +%s)
build_ok=1
printf '%s\n' $CORE $TEST_UNITS | xargs -P "$(nproc)" -I{} bash -c 'compile {}' || build_ok=0
torch_step=compile
[ $QUICK = 1 ] && torch_step=preprocess
printf '%s\n' $TORCH_UNITS | xargs -P "$(nproc)" -I{} bash -c "$torch_step {} \$TORCH_INC" || build_ok=0
o() { for u in "$@"; do printf '%s ' "$BUILD/obj/${u//\//_}.o"; done; }
programs="nccl_conformance_test, nccl_bandwidth"
if [ $build_ok = 1 ]; then
  $CXX -o "$BUILD/nccl_conformance_test" $(o $CORE $CONFORMANCE_UNITS backends/nccl/nccl_conformance_test) \
    $DEPS_LIB -lgtest_main -lgtest $GLOG_LIBS $CUDA_LIBS -pthread 2> "$LOGS/link_test.log" || build_ok=0
  $CXX -o "$BUILD/nccl_bandwidth" $(o $CORE tools/bench/nccl_bandwidth) \
    $DEPS_LIB $GLOG_LIBS $CUDA_LIBS -pthread 2> "$LOGS/link_bench.log" || build_ok=0
  if [ $QUICK = 1 ]; then
    programs="$programs; $(echo $TORCH_UNITS | wc -w) LibTorch units preprocessed (--quick)"
  else
    $CXX -o "$BUILD/train_demo" $(o $CORE $TORCH_UNITS) \
      $DEPS_LIB $GLOG_LIBS $TORCH_LIBS $CUDA_LIBS -pthread 2> "$LOGS/link_demo.log" || build_ok=0
    programs="$programs, train_demo"
  fi
  [ $build_ok = 1 ] || cat "$LOGS"/link_*.log | head -30
fi
if [ $build_ok = 1 ]; then
  record build PASS "$(( $(date +%s) - start )) s: $programs"
else
  record build FAIL "see $LOGS"
fi
if [ $BUILD_ONLY = 1 ] || [ $build_ok = 0 ]; then
  printf '\n%s\n' "${results[@]}"; [ $build_ok = 1 ]; exit
fi

# --- Checks ---------------------------------------------------------------------
nvidia-smi -L 2>/dev/null | head -n 4
check() {  # check NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local log="$LOGS/$(echo "$name" | tr -c 'A-Za-z0-9._\n-' '_').log"
  local t0=$(date +%s)
  if timeout --kill-after=5 "$limit" "$@" > "$log" 2>&1; then
    record "$name" PASS "$(( $(date +%s) - t0 )) s"
  else
    record "$name" FAIL "exit $? after $(( $(date +%s) - t0 )) s (log: $log)"
    tail -n 15 "$log"
  fi
}
cd "$BUILD"
check "conformance world 1" 240 env ACCEL_CONFORMANCE_MAX_WORLD_SIZE=1 \
  ./nccl_conformance_test --gtest_filter='Backends/*nccl_world1'
grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$LOGS"/conformance_world_1.log
check "conformance world 2 (1 GPU)" 240 env NCCL_MULTI_RANK_GPU_ENABLE=1 \
  ACCEL_CONFORMANCE_MAX_WORLD_SIZE=2 ./nccl_conformance_test --gtest_filter='Backends/*nccl_world2'
grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$LOGS"/conformance_world_2__1_GPU_.log
check "train_demo --backend=nccl" 120 ./train_demo --backend=nccl --noprogress --output_dir="$BUILD/tm1"
grep -E 'Accuracy|Trained|fingerprint' "$LOGS"/train_demo_--backend_nccl.log
check "train_demo nccl 2 ranks (1 GPU)" 120 env NCCL_MULTI_RANK_GPU_ENABLE=1 ./train_demo \
  --backend=nccl --num_processes=2 --main_process_port=0 --noprogress --output_dir="$BUILD/tm2"
grep -E 'Accuracy|Trained|fingerprint' "$LOGS"/train_demo_nccl_2_ranks__1_GPU_.log
# ZeRO stage 2 over NCCL (reduce-scatter in backward, all-gather after the
# step): the same parameters as DDP's run above, bit for bit.
check "train_demo nccl 2 ranks ZeRO-2 (1 GPU)" 120 env NCCL_MULTI_RANK_GPU_ENABLE=1 ./train_demo \
  --backend=nccl --num_processes=2 --main_process_port=0 --zero_stage=2 --noprogress \
  --output_dir="$BUILD/tm3"
grep -E 'Accuracy|Trained|fingerprint' "$LOGS"/train_demo_nccl_2_ranks_ZeRO-2__1_GPU_.log
# ZeRO stage 3: each Linear a unit, gathered around its forward and backward
# on the GPU (storage resized in the CUDA caching allocator).
check "train_demo nccl 2 ranks ZeRO-3 (1 GPU)" 120 env NCCL_MULTI_RANK_GPU_ENABLE=1 ./train_demo \
  --backend=nccl --num_processes=2 --main_process_port=0 --zero_stage=3 --noprogress \
  --output_dir="$BUILD/tm4"
grep -E 'Accuracy|Trained|fingerprint' "$LOGS"/train_demo_nccl_2_ranks_ZeRO-3__1_GPU_.log
ddp_print=$(grep -h fingerprint "$LOGS"/train_demo_nccl_2_ranks__1_GPU_.log 2>/dev/null)
for stage in 2 3; do
  zero_print=$(grep -h fingerprint "$LOGS"/train_demo_nccl_2_ranks_ZeRO-${stage}__1_GPU_.log 2>/dev/null)
  if [ -n "$ddp_print" ] && [ "$ddp_print" = "$zero_print" ]; then
    record "ZeRO-$stage equals DDP" PASS "$zero_print"
  else
    record "ZeRO-$stage equals DDP" FAIL "DDP '$ddp_print', ZeRO-$stage '$zero_print'"
  fi
done
check "bandwidth 1 rank" 120 ./nccl_bandwidth
cat "$LOGS"/bandwidth_1_rank.log
check "bandwidth 2 ranks (1 GPU)" 180 env NCCL_MULTI_RANK_GPU_ENABLE=1 ./nccl_bandwidth \
  --num_processes=2 --main_process_port=0 --sizes=1048576,16777216,268435456
cat "$LOGS"/bandwidth_2_ranks__1_GPU_.log
printf '\n%s\n' "${results[@]}" | tee "$LOGS/summary.txt"
if [ -n "${OUT:-}" ]; then
  cp "$LOGS/summary.txt" "$OUT/" && tar czf "$OUT/gpu_check_logs.tgz" -C "$BUILD" logs
fi
