"""Golden values for Composer's data methods (include/composer/data_algos.h), from PyTorch.

Run from the repository root with Debian's torch:  /usr/bin/python3 tests/golden/gen_data_algos.py
Composer itself is not installed here, so the functions below restate Composer's code (composer/
algorithms/{mixup,cutmix,label_smoothing,progressive_resizing,selective_backprop,
seq_length_warmup}) line for line on torch tensors; the random draws (permutation, mixing, box,
uniforms) are fixed and stored, so the C side applies the same ones. Read by
tests/test_data_algos.c."""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(20240613)
out = {}


def f64(values):
    """Doubles stored exactly as their bit patterns (I64): the golden reader has no F64."""
    return torch.tensor(values, dtype=torch.float64).view(torch.int64)


def one_hot(y, C):
    return F.one_hot(y.long(), C).float()


# ---- MixUp: composer.functional.mixup_batch with given mixing and indices ----
x = torch.randn(6, 3, 4, 5)
y = torch.randint(0, 10, (6,))
perm = torch.randperm(6)
mixing = 0.3
x_mix = (1 - mixing) * x + mixing * x[perm]
y_mix = (1 - mixing) * one_hot(y, 10) + mixing * one_hot(y[perm], 10)
logits = torch.randn(6, 10)
out.update({"mixup.x": x, "mixup.y": y, "mixup.perm": perm, "mixup.mixing": f64([mixing]),
            "mixup.x_mix": x_mix, "mixup.y_mix": y_mix, "mixup.logits": logits,
            # the loss on mixed targets, and MixUp's interpolated loss
            "mixup.loss_targets": F.cross_entropy(logits, y_mix).reshape(1),
            "mixup.loss_interp": ((1 - mixing) * F.cross_entropy(logits, y) +
                                  mixing * F.cross_entropy(logits, y[perm])).reshape(1)})

# ---- CutMix: composer.functional.cutmix_batch with given bbox and indices ----
def adjust_lambda(x, bbox):
    rx, ry, rw, rh = bbox
    return 1 - ((rw - rx) * (rh - ry) / (x.size()[-1] * x.size()[-2]))


x = torch.randn(5, 2, 7, 9)
y = torch.randint(0, 4, (5,))
perm = torch.randperm(5)
# boxes as _rand_bbox returns them (x along dim 2): inside, touching the corner, and empty
boxes = [(1, 2, 5, 8), (0, 0, 3, 9), (4, 4, 4, 7)]
for i, bbox in enumerate(boxes):
    rx, ry, rw, rh = bbox
    xc = torch.clone(x)
    xc[:, :, rx:rw, ry:rh] = xc[perm, :, rx:rw, ry:rh]
    lam = adjust_lambda(x, bbox)
    out[f"cutmix{i}.bbox"] = torch.tensor(bbox, dtype=torch.int64)
    out[f"cutmix{i}.x_cut"] = xc
    out[f"cutmix{i}.lambda"] = f64([lam])
    out[f"cutmix{i}.y_cut"] = lam * one_hot(y, 4) + (1 - lam) * one_hot(y[perm], 4)
out.update({"cutmix.x": x, "cutmix.y": y, "cutmix.perm": perm})

# ---- LabelSmoothing: composer.functional.smooth_labels ----
def smooth_labels(logits, target, smoothing=0.1):
    if target.dim() == 1:  # ensure_targets_one_hot
        target = one_hot(target, logits.shape[1])
    n_classes = logits.shape[1]
    return (target * (1. - smoothing)) + (smoothing / n_classes)


logits = torch.randn(7, 5)
y = torch.randint(0, 5, (7,))
soft = torch.softmax(torch.randn(7, 5), dim=1)
out.update({"ls.logits": logits, "ls.y": y, "ls.soft": soft,
            "ls.smooth_index": smooth_labels(logits, y, 0.1),
            "ls.smooth_dense": smooth_labels(logits, soft, 0.25),
            "ls.loss": F.cross_entropy(logits, smooth_labels(logits, y, 0.1)).reshape(1)})

