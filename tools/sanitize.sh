#!/usr/bin/env bash
# The sanitizer passes of CI over the LibTorch-free runtime and backends,
# whose six kinds of thread (communicator workers, watchdogs, store server
# and client, shared-memory waiters, Gloo's loop, the launcher's relays)
# are where data races would be.
#
#   tools/sanitize.sh asan   # AddressSanitizer + UndefinedBehaviorSanitizer
#   tools/sanitize.sh tsan   # ThreadSanitizer
#
# Extra arguments go to bazel test (targets default to the runtime and
# backends). Prints the elapsed time.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: tools/sanitize.sh asan|tsan [bazel test arguments]}
shift
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(//accel/runtime/... //backends/...)
fi
case "$kind" in
  asan)
    options=(--config=asan
             --test_env=ASAN_OPTIONS=detect_stack_use_after_return=1
             --test_env=UBSAN_OPTIONS=print_stacktrace=1) ;;
  tsan)
    options=(--config=tsan
             "--test_env=TSAN_OPTIONS=halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tools/sanitizers/tsan.supp") ;;
  *) echo "tools/sanitize.sh: unknown kind '$kind' (asan or tsan)" >&2; exit 2 ;;
esac
start=$(date +%s)
status=0
bazel test "${options[@]}" "${targets[@]}" || status=$?
echo "tools/sanitize.sh $kind: $(( $(date +%s) - start )) s, exit $status"
exit $status
