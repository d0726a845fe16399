"""Golden values for the training methods (EMA, SWA, SAM, LayerFreezing) from Debian's PyTorch.
Composer is not installed: each method's math is written out below from Composer's source
(composer/algorithms/<name>/<name>.py) in the torch operations Composer uses, so the values are
what Composer computes.

Run from the repository root with Debian's torch:  /usr/bin/python3 tests/golden/gen_train_algos.py
Read by tests/test_train_algos.c. Keys:
  ema.*   compute_ema over a short trajectory of a small model's state (a Linear and a BatchNorm2d,
          with running statistics and num_batches_tracked): "ema.w<k>.<name>" is the model's state
          at step k, "ema.avg<k>.<name>" the EMA model's state after compute_ema at step k
          (smoothing 2^(-1/3), Composer's half_life 3ba), starting from a copy of w0.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(1919)
out = {}


# ---- EMA: Composer's compute_ema with an nn.Module ema_model, verbatim ----
def compute_ema(model, ema_model, smoothing=0.99):
    with torch.no_grad():
        ema_params = ema_model.state_dict()
        for name, param in list(model.named_parameters()) + list(model.named_buffers()):
            if name in ema_params:
                ema_params[name].copy_(ema_params[name] * smoothing + param.data * (1. - smoothing))


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 3)
        self.bn = torch.nn.BatchNorm2d(4)


STEPS = 5
model = Small()
ema = Small()
smoothing = 2 ** (-(1 / 3))
states = []
for k in range(STEPS + 1):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
        model.bn.running_mean.copy_(torch.randn(4))
        model.bn.running_var.copy_(torch.rand(4) + 0.5)
        model.bn.num_batches_tracked.fill_(3 * k + 1)
    for name, t in model.state_dict().items():
        out[f"ema.w{k}.{name}"] = t.clone()
    if k == 0:
        ema.load_state_dict(model.state_dict())
        continue
    compute_ema(model, ema, smoothing)
    for name, t in ema.state_dict().items():
        out[f"ema.avg{k}.{name}"] = t.clone()

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_algos.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
