#!/usr/bin/python3
"""plot_metrics end to end: PNGs from JSONL runs, and clear errors."""

import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_metrics.py")


def run(*args):
    result = subprocess.run(["/usr/bin/python3", TOOL] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=120)
    return result.returncode, result.stdout


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise AssertionError("%s is not a PNG" % path)
    return struct.unpack(">II", head[16:24])


def write_run(folder, lines):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line))
            f.write("\n")
    return folder


def training_lines(steps, resumed_from=None):
    lines = [{"config": {"lr": 0.001, "epochs": 3}, "wall_time": 1.7e9}]
    for step in range(1, steps + 1):
        lines.append({"step": step, "wall_time": 1.7e9 + step,
                      "values": {"loss": 1.0 / step, "accuracy": step / steps,
                                 "learning_rate": 0.001 * (1 - step / steps),
                                 "samples_per_second": 1000 + step,
                                 "epoch": step // 4, "phase": "train"}})
    if resumed_from:
        for step in range(resumed_from, steps + 1):
            lines.append({"step": step, "values": {"loss": 0.5 / step}})
    return lines


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number, wire, payload):
    key = varint(number << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tensorboard_run(folder, steps):
    """An event file as TensorBoard's writers frame it (length, masked
    CRC-32C of it, the record, its masked CRC-32C): a file_version event,
    then one event per step with loss and accuracy as simple values."""
    os.makedirs(folder, exist_ok=True)
    records = [field(1, 1, struct.pack("<d", 1.7e9)) +
               field(3, 2, b"brain.Event:2")]
    for step in range(1, steps + 1):
        summary = b""
        for tag, value in (("loss", 1.0 / step), ("accuracy", step / steps)):
            summary += field(1, 2, field(1, 2, tag.encode()) +
                             field(2, 5, struct.pack("<f", value)))
        records.append(field(1, 1, struct.pack("<d", 1.7e9 + step)) +
                       field(2, 0, varint(step)) + field(5, 2, summary))
    with open(os.path.join(folder, "events.out.tfevents.1700000000.host.1.0"),
              "wb") as f:
        for record in records:
            length = struct.pack("<Q", len(record))
            f.write(length + struct.pack("<I", crc32c(length)) + record +
                    struct.pack("<I", crc32c(record)))
    return folder


class PlotMetricsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    # A run with --report_to=tensorboard alone has no metrics.jsonl ("no
    # such file" before): its event files are read.
    def test_a_tensorboard_only_run_is_plotted(self):
        folder = write_tensorboard_run(os.path.join(self.dir, "tb"), 30)
        code, out = run(folder)
        self.assertEqual(code, 0, out)
        self.assertIn("(loss, accuracy; up to 30 steps)", out)
        self.assertTrue(png_size(os.path.join(folder, "metrics.png"))[0] > 0)
        events = os.path.join(folder, "events.out.tfevents.1700000000.host.1.0")
        with open(events, "r+b") as f:
            # A loss's float flipped: the record's checksum no longer holds.
            data = bytearray(f.read())
            at = data.index(b"loss") + 6
            data[at] ^= 0x40
            f.seek(0)
            f.write(data)
        code, out = run(folder)
        self.assertEqual(code, 1, out)
        self.assertIn("fails its checksum", out)
        with open(events, "ab") as f:
            f.write(b"\x05\0\0\0")
        code, out = run(folder)
        self.assertEqual(code, 1, out)

    def test_plots_the_four_curves_of_a_run(self):
        folder = write_run(os.path.join(self.dir, "run"), training_lines(12, 9))
        code, out = run(folder)
        self.assertEqual(code, 0, out)
        self.assertIn("loss, accuracy, learning_rate, samples_per_second", out)
        self.assertIn("up to 12 steps", out)
        width, height = png_size(os.path.join(folder, "metrics.png"))
        self.assertEqual((width, height), (1280, 720))

    def test_several_runs_and_chosen_metrics(self):
        a = write_run(os.path.join(self.dir, "a"), training_lines(5))
        b = write_run(os.path.join(self.dir, "b"), training_lines(8))
        out_png = os.path.join(self.dir, "both.png")
        code, out = run(a, os.path.join(b, "metrics.jsonl"), "-o", out_png,
                        "--metrics=loss", "--smoothing=0")
        self.assertEqual(code, 0, out)
        self.assertEqual(png_size(out_png), (640, 360))
        self.assertIn("runs: a, b)", out)

    def test_runs_of_one_project_are_told_apart_by_their_folder(self):
        a = write_run(os.path.join(self.dir, "accel", "nlp"), training_lines(5))
        b = write_run(os.path.join(self.dir, "ddp", "nlp"), training_lines(5))
        code, out = run(a, b, "-o", os.path.join(self.dir, "two.png"))
        self.assertEqual(code, 0, out)
        self.assertIn("runs: accel/nlp, ddp/nlp)", out)

    def test_nan_values_are_gaps_not_errors(self):
        folder = write_run(os.path.join(self.dir, "nan"), [
            {"step": 1, "values": {"loss": 1.0}},
            {"step": 2, "values": {"loss": None}},
            {"step": 3, "values": {"loss": 0.5}}])
        code, out = run(folder)
        self.assertEqual(code, 0, out)

    def test_a_malformed_line_is_named_with_its_number(self):
        folder = write_run(os.path.join(self.dir, "bad"), [
            {"step": 1, "values": {"loss": 1.0}}, '{"step": 2, "values": {"lo'])
        code, out = run(folder)
        self.assertEqual(code, 1, out)
        self.assertIn("metrics.jsonl:2: not a JSON line", out)

    def test_a_line_without_step_is_named(self):
        folder = write_run(os.path.join(self.dir, "nostep"),
                           [{"values": {"loss": 1.0}}])
        code, out = run(folder)
        self.assertEqual(code, 1, out)
        self.assertIn('metrics.jsonl:1: expected {"step": <integer>', out)

    def test_a_missing_file_is_named(self):
        code, out = run(os.path.join(self.dir, "nowhere"))
        self.assertEqual(code, 1, out)
        self.assertIn("cannot read %s/nowhere: no such file"
                      % self.dir, out)

    def test_a_run_without_numbers_says_so(self):
        folder = write_run(os.path.join(self.dir, "text"), [
            {"config": {"lr": 1}}, {"step": 1, "values": {"note": "hello"}}])
        code, out = run(folder)
        self.assertEqual(code, 1, out)
        self.assertIn("no numbers to plot", out)

    def test_an_unknown_metric_lists_what_was_logged(self):
        folder = write_run(os.path.join(self.dir, "run"), training_lines(3))
        code, out = run(folder, "--metrics=loss,perplexity")
        self.assertEqual(code, 1, out)
        self.assertIn("no values for perplexity; the runs logged: accuracy, "
                      "epoch, learning_rate, loss, samples_per_second", out)

    def test_bad_smoothing_is_a_usage_error(self):
        code, out = run(self.dir, "--smoothing=1.5")
        self.assertEqual(code, 2, out)
        self.assertIn("--smoothing must be in [0, 1)", out)


if __name__ == "__main__":
    unittest.main()
