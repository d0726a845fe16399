#!/usr/bin/python3
"""An independent reader of TensorBoard event files for the tests (Debian's python3-protobuf).

Usage: tb_read.py EVENTS_FILE

Checks the TFRecord framing itself (u64 length, masked CRC-32C of the length, data, masked
CRC-32C of the data; CRC-32C written here in Python, not shared with the C code), decodes every
record as an Event with the protos transcribed in tensorboard_event.proto (compiled with protoc into
a temporary folder), checks that each record is the canonical encoding of what it decodes to (no
unknown fields, no stray bytes; an explicit step 0 is allowed), that histograms use TensorFlow's default bucket limits and that
their counts add up, and prints the events as JSON on stdout:

  [{"wall_time": ..., "step": ..., "file_version": "brain.Event:2"},
   {"wall_time": ..., "step": 3, "values": [{"tag": "loss/train/total", "simple_value": 1.25}]},
   {"...": ..., "values": [{"tag": "hyperparameters/text_summary", "plugin": "text", "text": "..."}]},
   {"...": ..., "values": [{"tag": "parameters/fc1.weight", "histo": {"min": ..., "bucket": [...]}}]}]

Any problem is printed on stderr and the exit status is 1.
"""
import importlib
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tf_default_limits():
    """TensorFlow's default histogram bucket limits (tensorflow/core/lib/histogram/histogram.cc)."""
    pos = []
    v = 1e-12
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    return [-sys.float_info.max] + [-x for x in reversed(pos)] + [0.0] + pos + [sys.float_info.max]


def fail(msg):
    print(f"tb_read: {msg}", file=sys.stderr)
    sys.exit(1)


def load_protos(tmp):
    proto = os.path.join(HERE, "tensorboard_event.proto")
    r = subprocess.run(["protoc", f"--python_out={tmp}", f"-I{HERE}", proto], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"protoc failed: {r.stderr}")
    sys.path.insert(0, tmp)
    return importlib.import_module("tensorboard_event_pb2")


def check_no_unknown(msg, where):
    try:
        unknown = msg.UnknownFields()
    except (AttributeError, NotImplementedError):
        unknown = ()
    if len(unknown):
        fail(f"{where}: {len(unknown)} unknown field(s) in {type(msg).__name__}")
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        items = value if fd.label == fd.LABEL_REPEATED else [value]
        for x in items:
            check_no_unknown(x, where)


def main():
    if len(sys.argv) != 2:
        fail("usage: tb_read.py EVENTS_FILE")
    path = sys.argv[1]
    raw = open(path, "rb").read()
    limits = tf_default_limits()
    limit_set = set(limits)
    with tempfile.TemporaryDirectory() as tmp:
        pb = load_protos(tmp)
        out = []
        pos = 0
        i = 0
        while pos < len(raw):
            where = f"{os.path.basename(path)} record {i} at byte {pos}"
            if len(raw) - pos < 12:
                fail(f"{where}: {len(raw) - pos} trailing bytes, not a record header")
            head = raw[pos:pos + 8]
            (length,) = struct.unpack("<Q", head)
            (hcrc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
            if hcrc != masked(head):
                fail(f"{where}: length CRC {hcrc:#010x} != {masked(head):#010x}")
            if pos + 12 + length + 4 > len(raw):
                fail(f"{where}: record of {length} bytes runs past the end of the file")
            data = raw[pos + 12:pos + 12 + length]
            (dcrc,) = struct.unpack("<I", raw[pos + 12 + length:pos + 16 + length])
            if dcrc != masked(data):
                fail(f"{where}: data CRC {dcrc:#010x} != {masked(data):#010x}")
            ev = pb.Event()
            ev.ParseFromString(data)
            check_no_unknown(ev, where)
            canon = data
            if ev.step == 0 and data[:1] == b"\x09" and data[9:11] == b"\x10\x00":
                canon = data[:9] + data[11:]  # step 0 written explicitly (as torch's writer does)
            if ev.SerializeToString() != canon:
                fail(f"{where}: the bytes are not the canonical encoding of the event they decode to")
            rec = {"wall_time": ev.wall_time, "step": ev.step}
            which = ev.WhichOneof("what")
            if which == "file_version":
                rec["file_version"] = ev.file_version
            elif which == "summary":
                vals = []
                for v in ev.summary.value:
                    d = {"tag": v.tag}
                    if v.HasField("metadata"):
                        d["plugin"] = v.metadata.plugin_data.plugin_name
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        d["simple_value"] = v.simple_value
                    elif kind == "tensor":
                        t = v.tensor
                        if t.dtype != pb.DT_STRING or [x.size for x in t.tensor_shape.dim] != [1] or len(t.string_val) != 1:
                            fail(f"{where}: tag {v.tag}: a text tensor must be DT_STRING of shape [1] with one string")
                        d["text"] = t.string_val[0].decode("utf-8")
                    elif kind == "histo":
                        h = v.histo
                        if len(h.bucket_limit) != len(h.bucket) or not h.bucket:
                            fail(f"{where}: tag {v.tag}: {len(h.bucket_limit)} limits for {len(h.bucket)} buckets")
                        if any(b <= a for a, b in zip(h.bucket_limit, h.bucket_limit[1:])):
                            fail(f"{where}: tag {v.tag}: bucket limits are not increasing")
                        if any(x not in limit_set for x in h.bucket_limit):
                            fail(f"{where}: tag {v.tag}: a bucket limit is not one of TensorFlow's defaults")
                        if sum(h.bucket) != h.num:
                            fail(f"{where}: tag {v.tag}: the buckets hold {sum(h.bucket)} values, num is {h.num}")
                        d["histo"] = {"min": h.min, "max": h.max, "num": h.num, "sum": h.sum,
                                      "sum_squares": h.sum_squares, "bucket_limit": list(h.bucket_limit),
                                      "bucket": list(h.bucket)}
                    else:
                        fail(f"{where}: tag {v.tag}: unexpected value kind {kind}")
                    vals.append(d)
                rec["values"] = vals
            else:
                fail(f"{where}: unexpected event kind {which}")
            out.append(rec)
            pos += 16 + length
            i += 1
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
