"""The PyTorch side of bench/train_throughput.c: one training run, timed as the C side times its own.

    /usr/bin/python3 bench/train_throughput.py WORKLOAD PRECISION STEPS WARMUP THREADS DATAFILE

Run by bench_train_throughput (which writes DATAFILE and reads the "RESULT <items/s> <s/step>" line);
Debian's python3-torch (1.13), torch.set_num_threads(THREADS) explicitly (it defaults to 1 here).

The models are the library's zoo models written in plain torch with the same math and sizes:
- char / gpt2: GPT-2 (pre-LN blocks, fused qkv projection, causal softmax attention as Hugging Face's
  GPT2Attention — torch 1.13 has no scaled_dot_product_attention —, tanh GELU through
  F.gelu(approximate="tanh"), final LayerNorm, lm_head tied to wte), dropout as the presets
  (0.2 for shakespeare-char, 0.1 for gpt2) after the embeddings, on the attention probabilities and
  after each block's projections; AdamW (lr 6e-4, betas 0.9/0.95, wd 0.1 on >= 2-d parameters);
- bert: Hugging Face's BertForMaskedLM in plain torch (tests/golden/hf_ref.py, the reference the
  BERT golden tests compare against) with examples/bert-tiny/config.json, dropout 0.1, decoder tied
  to the word embeddings; the MLM head on the masked positions only (the hidden states' rows whose
  label is not -100, gathered before the head: the library's sparse logits), or on every position
  as transformers computes it with CM_BENCH_TORCH_DENSE_MLM=1 (the driver's --torch-dense-mlm);
  AdamW (lr 1e-3, betas 0.9/0.98, eps 1e-6, wd 1e-5 on >= 2-d parameters) as examples/bert-mlm.yaml;
- resnet56: He et al.'s CIFAR ResNet-56 with option-A shortcuts (as tests/golden/gen_resnet.py),
  SGD (lr 0.1, momentum 0.9, wd 5e-4 on >= 2-d parameters).
amp_bf16 is torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss, as Composer.
With CM_BENCH_TORCH_CHANNELS_LAST=1 (the driver's --torch-channels-last) the ResNet and its input
batches are in torch.channels_last (Composer's ChannelsLast algorithm does the same).
"""
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

PRESETS = {  # V, P, C, L, H, dropout, T, B
    "char": (65, 256, 384, 6, 6, 0.2, 256, 8),
    "gpt2": (50257, 1024, 768, 12, 12, 0.1, 256, 8),
}


