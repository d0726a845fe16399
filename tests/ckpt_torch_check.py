"""Reads a checkpoint's model.safetensors with PyTorch alone (Debian's torch has no safetensors
package, so the format is parsed here from its specification: 8-byte little-endian header
length, JSON header, raw little-endian data) and compares every tensor's name and values with
the C side's dump (one line per parameter: name, then the float32 values in C's %a hex form).

usage: /usr/bin/python3 tests/ckpt_torch_check.py MODEL.safetensors EXPECTED.txt
Exit status 0 when names and values agree bit for bit."""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    assert meta.get("format") == "pt", f"metadata {meta}: expected format pt"
    data = bytearray(raw[8 + n:])
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(data[b:end], dtype=DTYPES[e["dtype"]]) if end > b else torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def main():
    tensors = load(sys.argv[1])
    expected = {}
    with open(sys.argv[2]) as f:
        for line in f:
            parts = line.split()
            expected[parts[0]] = torch.tensor([float.fromhex(v) for v in parts[1:]], dtype=torch.float32)
    if set(tensors) != set(expected):
        print(f"names differ: file {sorted(tensors)}, C {sorted(expected)}")
        return 1
    for name, want in expected.items():
        got = tensors[name].reshape(-1)
        if got.dtype != torch.float32 or not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            print(f"{name}: values differ")
            return 1
    # the state dict loads into the PyTorch twin of the C model (Sequential: Linear, ReLU, Linear)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    net.load_state_dict(tensors, strict=True)
    print(f"ok: {len(tensors)} tensors, names and values match; loaded into torch.nn.Sequential")
    return 0


if __name__ == "__main__":
    sys.exit(main())