# ---- ProgressiveResizing ----
def pr_scale(elapsed, initial_scale=.5, finetune_fraction=.2, delay_fraction=.5):
    if elapsed >= delay_fraction:
        scale_frac_elapsed = min([(elapsed - delay_fraction) / (1 - finetune_fraction - delay_fraction), 1])
    else:
        scale_frac_elapsed = 0.0
    return initial_scale + (1 - initial_scale) * scale_frac_elapsed


def pinned(scale, width, inc):
    return round(width * scale / inc) * inc / width


elapsed = [0.0, 0.3, 0.5, 0.55, 0.6, 0.71, 0.8, 0.95]
out["pr.elapsed"] = f64(elapsed)
out["pr.scale"] = f64([pr_scale(e) for e in elapsed])
out["pr.scale_alt"] = f64([pr_scale(e, 0.25, 0.1, 0.2) for e in elapsed])
pins = [(0.5, 28, 4), (0.5, 36, 4), (0.3, 28, 4), (0.62, 32, 8), (0.45, 32, 1), (0.7, 224, 32)]
out["pr.pin_in"] = f64(pins)
out["pr.pin_out"] = f64([pinned(*p) for p in pins])
for name, shape, s in [("a", (2, 3, 28, 28), pinned(0.5, 28, 4)), ("b", (2, 3, 28, 28), pinned(0.3, 28, 4)),
                       ("c", (1, 2, 32, 32), 0.75), ("d", (2, 1, 13, 11), 0.45),
                       # torch's index floorf(9·(float)(28/18)) = 14 where 9/(18/28) in double gives 13
                       ("e", (1, 1, 28, 28), 18 / 28)]:
    x = torch.randn(*shape)
    t = torch.randint(0, 7, (shape[0], shape[2], shape[3]))
    xs = F.interpolate(x, scale_factor=s, mode='nearest', recompute_scale_factor=False)
    # resize_targets with class-index targets: float, unsqueeze, resize, squeeze, back to int
    ts = F.interpolate(t.float().unsqueeze(1), scale_factor=s, mode='nearest',
                       recompute_scale_factor=False).squeeze(1).to(t.dtype)
    out.update({f"pr_{name}.x": x, f"pr_{name}.t": t, f"pr_{name}.scale": f64([s]),
                f"pr_{name}.x_resized": xs, f"pr_{name}.t_resized": ts})

# ---- SelectiveBackprop ----
def should_sb(current_duration, batch_idx, start=0.5, end=0.9, interrupt=2):
    is_interval = ((current_duration >= start) and (current_duration < end))
    is_step = ((interrupt == 0) or ((batch_idx + 1) % interrupt != 0))
    return is_interval and is_step


grid = []
for d in [0.0, 0.49, 0.5, 0.7, 0.899, 0.9, 1.0]:
    for b in range(4):
        for it in [0, 1, 2, 3]:
            grid.append([d, b, it, 1.0 if should_sb(d, b, 0.5, 0.9, it) else 0.0])
out["sb.should"] = f64(grid)


def select(losses, keep, u):
    """select_using_loss's selection: argsort, probs, then numpy.random.choice(N, k, replace=False, p)
    drawn one at a time with the given uniforms (each draw: cdf = cumsum(p) / cdf[-1];
    searchsorted(cdf, u, 'right'); p of the chosen set to 0)."""
    N = losses.shape[0]
    sorted_idx = torch.argsort(losses)
    n_select = int(keep * N)
    percs = np.arange(0.5, N, 1) / N
    probs = percs**((1.0 / keep) - 1.0)
    probs = probs / np.sum(probs)
    p = probs.copy()
    chosen = []
    for j in range(n_select):
        cdf = np.cumsum(p)
        cdf /= cdf[-1]
        i = int(cdf.searchsorted(u[j], side='right'))
        chosen.append(i)
        p[i] = 0
    return sorted_idx[torch.tensor(chosen, dtype=torch.int64)]


logits = torch.randn(12, 6)
y = torch.randint(0, 6, (12,))
losses = F.cross_entropy(logits, y, reduction='none')
out.update({"sb.logits": logits, "sb.y": y, "sb.losses": losses})
for keep in [0.5, 0.25, 0.9]:
    k = int(keep * 12)
    u = torch.rand(k, dtype=torch.float64)
    out[f"sb_keep{int(keep * 100)}.u"] = u.view(torch.int64)
    out[f"sb_keep{int(keep * 100)}.select"] = select(losses, keep, u.numpy())
