"""A safetensors file written from PyTorch tensors of many dtypes for the reader tests
(tests/test_safetensors.c): F64/F32/F16/BF16/I64/I32/I16/I8/U8/BOOL, a 0-d tensor, zero-size
tensors, non-ASCII names and names that need JSON escapes, and metadata. The values are simple
formulas the C test recomputes, plus random f32 values with torch's own bf16/f16 rounding of them.
Run: /usr/bin/python3 tests/golden/gen_safetensors.py (from the repo root)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(4321)
r = torch.randn(64, dtype=torch.float32) * 3
out = {
    "f64": torch.arange(6, dtype=torch.float64).reshape(2, 3) * 0.5 - 1,   # i/2 - 1
    "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8,        # i/8
    "f16": ((torch.arange(10, dtype=torch.float32) - 5) / 4).to(torch.float16),  # (i-5)/4
    "bf16": ((torch.arange(8, dtype=torch.float32) - 4) * 1.5).to(torch.bfloat16),  # (i-4)*1.5
    "randn_f32": r,
    "randn_bf16": r.to(torch.bfloat16),
    "randn_f16": r.to(torch.float16),
    "i64": torch.tensor([-(2 ** 62), -1, 0, 1, 2 ** 53 + 1, 2 ** 63 - 1], dtype=torch.int64),
    "i32": torch.arange(-3, 3, dtype=torch.int32),
    "i16": torch.tensor([-32768, 0, 32767], dtype=torch.int16),
    "i8": torch.tensor([-128, 5, 127], dtype=torch.int8),
    "u8": torch.arange(0, 256, 51, dtype=torch.uint8),                     # 0, 51, ..., 255
    "bool": torch.tensor([True, False, True, True]),
    "scalar": torch.tensor(3.5, dtype=torch.float32),                      # 0-d
    "empty": torch.zeros(0, 3, dtype=torch.float32),
    "empty_i64": torch.zeros(2, 0, dtype=torch.int64),
    "ünïcödé.weight": torch.tensor([1.0, -2.0], dtype=torch.float32),
    "日本語": torch.tensor([7], dtype=torch.int32),
    "emoji_\U0001F642": torch.tensor([9], dtype=torch.uint8),
    'quo"te\\back\ttab\x01': torch.tensor([1.25], dtype=torch.float32),
}
meta = {"format": "pt", "note": 'héllo "world"\n'}

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors_torch.safetensors")
stwrite.save(path, out, meta)
print("wrote", path, os.path.getsize(path), "bytes")
