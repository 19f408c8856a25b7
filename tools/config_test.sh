#!/usr/bin/env bash
# accel config writes the launch configuration; the launcher and programs
# read it before their command line; bad files and answers are clear errors.
set -euo pipefail
config=tools/config
launch=tools/launch
demo=examples/gather_demo
dir="$TEST_TMPDIR/config_test"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
has() { grep -qF -- "$2" <<<"$1" || fail "no '$2' in: $1"; }

# Asked on a terminal (here: --interactive with answers on stdin). A bad
# answer is asked again; an empty one keeps the default.
out=$(printf '0\n1\nthree\n2\nmpich\ngloo\nbf16\n\n5\n2\n' |
      "$config" --interactive --config_file="$dir/asked.flags")
echo "$out"
has "$out" "expected a whole number from 1 to 100000, found \"0\""
has "$out" "expected a whole number from 1 to 1000000, found \"three\""
has "$out" "expected one of auto, gloo, nccl, mpi, found \"mpich\""
has "$out" "expected a whole number from 0 to 3, found \"5\""
has "$out" "accel config: wrote $dir/asked.flags"
expected="--num_machines=1
--num_processes=2
--backend=gloo
--mixed_precision=bf16
--num_cpu_threads_per_process=1
--zero_stage=2"
[ "$(grep -v '^#' "$dir/asked.flags")" = "$expected" ] ||
  fail "asked.flags: $(cat "$dir/asked.flags")"

# The input ends before the last answer.
if printf '1\n' | "$config" --interactive --config_file="$dir/cut.flags" \
    >/dev/null 2>"$dir/err"; then fail "an ended input was accepted"; fi
has "$(cat "$dir/err")" "(the input ended)"

# From flags, without questions; other program flags given are kept.
"$config" --nointeractive --config_file="$dir/flags.flags" --num_processes=3 \
  --report_to=jsonl --reuse_host_memory=false >/dev/null
has "$(cat "$dir/flags.flags")" "--num_processes=3"
has "$(cat "$dir/flags.flags")" "--report_to=jsonl"
has "$(cat "$dir/flags.flags")" "--reuse_host_memory=false"
if "$config" --nointeractive --config_file="$dir/bad.flags" \
    --mixed_precision=fp8 2>"$dir/err"; then fail "fp8 was accepted"; fi
has "$(cat "$dir/err")" "--mixed_precision: expected one of no, bf16, fp16, found \"fp8\""
# Values programs would refuse at the next run are refused now.
for bad in "--zero_stage=9:from 0 to 3, found \"9\"" \
    "--gradient_accumulation_steps=0:from 1 to 1073741824, found \"0\"" \
    "--fsdp_sharding_strategy=BOGUS:expected one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD"; do
  if "$config" --nointeractive --config_file="$dir/bad.flags" "${bad%%:*}" \
      2>"$dir/err"; then fail "${bad%%:*} was accepted"; fi
  has "$(cat "$dir/err")" "${bad#*:}"
done
# Earlier values are the next run's defaults.
"$config" --nointeractive --config_file="$dir/flags.flags" --backend=gloo >/dev/null
has "$(cat "$dir/flags.flags")" "--num_processes=3"

# Programs read the default file ($HOME/.config/accel/...) when it exists.
export HOME="$dir/home"
unset ACCEL_CONFIG_FILE XDG_CONFIG_HOME
"$config" --nointeractive --num_processes=2 --main_process_port=0 >/dev/null
test -f "$HOME/.config/accel/default_config.flags" || fail "no default file"
has "$("$config" --show)" "$HOME/.config/accel/default_config.flags:"
out=$("$demo" 2>&1)
has "$out" "Gathered tensor: tensor([1, 2, 3, 1, 2, 3])"   # 2 processes
out=$("$demo" --num_processes=1 2>&1)                      # the command line wins
has "$out" "Gathered tensor: tensor([1, 2, 3])"
out=$("$demo" --config_file= 2>&1)                         # no configuration
has "$out" "Gathered tensor: tensor([1, 2, 3])"
# --config_file picks another; the launcher passes it on to the ranks.
printf -- '--num_processes=3\n--main_process_port=0\n' >"$dir/three.flags"
out=$("$demo" --config_file="$dir/three.flags" 2>&1)
has "$out" "tensor([1, 2, 3, 1, 2, 3, 1, 2, 3])"
out=$("$launch" --config_file="$dir/three.flags" -- "$demo" 2>&1)
has "$out" "tensor([1, 2, 3, 1, 2, 3, 1, 2, 3])"
# An accel flag that is not the launcher's reaches the ranks from the file.
printf -- '--num_processes=2\n--main_process_port=0\n--reuse_host_memory=false\n' \
  >"$dir/memory.flags"
