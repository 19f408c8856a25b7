#!/usr/bin/python3
"""plot_metrics: a PNG of a run's curves from its tracker's files.

  bazel run //tools:plot_metrics -- trained_model/train_demo/metrics.jsonl
  bazel run //tools:plot_metrics -- RUN_DIR [RUN_DIR ...] -o curves.png \\
      --metrics=loss,accuracy --smoothing=0.8

One panel per metric, each run a colour: loss, accuracy, learning rate and
samples/s first (when logged), then every other number the run logged.
Noisy curves (loss, accuracy, samples/s; 20 points or more) are drawn
faint with an exponential moving average on top, as TensorBoard does
(--smoothing, 0 for none). A step logged twice (a resumed run that repeats steps after its last
checkpoint) keeps its last value. Input: metrics.jsonl files or the folders
holding them (<logging_dir>/<project_name>); see
accel/tracking/jsonl_tracker.h for the format. A folder with TensorBoard's
event files and no metrics.jsonl (--report_to=tensorboard) is read from
those: its scalars, without the run's config.
"""

import argparse
import json
import math
import os
import struct
import sys
import textwrap

# Panels come in this order; names are matched exactly, then by suffix
# ("train/loss", "eval_accuracy").
KNOWN = [
    ("loss", "loss"),
    ("accuracy", "accuracy"),
    ("learning_rate", "learning rate"),
    ("lr", "learning rate"),
    ("samples_per_second", "samples/s"),
]
SMOOTHED = ("loss", "accuracy", "samples_per_second")
NOT_CURVES = ("epoch",)
MIN_POINTS_TO_SMOOTH = 20


class DataError(Exception):
    pass


EVENTS_PREFIX = "events.out.tfevents."


def event_files(folder):
    return sorted(os.path.join(folder, name) for name in os.listdir(folder)
                  if name.startswith(EVENTS_PREFIX))


def metrics_path(path):
    """The run's metrics.jsonl, else its first TensorBoard event file (a run
    with --report_to=tensorboard alone has no JSONL file)."""
    if os.path.isdir(path):
        jsonl = os.path.join(path, "metrics.jsonl")
        if os.path.isfile(jsonl):
            return jsonl
        events = event_files(path)
        if events:
            return events[0]
        path = jsonl
    if not os.path.isfile(path):
        raise DataError("cannot read %s: no such file (expected a "
                        "metrics.jsonl, an %s* file, or the folder holding "
                        "one)" % (path, EVENTS_PREFIX))
    return path


def load_run(path):
    """Returns (config, {metric: {step: value}}) of one run's file."""
    if os.path.basename(path).startswith(EVENTS_PREFIX):
        return load_tensorboard_run(path)
    return load_jsonl_run(path)


def read_varint(data, at):
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def proto_fields(data):
    """(field number, wire type, value) of a protobuf message's fields: ints
    for varints, bytes for fixed and length-delimited ones."""
    at = 0
    while at < len(data):
        key, at = read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = read_varint(data, at)
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 2:
            size, at = read_varint(data, at)
            value, at = data[at:at + size], at + size
        elif wire == 5:
            value, at = data[at:at + 4], at + 4
        else:
            raise ValueError("wire type %d" % wire)
        if at > len(data):
            raise ValueError("a field runs past the end")
        yield number, wire, value


def _crc_step(crc):
    for _ in range(8):
        crc = (crc >> 1) ^ (0x82F63B78 * (crc & 1))
    return crc


CRC32C = [_crc_step(byte) for byte in range(256)]


