"""Minimal safetensors writer for the golden-file generators (Debian's python3-torch, no extra
packages). Follows the reference writer: tensors sorted by dtype (descending enum order) then name,
compact JSON header padded with spaces to a multiple of 8."""
import json
import struct

import torch

_DT = {torch.float32: ("F32", 4), torch.int64: ("I64", 8), torch.int32: ("I32", 4),
       torch.bfloat16: ("BF16", 2), torch.uint8: ("U8", 1), torch.float16: ("F16", 2)}
_ORDER = ["U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "I8", "U8", "BOOL"]


def save(path, tensors):
    """tensors: dict name -> torch.Tensor (moved to CPU, made contiguous)."""
    items = []
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        dt, _ = _DT[t.dtype]
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        items.append((name, dt, list(t.shape), raw))
    items.sort(key=lambda x: (_ORDER.index(x[1]), x[0].encode()))
    header, off = {}, 0
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, raw in items:
            f.write(raw)
