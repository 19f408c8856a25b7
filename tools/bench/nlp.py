#!/usr/bin/python3
"""nlp_example against the same job in Python Accelerate.

  bazel run //tools/bench:nlp -- --peer_src=/path/to/accelerate-0.20.3/src \\
      [--counts=1,2] [--repetitions=3] [--plot=curves.png]

Both train on the same tokens (nlp_example's tokens.pt, made once), with
the same model, batch, optimizer, schedule, seed and one thread per process
(OMP_NUM_THREADS=1), in float32; runs alternate. accel runs twice: as the
example does by default (--invariant_micro_batches=4: four micro-batches
per global batch, the same bits at 1, 2 and 4 processes) and as Python
Accelerate sums (--invariant_micro_batches=0: one backward per process and
batch, DDP's allreduce): the latter is the same arithmetic as Python's. Per process
count: training samples/s (each program's own clock over its training
loops), wall time, the peak resident memory of the largest process
(GNU time's maximum RSS of the job, which counts the ranks it waited for),
and the last epoch's accuracy and F1; min/median/max over the repetitions
and accel/Python ratios of the runs paired by repetition. --plot draws the
last repetition's learning curves from both runs' metrics.jsonl with
tools/plot_metrics.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import bench_jobs
from bench_jobs import runfile, spread

EPOCH = re.compile(r"epoch (\d+): \{'accuracy': ([0-9.]+), 'f1': ([0-9.]+)")
TRAINED = re.compile(r"trained on (\d+) samples in ([0-9.]+) s: ([0-9.]+) samples/s")


def measure(argv, env, log):
    """Wall seconds, peak RSS (MiB) and the figures of one job."""
    job = bench_jobs.run_job("nlp bench", argv, env, log)
    epochs = EPOCH.findall(job.text)
    trained = TRAINED.search(job.text)
    if not epochs or not trained:
        sys.exit(f"nlp bench: no metrics in {log}:\n" + job.text[-2000:])
    return {"wall_s": job.wall_s, "peak_mib": job.peak_mib,
            "samples_per_s": float(trained.group(3)),
            "accuracy": float(epochs[-1][1]), "f1": float(epochs[-1][2])}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--peer_src", required=True,
                        help="folder holding Python Accelerate's accelerate package")
    parser.add_argument("--peer_dir", default="",
                        help="folder of launch.sh (default: ../shared/peer of the workspace)")
    parser.add_argument("--counts", default="1,2")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--plot", default="", help="PNG of the learning curves")
    parser.add_argument("--scratch", default="")
    args = parser.parse_args()
    bench_jobs.check_repetitions("nlp bench", args.repetitions)
    counts = [int(c) for c in args.counts.split(",")]
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")
    launch = bench_jobs.peer_launch("nlp bench", args.peer_src, args.peer_dir)
    example = runfile("examples/nlp_example")
    peer = runfile("tools/bench/accelerate_nlp.py")
    scratch = args.scratch or tempfile.mkdtemp(prefix="accel-nlp-bench-")
    print(f"scratch: {scratch}; load before: {os.getloadavg()[0]:.2f}")

    # The tokens, once (--epochs=0 tokenizes and stops).
    tokens_dir = os.path.join(scratch, "tokens")
    run = subprocess.run([example, "--epochs=0", "--output_dir=" + tokens_dir,
                          "--main_process_port=0"], capture_output=True, text=True)
    tokens = os.path.join(tokens_dir, "tokens.pt")
    if run.returncode != 0 or not os.path.isfile(tokens):
        sys.exit("nlp bench: nlp_example did not tokenize:\n" + run.stdout + run.stderr)

    # Who runs, and the flags that make accel's two configurations.
    runners = {"accel": ["--invariant_micro_batches=4"],
               "accel_ddp": ["--invariant_micro_batches=0"], "python": None}
    names = list(runners)
    results = {n: {who: [] for who in names} for n in counts}
    port = 29800
    last = {}
    for n in counts:
        for i in range(args.repetitions):
            # A different order each repetition: none always runs first.
            for who in names[i % 3:] + names[:i % 3]:
                out = os.path.join(scratch, f"{who}_{n}_{i}")
                os.makedirs(out)
                if runners[who] is not None:
                    shutil.copy(tokens, out)  # Not tokenizing again.
                    argv = [example, f"--num_processes={n}", "--output_dir=" + out,
                            "--main_process_port=0", "--report_to=jsonl",
                            f"--epochs={args.epochs}"] + runners[who]
                    env = {}
                else:
                    port += 1
                    argv = ["/bin/bash", launch, str(n), str(port), peer,
                            "--tokens=" + tokens, "--output_dir=" + out,
                            f"--epochs={args.epochs}"]
                    env = {"PEER_SRC": args.peer_src}
                results[n][who].append(measure(argv, env, out + ".log"))
                last[who] = out
    print(f"load after: {os.getloadavg()[0]:.2f}")

    print(f"\nnlp_example, {args.epochs} epochs, min/median/max over "
          f"{args.repetitions} runs; ratios: accel / Python, runs paired by "
          f"repetition.\naccel: the example's default, --invariant_micro_batches=4; "
          f"accel DDP sums: --invariant_micro_batches=0")
    header = ("processes", "figure", "accel", "accel DDP sums",
              "Python Accelerate", "ratio", "ratio DDP sums")
    row = "%-10s %-13s %-22s %-22s %-22s %-15s %s"
    print(row % header)
    for n in counts:
        for key, name, fmt in (("samples_per_s", "samples/s", "%.1f"),
                               ("wall_s", "wall s", "%.2f"),
                               ("peak_mib", "peak RSS MiB", "%.0f"),
                               ("accuracy", "accuracy", "%.4f"),
                               ("f1", "F1", "%.4f")):
            values = {who: [r[key] for r in results[n][who]] for who in names}
            python = values["python"]

            def ratio(who):
                if not all(python):
                    return "n/a"
                return spread([x / y for x, y in zip(values[who], python)], "%.2f")

            print(row % (n, name, spread(values["accel"], fmt),
                         spread(values["accel_ddp"], fmt), spread(python, fmt),
                         ratio("accel"), ratio("accel_ddp")))
    if args.plot:
        plot = runfile("tools/plot_metrics.py")
        subprocess.check_call(["/usr/bin/python3", plot,
                               os.path.join(last["accel"], "nlp_example"),
                               os.path.join(last["accel_ddp"], "nlp_example"),
                               os.path.join(last["python"], "python_accelerate"),
                               "--metrics=loss,accuracy,f1",
                               "-o", os.path.join(workspace, args.plot)])
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
