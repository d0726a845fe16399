"""Golden values for cross-entropy, softmax / log_softmax along a middle axis and var, from PyTorch.

Run from the repository root with Debian's torch:  /usr/bin/python3 tests/golden/gen_loss.py
For each case it stores the inputs, a fixed upstream gradient `<case>.gout`, the output and the
input gradients (backward called with gout). Read by tests/test_golden_loss.c."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(1234)
out = {}


def run(name, fn, inputs):
    """inputs: dict of tensors; float ones get requires_grad. Stores inputs, gout, out, grads."""
    leaves = {}
    for k, v in inputs.items():
        v = v.clone()
        if v.is_floating_point():
            v.requires_grad_(True)
        leaves[k] = v
        out[f"{name}.{k}"] = v.detach()
    y = fn(**leaves)
    g = torch.randn_like(y)
    y.backward(g)
    out[f"{name}.gout"] = g
    out[f"{name}.out"] = y.detach()
    for k, v in leaves.items():
        if v.is_floating_point():
            out[f"{name}.grad_{k}"] = v.grad


# ---- cross-entropy, class-index targets ----
x = torch.randn(6, 5)
t = torch.randint(0, 5, (6,))
t[1] = -100
t[4] = -100
run("ce_mean", lambda x, t: F.cross_entropy(x, t), {"x": x, "t": t})
run("ce_ls_mean", lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), {"x": x, "t": t})
run("ce_ls_sum", lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, reduction="sum"), {"x": x, "t": t})
run("ce_none", lambda x, t: F.cross_entropy(x, t, reduction="none"), {"x": x, "t": t})

# (N, C, d1, d2) with a custom ignore_index, smoothing, i32 targets
x = torch.randn(3, 4, 5, 2)
t = torch.randint(0, 4, (3, 5, 2))
t[0, 1, 0] = 3
t[2, 4, 1] = 3
run("ce_nd", lambda x, t: F.cross_entropy(x, t.long(), ignore_index=3, label_smoothing=0.1),
    {"x": x, "t": t.to(torch.int32)})
run("ce_nd_none", lambda x, t: F.cross_entropy(x, t, reduction="none"), {"x": x, "t": torch.randint(0, 4, (3, 5, 2))})

# ---- cross-entropy, probability targets (gradients to logits and targets) ----
x = torch.randn(4, 6)
p = torch.softmax(torch.randn(4, 6), dim=1)
run("ce_soft", lambda x, p: F.cross_entropy(x, p, label_smoothing=0.1), {"x": x, "p": p})
x = torch.randn(2, 3, 4)
p = torch.softmax(torch.randn(2, 3, 4), dim=1)
run("ce_soft_nd_none", lambda x, p: F.cross_entropy(x, p, reduction="none"), {"x": x, "p": p})

# ---- softmax / log_softmax along a middle axis ----
x = torch.randn(2, 5, 3) * 3
run("softmax_mid", lambda x: torch.softmax(x, dim=1), {"x": x})
run("log_softmax_mid", lambda x: torch.log_softmax(x, dim=1), {"x": x})

# ---- var ----
x = torch.randn(3, 6, 4)
run("var_c0", lambda x: torch.var(x, dim=1, correction=0), {"x": x})
run("var_c1", lambda x: torch.var(x, dim=1, correction=1), {"x": x})
run("var_c1_02_keep", lambda x: torch.var(x, dim=(0, 2), correction=1, keepdim=True), {"x": x})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loss.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
