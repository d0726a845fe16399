"""Golden values for the GPT-2 zoo model (tests/test_golden_gpt2.c), from PyTorch on CPU.

A minimal GPT-2 written with plain torch, with Hugging Face's GPT2LMHeadModel module names and math
(transformers is not needed): Conv1D projections with (in, out) weights, pre-LN blocks, causal
scaled-dot-product attention, tanh GELU ("gelu_new"), final LayerNorm, lm_head tied to wte. The
attention blocks carry HF's causal-mask buffers attn.bias (bool, (1, 1, P, P)) and attn.masked_bias,
so the weight file looks like a Hugging Face state_dict (including the tied lm_head.weight).

Writes two files next to this script:
- gpt2_tiny_hf.safetensors: the weights, state_dict() of the tiny model (the C test loads it);
- gpt2.safetensors: input_ids, labels (some -100), logits, loss and "grad.<name>" for every
  parameter (the gradient of wte includes the tied lm_head's part).

Run from the repo root: /usr/bin/python3 tests/golden/gen_gpt2.py
Check a file written by cm_gpt2_save_safetensors loads into PyTorch and gives the golden logits:
  /usr/bin/python3 tests/golden/gen_gpt2.py --verify path/to/saved.safetensors
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import stwrite  # noqa: E402

V, P, C, L, H = 96, 32, 32, 2, 4
B, T = 2, 20


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight (in, out), y = x @ W + b."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class GPT2Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((P, P), dtype=torch.bool)).view(1, 1, P, P))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.c_attn, self.c_proj = Conv1D(3 * C, C), Conv1D(C, C)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        w = q @ k.transpose(-1, -2) / math.sqrt(C // H)
        w = torch.where(self.bias[:, :, :t, :t], w, torch.tensor(torch.finfo(w.dtype).min))
        y = w.softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class GPT2MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(4 * C, C), Conv1D(C, 4 * C)

    def forward(self, x):
        h = self.c_fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))  # gelu_new
        return self.c_proj(h)


class GPT2Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C, eps=1e-5), GPT2Attention()
        self.ln_2, self.mlp = nn.LayerNorm(C, eps=1e-5), GPT2MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(P, C)
        self.h = nn.ModuleList([GPT2Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = GPT2Model()
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, ids):
        return self.lm_head(self.transformer(ids))


def read_safetensors(path):
    """A minimal reader (F32 tensors only; others skipped) -> dict name -> torch.Tensor."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] != "F32":
            continue
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").copy().reshape(e["shape"]))
    return out


def make():
    torch.manual_seed(2024)
    m = GPT2LMHeadModel()
    # larger than GPT-2's 0.02 init so every path moves the logits
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.split(".")[-2].startswith("ln_"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    ids = torch.randint(0, V, (B, T))
    labels = torch.randint(0, V, (B, T))
    labels[0, 3] = labels[0, 4] = labels[1, T - 1] = -100
    return m, ids, labels


def main():
    m, ids, labels = make()
    if len(sys.argv) == 3 and sys.argv[1] == "--verify":
        state = read_safetensors(sys.argv[2])
        ref = {k: v for k, v in m.state_dict().items() if k != "lm_head.weight" and not k.endswith(".attn.bias")
               and not k.endswith("masked_bias")}
        missing, unexpected = sorted(set(ref) - set(state)), sorted(set(state) - set(ref))
        assert not missing and not unexpected, f"missing {missing}, unexpected {unexpected}"
        res = m.load_state_dict(state, strict=False)
        assert sorted(res.missing_keys) == sorted(k for k in m.state_dict() if k not in state), res
        golden = read_safetensors(os.path.join(here, "gpt2.safetensors"))
        err = (m(ids) - golden["logits"]).abs().max().item()
        print(f"verify: {len(state)} tensors loaded, max |logits - golden| = {err:.3g}")
        assert err < 1e-5
        return
    logits = m(ids)
    loss = F.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100)
    loss.backward()
    stwrite.save(os.path.join(here, "gpt2_tiny_hf.safetensors"), m.state_dict(), {"format": "pt"})
    out = {"input_ids": ids, "labels": labels, "logits": logits, "loss": loss.reshape(1)}
    for name, p in m.named_parameters():
        out["grad." + name] = p.grad
    path = os.path.join(here, "gpt2.safetensors")
    stwrite.save(path, out)
    print("wrote", path, os.path.getsize(path), "bytes; loss", loss.item())


if __name__ == "__main__":
    main()
