#!/usr/bin/env bash
# accel config writes the launch configuration; the launcher and programs
# read it before their command line; bad files and answers are clear errors.
set -euo pipefail
config=tools/config
launch=tools/launch
demo=examples/gather_demo
train=examples/train_demo
dir="$TEST_TMPDIR/config_test"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
has() { grep -qF -- "$2" <<<"$1" || fail "no '$2' in: $1"; }

# Asked on a terminal (here: --interactive with answers on stdin). A bad
# answer is asked again; an empty one keeps the default.
out=$(printf '0\n1\nthree\n2\nmpich\ngloo\nbf16\n\n5\n2\n' |
      "$config" --interactive --config_file="$dir/asked.flags")
echo "$out"
has "$out" "expected a whole number from 1 to 1048576, found \"0\""
has "$out" "expected a whole number from 1 to 1048576, found \"three\""
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
# Today's flag file at the old default place is still read...
mkdir -p "$HOME/.config/accel"
printf -- '--num_processes=3\n--main_process_port=0\n' \
  >"$HOME/.config/accel/default_config.flags"
has "$("$demo" 2>&1)" "tensor([1, 2, 3, 1, 2, 3, 1, 2, 3])"
# ... until accel config writes Accelerate's YAML beside it, which wins.
"$config" --nointeractive --num_processes=2 --main_process_port=0 >/dev/null
test -f "$HOME/.config/accel/default_config.yaml" || fail "no default file"
has "$("$config" --show)" "$HOME/.config/accel/default_config.yaml:"
has "$(cat "$HOME/.config/accel/default_config.yaml")" "distributed_type: MULTI_GPU"
has "$(cat "$HOME/.config/accel/default_config.yaml")" "num_processes: 2"
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

# Accelerate's YAML (as `accelerate config` writes it on a CPU machine): the
# keys that apply set accel's flags; the ones Accelerate writes switched off
# are quiet; unknown keys and ones that do not apply are warnings naming them.
cat >"$dir/cpu.yaml" <<'YAML'
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
main_process_ip: null
main_process_port: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
use_cpu: true
mixed_precission: bf16
ipex_config:
  ipex: false
YAML
out=$("$demo" --config_file="$dir/cpu.yaml" 2>&1)
has "$out" "tensor([1, 2, 3, 1, 2, 3])"
has "$out" "accel: warning: $dir/cpu.yaml: unknown key mixed_precission (line 15) ignored (a misspelling?)"
[ "$(grep -c "accel: warning" <<<"$out")" = 1 ] || fail "warnings not once: $out"
out=$("$config" --show --config_file="$dir/cpu.yaml" 2>&1)
has "$out" "--num_processes=2"
has "$out" "--cpu=true"
printf 'distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_offload_params: true\ndowncast_bf16: yes\n' \
  >"$dir/fsdp.yaml"
out=$("$config" --show --config_file="$dir/fsdp.yaml" 2>&1)
has "$out" "--use_fsdp=true"
has "$out" "--fsdp_sharding_strategy=SHARD_GRAD_OP"
has "$out" "Accelerate's fsdp_config.fsdp_offload_params (line 5), downcast_bf16 (line 6) do not apply to accel and are ignored"
# Accelerate's examples/torch_native_parallelism/configs/tp_hsdp.yaml: its
# parallelism_config section is the mesh's flags (and the switch).
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_version: 2\nmixed_precision: bf16\nnum_processes: 8\nparallelism_config:\n  parallelism_config_cp_size: 1\n  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n  parallelism_config_tp_size: 2\n  parallelism_config_cp_comm_strategy: allgather\n' \
  >"$dir/tp_hsdp.yaml"
out=$("$config" --show --config_file="$dir/tp_hsdp.yaml" 2>&1)
for flag in --use_parallelism_config=true --parallelism_config_dp_replicate_size=2 \
    --parallelism_config_dp_shard_size=2 --parallelism_config_tp_size=2 \
    --parallelism_config_cp_size=1 --num_processes=8; do
  has "$out" "$flag"
