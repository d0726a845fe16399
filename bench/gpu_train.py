#!/usr/bin/env python3
"""PyTorch's side of bench/gpu_train.c: the same GPT (GPT-2 124M or the shakespeare-char model),
shapes, optimizer (AdamW lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D parameters,
fused when CUDA has it), gradient clipping at 1.0 and precision (fp32, tf32, amp_bf16 through
autocast) on the same GPU, eager and under torch.compile, with scaled_dot_product_attention (flash
attention where PyTorch picks it), as nanoGPT and the jjschwartz blog run it. Prints one line per
mode, like the C side:
    torch[-compile] <model> <precision> B T tok/s <x> step_ms <x> mfu <x> peak_mib <x> params <n>
Usage: gpu_train.py --model gpt2|char --precision fp32|tf32|amp_bf16 [--batch B --seq T --steps S
       --warmup W --compile 0|1|both --tiny]"""
import argparse, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F

PEAKS = [("H200", 989.4e12, 494.7e12, 66.9e12), ("H100 PCIe", 756e12, 378e12, 51.2e12),
         ("H100 NVL", 835e12, 417.5e12, 60e12), ("H100", 989.4e12, 494.7e12, 66.9e12),
         ("A100", 312e12, 156e12, 19.5e12), ("L40S", 362.1e12, 183e12, 91.6e12), ("L4", 121e12, 60e12, 30.3e12)]


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.reshape(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.c_proj(y)
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, P, C, L, H):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(P, C)
        s.h = nn.ModuleList(Block(C, H) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)
        s.lm_head = nn.Linear(C, V, bias=False)
        s.lm_head.weight = s.wte.weight

    def forward(s, idx, targets):
        T = idx.shape[1]
        x = s.wte(idx) + s.wpe(torch.arange(T, device=idx.device))
        for b in s.h:
            x = b(x)
        logits = s.lm_head(s.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def run(a, compiled):
    gpt2 = a.model == "gpt2"
    V, C, L, H = (50257, 768, 12, 12) if gpt2 else (65, 384, 6, 6)
    Vm = a.vocab or V  # the model's vocabulary: padded (llm.c's 50304) or the data's
    if a.tiny:
        C, L, H = 64, 2, 2
    B = a.batch or (2 if a.tiny else 8 if gpt2 else 64)
    T = a.seq or (64 if a.tiny else 1024 if gpt2 else 256)
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    dev = "cuda"
    torch.manual_seed(1234)
    m = GPT(Vm, max(T, 1024 if gpt2 else T), C, L, H).to(dev)
    n = sum(p.numel() for p in m.parameters())
    decay = [p for p in m.parameters() if p.dim() >= 2]
    other = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = torch.compile(m) if compiled else m
    g = torch.Generator(device="cpu").manual_seed(7)
    data = torch.randint(0, V, (a.warmup + a.steps, B, T + 1), generator=g).to(dev)
    amp = a.precision == "amp_bf16"

    def step(i):
        x, y = data[i, :, :-1], data[i, :, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(a.warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(a.warmup + i)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    toks = B * T * a.steps / secs
    name = torch.cuda.get_device_name()
    peak = next((r for r in PEAKS if r[0] in name), None)
    p = None if peak is None else peak[1] if amp else peak[2] if a.precision == "tf32" else peak[3]
    mfu = toks * (6 * n + 6 * L * C * T) / p if p else float("nan")
    print(f"torch{'-compile' if compiled else ''}{f'-v{Vm}' if a.vocab else ''} {a.model} {a.precision} {B} {T} tok/s {toks:.0f} "
          f"step_ms {1e3 * secs / a.steps:.2f} mfu {mfu:.4f} peak_mib {torch.cuda.max_memory_allocated() / 2**20:.0f} "
          f"params {n} device {name}", flush=True)
    if a.profile:
        profile_step(a, lambda: step(a.warmup + a.steps - 1), compiled)


def profile_step(a, one_step, compiled):
    """One more step under torch.profiler: the GPU time by kernel name, in scripts/ncu_summary.py's
    table (ms, launches, mean us, share), so ours and PyTorch's kernels can be set side by side."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            one_step()
            torch.cuda.synchronize()
        tot, cnt = {}, {}
        for e in prof.events():
            if str(getattr(e, "device_type", "")).split(".")[-1] != "CUDA":
                continue
            us = getattr(e, "device_time", None)
            if us is None:
                us = getattr(e, "cuda_time", 0.0)
            k = e.name.split("(")[0][:90]
            tot[k] = tot.get(k, 0.0) + us / 1e3
            cnt[k] = cnt.get(k, 0) + 1
        all_ms = sum(tot.values())
        tag = f"torch{'-compile' if compiled else ''}"
        print(f"{tag} profile: GPU time per step {all_ms:.2f} ms in {sum(cnt.values())} launches", flush=True)
        for k in sorted(tot, key=tot.get, reverse=True)[:a.profile]:
            print(f"{tot[k]:8.2f} {cnt[k]:7d} {1e3 * tot[k] / cnt[k]:8.1f} {100 * tot[k] / max(all_ms, 1e-9):5.1f}%  {k}",
                  flush=True)
    except Exception as e:  # the profile is extra: never lose the timing line for it
        print(f"profile FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--precision", default="amp_bf16")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", default="both")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--vocab", type=int, default=0, help="the model's vocab_size (>= the data's: 50257 / 65)")
    ap.add_argument("--profile", type=int, default=0, help="after timing, profile one step: print the N largest kernels")
    a = ap.parse_args()
    for c in ([False, True] if a.compile == "both" else [a.compile == "1"]):
        try:
            run(a, c)
        except Exception as e:  # one mode failing (e.g. compile) must not hide the other
            print(f"torch{'-compile' if c else ''} {a.model} {a.precision} FAILED {type(e).__name__}: {e}", flush=True)
