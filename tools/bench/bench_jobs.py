"""What the benches that run a job under accel and under Python Accelerate
share (//tools/bench:nlp, //tools/bench:lm): finding their runfiles and the
peer's launcher, running one job with its wall time and peak memory, and
min/median/max cells.

  import bench_jobs
  launch = bench_jobs.peer_launch("lm bench", args.peer_src, args.peer_dir)
  job = bench_jobs.run_job("lm bench", argv, env, log, timeout=900)
  print(job.text, job.wall_s, job.peak_mib)
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass


def runfile(path):
    # The bench's script is <runfiles>/accel/tools/bench/<bench>.py, as its
    # sh_binary starts it (this module may be imported from the source tree,
    # where Python resolves the script's symlink to).
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    return os.path.join(os.path.dirname(os.path.dirname(here)), path)


def peer_launch(bench, peer_src, peer_dir):
    """The peer's launch.sh (../shared/peer of the workspace unless
    peer_dir says), after checking that peer_src holds Accelerate."""
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")
    launch = os.path.join(peer_dir or os.path.join(workspace, "..", "shared", "peer"),
                          "launch.sh")
    if not os.path.isfile(launch):
        sys.exit(f"{bench}: no {launch}; give --peer_dir")
    if not os.path.isdir(os.path.join(peer_src, "accelerate")):
        sys.exit(f"{bench}: no accelerate package in {peer_src}")
    return launch


def check_repetitions(bench, repetitions):
    if repetitions < 1:
        sys.exit(f"{bench}: --repetitions must be at least 1")


@dataclass
class Job:
    text: str        # Its output, stdout and stderr together.
    wall_s: float    # NaN if it hung.
    peak_mib: float  # The job's maximum RSS (GNU time); NaN if it hung.
    hung: bool


def run_job(bench, argv, env, log, timeout=None, hung_ok=None):
    """Runs argv with OMP_NUM_THREADS=1 plus env, output in `log`. A job
    still running after `timeout` seconds is killed (its process group);
    hung_ok(text) says whether what it printed still counts (a rank that
    hangs at exit, as torch 1.13's gloo group sometimes does), else the
    bench stops, as it does when the job fails."""
    environment = dict(os.environ, OMP_NUM_THREADS="1", **env)
    hung = False
    with tempfile.NamedTemporaryFile("r") as rss:
        start = os.times().elapsed
        with open(log, "w") as out:
            job = subprocess.Popen(["/usr/bin/time", "-o", rss.name, "-f", "%M"] + argv,
                                   stdout=out, stderr=subprocess.STDOUT,
                                   env=environment, start_new_session=True)
            try:
                code = job.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                code, hung = job.wait(), True
        wall = os.times().elapsed - start
        peak = rss.read().split()
    text = open(log).read()
    if (hung and not (hung_ok and hung_ok(text))) or (code != 0 and not hung):
        sys.exit(f"{bench}: {argv[0]} failed ({code}, {'hung' if hung else 'exited'});"
                 f" see {log}:\n" + text[-2000:])
    nan = float("nan")
    return Job(text=text, wall_s=nan if hung else wall,
               peak_mib=nan if hung or not peak else int(peak[-1]) / 1024.0,
               hung=hung)


def spread(values, fmt):
    """"min/median/max"; NaN values (hung runs) are left out."""
    values = [v for v in values if v == v] or [float("nan")]
    return "/".join(fmt % v for v in (min(values), statistics.median(values),
                                      max(values)))