done
has "$out" "parallelism_config.parallelism_config_cp_comm_strategy (line 12)"
# A misspelled size is an unknown key, not one of Accelerate's.
printf 'parallelism_config:\n  parallelism_config_dp_shard_sise: 2\n' >"$dir/typo.yaml"
has "$("$config" --show --config_file="$dir/typo.yaml" 2>&1)" "unknown key parallelism_config.parallelism_config_dp_shard_sise (line 2) ignored (a misspelling?)"
# FSDP's hybrid strategies are read (sharded within each machine).
printf 'distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n' >"$dir/hybrid.yaml"
has "$("$config" --show --config_file="$dir/hybrid.yaml" 2>&1)" "--fsdp_sharding_strategy=HYBRID_SHARD_ZERO2"
# Written back as Accelerate's section.
"$config" --nointeractive --config_file="$dir/mesh.yaml" --num_processes=4 \
  --parallelism_config_dp_shard_size=2 --parallelism_config_tp_size=2 >/dev/null
has "$(cat "$dir/mesh.yaml")" "parallelism_config:
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2"
out=$("$config" --show --config_file="$dir/mesh.yaml" 2>&1)
has "$out" "--parallelism_config_tp_size=2"
# A value of the wrong type or outside its choices: file, line and key.
for bad in "num_processes: two|bad.yaml:1: num_processes: expected a whole number, found \"two\"" \
    "use_cpu: maybe|bad.yaml:1: use_cpu: expected true or false, found \"maybe\"" \
    "distributed_type: TPU|bad.yaml:1: distributed_type: expected one of NO, MULTI_CPU, MULTI_GPU, FSDP, DEEPSPEED, found \"TPU\"" \
    "mixed_precision: fp8|bad.yaml:1: mixed_precision: expected one of no, fp16, bf16, found \"fp8\" (accel has no fp8)" \
    "num_machines: 1\nfsdp_config: 3|bad.yaml:2: fsdp_config: expected a map, found a value" \
    "num_machines: 1\nnum_processes: [2|bad.yaml:3: not YAML" \
    "distributed_type: \"NO\"\nnum_processes: 2|bad.yaml:1: distributed_type NO runs one process, but num_processes is 2" \
    "distributed_type: DEEPSPEED|distributed_type DEEPSPEED needs deepspeed_config.zero_stage" \
    "num_processes: 0|bad.yaml:1: num_processes: expected 1 to 1048576, found 0" \
    "num_processes: 2147483647|bad.yaml:1: num_processes: expected 1 to 1048576, found 2147483647" \
    "num_processes: 010|bad.yaml:1: num_processes: \"010\" has a leading 0" \
    "main_process_port: 70000|bad.yaml:1: main_process_port: expected 0 to 65535, found 70000" \
    "num_machines: 2\nnum_processes: 3|bad.yaml:2: num_processes (3) must be a multiple of num_machines (2, line 1)" \
    "num_machines: 2\nmachine_rank: 5|bad.yaml:2: machine_rank (5) must be below num_machines (2)" \
    "backend: carrier_pigeon|bad.yaml:1: backend: expected one of auto, gloo, nccl, mpi, found \"carrier_pigeon\"" \
    "fsdp_config:\n  fsdp_sharding_strategy: HALF_SHARD|bad.yaml:2: fsdp_config.fsdp_sharding_strategy: expected one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, 1, 2, 3, 4, 5, found \"HALF_SHARD\"" \
    "num_processes: 2\n---\nnum_processes: 3|bad.yaml:3: a second YAML document" \
    "parallelism_config:\n  parallelism_config_tp_size: 0|bad.yaml:2: parallelism_config.parallelism_config_tp_size: expected 1 to 1048576, found 0" \
    "parallelism_config: 2|bad.yaml:1: parallelism_config: expected a map, found a value" \
    "base: &b\n  num_processes: 2\n<<: *b|bad.yaml:3: a YAML merge key (<<)" \
    "gradient_accumulation_steps: 2\ndeepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 4|bad.yaml:4: deepspeed_config.gradient_accumulation_steps is 4, but line 1 says 2" \
    "main_process_ip: $(printf 'a%.0s' $(seq 300))|bad.yaml:1: main_process_ip: expected a host name or address (1 to 253 characters)"; do
  printf "${bad%%|*}\n" >"$dir/bad.yaml"
  if out=$("$demo" --config_file="$dir/bad.yaml" 2>&1); then fail "accepted: ${bad%%|*}"; fi
  has "$out" "${bad#*|}"
done
# Accelerate's off values are quiet (accelerate config writes them), and
# MULTI_CPU means the CPU whatever use_cpu says, in either order.
printf 'use_cpu: false\ndistributed_type: MULTI_CPU\nfsdp_config:\n  fsdp_offload_params: false\ndeepspeed_config:\n  zero_stage: 0\n  offload_param_device: none\n' \
  >"$dir/off.yaml"
