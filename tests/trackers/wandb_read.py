#!/usr/bin/python3
"""An independent reader of a wandb offline run's transaction log (run-<id>.wandb) for the tests.

Usage: wandb_read.py RUN_FILE

The framing is read as wandb/sdk/internal/datastore.py reads it (transcribed here, not shared with
the C code): the 7-byte header ":W&B", magic 0xBEE1, version 0; then 32 KiB blocks of records
(u32 checksum = zlib.crc32 of the type byte continued over the data, u16 length, u8 type FULL /
FIRST / MIDDLE / LAST), a block's tail shorter than a record header padded with zeros. Each
assembled payload is decoded as a Record with the protos transcribed in wandb_record.proto
(compiled with protoc into a temporary folder) and checked to be the canonical encoding of what it
decodes to (no unknown fields). value_json strings are parsed with Python's json (NaN allowed, as
wandb's JSON has it). Prints the records as JSON:

  [{"num": 1, "header": {...}}, {"num": 2, "run": {...}}, {"num": 3, "config": {"k": v}},
   {"num": 4, "history": {"step": 0, "items": {"loss/train/total": 1.2, "_step": 0, ...}}},
   {"num": 9, "summary": {...}}, {"num": 10, "exit": {"exit_code": 0, "runtime": 1}}]

Any problem is printed on stderr and the exit status is 1.
"""
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER_LEN, BLOCK_LEN = 7, 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def fail(msg):
    print(f"wandb_read: {msg}", file=sys.stderr)
    sys.exit(1)


def records(raw):
    if len(raw) < HEADER_LEN:
        fail("shorter than the W&B header")
    ident, magic, version = struct.unpack("<4sHB", raw[:HEADER_LEN])
    if ident != b":W&B" or magic != 0xBEE1 or version != 0:
        fail(f"bad header {ident!r} {magic:#x} {version}")
    crc_of_type = [zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in range(5)]
    pos = HEADER_LEN

    def one():
        nonlocal pos
        left = BLOCK_LEN - pos % BLOCK_LEN
        if left < HEADER_LEN:
            if raw[pos:pos + left] != b"\0" * left:
                fail(f"byte {pos}: the block's tail is not zero padding")
            pos += left
        if pos == len(raw):
            return None
        if len(raw) - pos < HEADER_LEN:
            fail(f"byte {pos}: {len(raw) - pos} trailing bytes")
        checksum, length, rtype = struct.unpack("<IHB", raw[pos:pos + HEADER_LEN])
        if rtype not in (FULL, FIRST, MIDDLE, LAST):
            fail(f"byte {pos}: record type {rtype}")
        if pos % BLOCK_LEN + HEADER_LEN + length > BLOCK_LEN:
            fail(f"byte {pos}: a record of {length} bytes crosses its block")
        data = raw[pos + HEADER_LEN:pos + HEADER_LEN + length]
        if len(data) != length:
            fail(f"byte {pos}: record runs past the end")
        if zlib.crc32(data, crc_of_type[rtype]) & 0xFFFFFFFF != checksum:
            fail(f"byte {pos}: checksum {checksum:#010x} does not match")
        pos += HEADER_LEN + length
        return rtype, data

    while True:
        r = one()
        if r is None:
            return
        rtype, data = r
        if rtype == FULL:
            yield data
            continue
        if rtype != FIRST:
            fail(f"byte {pos}: a record of type {rtype} where FULL or FIRST was due")
        while True:
            r = one()
            if r is None:
                fail("the file ends inside a split record")
            if r[0] == LAST:
                data += r[1]
                break
            if r[0] != MIDDLE:
                fail(f"byte {pos}: a record of type {r[0]} inside a split record")
            data += r[1]
        yield data


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
        for x in (value if fd.label == fd.LABEL_REPEATED else [value]):
            check_no_unknown(x, where)


def items(lst, where):
    out = {}
    for it in lst:
        try:
            v = json.loads(it.value_json)
        except ValueError as e:
            fail(f"{where}: value_json {it.value_json!r} is not JSON: {e}")
        if isinstance(v, float) and not math.isfinite(v):
            v = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        key = it.key if it.key else "/".join(it.nested_key)
        if it.key and it.nested_key:
            fail(f"{where}: an item has both key and nested_key")
        out[key] = v
    return out


def main():
    if len(sys.argv) != 2:
        fail("usage: wandb_read.py RUN_FILE")
    raw = open(sys.argv[1], "rb").read()
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(["protoc", f"--python_out={tmp}", f"-I{HERE}", os.path.join(HERE, "wandb_record.proto")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"protoc failed: {r.stderr}")
        sys.path.insert(0, tmp)
        pb = importlib.import_module("wandb_record_pb2")
        out = []
        for i, data in enumerate(records(raw)):
            rec = pb.Record()
            rec.ParseFromString(data)
            where = f"record {i}"
            check_no_unknown(rec, where)
            if rec.SerializeToString() != data:
                fail(f"{where}: the bytes are not the canonical encoding of the record they decode to")
            d = {"num": rec.num}
            kind = rec.WhichOneof("record_type")
            if kind == "header":
                d["header"] = {"producer": rec.header.version_info.producer}
            elif kind == "run":
                x = rec.run
                d["run"] = {"run_id": x.run_id, "entity": x.entity, "project": x.project, "display_name": x.display_name,
                            "run_group": x.run_group, "job_type": x.job_type, "notes": x.notes, "tags": list(x.tags),
                            "host": x.host, "start_time": x.start_time.seconds + x.start_time.nanos * 1e-9}
            elif kind == "config":
                d["config"] = items(rec.config.update, where)
            elif kind == "history":
                d["history"] = {"step": rec.history.step.num if rec.history.HasField("step") else None,
                                "items": items(rec.history.item, where),
                                "keys": [it.key for it in rec.history.item]}
            elif kind == "summary":
                d["summary"] = items(rec.summary.update, where)
            elif kind == "exit":
                d["exit"] = {"exit_code": rec.exit.exit_code, "runtime": rec.exit.runtime}
            else:
                fail(f"{where}: unexpected record kind {kind}")
            out.append(d)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
