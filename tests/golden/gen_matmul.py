"""Golden values for cm_matmul and cm_linear from PyTorch: forward outputs and input gradients for
a fixed upstream gradient `*_gout`, plus a bf16 linear forward (torch's bf16 matmul, f32 result).
Run: /usr/bin/python3 tests/golden/gen_matmul.py (from the repo root)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(1234)
out = {}


def leaf(name, *shape):
    t = torch.randn(*shape, dtype=torch.float32)
    out[name] = t
    return t.clone().requires_grad_(True)


def record(prefix, y, inputs):
    g = torch.randn(y.shape, dtype=torch.float32)
    y.backward(g)
    out[prefix + "_out"] = y.detach()
    out[prefix + "_gout"] = g
    for name, t in inputs.items():
        out[name + "_grad"] = t.grad


# 2-D matmul
a = leaf("mm2_a", 7, 13)
b = leaf("mm2_b", 13, 5)
record("mm2", a @ b, {"mm2_a": a, "mm2_b": b})

# batched with broadcast: (2, 1, 4, 6) @ (3, 6, 5) -> (2, 3, 4, 5)
a = leaf("mmb_a", 2, 1, 4, 6)
b = leaf("mmb_b", 3, 6, 5)
record("mmb", a @ b, {"mmb_a": a, "mmb_b": b})

# linear, 3-D x, with bias
x = leaf("lin_x", 2, 5, 16)
w = leaf("lin_w", 12, 16)
bias = leaf("lin_b", 12)
record("lin", torch.nn.functional.linear(x, w, bias), {"lin_x": x, "lin_w": w, "lin_b": bias})

# linear without bias
x = leaf("linnb_x", 9, 16)
w = leaf("linnb_w", 12, 16)
record("linnb", torch.nn.functional.linear(x, w), {"linnb_x": x, "linnb_w": w})

# bf16 linear forward: inputs stored as bf16, torch's bf16 matmul result widened to f32
x = torch.randn(16, 64).to(torch.bfloat16)
w = torch.randn(32, 64).to(torch.bfloat16)
bias = torch.randn(32, dtype=torch.float32)
out["bf16_x"] = x
out["bf16_w"] = w
out["bf16_b"] = bias
out["bf16_out"] = (x @ w.t()).float() + bias

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "matmul.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