out=$("$config" --show --config_file="$dir/off.yaml" 2>&1)
has "$out" "--cpu=true"
if grep -q "warning" <<<"$out"; then fail "off values warned: $out"; fi
# A bad ACCEL_CONFIG_FILE (a FIFO would block the reader) is named.
mkfifo "$dir/fifo.yaml"
if out=$(ACCEL_CONFIG_FILE="$dir/fifo.yaml" timeout 20 "$demo" 2>&1); then
  fail "FIFO accepted"
fi
has "$out" "ACCEL_CONFIG_FILE=$dir/fifo.yaml: not a regular file (a FIFO)"
# The launcher starts at most 4096 processes per machine.
if out=$("$demo" --num_processes=5000 --main_process_port=0 2>&1); then
  fail "5000 processes accepted"
fi
has "$out" "accel starts at most 4096 per machine"
# A launch configuration's num_processes gives way to the launcher's count.
printf 'num_processes: 3\n' >"$dir/three.yaml"
out=$("$launch" --num_processes=2 --main_process_port=0 -- "$demo" \
  --config_file="$dir/three.yaml" 2>&1) || fail "config count refused: $out"
has "$out" "num_processes=3 (the launch configuration $dir/three.yaml) is left aside"
has "$out" "tensor([1, 2, 3, 1, 2, 3])"

# Accelerate's deepspeed.yaml template: the stage from its DeepSpeed JSON,
# found beside the YAML file.
printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: false\nnum_processes: 2\n' \
  >"$dir/deepspeed.yaml"
printf '{"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 3}\n' >"$dir/ds.json"
out=$(config_path=$(realpath "$config") && cd / && "$config_path" --show --config_file="$dir/deepspeed.yaml" 2>&1)
for flag in --zero_stage=2 --gradient_accumulation_steps=3 --num_processes=2; do
  has "$out" "$flag"
done
printf '{"zero_optimization": {}}\n' >"$dir/ds.json"
if out=$("$config" --show --config_file="$dir/deepspeed.yaml" 2>&1); then
  fail "JSON without a stage accepted"
fi
has "$out" "deepspeed.yaml:3: deepspeed_config.deepspeed_config_file: $dir/ds.json has no zero_optimization.stage (0 to 3, or \"auto\""

# The rest of a DeepSpeed JSON (Accelerate's deepspeed.yaml template): its
# precision and clipping apply; DeepSpeed's own keys are one warning naming
# them; "auto" and off values are quiet.
cat >"$dir/ds.json" <<'JSON'
{"zero_optimization": {"stage": 2, "overlap_comm": true,
                       "offload_optimizer": {"device": "none"}},
 "fp16": {"enabled": true, "loss_scale": 0},
 "bf16": {"enabled": false},
 "gradient_clipping": 1.0,
 "gradient_accumulation_steps": "auto",
 "train_micro_batch_size_per_gpu": "auto",
 "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
 "scheduler": {"type": "WarmupLR"},
 "wall_clock_breakdown": false}
JSON
out=$("$config" --show --config_file="$dir/deepspeed.yaml" 2>&1)
for flag in --zero_stage=2 --mixed_precision=fp16 --gradient_clipping=1.0; do
  has "$out" "$flag"
done
if grep -q -- "--gradient_accumulation_steps" <<<"$out"; then
  fail "\"auto\" accumulation set a value: $out"
fi
has "$out" "ds.json: DeepSpeed's fp16.loss_scale, optimizer, scheduler, zero_optimization.overlap_comm do not apply to accel and are ignored"
# Configuring again from such a file writes the JSON's settings out: said,
# since the reference to the JSON (its optimizer, for Accelerate) is gone.
cp "$dir/deepspeed.yaml" "$dir/rerun.yaml"
out=$("$config" --nointeractive --config_file="$dir/rerun.yaml" --num_processes=2 2>&1) ||
  fail "configuring again failed: $out"
has "$out" "the settings taken from $dir/ds.json are written out here, and the new file no longer names it as deepspeed_config_file"
printf '{"zero_optimization": {"stage": 1}, "fp16": {"enabled": true}, "bf16": {"enabled": true}}\n' >"$dir/ds.json"
if out=$("$config" --show --config_file="$dir/deepspeed.yaml" 2>&1); then
  fail "fp16 and bf16 both accepted"