def masked_crc(data):
    """TFRecord's masked CRC-32C (Castagnoli) of `data`."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def load_tensorboard_run(path):
    """The scalars of a run's TensorBoard event files (every file of its
    folder, in order): Event.step (2) and Event.summary (5), whose
    Summary.value (1) holds tag (1) and simple_value (2, a float32)."""
    series = {}
    for name in event_files(os.path.dirname(os.path.abspath(path))):
        with open(name, "rb") as f:
            data = f.read()
        at = 0
        while at < len(data):
            if at + 12 > len(data):
                raise DataError("%s: a record cut off at byte %d" % (name, at))
            (length, length_crc) = struct.unpack_from("<QI", data, at)
            record = data[at + 12:at + 12 + length]
            if len(record) != length or at + 16 + length > len(data):
                raise DataError("%s: a record cut off at byte %d" % (name, at))
            (record_crc,) = struct.unpack_from("<I", data, at + 12 + length)
            # As TensorBoard's reader: a damaged record is not plotted.
            if (masked_crc(data[at:at + 8]) != length_crc or
                    masked_crc(record) != record_crc):
                raise DataError("%s: the record at byte %d fails its checksum "
                                "(a damaged file)" % (name, at))
            at += 16 + length
            try:
                step, values = 0, []
                for number, wire, value in proto_fields(record):
                    if number == 2 and wire == 0:
                        step = value
                    elif number == 5 and wire == 2:
                        values.extend(scalars(value))
            except ValueError as e:
                raise DataError("%s: not a TensorBoard event file (%s)"
                                % (name, e))
            for tag, number in values:
                series.setdefault(tag, {})[step] = number
    return {}, series


def scalars(summary):
    """(tag, value) of a Summary's simple values."""
    for number, wire, value in proto_fields(summary):
        if number != 1 or wire != 2:
            continue
        tag, simple = None, None
        for field, kind, item in proto_fields(value):
            if field == 1 and kind == 2:
                tag = item.decode("utf-8", "replace")
            elif field == 2 and kind == 5:
                (simple,) = struct.unpack("<f", item)
        if tag is not None and simple is not None:
            yield tag, float(simple)


def load_jsonl_run(path):
    """Returns (config, {metric: {step: value}}) of one JSONL file."""
    config = {}
    series = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as e:
                raise DataError("%s:%d: not a JSON line (%s): %.60s"
                                % (path, number, e, line.strip()))
            if not isinstance(entry, dict):
                raise DataError("%s:%d: expected a JSON object, found %s"
                                % (path, number, type(entry).__name__))
            if "config" in entry:
                config.update(entry["config"])
                continue
            values = entry.get("values")
            step = entry.get("step")
            if not isinstance(values, dict) or not isinstance(step, int):
                raise DataError('%s:%d: expected {"step": <integer>, "values": '
                                '{...}}, found %.60s' % (path, number, line.strip()))
            for name, value in values.items():
                if value is None:  # NaN or infinity in the run.
                    value = math.nan
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue  # Text and flags are not curves.
                series.setdefault(name, {})[step] = float(value)
    return config, series


def panel_order(names):
    def rank(name):
        for i, (known, _) in enumerate(KNOWN):
            if name == known:
                return (i, 0, name)
        for i, (known, _) in enumerate(KNOWN):
            if name.endswith(known):
                return (i, 1, name)
        return (len(KNOWN), 0, name)
    return sorted(names, key=rank)


def label_of(name):
    for known, label in KNOWN:
        if name == known:
            return label
    return name


def smooth(values, weight):
    result = []
    last = None
    for v in values:
        if math.isnan(v):
            result.append(v)
            continue
        last = v if last is None else last * weight + (1 - weight) * v
        result.append(last)
    return result


def describe(config):
    shown = ", ".join("%s=%s" % (k, config[k]) for k in sorted(config))
    lines = textwrap.wrap(shown, width=100)
    if len(lines) > 3:
        lines = lines[:3]
        lines[-1] += " ..."
    return "\n".join(lines)


