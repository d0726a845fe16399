#!/usr/bin/python3
"""Which part of a pretrained BERT folder helps or hurts fine-tuning? Writes variants of a
Hugging Face BERT folder (config.json, model.safetensors, vocab.txt, tokenizer_config.json) in
which chosen parts are replaced by transformers' initialisation (normal(0, initializer_range)
weights and embeddings, LayerNorm weight 1 and bias 0, other biases 0, seed 0), or scaled:

  /usr/bin/python3 bench/hf_body_parts.py runs/bench-bert-mlm/huggingface/final -o runs/parts

  OUT/embeddings-only   the pretrained embeddings (word, position, token type, their LayerNorm), the rest new
  OUT/encoder-only      the pretrained encoder and MLM head, new embeddings
  OUT/words-only        the pretrained word embeddings alone
  OUT/all-but-words     everything pretrained but the word embeddings
  OUT/scaled-0.25       all pretrained, the three embedding tables times 0.25: the same function
                        (the embedding LayerNorm divides the scale out, up to its eps), smaller
                        weights for the optimizer
  OUT/reinit-top        all pretrained but the top encoder layer (Zhang et al. 2021, "Revisiting
                        few-sample BERT fine-tuning": the top layers are the most pretraining-specific)

Each is then fine-tuned like the folder itself (docs/PERFORMANCE.md, "What in the pretrained body
hurts"), e.g. composer train examples/bert-sst2.yaml model.pretrained_model_name_or_path=OUT/words-only.
It also prints the norms of the embedding tables' rows and of their mean row."""
import argparse
import json
import os
import shutil
import struct

import numpy as np

DT = {"F32": np.float32, "F16": np.float16}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        buf = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        if v["dtype"] not in DT:
            raise SystemExit(f"{path}: tensor {k} has dtype {v['dtype']} (F32 or F16 expected)")
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(buf[a:b], dtype=DT[v["dtype"]]).reshape(v["shape"]).astype(np.float32)
    return out


def save(path, tensors):
    header, parts, off = {}, [], 0
    for k in sorted(tensors):
        b = np.ascontiguousarray(tensors[k], dtype=np.float32).tobytes()
        header[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        parts.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in parts:
            f.write(b)


def fresh(tensors, std):
    rng = np.random.default_rng(0)
    out = {}
    for k, v in tensors.items():
        if k.endswith("LayerNorm.weight"):
            out[k] = np.ones_like(v)
        elif k.endswith("bias"):
            out[k] = np.zeros_like(v)
        else:
            out[k] = rng.normal(0.0, std, v.shape).astype(np.float32)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    for f in ("config.json", "model.safetensors", "vocab.txt"):
        if not os.path.exists(os.path.join(a.folder, f)):
            raise SystemExit(f"{a.folder}: no {f} (a BERT folder from cm_hf_save / hf_checkpointer expected)")
    cfg = json.load(open(os.path.join(a.folder, "config.json")))
    p = load(os.path.join(a.folder, "model.safetensors"))
    r = fresh(p, cfg.get("initializer_range", 0.02))
    word = [k for k in p if k.endswith("embeddings.word_embeddings.weight")]
    if not word:
        raise SystemExit(f"{a.folder}: no word_embeddings in model.safetensors")
    for k in sorted(p):
        if "embeddings" in k and "LayerNorm" not in k:
            rows = np.linalg.norm(p[k], axis=-1)
            print(f"{k}: row norm mean {rows.mean():.3f} (new init {np.linalg.norm(r[k], axis=-1).mean():.3f}), "
                  f"mean row's norm {np.linalg.norm(p[k].mean(0)):.3f}")
    emb = lambda k: ".embeddings." in k  # noqa: E731
    top = f".encoder.layer.{cfg.get('num_hidden_layers', 12) - 1}."
    variants = {
        "embeddings-only": {k: p[k] if emb(k) else r[k] for k in p},
        "encoder-only": {k: r[k] if emb(k) else p[k] for k in p},
        "words-only": {k: p[k] if k in word else r[k] for k in p},
        "all-but-words": {k: r[k] if k in word else p[k] for k in p},
        "scaled-0.25": {k: p[k] * 0.25 if emb(k) and "LayerNorm" not in k else p[k] for k in p},
        "reinit-top": {k: r[k] if top in k else p[k] for k in p},
    }
    for name, t in variants.items():
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        for f in ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(a.folder, f)):
                shutil.copy(os.path.join(a.folder, f), d)
        save(os.path.join(d, "model.safetensors"), t)
        print(d)


if __name__ == "__main__":
    main()