out=$("$launch" --config_file="$dir/memory.flags" -- "$demo" --v=1 2>&1)
has "$out" "[rank 1/2] host memory: malloc left as it is (--reuse_host_memory=false)"
# --cpu (Accelerate's cpu=True) reaches the ranks; with nccl it is refused.
printf -- '--num_processes=2\n--main_process_port=0\n--cpu=true\n' >"$dir/cpu.flags"
out=$("$demo" --config_file="$dir/cpu.flags" 2>&1)
has "$out" "tensor([1, 2, 3, 1, 2, 3])"
if out=$("$demo" --config_file="$dir/cpu.flags" --backend=nccl 2>&1); then
  fail "--cpu with --backend=nccl was accepted"
fi
has "$out" "cpu (--cpu) asks to train on the CPU, but backend (--backend) is nccl"

# Bad files are errors naming the file and line.
printf -- '--num_processes=2\nnum_machines 2\n' >"$dir/broken.flags"
if out=$("$demo" --config_file="$dir/broken.flags" 2>&1); then fail "broken file accepted"; fi
has "$out" "error: $dir/broken.flags:2: expected --flag=value, found \"num_machines 2\""
printf -- '--epochs=3\n' >"$dir/foreign.flags"
if out=$("$demo" --config_file="$dir/foreign.flags" 2>&1); then fail "--epochs accepted"; fi
has "$out" "$dir/foreign.flags:1: --epochs cannot be set in a configuration file"
printf -- '--num_processes=two\n' >"$dir/value.flags"
if out=$("$demo" --config_file="$dir/value.flags" 2>&1); then fail "two accepted"; fi
has "$out" "--num_processes=two: not a valid int32 value"
# A huge one-line file or a binary one: a short message, no raw bytes.
head -c 100000000 /dev/zero | tr '\0' 'x' >"$dir/huge.flags"
if out=$("$demo" --config_file="$dir/huge.flags" 2>&1); then fail "huge accepted"; fi
has "$out" "$dir/huge.flags is 100000000 bytes; a launch configuration"
[ "${#out}" -lt 1000 ] || fail "huge file echoed: ${#out} bytes"
printf -- '--num_processes=2\n\x7fELF\x02\x01\x01\x00\x1b[31m\n' >"$dir/binary.flags"
if out=$("$demo" --config_file="$dir/binary.flags" 2>&1); then fail "binary accepted"; fi
has "$out" 'binary.flags:2: a control byte in "\x7fELF\x02\x01\x01\x00\x1b[31m"'
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' <<<"$out"; then
  fail "raw control bytes in: $out"
fi
long_line="--num_processes=$(head -c 5000 /dev/zero | tr '\0' '7')"
echo "$long_line" >"$dir/long.flags"
if out=$("$demo" --config_file="$dir/long.flags" 2>&1); then fail "long accepted"; fi
has "$out" "(the first 60 of 5016 bytes)"
if out=$("$demo" --config_file="$dir/missing.flags" 2>&1); then fail "missing accepted"; fi
has "$out" "--config_file=$dir/missing.flags: No such file or directory"
if out=$("$demo" --config_file="$dir" 2>&1); then fail "a folder accepted"; fi
has "$out" "--config_file=$dir: not a regular file (a folder)"
printf -- '--num_processes=2\0--seed=3\n' >"$dir/nul.flags"
if out=$("$demo" --config_file="$dir/nul.flags" 2>&1); then fail "NUL accepted"; fi
has "$out" "nul.flags:1: a control byte in \"--num_processes=2\\x00--seed=3\""
printf -- '\n--num_processes=2junk\n' >"$dir/junk.flags"
if out=$("$demo" --config_file="$dir/junk.flags" 2>&1); then fail "junk accepted"; fi
has "$out" "junk.flags:2: --num_processes=2junk: not a valid int32 value"
echo PASS
