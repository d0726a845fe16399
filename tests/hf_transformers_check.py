"""Loads pretrained folders the C library wrote (cm_hf_save, composer ckpt export --hf) with Hugging
Face's own transformers (`from_pretrained`, the class named by config.json's "architectures") and
its tokenizer (AutoTokenizer), and checks the logits against the ones the C side computed. Debian has
no transformers, so this runs where it is installed (the lent GPU machine: scripts/gpu-check); the
folders come from `CM_HF_KEEP_DIR=DIR test_hf --filter 'hf/reference_gives*'` (scripts/gpu-bundle).

usage: python3 tests/hf_transformers_check.py DIR [DIR ...]   (each DIR holds model/ and expected.safetensors)
Exit status 0 when every model loads with no missing or unexpected weights and every logit agrees
within 2e-5 + 1e-4·|expected|."""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file

SENTENCE = "Hello world, the model loads: unaffable tokenizers!"  # as in tests/test_hf.c


def check(d):
    folder, want = os.path.join(d, "model"), load_file(os.path.join(d, "expected.safetensors"))
    arch = json.load(open(os.path.join(folder, "config.json")))["architectures"][0]
    model, info = getattr(transformers, arch).from_pretrained(folder, output_loading_info=True)
    model.eval()
    missing, unexpected = info.get("missing_keys", []), info.get("unexpected_keys", [])
    kw = {"input_ids": want["input_ids"].long()}
    for k in ("attention_mask", "token_type_ids"):
        if k in want:
            kw[k] = want[k].long()
    with torch.no_grad():
        got = model(**kw).logits.float()
    exp = want["logits"].float()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok(SENTENCE, add_special_tokens=False)["input_ids"]
    ours = want["sentence_ids"].tolist()
    if got.shape != exp.shape:
        print(f"{d}: {arch}: logits shape {tuple(got.shape)} in transformers, {tuple(exp.shape)} from C")
        return 1
    err = (got - exp).abs()
    bad = int((err > 2e-5 + 1e-4 * exp.abs()).sum())
    print(f"{d}: transformers {transformers.__version__} {arch}: missing {list(missing)}, unexpected "
          f"{list(unexpected)}, {exp.numel()} logits, max |diff| {err.max().item():.3g}, {bad} outside "
          f"2e-5 + 1e-4*|x|; {type(tok).__name__}: {len(enc)} ids for a sentence, "
          f"{'the same as ours' if enc == ours else f'ours {ours}, transformers {enc}'}")
    return 1 if bad or missing or unexpected or enc != ours else 0


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    return max(check(d) for d in args)


if __name__ == "__main__":
    sys.exit(main())
