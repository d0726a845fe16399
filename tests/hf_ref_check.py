"""Loads a pretrained folder the C library wrote (cm_hf_save, composer ckpt export --hf) into the
plain-torch reference (tests/golden/hf_ref.py: transformers' BERT / GPT-2 written out, strict about
names) and checks its logits against the ones the C side computed.

usage: /usr/bin/python3 tests/hf_ref_check.py FOLDER EXPECTED.safetensors [FOLDER EXPECTED ...]
EXPECTED holds "input_ids" (and "attention_mask", "token_type_ids" when the model takes them) and
"logits". Exit status 0 when every logit agrees within 2e-5 + 1e-4·|expected|."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden"))
import hf_ref  # noqa: E402


def check(folder, expected):
    want = hf_ref.read_safetensors(expected)
    model = hf_ref.from_pretrained(folder)
    ids = want["input_ids"].long()
    am = want["attention_mask"].long() if "attention_mask" in want else None
    tt = want["token_type_ids"].long() if "token_type_ids" in want else None
    with torch.no_grad():
        got = model(ids, am, tt)
    exp = want["logits"].float()
    if got.shape != exp.shape:
        print(f"{folder}: logits shape {tuple(got.shape)} in the reference, {tuple(exp.shape)} from C")
        return 1
    err = (got - exp).abs()
    tol = 2e-5 + 1e-4 * exp.abs()
    bad = int((err > tol).sum())
    print(f"{folder}: {type(model).__name__}, {exp.numel()} logits, max |diff| {err.max().item():.3g}, "
          f"{bad} outside 2e-5 + 1e-4*|x|")
    return 1 if bad else 0


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        print(__doc__)
        return 2
    return max(check(args[i], args[i + 1]) for i in range(0, len(args), 2))


if __name__ == "__main__":
    sys.exit(main())
