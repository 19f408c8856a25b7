#!/usr/bin/env bash
# Soak test (by hand, not in CI): runs train_demo many times at 2-4
# processes, kills a random rank at a random moment or in the middle of a
# save_state, then checks that the failure ended the job (no hang), that
# every complete checkpoint still loads (none lost), and that --resume
# reaches the same parameters as an uninterrupted run.
#
#   tools/soak.sh [RUNS]      (default 30)
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-30}
EPOCHS=6
bazel build -c opt //examples:train_demo >/dev/null 2>&1 || { echo "build failed"; exit 1; }
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)/examples/train_demo
WORK=$(mktemp -d /tmp/accel-soak.XXXXXX)
COMMON=(--epochs=$EPOCHS --batch_size=12 --sleep_per_step_ms=20 --noprogress
        --timeout_s=60 --main_process_port=0)

fingerprint() { grep -o 'Parameter fingerprint: [0-9a-f]*' "$1" | tail -n 1; }
children() { cat "/proc/$1/task/$1/children" 2>/dev/null; }

declare -A reference
for n in 2 3 4; do
  "$BIN" --num_processes=$n "${COMMON[@]}" --output_dir="$WORK/reference$n" > "$WORK/reference$n.log" 2>&1
  reference[$n]=$(fingerprint "$WORK/reference$n.log")
  [ -n "${reference[$n]}" ] || { echo "reference run at $n processes failed"; cat "$WORK/reference$n.log"; exit 1; }
done

clear=0; resumed=0; hung=0; lost=0; wrong=0; unclear=0
save_kills=0; random_kills=0
for run in $(seq 1 "$RUNS"); do
  n=$(( 2 + RANDOM % 3 ))
  dir="$WORK/run$run"; log="$dir.log"
  setsid "$BIN" --num_processes=$n "${COMMON[@]}" --output_dir="$dir" > "$log" 2>&1 &
  launcher=$!
  mode=$(( RANDOM % 2 ))
  if [ $mode = 0 ]; then
    # A random moment of training.
    sleep "0.$(( 2 + RANDOM % 8 ))"
  else
    # The middle of a save: a checkpoint file being written aside.
    for _ in $(seq 1 3000); do
      compgen -G "$dir/checkpoints/checkpoint_*/*.partial.*" >/dev/null && break
      sleep 0.001
    done
  fi
  ranks=($(children $launcher))
  if [ ${#ranks[@]} -gt 0 ]; then
    kill -9 "${ranks[$(( RANDOM % ${#ranks[@]} ))]}" 2>/dev/null
    if [ $mode = 0 ]; then random_kills=$((random_kills + 1)); else save_kills=$((save_kills + 1)); fi
  fi
  # The job must end by itself, long before its 60 s collective timeout.
  ended=0
  for _ in $(seq 1 300); do
    kill -0 $launcher 2>/dev/null || { ended=1; break; }
    sleep 0.1
  done
  if [ $ended = 0 ]; then
    hung=$((hung + 1)); echo "run $run: HUNG (log $log)"
    kill -9 -- -$launcher 2>/dev/null; wait $launcher 2>/dev/null; continue
  fi
  wait $launcher; code=$?
  if [ $code != 0 ] && ! grep -q "accel launch: rank [0-9]* (pid [0-9]*) was killed by signal 9" "$log"; then
    unclear=$((unclear + 1)); echo "run $run: exit $code without a clear message (log $log)"
  elif [ $code != 0 ]; then
    clear=$((clear + 1))
  fi
  # Every complete checkpoint must still load.
  for ckpt in "$dir"/checkpoints/checkpoint_*; do
    [ -e "$ckpt/accelerator_state.pt" ] || continue
    if ! "$BIN" --resume_from="$ckpt" --epochs=0 --noprogress --output_dir="$dir/check" > "$dir.check.log" 2>&1; then
      lost=$((lost + 1)); echo "run $run: checkpoint $ckpt no longer loads (log $dir.check.log)"
    fi
  done
  # Resuming must reach the uninterrupted result.
  "$BIN" --num_processes=$n "${COMMON[@]}" --resume --output_dir="$dir" > "$dir.resume.log" 2>&1
  if [ "$(fingerprint "$dir.resume.log")" = "${reference[$n]}" ]; then
    resumed=$((resumed + 1))
  else
    wrong=$((wrong + 1)); echo "run $run: resumed run differs (log $dir.resume.log)"
  fi
done

printf '\nsoak: %d runs of train_demo at 2-4 processes (%d killed at a random moment, %d during save_state)\n' \
  "$RUNS" "$random_kills" "$save_kills"
printf '%-44s %5d\n' "ended with a clear error" "$clear" \
  "finished before the kill (no failure)" "$(( RUNS - clear - hung - unclear ))" \
  "resumed to the uninterrupted result" "$resumed" \
  "hung" "$hung" \
  "lost a checkpoint" "$lost" \
  "ended without a clear message" "$unclear" \
  "resumed to a different result" "$wrong"
echo "logs: $WORK"
[ $hung = 0 ] && [ $lost = 0 ] && [ $wrong = 0 ] && [ $unclear = 0 ]
