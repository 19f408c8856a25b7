#!/usr/bin/env bash
# Soak test (by hand, not in CI): runs train_demo many times at 2-4
# processes, kills a random rank at a random moment or in the middle of a
# save_state, then checks that the failure ended the job (no hang), that
# every complete checkpoint still loads (none lost), and that --resume
# reaches the same parameters as an uninterrupted run. As root it also fills
# a small tmpfs during a save: one clear error per rank, nothing left behind,
# and --resume continues from the last checkpoint that fit.
#
#   tools/soak.sh [RUNS]      (default 30)
#
# It removes everything it wrote when it ends (the logs of failed runs stay
# in the folder it names), and leaves bazel-bin as it found it.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-30}
EPOCHS=8
# No convenience symlinks: bazel-bin keeps pointing at the fastbuild outputs.
bazel build -c opt --symlink_prefix=/ //examples:train_demo >/dev/null 2>&1 || { echo "build failed"; exit 1; }
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)/examples/train_demo
WORK=$(mktemp -d /tmp/accel-soak.XXXXXX)
FULL=$WORK/full
failed=0
cleanup() {
  mountpoint -q "$FULL" 2>/dev/null && umount "$FULL"
  if [ $failed = 0 ]; then
    rm -rf "$WORK"
  else
    # Keep the logs of what went wrong, not the checkpoints.
    find "$WORK" -mindepth 1 -not -name '*.log' -delete 2>/dev/null
    echo "logs of the failed runs: $WORK"
  fi
}
trap cleanup EXIT
# A wide hidden layer makes each save write ~30 MB, so that kills land
# inside saves.
COMMON=(--epochs=$EPOCHS --batch_size=12 --hidden=250000 --sleep_per_step_ms=20 --noprogress
        --timeout_s=60 --main_process_port=0)

fingerprint() { grep -o 'Parameter fingerprint: [0-9a-f]*' "$1" | tail -n 1; }
children() { cat "/proc/$1/task/$1/children" 2>/dev/null; }

full_disk=skipped
if [ "$(id -u)" = 0 ] && mkdir -p "$FULL" && mount -t tmpfs -o size=200k tmpfs "$FULL" 2>/dev/null; then
  # The first checkpoints fit, a later one does not.
  full=(--num_processes=2 --hidden=500 --epochs=6 --noprogress --main_process_port=0 --output_dir="$FULL/out")
  "$BIN" "${full[@]}" > "$WORK/full.log" 2>&1; code=$?
  # Rank 0 names the file and the reason; every rank ends in one error line.
  # "cannot write 'F.partial.P.N' (for 'F'): No space left on device"
  no_space=$(grep -c "^error: .*cannot write '$FULL/out/[^']*'\( (for '[^']*')\)\?: No space left on device" "$WORK/full.log")
  errors=$(grep -c "^error: " "$WORK/full.log")
  leftovers=$(find "$FULL" -name '*.partial.*' | wc -l)
  newest=$(ls -d "$FULL"/out/checkpoints/checkpoint_*/accelerator_state.pt 2>/dev/null | sort -V | tail -n 1)
  "$BIN" "${full[@]}" --resume > "$WORK/full.resume.log" 2>&1
  if [ $code = 1 ] && [ "$no_space" = 1 ] && [ "$errors" = 2 ] && [ "$leftovers" = 0 ] &&
     [ -n "$newest" ] && grep -q "Resumed from $(dirname "$newest") " "$WORK/full.resume.log" &&
     ! grep -q "terminate called" "$WORK/full.log" "$WORK/full.resume.log"; then
    full_disk=passed
  else
    full_disk=FAILED; failed=1
    echo "full disk: exit $code, $no_space 'No space left' errors (want 1), $errors error lines (want 2), $leftovers partial files left, newest complete '$newest' (log $WORK/full.log)"
  fi
  umount "$FULL"
fi

