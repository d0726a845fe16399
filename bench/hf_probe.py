#!/usr/bin/python3
"""Linear probes of a Hugging Face BERT folder: how much does the body know about SST-2's
sentiment before any fine-tuning? For each folder, the frozen body's features of SST-2 training
sentences feed an L2-regularised logistic regression (numpy, three strengths, the best kept), and
its accuracy on the dev sentences is printed — for three features:

  cls       the last layer at [CLS] (what BertForSequenceClassification's pooler reads)
  mean      the last layer averaged over the sentence's tokens
  emb_mean  the embedding layer's output (after its LayerNorm) averaged: a bag of words

  /usr/bin/python3 bench/hf_probe.py FOLDER [FOLDER ...] [--random] [--rows 2000]

--random adds the first folder's shape with transformers' initialisation (normal(0,
initializer_range), LayerNorm 1 and 0, biases 0; seed 0) as the baseline. The forward is BERT's
(post-LN layers, exact GELU, absolute positions, token type 0) in numpy, one sentence at a time
(about a minute a folder); the tokenizer is bert-base-uncased's WordPiece, lower-cased, from the
folder's vocab.txt. docs/PERFORMANCE.md ("What the body knows") has the figures."""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_body_parts  # noqa: E402  (safetensors reading, transformers' initialisation)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from wordpiece_ref import basic, wordpiece  # noqa: E402

SST2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "sst2")


def read_rows(path, vocab, n=None, max_len=64):
    rows = []
    with open(path, encoding="utf-8") as f:
        head = f.readline().rstrip("\n").split("\t")
        si, li = head.index("sentence"), head.index("label")
        for line in f:
            cols = line.rstrip("\n").split("\t")
            ids = [vocab["[CLS]"]]
            for w in basic(cols[si]):
                ids += [vocab[p] for p in wordpiece(w, vocab)]
            rows.append((ids[:max_len - 1] + [vocab["[SEP]"]], int(cols[li])))
            if n and len(rows) >= n:
                break
    return rows


class Body:
    def __init__(self, folder, random_init):
        t = hf_body_parts.load(os.path.join(folder, "model.safetensors"))
        t = {k[5:] if k.startswith("bert.") else k: v for k, v in t.items()}
        cfg = json.load(open(os.path.join(folder, "config.json")))
        if random_init:
            t = hf_body_parts.fresh(t, cfg.get("initializer_range", 0.02))
        self.t, self.eps = t, cfg.get("layer_norm_eps", 1e-12)
        self.H, self.NH, self.NL = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise SystemExit(f"{folder}: hidden_act {cfg['hidden_act']}: this probe implements gelu only")
        self.erf = np.vectorize(math.erf)

    def ln(self, x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + self.eps) * self.t[p + ".weight"] + self.t[p + ".bias"]

    def lin(self, x, p):
        return x @ self.t[p + ".weight"].T + self.t[p + ".bias"]

    def features(self, ids):
        t, L, NH = self.t, len(ids), self.NH
        x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:L] + \
            t["embeddings.token_type_embeddings.weight"][0]
        x = self.ln(x, "embeddings.LayerNorm")
        emb = x
        for layer in range(self.NL):
            p = f"encoder.layer.{layer}."
            q, k, v = (self.lin(x, p + "attention.self." + n).reshape(L, NH, -1).transpose(1, 0, 2)
                       for n in ("query", "key", "value"))
            a = q @ k.transpose(0, 2, 1) / math.sqrt(self.H // NH)
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            ctx = (a @ v).transpose(1, 0, 2).reshape(L, self.H)
            x = self.ln(x + self.lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self.lin(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + self.erf(h / math.sqrt(2.0)))
            x = self.ln(x + self.lin(h, p + "output.dense"), p + "output.LayerNorm")
        return {"cls": x[0], "mean": x.mean(0), "emb_mean": emb.mean(0)}


def probe(xtr, ytr, xte, yte):
    """Dev accuracy of logistic regression on standardised features, best of three L2 strengths."""
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    best = 0.0
    for lam in (1e-3, 1e-2, 1e-1):
        w, b = np.zeros(xtr.shape[1]), 0.0
        for _ in range(500):
            g = 1.0 / (1.0 + np.exp(-(xtr @ w + b))) - ytr
            w -= 0.5 * (xtr.T @ g / len(ytr) + lam * w)
            b -= 0.5 * g.mean()
        best = max(best, float(((xte @ w + b > 0) == yte).mean()))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--random", action="store_true", help="add the first folder's shape with new weights")
    ap.add_argument("--rows", type=int, default=2000, help="SST-2 training rows to fit on (the first N)")
    ap.add_argument("--sst2", default=SST2, help="folder with train.tsv and dev.tsv")
    a = ap.parse_args()
    runs = [(f, False) for f in a.folders] + ([(a.folders[0], True)] if a.random else [])
    print("folder\tweights\trows\tcls\tmean\temb_mean")
    for folder, rnd in runs:
        vocab = {w.rstrip("\n"): i for i, w in enumerate(open(os.path.join(folder, "vocab.txt"), encoding="utf-8"))}
        train = read_rows(os.path.join(a.sst2, "train.tsv"), vocab, a.rows)
        dev = read_rows(os.path.join(a.sst2, "dev.tsv"), vocab)
        body = Body(folder, rnd)
        ftr = [body.features(ids) for ids, _ in train]
        fte = [body.features(ids) for ids, _ in dev]
        ytr, yte = np.array([y for _, y in train]), np.array([y for _, y in dev])
        acc = [probe(np.stack([f[k] for f in ftr]), ytr, np.stack([f[k] for f in fte]), yte)
               for k in ("cls", "mean", "emb_mean")]
        print(f"{folder}\t{'random' if rnd else 'pretrained'}\t{len(train)}\t" + "\t".join(f"{v:.3f}" for v in acc),
              flush=True)


if __name__ == "__main__":
    main()
