"""Golden values for cm_attention: explicit PyTorch math (torch 1.13 has no public
scaled_dot_product_attention), softmax(q @ k^T * scale + bias + mask) @ v, with the gradients of q, k,
v and bias for a fixed upstream gradient `gout`. Run: /usr/bin/python3 tests/golden/gen_attention.py"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import stwrite  # noqa: E402


def alibi(H, T, S):
    """ALiBi bias (1, H, T, S): -m_h * |i - j| with m_h = 2^(-8 (h + 1) / H)."""
    m = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]).view(1, H, 1, 1)
    i = torch.arange(T).view(1, 1, T, 1)
    j = torch.arange(S).view(1, 1, 1, S)
    return -m * (i - j).abs().float()


def case(out, name, B, H, T, S, D, causal=False, bias=None, mask=None, scale=None):
    q = torch.randn(B, H, T, D, requires_grad=True)
    k = torch.randn(B, H, S, D, requires_grad=True)
    v = torch.randn(B, H, S, D, requires_grad=True)
    sc = scale if scale is not None else 1.0 / math.sqrt(D)
    logits = q @ k.transpose(-1, -2) * sc
    if bias is not None:
        bias = bias.clone().requires_grad_(True)
        logits = logits + bias
    neg = torch.zeros(B, 1, T, S)
    if causal:  # top-left aligned, as torch's is_causal: query i sees keys j <= i
        neg = neg.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        neg = neg.masked_fill(mask.view(B, 1, 1, S) == 0, float("-inf"))
    o = torch.softmax(logits + neg, dim=-1) @ v
    gout = torch.randn_like(o)
    o.backward(gout)
    out[name + ".q"], out[name + ".k"], out[name + ".v"] = q, k, v
    out[name + ".gout"], out[name + ".out"] = gout, o
    out[name + ".dq"], out[name + ".dk"], out[name + ".dv"] = q.grad, k.grad, v.grad
    if bias is not None:
        out[name + ".bias"], out[name + ".dbias"] = bias, bias.grad
    if mask is not None:
        out[name + ".mask"] = mask


def main():
    torch.manual_seed(0)
    out = {}
    case(out, "plain", 2, 3, 5, 7, 8)
    case(out, "causal", 2, 2, 6, 6, 5, causal=True)
    case(out, "causal_t_lt_s", 1, 2, 3, 5, 4, causal=True, scale=0.25)
    case(out, "alibi", 2, 4, 6, 6, 8, causal=True, bias=alibi(4, 6, 6))
    mask = torch.ones(2, 7, dtype=torch.uint8)
    mask[0, 5:] = 0
    mask[1, 2] = 0
    case(out, "pad", 2, 2, 4, 7, 6, mask=mask)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention.safetensors")
    stwrite.save(path, out)
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