fi
has "$out" "enables both fp16 and bf16"
printf 'mixed_precision: bf16\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n' >"$dir/ds_bf16.yaml"
printf '{"zero_optimization": {"stage": 1}, "fp16": {"enabled": true}}\n' >"$dir/ds.json"
if out=$("$config" --show --config_file="$dir/ds_bf16.yaml" 2>&1); then
  fail "bf16 beside the JSON's fp16 accepted"
fi
has "$out" "ds_bf16.yaml:1: mixed_precision is bf16, but $dir/ds.json enables fp16: give one"
# "stage": "auto" takes deepspeed_config.zero_stage (as Accelerate fills
# it in); a stage of another type is named, quoted.
printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 1\n' >"$dir/ds_auto.yaml"
printf '{"zero_optimization": {"stage": "auto"}}\n' >"$dir/ds.json"
out=$("$config" --show --config_file="$dir/ds_auto.yaml" 2>&1) || fail "auto stage: $out"
has "$out" "--zero_stage=1"
printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n' >"$dir/ds_auto2.yaml"
out=$("$config" --show --config_file="$dir/ds_auto2.yaml" 2>&1) || fail "auto stage alone: $out"
has "$out" "--zero_stage=2"  # Accelerate's DeepSpeed plugin's default.
printf '{"zero_optimization": {"stage": "2"}}\n' >"$dir/ds.json"
if out=$("$config" --show --config_file="$dir/ds_auto.yaml" 2>&1); then
  fail "a stage of text accepted"
fi
has "$out" 'zero_optimization.stage: expected 0 to 3 or "auto", found "\"2\""'
# What is at the JSON's path, when it is not a file, is said (a FIFO would
# block the reader: it is refused before it is opened).
mkdir -p "$dir/dsdir"
mkfifo "$dir/dsfifo"
for what in "dsdir|a folder" "dsfifo|a FIFO"; do
  printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: %s\n' "${what%%|*}" >"$dir/ds_odd.yaml"
  if out=$(timeout 20 "$config" --show --config_file="$dir/ds_odd.yaml" 2>&1); then
    fail "${what%%|*} accepted"
  fi
  has "$out" "is not a regular file (${what#*|})"
done
# A JSON of 1.5 GB (sparse: no disk) is refused before a byte is read.
truncate -s 1500M "$dir/huge.json"
printf 'distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: huge.json\n' >"$dir/huge.yaml"
start=$(date +%s%N)
if out=$( (ulimit -v 1000000; "$config" --show --config_file="$dir/huge.yaml") 2>&1); then
  fail "a 1.5 GB JSON was accepted"
fi
has "$out" "1572864000 bytes, more than the 1048576"
ms=$((($(date +%s%N) - start) / 1000000))
((ms < 5000)) || fail "the 1.5 GB JSON took $ms ms to refuse"
rm -f "$dir/huge.json"

# YAML aliases that name 10^10 values (942 bytes: 10 levels of 10 keys,
# each an alias of the level below) under keys accel looks into: read in
# bounded time, the key named as ignored.
{
  echo 'a0: &a0 {k: false}'
  for level in 1 2 3 4 5 6 7 8 9; do
    printf 'a%d: &a%d {' "$level" "$level"
    for key in 0 1 2 3 4 5 6 7 8; do printf 'k%d: *a%d, ' "$key" $((level - 1)); done
    printf 'k9: *a%d}\n' $((level - 1))
  done
  echo 'ipex_config: *a9'
  echo 'fsdp_config: *a9'
  echo 'num_processes: 2'
} >"$dir/bomb.yaml"
start=$(date +%s%N)
out=$(timeout 60 "$config" --show --config_file="$dir/bomb.yaml" 2>&1) ||
  fail "the alias bomb: $out"
ms=$((($(date +%s%N) - start) / 1000000))
((ms < 5000)) || fail "the alias bomb took $ms ms"
has "$out" "--num_processes=2"
has "$out" "ipex_config (line 11)"
echo "alias bomb read in $ms ms"

# Escapes that decode to control bytes, and raw bytes that are not UTF-8,
# never reach the terminal: the file and line are named instead.
printf 'main_process_ip: "\\e[31mRED\\e[0m\\nfake line: all good"\n' >"$dir/escape.yaml"
if out=$("$config" --show --config_file="$dir/escape.yaml" 2>&1); then
  fail "escapes accepted: $out"
