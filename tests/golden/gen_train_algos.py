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
  lf.*    LayerFreezing: "lf.schedule" rows (current_duration, freeze_start, freeze_level, fraction,
          depth of 3 layers, depth of 16 layers) from _freeze_schedule and freeze_layers' int();
          a trajectory of an nn.Sequential(Linear(4, 6), ReLU, Linear(6, 5), ReLU, Linear(5, 3))
          under AdamW and under SGD with momentum ("lf.<opt>.init.<name>", "lf.grad<k>.<name>",
          "lf.<opt>.final.<name>"): 5 steps with fixed gradients, freeze_layers(current_duration
          0.75, freeze_start 0.5, freeze_level 1.0) before step 2 — layer "0" is frozen, loses its
          gradient and leaves the optimizer's group.
  sam.*   SAM: Composer's SAMOptimizer (verbatim) over SGD(lr 0.1, momentum 0.9, weight_decay 1e-3) on
          nn.Sequential(Linear(6, 8), ReLU, Linear(8, 3)) with a fixed batch ("sam.x" (8, 6),
          "sam.y" (8,)) and mean cross-entropy; "sam.init.<name>", and "sam.i<interval>.step<k>.<name>"
          after step k (k = 1..4) for interval 1 and 2; "sam.i1.loss<k>" the loss each step returns.
  swa.*   SWA: torch.optim.swa_utils.AveragedModel.update_parameters over a trajectory of the Small
          model's parameters ("swa.w<k>.<name>" the model at update k, "swa.avg<k>.<name>" the average
          after it, k = 0..5); SWALR's learning rates ("swa.lr.<strategy>.a<anneal_epochs>": the lr after
          0..14 scheduler steps, from lr 0.1 toward swa_lr 0.01).
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


# ---- LayerFreezing: Composer's functions, verbatim ----
def _freeze_schedule(current_duration, freeze_start, freeze_level):
    if current_duration <= freeze_start:
        return 0.0
    total_freezing_time = 1.0 - freeze_start
    freezing_time_elapsed = current_duration - freeze_start
    freezing_time_elapsed_frac = freezing_time_elapsed / total_freezing_time
    return freeze_level * freezing_time_elapsed_frac


def _get_layers(module, flat_children):
    if (len(list(module.children())) == 0 and len(list(module.parameters())) > 0):
        flat_children.append(module)
    else:
        for child in module.children():
            _get_layers(child, flat_children)


def _remove_param_from_optimizers(p, optimizers):
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group['params'] = list(filter(lambda x: id(x) != id(p), group['params']))


def freeze_layers(model, optimizers, current_duration, freeze_start=0.5, freeze_level=1.0):
    flat_children = []
    _get_layers(model, flat_children)
    freeze_percentage = _freeze_schedule(current_duration=current_duration, freeze_start=freeze_start,
                                         freeze_level=freeze_level)
    freeze_depth = int(freeze_percentage * len(flat_children[0:-1]))
    for i, child in enumerate(flat_children[0:-1]):
        if i < freeze_depth:
            for p in child.parameters():
                _remove_param_from_optimizers(p, optimizers)
                p.requires_grad = False
    return freeze_depth, freeze_percentage


rows = []
for cur in [0.0, 0.25, 0.5, 0.5000001, 0.6, 0.75, 0.9, 1.0]:
    for start in [0.0, 0.5, 0.9]:
        for level in [1.0, 0.5, 0.3]:
            f = _freeze_schedule(cur, start, level)
            rows.append([cur, start, level, f, int(f * 2), int(f * 15)])
out["lf.schedule"] = torch.tensor(rows, dtype=torch.float32)
out["lf.schedule_depths"] = torch.tensor([[r[4], r[5]] for r in rows], dtype=torch.int64)

LF_STEPS = 5
lf_init = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 5), torch.nn.ReLU(),
                              torch.nn.Linear(5, 3))
lf_grads = [{n: torch.randn_like(p) for n, p in lf_init.named_parameters()} for _ in range(LF_STEPS)]
for k in range(LF_STEPS):
    for n, g in lf_grads[k].items():
        out[f"lf.grad{k}.{n}"] = g
