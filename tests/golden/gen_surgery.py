"""Golden values for the model-surgery algorithms (tests/test_golden_surgery.c), from PyTorch on CPU,
written with Composer's own formulas (composer/algorithms/*, reproduced here: Composer is not a
Debian package):

  blur.*       blur_2d (BlurPool's [1 2 1; 2 4 2; 1 2 1]/16 depthwise filter) at stride 1 and 2,
               with its input gradient; blurmax.* blurmax_pool2d (max at stride 1, then the blur)
  bconv.*      BlurConv2d from a strided Conv2d, blur_first true and false
  gbn.*        _GhostBatchNorm: torch.chunk into ceil(B/g) chunks, momentum / chunks, the output,
               gradients and the running statistics (and num_batches_tracked) after one step
  se.*         SqueezeExcite2d: output and gradients of x and both Linear weights
  sdb.*/sdk.*  a torchvision Bottleneck / BasicBlock in eval under StochasticDepth (the residual
               branch scaled by 1 - drop_rate), with non-trivial BatchNorm running statistics
  alibi.*      _get_alibi_head_slopes for several head counts; the BERT (bidirectional) bias; a
               BertSelfAttention and a causal GPT2Attention forward with Composer's ALiBi forms
  ws.*         WeightStandardization: the standardized weight, a convolution with it and its gradients
  fac.*        Factorize's SVD initialisation (the rank-k product and the singular values) of a linear
               and a convolution weight, and the factorized convolution's output
  glu.*        BERTGatedFFOutput: output and the hidden states' gradient
  lpln.*/lpgn.* LPLayerNorm / LPGroupNorm under autocast: the norm of bf16 x, weight and bias,
               computed in f32 and rounded to bf16 — what PyTorch's CUDA kernels (Composer's target)
               compute. Debian's torch 1.13 CPU bf16 kernels round intermediate values too (their
               results differ from that by up to 0.016 absolute on these inputs), so they are not
               the reference.

Run from the repo root: /usr/bin/python3 tests/golden/gen_surgery.py
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(20261127)
out = {}


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_(True)


# ---- BlurPool (composer/algorithms/blurpool/blurpool_layers.py) ----

def default_filter():
    return torch.tensor([[[[1, 2, 1], [2, 4, 2], [1, 2, 1]]]], dtype=torch.float32) / 16.0


def blur_2d(x, stride=1, filt=None):
    filt = default_filter() if filt is None else filt
    _, c, h, w = x.shape
    if filt.shape[0] == 1 and c > 1:
        filt = filt.repeat((c, 1, 1, 1))
    if h + 2 < 3 or w + 2 < 3:
        return x
    return F.conv2d(x, filt, None, stride, 1, 1, c)


def blurmax_pool2d(x, kernel_size, stride, padding):
    maxs = F.max_pool2d(x, kernel_size=kernel_size, stride=1, padding=padding)
    return blur_2d(maxs, stride=stride)


x = leaf(2, 5, 7, 9)
y1 = blur_2d(x, 1)
y2 = blur_2d(x, 2)
g2 = torch.randn_like(y2)
y2.backward(g2)
out.update({"blur.x": x, "blur.s1": y1, "blur.s2": y2, "blur.gout": g2, "blur.dx": x.grad})

x = leaf(2, 3, 9, 9)
out.update({"blurmax.x": x, "blurmax.k3s2p1": blurmax_pool2d(x, 3, 2, 1), "blurmax.k2s2p0": blurmax_pool2d(x, 2, 2, 0)})

# BlurConv2d.from_conv2d of Conv2d(4, 6, 3, stride 2, padding 1, bias)
conv = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=True)
x = leaf(2, 4, 8, 8)
with torch.no_grad():
    first = conv(blur_2d(x, 1))
    after = blur_2d(F.conv2d(x, conv.weight, conv.bias, 1, 1), 2)
out.update({"bconv.w": conv.weight, "bconv.b": conv.bias, "bconv.x": x, "bconv.first": first, "bconv.after": after})

# ---- GhostBatchNorm (composer/algorithms/ghost_batchnorm/ghost_batchnorm.py) ----

B, C, g = 10, 3, 4
x = leaf(B, C, 4, 4, scale=1.5)
bn = torch.nn.BatchNorm2d(C)
with torch.no_grad():
    bn.weight.copy_(torch.randn(C))
    bn.bias.copy_(torch.randn(C))
    bn.running_mean.copy_(torch.randn(C))
    bn.running_var.copy_(torch.rand(C) + 0.5)
out.update({"gbn.w": bn.weight.detach().clone(), "gbn.b": bn.bias.detach().clone(),
            "gbn.rm0": bn.running_mean.clone(), "gbn.rv0": bn.running_var.clone()})
nchunks = int(math.ceil(B / g))
m0 = bn.momentum
bn.momentum = m0 / nchunks
y = torch.cat([bn(c) for c in x.chunk(nchunks, 0)], dim=0)
bn.momentum = m0
gy = torch.randn_like(y)
y.backward(gy)
out.update({"gbn.x": x, "gbn.y": y, "gbn.gout": gy, "gbn.dx": x.grad, "gbn.dw": bn.weight.grad, "gbn.db": bn.bias.grad,
            "gbn.rm": bn.running_mean, "gbn.rv": bn.running_var,
            "gbn.nbt": bn.num_batches_tracked.clone()})
bn.eval()
xe = torch.randn(5, C, 4, 4)
with torch.no_grad():
    out.update({"gbn.xe": xe, "gbn.ye": bn(xe)})

# ---- SqueezeExcite (composer/algorithms/squeeze_excite/squeeze_excite.py) ----

Cse, L = 6, 3
x = leaf(2, Cse, 5, 5)
w1 = leaf(L, Cse, scale=0.5)
w2 = leaf(Cse, L, scale=0.5)
coeff = torch.sigmoid(F.linear(torch.relu(F.linear(F.adaptive_avg_pool2d(x, 1).flatten(1), w1)), w2))
y = x * coeff.reshape(2, Cse, 1, 1)
gy = torch.randn_like(y)
y.backward(gy)
out.update({"se.x": x, "se.w1": w1, "se.w2": w2, "se.y": y, "se.gout": gy, "se.dx": x.grad, "se.dw1": w1.grad,
            "se.dw2": w2.grad})


# ---- StochasticDepth in eval (composer/algorithms/stochastic_depth/stochastic_layers.py) ----

def bn_module(c):
    m = torch.nn.BatchNorm2d(c)
    with torch.no_grad():
        m.weight.copy_(torch.randn(c) * 0.5 + 1)
        m.bias.copy_(torch.randn(c) * 0.1)
        m.running_mean.copy_(torch.randn(c) * 0.2)
        m.running_var.copy_(torch.rand(c) + 0.5)
    return m.eval()


def save_block(tag, mods, x, y, rate):
    for name, m in mods.items():
        for k, v in m.state_dict().items():
            out[f"{tag}.w.{name}.{k}"] = v.clone()
    out.update({f"{tag}.x": x, f"{tag}.y": y, f"{tag}.rate": torch.tensor([rate])})


rate = 0.3
cin, planes = 8, 4
mods = {"conv1": torch.nn.Conv2d(cin, planes, 1, bias=False), "bn1": bn_module(planes),
        "conv2": torch.nn.Conv2d(planes, planes, 3, stride=2, padding=1, bias=False), "bn2": bn_module(planes),
        "conv3": torch.nn.Conv2d(planes, 4 * planes, 1, bias=False), "bn3": bn_module(4 * planes),
        "downsample.0": torch.nn.Conv2d(cin, 4 * planes, 1, stride=2, bias=False), "downsample.1": bn_module(4 * planes)}
x = torch.randn(2, cin, 6, 6)
with torch.no_grad():
    o = torch.relu(mods["bn1"](mods["conv1"](x)))
    o = torch.relu(mods["bn2"](mods["conv2"](o)))
    o = mods["bn3"](mods["conv3"](o)) * (1 - rate)
    y = torch.relu(o + mods["downsample.1"](mods["downsample.0"](x)))
save_block("sdb", mods, x, y, rate)

cin, planes = 4, 8
mods = {"conv1": torch.nn.Conv2d(cin, planes, 3, stride=2, padding=1, bias=False), "bn1": bn_module(planes),
        "conv2": torch.nn.Conv2d(planes, planes, 3, padding=1, bias=False), "bn2": bn_module(planes),
        "downsample.0": torch.nn.Conv2d(cin, planes, 1, stride=2, bias=False), "downsample.1": bn_module(planes)}
x = torch.randn(2, cin, 6, 6)
with torch.no_grad():
    o = torch.relu(mods["bn1"](mods["conv1"](x)))
    o = mods["bn2"](mods["conv2"](o)) * (1 - rate)
    y = torch.relu(o + mods["downsample.1"](mods["downsample.0"](x)))
save_block("sdk", mods, x, y, rate)


# ---- ALiBi (composer/algorithms/alibi/attention_surgery_functions) ----

def alibi_slopes(n):
    def pow2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return pow2(n)
    p = 2 ** math.floor(math.log2(n))
    return pow2(p) + alibi_slopes(2 * p)[0::2][:n - p]


for h in (1, 2, 4, 6, 8, 12, 16, 25):
    out[f"alibi.slopes{h}"] = torch.tensor(alibi_slopes(h), dtype=torch.float32)


def bert_alibi(n_heads, T):
    rel = torch.abs(torch.arange(T)[None, :] - torch.arange(T)[:, None]).unsqueeze(0).expand(n_heads, -1, -1)
    return (torch.tensor(alibi_slopes(n_heads)).unsqueeze(1).unsqueeze(1) * -rel).unsqueeze(0)


def gpt_alibi(n_heads, T):
    return torch.tensor(alibi_slopes(n_heads)).unsqueeze(1).unsqueeze(1) * torch.arange(T).unsqueeze(0).unsqueeze(0)


out["alibi.bert_bias_h6_t5"] = bert_alibi(6, 5)[0]

Cm, H, T = 12, 4, 5
D = Cm // H
x = torch.randn(2, T, Cm)
q, k, v = (torch.nn.Linear(Cm, Cm) for _ in range(3))


def heads(t):
    return t.view(2, T, H, D).permute(0, 2, 1, 3)


with torch.no_grad():
    sc = heads(q(x)) @ heads(k(x)).transpose(-1, -2) / math.sqrt(D) + bert_alibi(H, T)
    ctx = (torch.softmax(sc, -1) @ heads(v(x))).permute(0, 2, 1, 3).reshape(2, T, Cm)
out.update({"alibi.bert.x": x, "alibi.bert.y": ctx})
for name, m in (("query", q), ("key", k), ("value", v)):
    out[f"alibi.bert.w.{name}.weight"] = m.weight.detach().clone()
    out[f"alibi.bert.w.{name}.bias"] = m.bias.detach().clone()

# GPT2Attention (Conv1D weights (in, out)) with Composer's _attn: + slope·j, then the causal mask
c_attn_w, c_attn_b = torch.randn(Cm, 3 * Cm) * 0.2, torch.randn(3 * Cm) * 0.1
c_proj_w, c_proj_b = torch.randn(Cm, Cm) * 0.2, torch.randn(Cm) * 0.1
with torch.no_grad():
    qkv = x @ c_attn_w + c_attn_b
    qq, kk, vv = qkv.split(Cm, dim=2)
    w = heads(qq) @ heads(kk).transpose(-1, -2) / math.sqrt(D) + gpt_alibi(H, T)[:, :, 0:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    w = torch.where(mask, w, torch.tensor(torch.finfo(torch.float32).min))
    a = (torch.softmax(w, -1) @ heads(vv)).permute(0, 2, 1, 3).reshape(2, T, Cm)
    y = a @ c_proj_w + c_proj_b
out.update({"alibi.gpt.x": x, "alibi.gpt.y": y, "alibi.gpt.w.c_attn.weight": c_attn_w,
            "alibi.gpt.w.c_attn.bias": c_attn_b, "alibi.gpt.w.c_proj.weight": c_proj_w,
            "alibi.gpt.w.c_proj.bias": c_proj_b})

# ---- LowPrecisionLayerNorm / GroupNorm under autocast (LPLayerNorm.forward) ----

x = torch.randn(3, 4, 10) * 2 + 1
w, b = torch.randn(10), torch.randn(10)

def bf(t):
    return t.bfloat16().float()


with torch.no_grad():
    y = F.layer_norm(bf(x), (10,), bf(w), bf(b), 1e-5).bfloat16()
out.update({"lpln.x": x, "lpln.w": w, "lpln.b": b, "lpln.y": y.float()})
x = torch.randn(2, 6, 3, 3) * 2 + 1
w, b = torch.randn(6), torch.randn(6)
with torch.no_grad():
    y = F.group_norm(bf(x), 3, bf(w), bf(b), 1e-5).bfloat16()
out.update({"lpgn.x": x, "lpgn.w": w, "lpgn.b": b, "lpgn.y": y.float()})

# ---- WeightStandardization (composer/algorithms/weight_standardization) ----

def standardize(W):
    dims = list(range(1, W.dim()))
    var, mean = torch.var_mean(W, dim=dims, keepdim=True, unbiased=False)
    return (W - mean) / torch.sqrt(var + 1e-10)


W = leaf(6, 4, 3, 3, scale=3.0)
x = leaf(2, 4, 7, 7)
Ws = standardize(W)
y = F.conv2d(x, Ws, None, 1, 1)
gy = torch.randn_like(y)
y.backward(gy)
out.update({"ws.w": W, "ws.std": Ws, "ws.x": x, "ws.y": y, "ws.gout": gy, "ws.dx": x.grad, "ws.dw": W.grad})


# ---- Factorize's initialisation (factorize_core._svd_initialize on Composer's matrices) ----

def svd_init(Wa, k):
    U, sv, Vt = torch.linalg.svd(Wa, full_matrices=False)
    r = torch.sqrt(sv[:k])
    return U[:, :k] * r, Vt[:k] * r.reshape(-1, 1), sv


Wl = torch.randn(12, 20)
a, b, sv = svd_init(Wl.T.contiguous(), 5)  # FactorizedLinear: weight (in, out) = W^T
out.update({"fac.lw": Wl, "fac.lprod5": a @ b, "fac.ls": sv})
Wc, bc = torch.randn(8, 6, 3, 3), torch.randn(8)
a, b, sv = svd_init(Wc.reshape(8, -1).T.contiguous(), 3)  # _weights_conv2d_to_mat: (fan_in, out)
W0 = a.T.reshape(3, 6, 3, 3)                                 # _mat_to_weights_conv2d
W1 = b.T.reshape(8, 3, 1, 1)
xc = torch.randn(2, 6, 6, 6)
with torch.no_grad():
    yc = F.conv2d(F.conv2d(xc, W0, None, 1, 1), W1, bc)
out.update({"fac.cw": Wc, "fac.cb": bc, "fac.cx": xc, "fac.cy": yc, "fac.cs": sv})

# ---- GatedLinearUnits (gated_linear_unit_layers.BERTGatedFFOutput) ----

Cg, Fg = 8, 16
h = leaf(2, 3, Cg)
gl, ng, wo = torch.nn.Linear(Cg, Fg, bias=False), torch.nn.Linear(Cg, Fg, bias=False), torch.nn.Linear(Fg, Cg)
ln = torch.nn.LayerNorm(Cg, eps=1e-12)
with torch.no_grad():
    ln.weight.copy_(torch.rand(Cg) + 0.5)
    ln.bias.copy_(torch.randn(Cg) * 0.1)
y = ln(wo(F.gelu(gl(h)) * ng(h)) + h)
gy = torch.randn_like(y)
y.backward(gy)
out.update({"glu.h": h, "glu.y": y, "glu.gout": gy, "glu.dh": h.grad, "glu.w.gated_layer.weight": gl.weight,
            "glu.w.non_gated_layer.weight": ng.weight, "glu.w.wo.weight": wo.weight, "glu.w.wo.bias": wo.bias,
            "glu.w.layernorm.weight": ln.weight, "glu.w.layernorm.bias": ln.bias})

stwrite.save(os.path.join(os.path.dirname(os.path.abspath(__file__)), "surgery.safetensors"),
             {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in out.items()},
             {"generator": "gen_surgery.py", "torch": torch.__version__})
print("wrote", len(out), "tensors")