fi
has "$out" 'escape.yaml:1: main_process_ip: "\x1b[31mRED\x1b[0m\x0afake line: all good" holds a control character'
if grep -q $'\e' <<<"$out"; then fail "an escape reached the output"; fi
printf 'report_to: "jsonl\xff\xfe"\n' >"$dir/latin.yaml"
if out=$("$config" --show --config_file="$dir/latin.yaml" 2>&1); then
  fail "non-UTF-8 accepted: $out"
fi
has "$out" "latin.yaml:1: bytes that are not UTF-8"
printf 'report_to: "json\\u00ff\\x01"\n' >"$dir/escaped.yaml"
if out=$("$config" --show --config_file="$dir/escaped.yaml" 2>&1); then
  fail "a decoded control byte accepted: $out"
fi
has "$out" "escaped.yaml:1: report_to:"

# accel config --use_fsdp writes a file that launches (no zero_stage 0
# beside FSDP), and rewriting a file keeps what it does not ask about.
"$config" --nointeractive --config_file="$dir/fsdp_written.yaml" \
  --num_processes=2 --use_fsdp --backend=gloo >/dev/null
if grep -q zero_stage "$dir/fsdp_written.yaml"; then
  fail "zero_stage beside FSDP: $(cat "$dir/fsdp_written.yaml")"
fi
out=$("$demo" --config_file="$dir/fsdp_written.yaml" --main_process_port=0 2>&1) ||
  fail "written FSDP file refused: $out"
"$config" --nointeractive --config_file="$dir/cpu_written.yaml" \
  --num_processes=2 --cpu --timeout_s=77 >/dev/null
"$config" --nointeractive --config_file="$dir/cpu_written.yaml" \
  --num_processes=4 >/dev/null
out=$("$config" --show --config_file="$dir/cpu_written.yaml" 2>&1)
for flag in --num_processes=4 --cpu=true --timeout_s=77; do has "$out" "$flag"; done
has "$(cat "$dir/cpu_written.yaml")" "distributed_type: MULTI_CPU"
# The first YAML written where a flag file was starts from its values.
mkdir -p "$dir/xdg/accel"
printf -- '--num_processes=2\n--cpu\n--timeout_s=77\n' \
  >"$dir/xdg/accel/default_config.flags"
XDG_CONFIG_HOME="$dir/xdg" "$config" --nointeractive --mixed_precision=bf16 \
  >/dev/null
out=$(XDG_CONFIG_HOME="$dir/xdg" "$config" --show=true 2>&1)
for flag in default_config.yaml --num_processes=2 --cpu=true --timeout_s=77 \
    --mixed_precision=bf16; do
  has "$out" "$flag"
done
# accel config writes YAML that reads back as the same flags.
"$config" --nointeractive --config_file="$dir/written.yaml" --num_processes=3 \
  --backend=gloo --mixed_precision=bf16 --report_to=jsonl >/dev/null
has "$(cat "$dir/written.yaml")" "distributed_type: MULTI_GPU"
has "$(cat "$dir/written.yaml")" "# accel: --backend=gloo"
"$config" --nointeractive --config_file="$dir/one.yaml" >/dev/null
has "$(cat "$dir/one.yaml")" "distributed_type: 'NO'"
if grep -qE "^(backend|zero_stage|num_cpu_threads_per_process):" "$dir/one.yaml"; then
  fail "accel's defaults written: $(cat "$dir/one.yaml")"
fi
has "$(cat "$dir/written.yaml")" "mixed_precision: 'bf16'"
out=$("$config" --show --config_file="$dir/written.yaml" 2>&1)
for flag in --num_processes=3 --backend=gloo --mixed_precision=bf16 \
    --report_to=jsonl --cpu=false; do
  has "$out" "$flag"
done
# Accelerate's own loader reads what accel config writes: it refuses any
# top-level key but its ClusterConfig's ("ValueError: unknown keys" for
# zero_stage, gradient_accumulation_steps, num_cpu_threads_per_process).
# A ZeRO stage is DeepSpeed's, accumulation under deepspeed_config, accel's
# own flags in "# accel:" lines; each reads back as given.
"$config" --nointeractive --config_file="$dir/both.yaml" --num_processes=2 \
  --zero_stage=2 --gradient_accumulation_steps=4 --gradient_clipping=1.5 \
  --num_cpu_threads_per_process=2 --backend=gloo --timeout_s=77 \
  --nocollective_checks --fsdp_transformer_layer_cls_to_wrap=Block >/dev/null