def plot(runs, metrics, output, smoothing, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 2 if len(metrics) > 1 else 1
    rows = (len(metrics) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 3.6 * rows),
                                squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, name in enumerate(metrics):
        ax = axes[index // columns][index % columns]
        for run_index, (run_name, (config, series)) in enumerate(runs):
            points = series.get(name)
            if not points:
                continue
            steps = sorted(points)
            values = [points[s] for s in steps]
            colour = colours[run_index % len(colours)]
            label = run_name if len(runs) > 1 else None
            # A few points (one per epoch) are drawn as they are.
            noisy = (name.endswith(SMOOTHED) and smoothing > 0 and
                     len(values) >= MIN_POINTS_TO_SMOOTH)
            if noisy:
                ax.plot(steps, values, color=colour, alpha=0.25, linewidth=1)
                ax.plot(steps, smooth(values, smoothing), color=colour,
                        linewidth=1.8, label=label)
            else:
                ax.plot(steps, values, color=colour, linewidth=1.8,
                        marker="o" if len(values) <= 20 else None,
                        markersize=3, label=label)
        ax.set_title(label_of(name))
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if name in ("learning_rate", "lr"):
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        if label is not None:
            ax.legend(fontsize="small")
    for index in range(len(metrics), rows * columns):
        axes[index // columns][index % columns].axis("off")
    if len(runs) == 1:
        run_name, (config, _) = runs[0]
        heading = title or run_name
        if config:
            heading += "\n" + describe(config)
    else:
        heading = title or "%d runs" % len(runs)
    figure.suptitle(heading, fontsize=11)
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)


def main(argv):
    parser = argparse.ArgumentParser(
        prog="plot_metrics", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[2:]))
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="metrics.jsonl files, TensorBoard event files, "
                             "or the folders holding them")
    parser.add_argument("-o", "--output", default=None,
                        help="the PNG to write (default: metrics.png beside "
                             "the first run's file)")
    parser.add_argument("--metrics", default="",
                        help="comma-separated metrics to plot, in this order "
                             "(default: every number logged)")
    parser.add_argument("--smoothing", type=float, default=0.6,
                        help="moving-average weight in [0, 1) for loss, "
                             "accuracy and samples/s (default 0.6)")
    parser.add_argument("--title", default="", help="the figure's title")
    args = parser.parse_args(argv)
    if not 0 <= args.smoothing < 1:
        parser.error("--smoothing must be in [0, 1), found %s" % args.smoothing)
    # Under `bazel run`, paths are the user's, not the runfiles tree's.
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])
    try:
        folders = [os.path.dirname(os.path.abspath(metrics_path(run)))
                   for run in args.runs]
        names = [os.path.basename(folder) for folder in folders]
        if len(set(names)) < len(names):
            # Runs of one project: the folder above tells them apart.
            names = [os.path.join(os.path.basename(os.path.dirname(folder)), name)
                     for folder, name in zip(folders, names)]
        runs = [(name, load_run(metrics_path(run)))
                for name, run in zip(names, args.runs)]
        available = set()
        for _, (_, series) in runs:
            available.update(series)
        if args.metrics:
            metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
            missing = [m for m in metrics if m not in available]
            if missing:
                raise DataError("no values for %s; the runs logged: %s"
                                % (", ".join(missing), ", ".join(sorted(available))
                                   or "no numbers"))
        else:
            metrics = panel_order(n for n in available if n not in NOT_CURVES)
        if not metrics:
            raise DataError('%s: no numbers to plot (expected lines like '
                            '{"step": 1, "values": {"loss": 0.5}})'
                            % ", ".join(args.runs))
        output = args.output or os.path.join(
            os.path.dirname(metrics_path(args.runs[0])), "metrics.png")
        plot(runs, metrics, output, args.smoothing, args.title)
    except DataError as e:
        print("plot_metrics: error: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("plot_metrics: error: %s" % e, file=sys.stderr)
        return 1
    steps = max(len(s) for _, (_, series) in runs for s in series.values())
    print("plot_metrics: wrote %s (%s; up to %d steps%s)"
          % (output, ", ".join(metrics), steps,
             "; runs: " + ", ".join(name for name, _ in runs) if len(runs) > 1
             else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
