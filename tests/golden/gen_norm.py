"""Golden values for the normalisation ops (tests/test_golden_norm.c), from PyTorch on CPU.

Each case stores its inputs, a fixed upstream gradient `gout`, the output and the input gradients
from `out.backward(gout)`. Batch-norm training cases also store the running stats before and after
one step (momentum 0.1). Run from the repo root: /usr/bin/python3 tests/golden/gen_norm.py
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(1234)
out = {}


def leaf(*shape, scale=1.0, shift=0.0):
    return (torch.randn(*shape) * scale + shift).requires_grad_(True)


# layer_norm over the last dim of (3, 4, 10), with weight and bias
x = leaf(3, 4, 10, scale=2.0, shift=1.0)
w, b = leaf(10), leaf(10)
y = F.layer_norm(x, (10,), w, b, eps=1e-5)
g = torch.randn_like(y)
y.backward(g)
out.update({"ln.x": x, "ln.w": w, "ln.b": b, "ln.gout": g, "ln.y": y, "ln.dx": x.grad, "ln.dw": w.grad,
            "ln.db": b.grad})


def bn_train(tag, shape, C):
    xx = leaf(*shape, scale=1.5, shift=0.5)
    ww, bb = leaf(C), leaf(C)
    rm0, rv0 = torch.randn(C), torch.rand(C) + 0.5
    rm, rv = rm0.clone(), rv0.clone()
    yy = F.batch_norm(xx, rm, rv, ww, bb, training=True, momentum=0.1, eps=1e-5)
    gg = torch.randn_like(yy)
    yy.backward(gg)
    out.update({f"{tag}.x": xx, f"{tag}.w": ww, f"{tag}.b": bb, f"{tag}.rm0": rm0, f"{tag}.rv0": rv0,
                f"{tag}.gout": gg, f"{tag}.y": yy, f"{tag}.dx": xx.grad, f"{tag}.dw": ww.grad, f"{tag}.db": bb.grad,
                f"{tag}.rm": rm, f"{tag}.rv": rv})


# batch_norm training step: NCHW and (N, C)
bn_train("bn4", (4, 3, 5, 6), 3)
bn_train("bn2", (16, 7), 7)

# batch_norm eval (running stats fixed, differentiable in x, w, b)
x = leaf(2, 3, 4, 4)
w, b = leaf(3), leaf(3)
rm, rv = torch.randn(3), torch.rand(3) + 0.5
y = F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5)
g = torch.randn_like(y)
y.backward(g)
out.update({"bne.x": x, "bne.w": w, "bne.b": b, "bne.rm": rm, "bne.rv": rv, "bne.gout": g, "bne.y": y,
            "bne.dx": x.grad, "bne.dw": w.grad, "bne.db": b.grad})

# group_norm: (2, 6, 4, 5), 3 groups
x = leaf(2, 6, 4, 5, scale=1.5, shift=-0.5)
w, b = leaf(6), leaf(6)
y = F.group_norm(x, 3, w, b, eps=1e-5)
g = torch.randn_like(y)
y.backward(g)
out.update({"gn.x": x, "gn.w": w, "gn.b": b, "gn.gout": g, "gn.y": y, "gn.dx": x.grad, "gn.dw": w.grad,
            "gn.db": b.grad})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "norm.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
