"""Golden optimizer trajectories from PyTorch: torch.optim.SGD / Adam / AdamW, and Composer's
DecoupledSGDW / DecoupledAdamW written out by hand below (composer is not installed; the formulas
follow composer/optim/decoupled_weight_decay.py: p *= 1 - (lr / initial_lr) * wd, then the
SGD / Adam update without weight decay in the gradient).

Run from the repository root with Debian's torch:  /usr/bin/python3 tests/golden/gen_optim.py
Two parameters p0 (4, 5) and p1 (7,), five steps with fixed gradients and a changing learning-rate
multiplier MULTS (a schedule: lr = base_lr * mult, set on every group before the step). Stores the
shared inputs ("init.p0", "grad.<k>.p0", ...), the parameters after each step
("<case>.step<k>.p0"), and the final optimizer state ("<case>.<key>.p0", key as in torch's
state_dict). Read by tests/test_golden_optim.c."""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(2024)
MULTS = [1.0, 0.5, 0.3, 0.9, 0.1]
STEPS = len(MULTS)
init = {"p0": torch.randn(4, 5), "p1": torch.randn(7)}
grads = [{"p0": torch.randn(4, 5), "p1": torch.randn(7)} for _ in range(STEPS)]
out = {f"init.{k}": v for k, v in init.items()}
for s, g in enumerate(grads):
    for k, v in g.items():
        out[f"grad.{s}.{k}"] = v


class DecoupledSGDW(torch.optim.SGD):
    """Composer's DecoupledSGDW, from its documented update rule."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        for g in self.param_groups:
            g["initial_lr"] = g["lr"]

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            lr, wd, mom, damp = g["lr"], g["weight_decay"], g["momentum"], g["dampening"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                st = self.state[p]
                if mom != 0:
                    if "momentum_buffer" not in st:
                        buf = torch.clone(d).detach()
                        st["momentum_buffer"] = buf
                    else:
                        buf = st["momentum_buffer"]
                        buf.mul_(mom).add_(d, alpha=1 - damp)
                    d = d.add(buf, alpha=mom) if g["nesterov"] else buf
                if wd != 0:
                    decay = (lr / g["initial_lr"]) if g["initial_lr"] else 1.0
                    p.mul_(1 - decay * wd)
                p.add_(d, alpha=-lr)


class DecoupledAdamW(torch.optim.AdamW):
    """Composer's DecoupledAdamW, from its documented update rule."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        for g in self.param_groups:
            g["initial_lr"] = g["lr"]

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            lr, wd, eps, ams = g["lr"], g["weight_decay"], g["eps"], g["amsgrad"]
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "step" not in st:
                    st["step"] = torch.zeros(())
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                    if ams:
                        st["max_exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                step = st["step"].item()
                if wd != 0:
                    decay = (lr / g["initial_lr"]) if g["initial_lr"] else 1.0
                    p.mul_(1 - decay * wd)
                bc1 = 1 - b1 ** step
                bc2 = 1 - b2 ** step
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                if ams:
                    torch.maximum(st["max_exp_avg_sq"], v, out=st["max_exp_avg_sq"])
                    denom = (st["max_exp_avg_sq"].sqrt() / math.sqrt(bc2)).add_(eps)
                else:
                    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
                p.addcdiv_(m, denom, value=-(lr / bc1))


# case name -> (optimizer class, [(param names, group kwargs)])
CASES = {
    "sgd_plain": (torch.optim.SGD, [(["p0", "p1"], dict(lr=0.1))]),
    "sgd_wd": (torch.optim.SGD, [(["p0", "p1"], dict(lr=0.1, weight_decay=0.01))]),
    "sgd_momentum": (torch.optim.SGD, [(["p0", "p1"], dict(lr=0.1, momentum=0.9))]),
    "sgd_dampening": (torch.optim.SGD, [(["p0", "p1"], dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01))]),
    "sgd_nesterov": (torch.optim.SGD, [(["p0", "p1"], dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01))]),
    "sgd_groups": (torch.optim.SGD, [(["p0"], dict(lr=0.1, momentum=0.9)),
                                     (["p1"], dict(lr=0.05, momentum=0.5, weight_decay=0.1))]),
    "adam": (torch.optim.Adam, [(["p0", "p1"], dict(lr=1e-2))]),
    "adam_wd": (torch.optim.Adam, [(["p0", "p1"], dict(lr=1e-2, weight_decay=0.1))]),
    "adam_amsgrad": (torch.optim.Adam, [(["p0", "p1"], dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.01,
                                                           amsgrad=True))]),
    "adamw": (torch.optim.AdamW, [(["p0", "p1"], dict(lr=1e-2, weight_decay=0.1))]),
    "adamw_amsgrad": (torch.optim.AdamW, [(["p0", "p1"], dict(lr=1e-2, weight_decay=0.1, amsgrad=True))]),
    "adamw_groups": (torch.optim.AdamW, [(["p0"], dict(lr=1e-2, weight_decay=0.1)),
                                         (["p1"], dict(lr=3e-3, weight_decay=0.0, eps=1e-3))]),
    "decoupled_sgdw": (DecoupledSGDW, [(["p0", "p1"], dict(lr=0.1, momentum=0.9, weight_decay=0.01))]),
    "decoupled_sgdw_nesterov": (DecoupledSGDW, [(["p0", "p1"], dict(lr=0.1, momentum=0.9, nesterov=True,
                                                                   weight_decay=0.05))]),
    "decoupled_adamw": (DecoupledAdamW, [(["p0", "p1"], dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01))]),
    "decoupled_adamw_amsgrad": (DecoupledAdamW, [(["p0", "p1"], dict(lr=1e-2, betas=(0.9, 0.95),
                                                                     weight_decay=0.05, amsgrad=True))]),
}

for case, (cls, groups) in CASES.items():
    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    opt = cls([dict(params=[params[n] for n in names], **kw) for names, kw in groups])
    base = [g["lr"] for g in opt.param_groups]
    for s in range(STEPS):
        for k, p in params.items():
            p.grad = grads[s][k].clone()
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * MULTS[s]
        opt.step()
        for k, p in params.items():
            out[f"{case}.step{s + 1}.{k}"] = p.detach().clone()
    for k, p in params.items():
        for key, val in opt.state[p].items():
            if key != "step" and torch.is_tensor(val):
                out[f"{case}.{key}.{k}"] = val.detach().clone()

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
