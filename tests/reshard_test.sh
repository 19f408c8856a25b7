#!/usr/bin/env bash
# A sharded checkpoint (any process count, DDP or ZeRO) resumes at any
# process count and any stage 0-3: //examples:gpt saves at step 15 of 30
# (mid-epoch) under stage 3, stage 1 or DDP, then resumes elsewhere. At every
# count all stages give the same parameters bit for bit as stage 0 (DDP, the
# reference at that count); at the saving count they are the uninterrupted
# run's. A damaged shard (truncated, or its data
# changed) fails on every rank, naming the file, before any step, and
# --resume passes over it.
set -euo pipefail
gpt=examples/gpt
# The synthetic text and a small model (with dropout, whose generator
# resumes too); no progress lines, sample or peak measurement.
markov=(--text=markov --block_size=32 --n_embd=64 --dropout=0.1
        --print_every=0 --generate=0 --peak_gflops=1)
dir="$TEST_TMPDIR/reshard"
mkdir -p "$dir"
fail() { echo "FAIL: $*" >&2; exit 1; }
run() {  # run NAME FLAGS... : prints the parameter fingerprint
  local name=$1
  shift
  local out
  out=$(timeout 300 "$gpt" "${markov[@]}" --main_process_port=0 \
        --batch_size=12 --max_steps=30 --output_dir="$dir/$name" "$@" 2>&1) ||
    fail "$name: $out"
  grep -o 'Parameter fingerprint: [0-9a-f]*' <<<"$out" | cut -d' ' -f3
}

# Each check's fingerprint at a count: reference["SAVED-STAGE-COUNT"].
declare -A reference_at
# Saved at $1 processes, stage $2; resumed at each count of $3 under each
# stage of $4 (default all four; the first is the reference).
check() {
  local saved=$1 stage=$2 counts=$3 stages=${4:-0 1 2 3}
  local source="saved$saved-$stage"
  local whole
  whole=$(run "$source" --num_processes="$saved" --zero_stage="$stage" \
          --checkpointing_steps=15)
  local checkpoint="$dir/$source/checkpoints/checkpoint_1"
  ls "$checkpoint"/rank-*-of-*.safetensors >/dev/null ||
    fail "no shard files in $checkpoint"
  for n in $counts; do
    local reference=""
    for s in $stages; do
      local got
      got=$(run "from$saved-$stage-to$n-$s" --num_processes="$n" \
            --zero_stage="$s" --resume_from="$checkpoint")
      echo "saved at $saved procs stage $stage -> $n procs stage $s: $got"
      [ -n "$reference" ] || reference=$got
      [ "$got" = "$reference" ] ||
        fail "$n processes, stage $s: $got, stage 0 gave $reference"
      if [ "$n" = "$saved" ] && [ "$got" != "$whole" ]; then
        fail "resumed at the same count: $got, uninterrupted $whole"
      fi
    done
    reference_at["$saved-$stage-$n"]=$reference
  done
}

# Every stage at every count once; the other checkpoints resume at the two
# ends, DDP (whole) and stage 3 (all sharded): 31 runs of //examples:gpt
# instead of 41.
check 2 3 "1 2 3 4"
check 4 3 "2" "0 3"
check 3 1 "2" "0 3"
# DDP (stage 0) saves sharded too: it resumes under ZeRO, at another count.
check 2 0 "2 3" "0 3"
# At another count, the stage-3 checkpoint gives what DDP's checkpoint of
# the same step gives there (DDP resumes exactly at any count).
[ "${reference_at[2-3-3]}" = "${reference_at[2-0-3]}" ] ||
  fail "at 3 processes: from stage 3 ${reference_at[2-3-3]}," \
    "from DDP ${reference_at[2-0-3]}"
# So does a one-process run: its checkpoint resumes a ZeRO job at 4.
check 1 0 "4" "0 3"

