"""Golden values for a short GPT-2 training run (tests/test_golden_train_gpt2.c), from PyTorch on CPU.

A tiny GPT-2 (V 64, P 16, C 32, L 2, H 4, no dropout; the model code of gen_gpt2.py, Hugging Face's
GPT2LMHeadModel names and math, lm_head tied to wte) is trained 5 steps from fixed initial weights on
5 fixed batches of 4 windows of 16 tokens, as the C trainer does it:

- loss: mean cross-entropy over the positions whose label is not -100 (labels are next-token
  targets, already shifted, as the C token-file dataset gives them);
- gradient clipping by global norm 1.0 (torch.nn.utils.clip_grad_norm_, Composer's GradientClipping);
- torch.optim.AdamW(lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1) with two groups: the
  parameters with >= 2 dims (wte, wpe and the Conv1D weights) decay; those with < 2 dims (biases,
  LayerNorm weights and biases) do not — the C library's default no_decay flag (nn.h:
  cm_param_info.no_decay is set on every parameter with fewer than 2 dims);
- the learning rate of step k (k = 0..4, the number of batches already trained) is
  1e-2 * f(k) with f Composer's CosineAnnealingWithWarmupScheduler(t_warmup=2ba, t_max=1dur=5ba,
  alpha_f=0.1) evaluated AT batch k (optim.h's convention: set lr = base_lr * f(k), then
  optimizer.step() for batch k). Composer / LambdaLR evaluate it one batch late (batch k uses
  f(k-1)); the C library does not, and this reference follows the C library.

Two runs from the same weights and token windows:
- "plain": every label counts;
- "masked": some labels are -100, a different number in each row, so microbatches hold different
  numbers of loss-generating tokens (the C test checks accumulate_train_batch_on_tokens on it).

Writes tests/golden/train_gpt2.safetensors:
  input_ids (5, 4, 16) i64, labels (5, 4, 16) i64, labels_masked (5, 4, 16) i64 (-100 = ignored),
  init.<name>            the initial parameters (HF names, no lm_head.weight: it is wte),
  lr (5,) f32            the learning rate of each step,
  <run>.loss (5,) f32    the batch loss before each step,
  <run>.grad_norm (5,)   f32, the global gradient norm before clipping (clip_grad_norm_'s return),
  <run>.final.<name>     the parameters after the 5th step,  for run in {plain, masked}.

Run from the repo root: /usr/bin/python3 tests/golden/gen_train_gpt2.py
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import gen_gpt2  # noqa: E402  (the model classes read the module's size constants when built)
import stwrite  # noqa: E402

V, P, C, L, H = 64, 16, 32, 2, 4
gen_gpt2.V, gen_gpt2.P, gen_gpt2.C, gen_gpt2.L, gen_gpt2.H = V, P, C, L, H
N_STEPS, B, T = 5, 4, 16
BASE_LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
T_WARMUP, T_MAX, ALPHA_F = 2, N_STEPS, 0.1


def lr_multiplier(k):
    """optim.h COSINE_ANNEALING_WITH_WARMUP at t = k batches (t_warmup 2ba, t_max 5ba, alpha_f 0.1)."""
    if k < T_WARMUP:
        return k / T_WARMUP
    tau = min(max((k - T_WARMUP) / (T_MAX - T_WARMUP), 0.0), 1.0) if T_MAX > T_WARMUP else 0.0
    return ALPHA_F + (1.0 - ALPHA_F) * (1.0 + math.cos(math.pi * tau)) / 2.0


def make_model():
    torch.manual_seed(1234)
    m = gen_gpt2.GPT2LMHeadModel()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.split(".")[-2].startswith("ln_"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.05 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return m


def make_data():
    """A token stream with structure to learn (a noisy repeating pattern), cut into windows of T+1."""
    g = torch.Generator().manual_seed(77)
    n = N_STEPS * B * T + 1
    pattern = torch.randint(0, V, (11,), generator=g)
    stream = pattern.repeat(n // 11 + 1)[:n].clone()
    noise = torch.rand(n, generator=g) < 0.25
    stream[noise] = torch.randint(0, V, (int(noise.sum()),), generator=g)
    ids = torch.stack([stream[i * T:i * T + T] for i in range(N_STEPS * B)]).view(N_STEPS, B, T)
    labels = torch.stack([stream[i * T + 1:i * T + T + 1] for i in range(N_STEPS * B)]).view(N_STEPS, B, T)
    masked = labels.clone()
    # row r of every batch ignores a different number of positions (0, 3, 9, 14 + the step's offset),
    # at different places, so microbatches of 3 + 1 rows hold very different token counts
    for s in range(N_STEPS):
        for r, n_ign in enumerate((0, 3 + s % 2, 9, 14 - s % 3)):
            start = (5 * r + 3 * s) % (T - n_ign + 1)
            masked[s, r, start:start + n_ign] = -100
    return ids, labels, masked


def train(m, ids, labels):
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in m.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=BASE_LR, betas=BETAS, eps=EPS)
    losses, norms = [], []
    for k in range(N_STEPS):
        for grp in opt.param_groups:
            grp["lr"] = BASE_LR * lr_multiplier(k)  # evaluated at the batch being trained (see above)
        opt.zero_grad()
        logits = m(ids[k])
        loss = F.cross_entropy(logits.view(-1, V), labels[k].reshape(-1), ignore_index=-100)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP).item())
        opt.step()
        losses.append(loss.item())
    return losses, norms


def main():
    ids, labels, masked = make_data()
    out = {"input_ids": ids, "labels": labels, "labels_masked": masked,
           "lr": torch.tensor([BASE_LR * lr_multiplier(k) for k in range(N_STEPS)], dtype=torch.float32)}
    m = make_model()
    for name, p in m.named_parameters():
        out["init." + name] = p.detach().clone()
    for run, lab in (("plain", labels), ("masked", masked)):
        m = make_model()
        losses, norms = train(m, ids, lab)
        out[run + ".loss"] = torch.tensor(losses, dtype=torch.float32)
        out[run + ".grad_norm"] = torch.tensor(norms, dtype=torch.float32)
        for name, p in m.named_parameters():
            out[run + ".final." + name] = p.detach().clone()
        print(run, "losses", ["%.6f" % x for x in losses], "grad norms", ["%.4f" % x for x in norms])
    path = os.path.join(here, "train_gpt2.safetensors")
    stwrite.save(path, out, {"format": "pt"})
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
