#!/usr/bin/python3
"""Reads TensorBoard event files back and checks them against a JSONL run.

Independent of accel's C++ writer: it parses the TFRecord framing itself,
checks both masked CRC-32C of every record, and decodes the Event messages
with python3-protobuf from the same .proto files (compiled here with
protoc --python_out). Then it compares, record by record, with the
expectation, a file in the JSONL tracker's format:

  {"config": {...}}                          -> the hparams session start
  {"step": N, "values": {...}}, one per log  -> one Summary event each
  {"finished": true}  (optional, last)       -> the session end (success)

  read_tensorboard_events.py --protoc=protoc --proto_root=. \
      --wkt_root=/usr/include --expect=metrics.jsonl RUN_DIR_OR_FILE

Exit status 0 when everything matches (a summary of what was checked is
printed), 1 with the first difference otherwise, 2 for bad arguments.
"""

import argparse
import glob
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile


class Mismatch(Exception):
    pass


def crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path, counts):
    with open(path, "rb") as f:
        blob = f.read()
    offset = 0
    index = 0
    while offset < len(blob):
        if len(blob) - offset < 12:
            raise Mismatch("%s: record %d: truncated header (%d bytes left)"
                           % (path, index, len(blob) - offset))
        header = blob[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[offset + 8:offset + 12])
        if length_crc != masked_crc32c(header):
            raise Mismatch("%s: record %d: length CRC %08x, expected %08x"
                           % (path, index, length_crc, masked_crc32c(header)))
        counts["length CRCs"] += 1
        start = offset + 12
        if len(blob) - start < length + 4:
            raise Mismatch("%s: record %d: truncated data (%d of %d bytes)"
                           % (path, index, len(blob) - start, length + 4))
        data = blob[start:start + length]
        (data_crc,) = struct.unpack("<I", blob[start + length:start + length + 4])
        if data_crc != masked_crc32c(data):
            raise Mismatch("%s: record %d: data CRC %08x, expected %08x"
                           % (path, index, data_crc, masked_crc32c(data)))
        counts["data CRCs"] += 1
        yield data
        offset = start + length + 4
        index += 1


