"""Golden values for the transformer blocks (tests/test_layers.c), from PyTorch on CPU.

A GPT-2 block (pre-LN, Conv1D projections with (in, out) weights, tanh GELU, causal) and a BERT layer
(post-LN, exact GELU, padding mask), written with plain torch to match Hugging Face's modules and
parameter names (transformers is not needed). Each stores its parameters under "<tag>.<HF name>", the
input x, a fixed upstream gradient gout, the output y, dx and every parameter gradient as
"<tag>.grad.<HF name>". Dropout is off. Run from the repo root: /usr/bin/python3 tests/golden/gen_blocks.py
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(4321)
out = {}


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight (in, out), y = x @ W + b."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


def attend(q, k, v, H, causal, add_mask=None):
    B, T, C = q.shape
    D = C // H
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    if add_mask is not None:
        s = s + add_mask
    y = s.softmax(-1) @ v
    return y.transpose(1, 2).reshape(B, T, C)


class GPT2Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.c_attn, self.c_proj = Conv1D(3 * C, C), Conv1D(C, C)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=2)
        return self.c_proj(attend(q, k, v, self.H, True))


class GPT2MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(4 * C, C), Conv1D(C, 4 * C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C, eps=1e-5), GPT2Attention(C, H)
        self.ln_2, self.mlp = nn.LayerNorm(C, eps=1e-5), GPT2MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class BertSelfAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.query, self.key, self.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x, add_mask):
        return attend(self.query(x), self.key(x), self.value(x), self.H, False, add_mask)


class BertOut(nn.Module):
    def __init__(self, i, C):
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(i, C), nn.LayerNorm(C, eps=1e-12)

    def forward(self, h, res):
        return self.LayerNorm(self.dense(h) + res)


class BertAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.self, self.output = BertSelfAttention(C, H), BertOut(C, C)

    def forward(self, x, add_mask):
        return self.output(self.self(x, add_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.dense = nn.Linear(C, 4 * C)

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.attention, self.intermediate, self.output = BertAttention(C, H), BertIntermediate(C), BertOut(4 * C, C)

    def forward(self, x, add_mask):
        h = self.attention(x, add_mask)
        return self.output(self.intermediate(h), h)


def randomise(m):
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("LayerNorm.weight") or name.split(".")[-2].startswith("ln_"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))


def record(tag, m, x, y, gout, extra):
    y.backward(gout)
    out.update({f"{tag}.x": x, f"{tag}.gout": gout, f"{tag}.y": y, f"{tag}.dx": x.grad})
    for name, p in m.named_parameters():
        out[f"{tag}.{name}"] = p
        out[f"{tag}.grad.{name}"] = p.grad
    out.update(extra)


C, H = 16, 4
g = GPT2Block(C, H)
randomise(g)
x = torch.randn(2, 5, C, requires_grad=True)
y = g(x)
record("gpt", g, x, y, torch.randn_like(y), {})

b = BertLayer(C, H)
randomise(b)
x = torch.randn(2, 6, C, requires_grad=True)
mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.int64)
add = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
y = b(x, add)
record("bert", b, x, y, torch.randn_like(y), {"bert.mask": mask})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blocks.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
