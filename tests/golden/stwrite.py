"""Minimal safetensors writer for the golden-file generators (Debian's python3-torch, no extra
packages). Follows the reference writer (huggingface/safetensors, FORMATS.md §4.3): tensors sorted
by dtype (descending enum order) then name (byte order), compact JSON header with "__metadata__"
first and the fields in the order dtype, shape, data_offsets, non-ASCII written as raw UTF-8 (as
serde_json does), padded with spaces to a multiple of 8."""
import json
import struct

import torch

_DT = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
       torch.uint8: "U8", torch.bool: "BOOL"}
# The reference's Dtype enum order ("increasing alignment"), reversed: the writer's sort order.
_ORDER = list(reversed(["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                        "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
                        "C64", "F64", "I64", "U64"]))


def save(path, tensors, metadata=None):
    """tensors: dict name -> torch.Tensor (moved to CPU, made contiguous); metadata: dict str -> str."""
    items = []
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        dt = _DT[t.dtype]
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        items.append((name, dt, list(t.shape), raw))
    items.sort(key=lambda x: (_ORDER.index(x[1]), x[0].encode()))
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, raw in items:
            f.write(raw)