for name, make in [("adamw", lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1)),
                   ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.05))]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 5), torch.nn.ReLU(),
                                torch.nn.Linear(5, 3))
    model.load_state_dict(lf_init.state_dict())
    for n, p in model.named_parameters():
        out[f"lf.{name}.init.{n}"] = p.detach().clone()
    opt = make(model.parameters())
    for k in range(LF_STEPS):
        if k == 2:
            depth, pct = freeze_layers(model, [opt], current_duration=0.75, freeze_start=0.5, freeze_level=1.0)
            assert depth == 1 and pct == 0.5
        for n, p in model.named_parameters():
            p.grad = lf_grads[k][n].clone() if p.requires_grad else None  # frozen: backward gives none
        opt.step()
    for n, p in model.named_parameters():
        out[f"lf.{name}.final.{n}"] = p.detach().clone()


# ---- SAM: Composer's SAMOptimizer, verbatim but for the trainer plumbing (ddp_sync, loss_dict) ----
class SAMOptimizer(torch.optim.Optimizer):
    def __init__(self, base_optimizer, rho=0.05, epsilon=1.0e-12, interval=1, **kwargs):
        if rho < 0:
            raise ValueError(f'Invalid rho, should be non-negative: {rho}')
        self.base_optimizer = base_optimizer
        self.global_step = 0
        self.interval = interval
        defaults = {'rho': rho, 'epsilon': epsilon, **kwargs}
        super(SAMOptimizer, self).__init__(self.base_optimizer.param_groups, defaults)

    @torch.no_grad()
    def sub_e_w(self):
        for group in self.param_groups:
            for p in group['params']:
                if 'e_w' not in self.state[p]:
                    continue
                e_w = self.state[p]['e_w']
                p.sub_(e_w)

    @torch.no_grad()
    def first_step(self):
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group['rho'] / (grad_norm + group['epsilon'])
            for p in group['params']:
                if p.grad is None:
                    continue
                e_w = p.grad * scale.to(p)
                p.add_(e_w)
                self.state[p]['e_w'] = e_w

    @torch.no_grad()
    def second_step(self):
        for group in self.param_groups:
            for p in group['params']:
                if p.grad is None or 'e_w' not in self.state[p]:
                    continue
                p.sub_(self.state[p]['e_w'])
        self.base_optimizer.step()

    @torch.no_grad()
    def step(self, closure=None):
        closure = torch.enable_grad()(closure)
        loss = None
        if (self.global_step + 1) % self.interval == 0:
            loss = closure()
            if loss:
                self.first_step()
                if closure():
                    self.second_step()
                else:
                    self.sub_e_w()
        else:
            loss = closure()
            if loss:
                self.base_optimizer.step()
        self.global_step += 1
        return loss

    def _grad_norm(self):
        norm = torch.norm(torch.stack([p.grad.norm(p=2) for group in self.param_groups for p in group['params']
                                       if p.grad is not None]), p='fro')
        return norm


sam_init = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
for n, p in sam_init.named_parameters():
    out[f"sam.init.{n}"] = p.detach().clone()
sam_x = torch.randn(8, 6)
sam_y = torch.randint(0, 3, (8,))
out["sam.x"] = sam_x
out["sam.y"] = sam_y
for interval in (1, 2):
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model.load_state_dict(sam_init.state_dict())
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    opt = SAMOptimizer(base, rho=0.5, epsilon=1.0e-12, interval=interval)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(sam_x), sam_y)
        loss.backward()
        return loss.item()

    for k in range(1, 5):
        loss = opt.step(closure)
        if interval == 1:
            out[f"sam.i1.loss{k}"] = torch.tensor([loss], dtype=torch.float32)
        for n, p in model.named_parameters():
            out[f"sam.i{interval}.step{k}.{n}"] = p.detach().clone()


# ---- SWA: torch's AveragedModel and SWALR (what Composer's SWA wraps) ----
from torch.optim.swa_utils import SWALR, AveragedModel  # noqa: E402

model = Small()
averaged = AveragedModel(model)
for k in range(6):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (1 + k))
    for name, t in model.named_parameters():
        out[f"swa.w{k}.{name}"] = t.detach().clone()
    averaged.update_parameters(model)
    for name, t in averaged.module.named_parameters():
        out[f"swa.avg{k}.{name}"] = t.detach().clone()
for strategy in ("linear", "cos"):
    for anneal in (0, 1, 4):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        sched = SWALR(opt, swa_lr=0.01, anneal_epochs=anneal, anneal_strategy=strategy)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(14):
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        out[f"swa.lr.{strategy}.a{anneal}"] = torch.tensor(lrs, dtype=torch.float64).float()

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_algos.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
