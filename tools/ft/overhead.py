#!/usr/bin/env python3
"""Throughput of examples/ft_train with and without --fault_tolerance.

    tools/ft/overhead.py --repetitions=5 -- --model=gpt --steps=300

Runs the same job (N processes under tools/launch) alternately with the
mode (a quorum per step through the store) and without it (one
communicator over every rank), and prints steps/s as min/median/max for
each and the ratio of the medians, with the CPU's name.
"""
import argparse
import re
import statistics
import subprocess
import sys

RATE = re.compile(r"\(([\d.]+) steps/s\)")


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run(args, fault_tolerance):
    command = [f"{args.bin}/tools/launch", f"--num_processes={args.processes}",
               "--main_process_port=0"]
    if fault_tolerance:
        command.append("--fault_tolerance")
    command += ["--", f"{args.bin}/examples/ft_train",
                f"--fault_tolerance={'true' if fault_tolerance else 'false'}"]
    out = subprocess.run(command + args.train_flags, capture_output=True, text=True)
    rates = RATE.findall(out.stdout)
    if out.returncode != 0 or not rates:
        sys.exit("failed: " + " ".join(command) + "\n" + out.stdout + out.stderr)
    return float(rates[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--bin", default="bazel-bin")
    parser.add_argument("train_flags", nargs="*")
    args = parser.parse_args()
    results = {False: [], True: []}
    for _ in range(args.repetitions):
        for mode in (False, True):
            results[mode].append(run(args, mode))
    print(f"{cpu_name()}, {args.processes} processes, ft_train "
          f"{' '.join(args.train_flags)}, {args.repetitions} runs each (steps/s)")
    print("| mode | min | median | max |")
    print("|---|---|---|---|")
    for mode, name in ((False, "plain data parallel"), (True, "--fault_tolerance")):
        values = results[mode]
        print(f"| {name} | {min(values):.1f} | {statistics.median(values):.1f} | "
              f"{max(values):.1f} |")
    ratio = statistics.median(results[True]) / statistics.median(results[False])
    print(f"median with the mode / without: {ratio:.3f}")


if __name__ == "__main__":
    main()
