"""A small pretrained BERT body for the fine-tuning test (tests/test_hf_finetune.c), from the
plain-torch reference hf_ref.py.

The test shows that fine-tuning from a pretrained folder beats the same run from random weights,
so it fails if loading silently skipped the weights. A body whose features know sentiment makes
that difference large and cheap to see: this script trains a tiny BertForSequenceClassification
(2 layers, hidden 32, 2 heads, intermediate 64, 64 positions, a 2000-token WordPiece vocabulary cut
from bert-base-uncased's by frequency in SST-2's training sentences) on SST-2's train.tsv for one
epoch, then saves only its BertModel body without the pooler — names without the "bert." prefix,
architectures ["BertModel"], weights in F16 — as save_pretrained would save a bare BertModel. Loading
it for sequence_classification therefore has to initialise the pooler and the classifier (the
"newly initialized" path) and take every other weight from the file (the bare-name and F16 paths).
Its dev accuracy (printed) never enters the test: the C side fine-tunes its own new head.

Writes tests/golden/hf/bert-sst2-body/: config.json, model.safetensors, vocab.txt,
tokenizer_config.json. Run from the repo root: /usr/bin/python3 tests/golden/gen_hf_sst2.py
(a few minutes: one thread).
"""
import collections
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_ref  # noqa: E402
from wordpiece_ref import basic, wordpiece  # noqa: E402
import stwrite  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
SST2 = os.path.join(ROOT, "..", "shared", "data", "sst2")
BERT_VOCAB = os.path.join(ROOT, "..", "shared", "data", "bert", "vocab.txt")
OUT = os.path.join(HERE, "hf", "bert-sst2-body")
V, L = 2000, 64


def read_tsv(name):
    rows = []
    with open(os.path.join(SST2, name), encoding="utf-8") as f:
        next(f)
        for line in f:
            line = line.rstrip("\r\n")
            if line:
                s, y = line.rsplit("\t", 1)
                rows.append((s, int(y)))
    return rows


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # reproducible sums (and no spinning threads on a busy machine)
    full = {t.rstrip("\n"): i for i, t in enumerate(open(BERT_VOCAB, encoding="utf-8"))}
    train, dev = read_tsv("train.tsv"), read_tsv("dev.tsv")
    counts = collections.Counter()
    for s, _ in train:
        for w in basic(s):
            counts.update(wordpiece(w, full))
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = []
    for c in "abcdefghijklmnopqrstuvwxyz0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~":
        chars.append(c)
    chars += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    vocab_list = special + chars
    for t, _ in counts.most_common():
        if len(vocab_list) == V:
            break
        if t not in vocab_list and t != "[UNK]":
            vocab_list.append(t)
    vocab = {t: i for i, t in enumerate(vocab_list)}

    def encode(s):
        ids = [vocab["[CLS]"]]
        for w in basic(s):
            ids += [vocab[p] for p in wordpiece(w, vocab)]
        ids = ids[:L - 1] + [vocab["[SEP]"]]
        return ids + [0] * (L - len(ids))

    X = torch.tensor([encode(s) for s, _ in train])
    Y = torch.tensor([y for _, y in train])
    Xd = torch.tensor([encode(s) for s, _ in dev])
    Yd = torch.tensor([y for _, y in dev])
    cfg = dict(architectures=["BertModel"], model_type="bert", attention_probs_dropout_prob=0.1, hidden_act="gelu",
               hidden_dropout_prob=0.1, hidden_size=32, initializer_range=0.02, intermediate_size=64,
               layer_norm_eps=1e-12, max_position_embeddings=L, num_attention_heads=2, num_hidden_layers=2,
               pad_token_id=0, position_embedding_type="absolute", type_vocab_size=2, vocab_size=V,
               torch_dtype="float16")
    m = hf_ref.BertForSequenceClassification(hf_ref.Cfg(dict(cfg, num_labels=2)))
    B = 64
    steps = len(X) // B
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 50) * max(0.0, 1 - s / steps))
    perm = torch.randperm(len(X))
    m.train()
    print(f"vocabulary {len(vocab)} tokens; training {steps} steps", flush=True)
    for k in range(steps):
        idx = perm[k * B:(k + 1) * B]
        x = X[idx]
        loss = torch.nn.functional.cross_entropy(m(x, (x != 0).long()), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    m.eval()
    with torch.no_grad():
        acc = (m(Xd, (Xd != 0).long()).argmax(-1) == Yd).float().mean().item()
    print(f"body trained {steps} steps; its own classifier's SST-2 dev accuracy {acc:.4f}")

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    body = {k[len("bert."):]: v.half() for k, v in m.state_dict().items()
            if k.startswith("bert.") and not k.startswith("bert.pooler.")}
    stwrite.save(os.path.join(OUT, "model.safetensors"), body, {"format": "pt"})
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(OUT, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab_list))
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": L}, f, indent=2)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