accelerate_keys='compute_environment distributed_type mixed_precision use_cpu
  debug num_processes machine_rank num_machines gpu_ids main_process_ip
  main_process_port rdzv_backend same_network main_training_function
  enable_cpu_affinity fp8_config deepspeed_config fsdp_config
  parallelism_config megatron_lm_config mpirun_config downcast_bf16 tpu_name
  tpu_zone tpu_use_cluster tpu_use_sudo command_file commands tpu_vm tpu_env
  dynamo_config ipex_config'
unknown=$(/usr/bin/python3 -c '
import sys, yaml
keys = set(yaml.safe_load(open(sys.argv[1])))
print(" ".join(sorted(keys - set(sys.argv[2].split()))))
' "$dir/both.yaml" "$accelerate_keys")
[ -z "$unknown" ] || fail "keys Accelerate refuses: $unknown in $(cat "$dir/both.yaml")"
has "$(cat "$dir/both.yaml")" "distributed_type: DEEPSPEED"
out=$("$config" --show --config_file="$dir/both.yaml" 2>&1)
for flag in --num_processes=2 --zero_stage=2 --gradient_accumulation_steps=4 \
    --gradient_clipping=1.5 --num_cpu_threads_per_process=2 --backend=gloo \
    --timeout_s=77 --collective_checks=false \
    --fsdp_transformer_layer_cls_to_wrap=Block; do
  has "$out" "$flag"
done
printf 'distributed_type: MULTI_CPU\n# accel: --no_such_flag=1\n' >"$dir/comment.yaml"
if out=$("$config" --show --config_file="$dir/comment.yaml" 2>&1); then
  fail "an unknown flag in an accel line was accepted"
fi
has "$out" 'comment.yaml:2: expected "# accel: --flag=value" with one of accel'"'"'s flags'
printf 'distributed_type: MULTI_CPU\n# accel: --timout_s=5\n' >"$dir/comment.yaml"
if out=$("$config" --show --config_file="$dir/comment.yaml" 2>&1); then
  fail "a misspelt flag in an accel line was accepted"
fi
has "$out" "(did you mean --timeout_s?)"
# Without a ZeRO stage Accelerate reads no deepspeed_config: accumulation
# and clipping are then accel's own lines; a number is written as one.
"$config" --nointeractive --config_file="$dir/ddp.yaml" --num_processes=2 \
  --gradient_accumulation_steps=4 --gradient_clipping=1.5 >/dev/null
if grep -q deepspeed_config "$dir/ddp.yaml"; then
  fail "deepspeed_config outside DEEPSPEED: $(cat "$dir/ddp.yaml")"
fi
has "$(cat "$dir/ddp.yaml")" "# accel: --gradient_accumulation_steps=4"
has "$(cat "$dir/both.yaml")" "gradient_clipping: 1.5"

# Accelerate's templates (examples/config_yaml_templates) launch train_demo:
# single_accelerator.yaml on one CPU process ...
printf 'distributed_type: "NO"\nmixed_precision: "bf16"\n' >"$dir/single.yaml"
out=$("$train" --config_file="$dir/single.yaml" --noprogress --output_dir="$dir/single" 2>&1)
has "$out" "on 1 process(es)"
# ... and multi_node.yaml's two machines (here both on this one, with the
# address, port and second machine's rank from the command line; 8 processes).
cat >"$dir/multi_node.yaml" <<'YAML'
distributed_type: MULTI_GPU
machine_rank: 0
main_process_ip: '1234'
main_process_port: 9999
num_machines: 2
num_processes: 8
rdzv_backend: static
same_network: false
YAML
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export ACCEL_RUN_SECRET=config-test-$$
machine() {
  timeout 120 "$train" --config_file="$dir/multi_node.yaml" --machine_rank="$1" \
    --main_process_ip=127.0.0.1 --main_process_port="$port" --noprogress \
    --output_dir="$dir/multi" >"$dir/machine_$1.log" 2>&1
}
machine 0 & first=$!
machine 1 || fail "machine 1: $(tail -n 20 "$dir/machine_1.log")"
wait "$first" || fail "machine 0: $(tail -n 20 "$dir/machine_0.log")"
has "$(cat "$dir/machine_0.log")" "on 8 process(es) (gloo)"
echo PASS