def compile_protos(args, out_dir):
    protos = ["accel/tracking/tensorboard.proto", "accel/tracking/hparams.proto"]
    command = [args.protoc, "-I" + args.proto_root, "-I" + args.wkt_root,
               "--python_out=" + out_dir] + protos
    result = subprocess.run(command, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise Mismatch("protoc failed: %s\n%s" % (" ".join(command), result.stdout))
    sys.path.insert(0, out_dir)
    return (importlib.import_module("accel.tracking.tensorboard_pb2"),
            importlib.import_module("accel.tracking.hparams_pb2"))


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same_number(found, expected):
    if expected is None:  # JSON's NaN and infinities.
        return math.isnan(found) or math.isinf(found)
    if isinstance(expected, bool):
        expected = 1.0 if expected else 0.0
    expected = float32(float(expected))
    if math.isinf(expected):
        return found == expected
    return found == expected


def load_expectation(path):
    config = None
    logs = []
    finished = False
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as e:
                raise Mismatch("%s:%d: not JSON: %s" % (path, number, e))
            if "config" in entry:
                config = entry["config"]
            elif "values" in entry:
                logs.append((entry["step"], entry["values"]))
            elif entry.get("finished"):
                finished = True
    return config, logs, finished


def check_plugin(value, plugin):
    found = value.metadata.plugin_data.plugin_name
    if found != plugin:
        raise Mismatch("tag %r: plugin %r, expected %r" % (value.tag, found, plugin))


def check_text(value, expected, tb):
    check_plugin(value, "text")
    tensor = value.tensor
    if tensor.dtype != tb.DT_STRING or list(tensor.string_val) != [expected.encode()]:
        raise Mismatch("text %r: %r, expected %r"
                       % (value.tag, list(tensor.string_val), expected))


def check_hparams(event, config, tb, hp, counts):
    values = {v.tag: v for v in event.summary.value}
    start = values.get("_hparams_/session_start_info")
    if start is None:
        raise Mismatch("step %d: no _hparams_/session_start_info in %s"
                       % (event.step, sorted(values)))
    check_plugin(start, "hparams")
    data = hp.HParamsPluginData.FromString(start.metadata.plugin_data.content)
    if data.version != 0 or not data.HasField("session_start_info"):
        raise Mismatch("session_start_info: unexpected plugin data %s" % data)
    found = data.session_start_info.hparams
    if sorted(found) != sorted(config):
        raise Mismatch("hparams %s, expected %s" % (sorted(found), sorted(config)))
    for key, expected in config.items():
        value = found[key]
        kind = value.WhichOneof("kind")
        if isinstance(expected, str):
            ok = kind == "string_value" and value.string_value == expected
        elif isinstance(expected, bool):
            ok = kind == "bool_value" and value.bool_value == expected
        elif expected is None:
            ok = kind == "number_value" and not math.isfinite(value.number_value)
        else:
            ok = kind == "number_value" and value.number_value == float(expected)
        if not ok:
            raise Mismatch("hparam %r: %s, expected %r" % (key, value, expected))
        counts["hparams"] += 1
    table = values.get("hparams")
    if table is None:
        raise Mismatch("no text summary 'hparams' beside the session start")
    for key in config:
        if ("| %s |" % key).encode() not in table.tensor.string_val[0]:
            raise Mismatch("hparams table lacks %r" % key)


def check_log(event, step, expected, tb, counts):
    if event.step != step:
        raise Mismatch("event step %d, expected %d" % (event.step, step))
    counts["steps"] += 1
    found = {v.tag: v for v in event.summary.value}
    if sorted(found) != sorted(expected):
        raise Mismatch("step %d: tags %s, expected %s"
                       % (step, sorted(found), sorted(expected)))
    for tag, want in expected.items():
        value = found[tag]
        counts["tags"] += 1
        if isinstance(want, str):
            check_text(value, want, tb)
        else:
            if value.WhichOneof("value") != "simple_value":
                raise Mismatch("step %d, %r: not a scalar: %s" % (step, tag, value))
            if not same_number(value.simple_value, want):
                raise Mismatch("step %d, %r: %r, expected %r (as float32)"
                               % (step, tag, value.simple_value, want))
        counts["values"] += 1


def check(args):
    if os.path.isdir(args.events):
        files = sorted(glob.glob(os.path.join(args.events, "events.out.tfevents.*")))
        if not files:
            raise Mismatch("no events.out.tfevents.* file in %s" % args.events)
    else:
        files = [args.events]
    counts = {k: 0 for k in ["files", "records", "length CRCs", "data CRCs",
                             "steps", "tags", "values", "hparams"]}
    with tempfile.TemporaryDirectory() as out_dir:
        tb, hp = compile_protos(args, out_dir)
        events = []
        for path in files:
            counts["files"] += 1
            first = True
            for data in read_records(path, counts):
                counts["records"] += 1
                event = tb.Event.FromString(data)
                if first:
                    if event.file_version != "brain.Event:2":
                        raise Mismatch("%s: first record is not file_version "
                                       "brain.Event:2: %s" % (path, event))
                    if event.source_metadata.writer != "accel":
                        raise Mismatch("%s: writer %r" % (path, event.source_metadata.writer))
                    first = False
                    continue
                if event.wall_time < 1.5e9:
                    raise Mismatch("implausible wall_time %r" % event.wall_time)
                events.append(event)
        config, logs, finished = load_expectation(args.expect)
        position = 0
        if config is not None:
            if not events:
                raise Mismatch("no events; expected the hparams session start")
            check_hparams(events[0], config, tb, hp, counts)
            position = 1
        for step, values in logs:
            if position >= len(events):
                raise Mismatch("%d events; expected a log at step %d after them"
                               % (len(events), step))
            check_log(events[position], step, values, tb, counts)
            position += 1
        if finished:
            if position >= len(events):
                raise Mismatch("no session end after the last log")
            end = {v.tag: v for v in events[position].summary.value}.get(
                "_hparams_/session_end_info")
            if end is None:
                raise Mismatch("event %d is not the session end: %s"
                               % (position, events[position]))
            data = hp.HParamsPluginData.FromString(end.metadata.plugin_data.content)
            if data.session_end_info.status != hp.STATUS_SUCCESS:
                raise Mismatch("session end status %d, expected success"
                               % data.session_end_info.status)
            position += 1
        if position != len(events):
            raise Mismatch("%d events after the expected ones, first: %s"
                           % (len(events) - position, events[position]))
    print("checked " + ", ".join("%d %s" % (n, k) for k, n in counts.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protoc", required=True)
    parser.add_argument("--proto_root", required=True,
                        help="folder holding accel/tracking/*.proto")
    parser.add_argument("--wkt_root", required=True,
                        help="folder holding google/protobuf/struct.proto")
    parser.add_argument("--expect", required=True, help="a JSONL run")
    parser.add_argument("events", help="an event file or a run folder")
    args = parser.parse_args()
    try:
        check(args)
    except Mismatch as e:
        print("MISMATCH: %s" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