# --resume passes over a newest checkpoint that lost a shard file for the
# one before it.
rm "$dir/saved4-3/checkpoints/checkpoint_2/rank-00001-of-00004.safetensors"
out=$(timeout 120 "$gpt" "${markov[@]}" --main_process_port=0 --batch_size=12 \
      --num_processes=2 --zero_stage=3 --max_steps=30 \
      --output_dir="$dir/saved4-3" --resume 2>&1) || fail "resume: $out"
grep -q "Resumed from $dir/saved4-3/checkpoints/checkpoint_1 at step 15" \
  <<<"$out" || fail "did not fall back to checkpoint_1: $out"
grep -q "rank-00001-of-00004.safetensors" <<<"$out" ||
  fail "the skipped checkpoint's problem is not named: $out"

# Damaged data (size and header intact, so only the checksums can tell):
# --resume passes over it for the checkpoint before, and a load of it fails
# on every rank before anything changes, naming the file and the checksum.
damaged="$dir/saved3-1/checkpoints/checkpoint_2/rank-00002-of-00003.safetensors"
python3 - "$damaged" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    header = struct.unpack("<Q", f.read(8))[0]
    f.seek(8 + header + 100)
    byte = f.read(1)
    f.seek(8 + header + 100)
    f.write(bytes([byte[0] ^ 0x10]))
PY
out=$(timeout 120 "$gpt" "${markov[@]}" --main_process_port=0 --batch_size=12 \
      --num_processes=3 --zero_stage=1 --max_steps=30 \
      --output_dir="$dir/saved3-1" --resume 2>&1) || fail "resume: $out"
grep -q "Resumed from $dir/saved3-1/checkpoints/checkpoint_1 at step 15" \
  <<<"$out" || fail "did not pass over damaged data: $out"
grep -q "rank-00002-of-00003.safetensors.*checksum" <<<"$out" ||
  fail "the damaged data is not named: $out"
if out=$(timeout 120 "$gpt" "${markov[@]}" --main_process_port=0 --batch_size=12 \
         --num_processes=2 --zero_stage=3 --output_dir="$dir/damaged_data" \
         --resume_from="$dir/saved3-1/checkpoints/checkpoint_2" 2>&1); then
  fail "loaded damaged data: $out"
fi
[ "$(grep -c '^error: \[rank.*checksum' <<<"$out")" = 2 ] ||
  fail "not every rank named the checksum: $out"
grep -q "^step " <<<"$out" && fail "a step ran: $out"

# A sharded checkpoint that lost its index, loaded at another count: the
# index is named (not the new ranks' random-state files).
cp -r "$dir/saved4-3/checkpoints/checkpoint_1" "$dir/no_index"
rm "$dir/no_index/sharded_state.index.json"
if out=$(timeout 120 "$gpt" "${markov[@]}" --main_process_port=0 --batch_size=12 \
         --num_processes=3 --zero_stage=3 --output_dir="$dir/no_index_run" \
         --resume_from="$dir/no_index" 2>&1); then
  fail "loaded without an index: $out"
fi
grep -q "sharded_state.index.json': is missing" <<<"$out" ||
  fail "the missing index is not named: $out"
grep -q "random_states" <<<"$out" && fail "blamed random-state files: $out"

# A truncated shard: every rank fails before any step, naming the file.
victim="$dir/saved2-3/checkpoints/checkpoint_1/rank-00001-of-00002.safetensors"
truncate -s -8 "$victim"
if out=$(timeout 120 "$gpt" "${markov[@]}" --main_process_port=0 --batch_size=12 \
         --num_processes=3 --zero_stage=3 \
         --output_dir="$dir/damaged" \
         --resume_from="$dir/saved2-3/checkpoints/checkpoint_1" 2>&1); then
  fail "loaded a truncated shard: $out"
fi
echo "$out" | tail -3
grep -q "rank-00001-of-00002.safetensors" <<<"$out" ||
  fail "the error does not name the shard: $out"
[ "$(grep -c '^error: \[rank' <<<"$out")" = 3 ] ||
  fail "not every rank reported it: $out"
grep -q "^step " <<<"$out" && fail "a step ran: $out"
echo "PASS"