for name, shape, s in [("a", (2, 3, 13, 11), 0.5), ("b", (1, 2, 16, 16), 0.7), ("c", (2, 1, 9, 20), 0.35)]:
    x = torch.randn(*shape)
    out[f"sb_interp_{name}.x"] = x
    out[f"sb_interp_{name}.scale"] = f64([s])
    out[f"sb_interp_{name}.out"] = F.interpolate(x, scale_factor=s, mode='bilinear', align_corners=False,
                                                 recompute_scale_factor=False)

# ---- SeqLengthWarmup: set_batch_sequence_length ----
def set_batch_sequence_length(batch, curr_seq_len, truncate=True, preserve_end_of_sequence=False):
    batch = {k: v.clone() for k, v in batch.items()}
    batch_seq_len = 0
    for batch_tensor in batch.values():
        tensor_shape = batch_tensor.shape
        if len(tensor_shape) > 1:
            batch_seq_len = tensor_shape[1]
            break
    if curr_seq_len >= batch_seq_len:
        return batch
    if truncate:
        if preserve_end_of_sequence:
            r_idx = torch.arange(batch['attention_mask'].shape[0])
            eos_idx = batch['attention_mask'].sum(dim=1).long() - 1
            eos_idx_truncated = eos_idx.clamp(max=curr_seq_len - 1)
            for k in batch.keys():
                eos_value = batch[k][r_idx, eos_idx]
                batch[k] = batch[k][:, :curr_seq_len].contiguous()
                batch[k][r_idx, eos_idx_truncated] = eos_value
        else:
            for k in batch.keys():
                batch[k] = batch[k][:, :curr_seq_len].contiguous()
    else:
        input_ids_shape = batch['input_ids'].shape
        input_ids = batch['input_ids'].view(-1)
        tensor_len = (input_ids.shape[0] // curr_seq_len) * curr_seq_len
        input_ids = input_ids[:tensor_len]
        input_ids = input_ids.view(-1, curr_seq_len)
        batch['input_ids'] = input_ids
        for k, v in batch.items():
            if k == 'input_ids':
                continue
            v = v.view(-1)
            v = v[:tensor_len]
            batch[k] = v.view(-1, curr_seq_len)
    return batch


ids = torch.randint(0, 100, (3, 10), dtype=torch.int32)
mask = torch.ones(3, 10, dtype=torch.int32)
mask[0, 7:] = 0   # row 0 ends at 6
mask[1, 2:] = 0   # row 1 ends at 1, inside the cut
labels = torch.randint(0, 100, (3, 10), dtype=torch.int64)
batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
out.update({"slw.input_ids": ids, "slw.attention_mask": mask, "slw.labels": labels})
for name, L, trunc, pres in [("trunc4", 4, True, False), ("pres4", 4, True, True), ("reshape4", 4, False, False),
                             ("reshape3", 3, False, False), ("long", 12, True, False)]:
    b = set_batch_sequence_length(batch, L, trunc, pres)
    for k, v in b.items():
        out[f"slw_{name}.{k}"] = v


def slw_length(batch, total, duration=0.3, min_seq_length=8, max_seq_length=1024, step_size=8):
    num_warmup_steps = int(total * duration)
    num_update_steps = (max_seq_length - min_seq_length) // step_size
    update_every_n_steps = num_warmup_steps // num_update_steps
    curr = step_size * (int(batch) // update_every_n_steps) + min_seq_length
    return min(max(curr, min_seq_length), max_seq_length)


sched = []
for total, dur, mn, mx, st in [(1000, 0.3, 8, 64, 8), (10000, 0.3, 8, 1024, 8), (500, 0.5, 16, 128, 16)]:
    for b in [0, 1, 10, 37, 42, 100, 149, 150, 299, 300, 2999, 9999]:
        sched.append([total, dur, mn, mx, st, b, slw_length(b, total, dur, mn, mx, st)])
out["slw.schedule"] = f64(sched)

stwrite.save(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data_algos.safetensors"), out,
             {"generator": "gen_data_algos.py", "torch": torch.__version__})
print("wrote", len(out), "tensors")
