"""Golden values for conv2d, pooling and bilinear resize (tests/test_golden_conv.c).

For every case: the input(s), a fixed upstream gradient `gout`, PyTorch's output and the input
gradients from out.backward(gout). Channels-last cases store x as (N, H, W, C) and the output and
gradients in that layout too (PyTorch computes on the permuted NCHW view).
Run: /usr/bin/python3 tests/golden/gen_conv.py  (from the repository root)."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(0)
out = {}


def to_cl(t):
    return t.permute(0, 2, 3, 1).contiguous()


def from_cl(t):
    return t.permute(0, 3, 1, 2)


# name: (N, Cin, H, W, Cout, kh, kw, stride, padding, dilation, groups, bias, channels_last)
CONV = {
    "c_basic": (2, 3, 8, 7, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, True, False),
    "c_s2p1": (2, 4, 9, 8, 6, 3, 3, (2, 2), (1, 1), (1, 1), 1, True, False),
    "c_dil2": (1, 3, 9, 9, 2, 3, 3, (1, 1), (2, 2), (2, 2), 1, False, False),
    "c_groups": (2, 4, 6, 7, 6, 3, 2, (1, 2), (1, 0), (1, 1), 2, True, False),
    "c_dw": (2, 6, 7, 6, 6, 3, 3, (2, 1), (1, 1), (1, 1), 6, True, False),
    "c_1x1": (3, 5, 4, 6, 7, 1, 1, (1, 1), (0, 0), (1, 1), 1, True, False),
    "c_cl": (2, 4, 8, 7, 6, 3, 3, (2, 2), (1, 1), (1, 1), 2, True, True),
    "c_cl_1x1": (2, 6, 5, 4, 4, 1, 1, (1, 1), (0, 0), (1, 1), 1, False, True),
}
for name, (n, ci, h, w, co, kh, kw, s, p, d, g, has_b, cl) in CONV.items():
    x = torch.randn(n, ci, h, w, requires_grad=True)
    wt = torch.randn(co, ci // g, kh, kw, requires_grad=True)
    b = torch.randn(co, requires_grad=True) if has_b else None
    y = F.conv2d(x, wt, b, stride=s, padding=p, dilation=d, groups=g)
    gout = torch.randn_like(y)
    y.backward(gout)
    lay = to_cl if cl else (lambda t: t)
    out[name + ".x"] = lay(x.detach())
    out[name + ".w"] = wt.detach()
    out[name + ".y"] = lay(y.detach())
    out[name + ".gout"] = lay(gout)
    out[name + ".dx"] = lay(x.grad)
    out[name + ".dw"] = wt.grad
    if has_b:
        out[name + ".b"] = b.detach()
        out[name + ".db"] = b.grad


def single(name, x_nchw, fn, cl=False):
    x = x_nchw.clone().requires_grad_(True)
    y = fn(x)
    gout = torch.randn_like(y)
    y.backward(gout)
    lay = to_cl if cl else (lambda t: t)
    out[name + ".x"] = lay(x.detach())
    out[name + ".y"] = lay(y.detach())
    out[name + ".gout"] = lay(gout)
    out[name + ".dx"] = lay(x.grad)


# Pooling cases: name -> (x shape NCHW, kernel, stride, padding, ceil_mode, count_include_pad, channels_last)
POOL = {
    "p_k2": ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), False, True, False),
    "p_k3s2p1": ((2, 3, 9, 7), (3, 3), (2, 2), (1, 1), False, True, False),
    "p_ceil": ((1, 2, 7, 9), (3, 2), (2, 2), (1, 1), True, True, False),
    "p_ceil_excl": ((1, 2, 7, 9), (3, 2), (2, 2), (1, 1), True, False, False),
    "p_ceil_edge": ((1, 2, 5, 5), (2, 2), (2, 2), (1, 1), True, True, False),  # last-window rule drops one
    "p_cl": ((2, 4, 7, 6), (3, 3), (2, 1), (1, 1), True, False, True),
}
for name, (shape, k, s, p, ceil, incl, cl) in POOL.items():
    x = torch.randn(*shape)
    single("max" + name, x, lambda t: F.max_pool2d(t, k, s, p, ceil_mode=ceil), cl)
    single("avg" + name, x, lambda t: F.avg_pool2d(t, k, s, p, ceil_mode=ceil, count_include_pad=incl), cl)

# Adaptive average pooling: name -> (x shape, output size, channels_last)
ADAPT = {"a_down": ((2, 3, 7, 9), (3, 4), False), "a_global": ((2, 3, 5, 6), (1, 1), False),
         "a_up": ((1, 2, 3, 4), (5, 7), False), "a_cl": ((2, 3, 10, 7), (4, 3), True)}
for name, (shape, o, cl) in ADAPT.items():
    single(name, torch.randn(*shape), lambda t: F.adaptive_avg_pool2d(t, o), cl)

# Bilinear resize: name -> (x shape, output size, align_corners, channels_last)
RESIZE = {"r_up": ((2, 2, 4, 5), (9, 7), False, False), "r_up_ac": ((2, 2, 4, 5), (9, 7), True, False),
          "r_down": ((1, 3, 9, 8), (4, 3), False, False), "r_down_ac": ((1, 3, 9, 8), (4, 1), True, False),
          "r_cl": ((2, 3, 5, 6), (8, 4), False, True)}
for name, (shape, o, ac, cl) in RESIZE.items():
    single(name, torch.randn(*shape), lambda t: F.interpolate(t, size=o, mode="bilinear", align_corners=ac), cl)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