declare -A reference
for n in 2 3 4; do
  "$BIN" --num_processes=$n "${COMMON[@]}" --output_dir="$WORK/reference$n" > "$WORK/reference$n.log" 2>&1
  reference[$n]=$(fingerprint "$WORK/reference$n.log")
  [ -n "${reference[$n]}" ] || { failed=1; echo "reference run at $n processes failed"; cat "$WORK/reference$n.log"; exit 1; }
done

clear=0; resumed=0; hung=0; lost=0; wrong=0; unclear=0; torn=0
save_kills=0; random_kills=0
for run in $(seq 1 "$RUNS"); do
  n=$(( 2 + RANDOM % 3 ))
  dir="$WORK/run$run"; log="$dir.log"
  "$BIN" --num_processes=$n "${COMMON[@]}" --output_dir="$dir" > "$log" 2>&1 &
  launcher=$!
  mode=$(( RANDOM % 2 ))
  if [ $mode = 0 ]; then
    # A random moment of training, once the first epoch is done.
    for _ in $(seq 1 200); do
      [ -d "$dir/checkpoints/checkpoint_1" ] && break
      sleep 0.05
    done
    sleep "$(( RANDOM % 2 )).$(( RANDOM % 10 ))"
  else
    # Inside save_state: as soon as a new checkpoint folder appears (after a
    # random number of epochs), while its files are being written.
    target=$(( 1 + RANDOM % (EPOCHS - 1) ))
    while [ ! -d "$dir/checkpoints/checkpoint_$target" ]; do
      kill -0 $launcher 2>/dev/null || break
    done
  fi
  ranks=($(children $launcher))
  if [ ${#ranks[@]} -gt 0 ]; then
    # In a save, the main process (the first child, rank 0) writes the
    # shared files: kill it there most of the time.
    victim=$(( RANDOM % ${#ranks[@]} ))
    [ $mode = 1 ] && [ $(( RANDOM % 4 )) != 0 ] && victim=0
    kill -9 "${ranks[$victim]}" 2>/dev/null
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
    # The ranks die with the launcher (PR_SET_PDEATHSIG).
    kill -9 $launcher 2>/dev/null; wait $launcher 2>/dev/null; continue
  fi
  wait $launcher; code=$?
  # Evidence that a save was cut short: a checkpoint left incomplete.
  for ckpt in "$dir"/checkpoints/checkpoint_*; do
    [ -d "$ckpt" ] && [ ! -e "$ckpt/accelerator_state.pt" ] && { torn=$((torn + 1)); break; }
  done
  if [ $code != 0 ] && ! grep -q "accel launch: rank [0-9]* (pid [0-9]*) was killed by signal 9" "$log"; then
    unclear=$((unclear + 1)); echo "run $run: exit $code without a clear message (log $log)"
  elif [ $code != 0 ]; then
    clear=$((clear + 1))
  fi
  # Every complete checkpoint must still load.
  for ckpt in "$dir"/checkpoints/checkpoint_*; do
    [ -e "$ckpt/accelerator_state.pt" ] || continue
    if ! "$BIN" --resume_from="$ckpt" --epochs=0 --hidden=250000 --noprogress --output_dir="$dir/check" > "$dir.check.log" 2>&1; then
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

printf '\nsoak: %d runs of train_demo at 2-4 processes: %d ranks killed at a random moment, %d as a save began; %d saves left torn\n' \
  "$RUNS" "$random_kills" "$save_kills" "$torn"
printf '%-44s %5d\n' "ended with a clear error" "$clear" \
  "finished before the kill (no failure)" "$(( RUNS - clear - hung - unclear ))" \
  "resumed to the uninterrupted result" "$resumed" \
  "hung" "$hung" \
  "lost a checkpoint" "$lost" \
  "ended without a clear message" "$unclear" \
  "resumed to a different result" "$wrong"
printf '%-44s %5s\n' "full disk during a save (200 KB tmpfs)" "$full_disk"
[ $hung = 0 ] && [ $lost = 0 ] && [ $wrong = 0 ] && [ $unclear = 0 ] || failed=1
exit $failed