class Attention(nn.Module):
    def __init__(self, C, H, P, p):
        super().__init__()
        self.C, self.H = C, H
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.attn_drop, self.resid_drop = nn.Dropout(p), nn.Dropout(p)
        self.register_buffer("bias", torch.tril(torch.ones(P, P, dtype=torch.bool)).view(1, 1, P, P))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.C, dim=2)
        q, k, v = (z.view(b, t, self.H, c // self.H).transpose(1, 2) for z in (q, k, v))
        w = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(c // self.H))
        w = w.masked_fill(~self.bias[:, :, :t, :t], float("-inf"))
        y = self.attn_drop(w.softmax(-1)) @ v
        return self.resid_drop(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, C, H, P, p):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C), Attention(C, H, P, p)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc, self.c_proj, self.drop = nn.Linear(C, 4 * C), nn.Linear(4 * C, C), nn.Dropout(p)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, V, P, C, L, H, p):
        super().__init__()
        self.wte, self.wpe, self.drop = nn.Embedding(V, C), nn.Embedding(P, C), nn.Dropout(p)
        self.h = nn.ModuleList([Block(C, H, P, p) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, prm in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(prm, 0.0, 0.02 / math.sqrt(2 * L))
            elif prm.dim() >= 2:
                nn.init.normal_(prm, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(prm)

    def forward(self, ids):
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(ids.shape[1])))
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


class BasicBlock(nn.Module):
    def __init__(self, inp, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride, self.inp, self.out = stride, inp, planes
        self.pad = stride != 1 or inp != planes

    def shortcut(self, x):
        if not self.pad:
            return x
        x = x[:, :, ::self.stride, ::self.stride]
        lo = (self.out - self.inp) // 2
        return F.pad(x, (0, 0, 0, 0, lo, self.out - self.inp - lo))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class ResNetCifar(nn.Module):
    def __init__(self, n=9, widths=(16, 32, 64), classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        ch, stages = widths[0], []
        for i, w in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(ch, w, 2 if i > 0 and j == 0 else 1))
                ch = w
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(ch, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.stages(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def groups(model, wd):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    workload, precision, steps, warmup, threads, path = sys.argv[1:7]
    steps, warmup, threads = int(steps), int(warmup), int(threads)
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    total = steps + warmup
    if workload in PRESETS:
        V, P, C, L, H, p, T, B = PRESETS[workload]
        toks = torch.from_numpy(np.fromfile(path, dtype=np.int32).astype(np.int64))
        n = total * B
        ids = torch.stack([toks[i * T:i * T + T] for i in range(n)]).view(total, B, T)
        labels = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(n)]).view(total, B, T)
        model = GPT(V, P, C, L, H, p)
        opt = torch.optim.AdamW(groups(model, 0.1), lr=6e-4, betas=(0.9, 0.95))
        batches = [(ids[k], labels[k]) for k in range(total)]
        items = B * T

        def loss_fn(x, y):
            logits = model(x)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
    elif workload == "bert":
        sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))
        import hf_ref
        import json
        with open(os.path.join(HERE, "..", "examples", "bert-tiny", "config.json")) as f:
            cfg = hf_ref.Cfg(json.load(f))
        B, T = 64, 128
        raw = torch.from_numpy(np.fromfile(path, dtype=np.int32).astype(np.int64))
        n = total * B
        ids, lab = raw[:n * T].view(total, B, T), raw[n * T:2 * n * T].view(total, B, T)
        mask = torch.ones(B, T, dtype=torch.int64)
        if precision == "amp_bf16":
            # torch 1.13's CPU autocast leaves layer_norm out of its lists, so the head's LayerNorm
            # meets a bf16 input with f32 weights and fails; torch >= 2.0 runs layer_norm in f32
            # under autocast. The head's LayerNorm input is cast to f32 here, as those versions do.
            def transform_f32(self, x):
                return self.LayerNorm(self.act(self.dense(x)).float())
            hf_ref.BertPredictionHeadTransform.forward = transform_f32
        model = hf_ref.BertForMaskedLM(cfg)
        opt = torch.optim.AdamW(groups(model, 1e-5), lr=1e-3, betas=(0.9, 0.98), eps=1e-6)
        batches = [(ids[k], lab[k]) for k in range(total)]
        items = B * T
        dense = os.environ.get("CM_BENCH_TORCH_DENSE_MLM") == "1"

        def loss_fn(x, y):
            h = model.bert(x, mask)
            if dense:
                logits = model.cls(h)
                return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), ignore_index=-100)
            rows = (y.view(-1) != -100).nonzero().squeeze(1)
            return F.cross_entropy(model.cls(h.reshape(-1, h.shape[-1])[rows]), y.view(-1)[rows])
    elif workload == "resnet56":
        B = 128
        n = total * B
        raw = np.fromfile(path, dtype=np.uint8)
        img = torch.from_numpy(raw[:n * 3072 * 4].view(np.float32).reshape(n, 3, 32, 32).copy())
        lab = torch.from_numpy(raw[n * 3072 * 4:].view(np.int64).copy())
        model = ResNetCifar()
        channels_last = os.environ.get("CM_BENCH_TORCH_CHANNELS_LAST") == "1"
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(groups(model, 5e-4), lr=0.1, momentum=0.9)
        batches = [(img[k * B:(k + 1) * B], lab[k * B:(k + 1) * B]) for k in range(total)]
        items = B

        def loss_fn(x, y):
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return F.cross_entropy(model(x), y)
    else:
        sys.exit("train_throughput.py: unknown workload " + workload)
    model.train()
    amp = precision == "amp_bf16"
    t_start = None
    for k in range(total):
        if k == warmup:
            t_start = time.perf_counter()
        x, y = batches[k]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        loss.item()
    dt = time.perf_counter() - t_start
    print("RESULT %.3f %.4f" % (steps * items / dt, dt / steps), flush=True)


if __name__ == "__main__":
    main()
