"""Golden Hugging Face folders and their logits (tests/test_hf.c), from the plain-torch reference
hf_ref.py (transformers' BERT and GPT-2, written out; Debian has torch but not transformers).

Writes under tests/golden/hf/:
  bert-mlm/   BertForMaskedLM, config.json as transformers writes it, model.safetensors without the
              tied cls.predictions.decoder.{weight,bias} (save_pretrained drops them), vocab.txt (a
              100-token WordPiece vocabulary) and tokenizer_config.json (BertTokenizer,
              do_lower_case, model_max_length 32)
  bert-cls/   BertForSequenceClassification with 3 labels (id2label), intermediate_size 48,
              hidden_act gelu_new, weights in two shards with model.safetensors.index.json, and the
              tokenizer as a fast-tokenizer tokenizer.json (WordPiece model, BertNormalizer)
  gpt2/       GPT2LMHeadModel (vocab 266: GPT-2's 256 byte tokens, 9 merges and <|endoftext|>),
              weights without the tied lm_head.weight, vocab.json + merges.txt + tokenizer_config.json
and tests/golden/hf_logits.safetensors: the inputs (a padded batch) and each model's logits
("bert-mlm.logits", "bert-cls.logits", "gpt2.logits"), computed by loading each folder back
(from_pretrained) in eval mode.

Run from the repo root: /usr/bin/python3 tests/golden/gen_hf.py
"""
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_ref  # noqa: E402
import stwrite  # noqa: E402

OUT = os.path.join(HERE, "hf")

# A 100-token lower-case WordPiece vocabulary: BERT's special tokens, letters, continuations and a
# few words (enough to tokenize the tests' sentences without [UNK]).
WORDS = ["the", "script", "movie", "film", "good", "bad", "great", "is", "was", "not", "it", "this", "and", "of",
         "fun", "dull", "story", "##es", "##ing", "##ly", "##ed", "very", "best", "worst", "plot", "acting",
         "love", "hate", "cast", "to", "##er", "an", "one", "in"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB = (["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "'"] + LETTERS +
         ["##" + c for c in LETTERS] + WORDS)
assert len(VOCAB) == 96, len(VOCAB)
VOCAB += ["[unused1]", "[unused2]", "[unused3]", "[unused4]"]
assert len(VOCAB) == 100 and len(set(VOCAB)) == 100

BERT_CFG = dict(architectures=["BertForMaskedLM"], model_type="bert", attention_probs_dropout_prob=0.1,
                hidden_act="gelu", hidden_dropout_prob=0.1, hidden_size=32, initializer_range=0.02,
                intermediate_size=64, layer_norm_eps=1e-12, max_position_embeddings=32, num_attention_heads=4,
                num_hidden_layers=2, pad_token_id=0, position_embedding_type="absolute", torch_dtype="float32",
                transformers_version="4.41.2", type_vocab_size=2, use_cache=True, vocab_size=100)


def bert_tokenizer_files(folder, fast):
    cfg = {"tokenizer_class": "BertTokenizerFast" if fast else "BertTokenizer", "do_lower_case": True,
           "model_max_length": 32, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
           "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenize_chinese_chars": True, "strip_accents": None,
           "clean_up_tokenization_spaces": True}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if not fast:
        with open(os.path.join(folder, "vocab.txt"), "w") as f:
            f.write("".join(t + "\n" for t in VOCAB))
        return
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": VOCAB.index(t), "content": t, "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True} for t in special],
          "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                         "strip_accents": None, "lowercase": True},
          "pre_tokenizer": {"type": "BertPreTokenizer"},
          "post_processor": {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}},
                                        {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                             "pair": [], "special_tokens": {}},
          "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
          "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                    "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(VOCAB)}}}
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tj, f, indent=1, ensure_ascii=False)


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def gpt2_tokenizer_files(folder):
    alpha = byte_alphabet()
    vocab = {alpha[b]: b for b in range(256)}  # ids = byte values, as a small test vocabulary
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n"), ("Ġ", "s"), ("e", "r"), ("o", "n"),
              ("Ġ", "w")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 32, "add_prefix_space": False,
                   "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, f,
                  indent=2)
    return len(vocab)


def main():
    torch.manual_seed(0)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    gold = {}

    # inputs: B = 3 sequences of L = 12, the last two padded
    B, L = 3, 12
    ids = torch.randint(5, 100, (B, L))
    am = torch.ones(B, L, dtype=torch.int64)
    am[1, 9:] = 0
    am[2, 5:] = 0
    ids[am == 0] = 0
    ids[:, 0] = 3  # [CLS]
    tt = torch.zeros(B, L, dtype=torch.int64)
    tt[0, 6:] = 1
    gold["bert.input_ids"], gold["bert.attention_mask"], gold["bert.token_type_ids"] = ids, am, tt

    # bert-mlm: BertForMaskedLM, vocab.txt
    d = os.path.join(OUT, "bert-mlm")
    c = dict(BERT_CFG)
    m = hf_ref.BertForMaskedLM(hf_ref.Cfg(c))
    with torch.no_grad():  # a nonzero decoder bias, so the test sees it
        m.cls.predictions.bias.normal_(0.0, 0.5)
    hf_ref.save_pretrained(m, d, c)
    bert_tokenizer_files(d, fast=False)
    gold["bert-mlm.logits"] = hf_ref.from_pretrained(d)(ids, am, tt).detach()

    # bert-cls: BertForSequenceClassification, 3 labels, sharded, tokenizer.json
    d = os.path.join(OUT, "bert-cls")
    c = dict(BERT_CFG, architectures=["BertForSequenceClassification"], intermediate_size=48,
             hidden_act="gelu_new", classifier_dropout=None,
             id2label={"0": "negative", "1": "neutral", "2": "positive"},
             label2id={"negative": 0, "neutral": 1, "positive": 2})
    m = hf_ref.BertForSequenceClassification(hf_ref.Cfg(c))
    with torch.no_grad():
        for p in m.parameters():  # LayerNorms and biases away from 1 / 0, so every tensor matters
            p.add_(torch.randn_like(p) * 0.05)
    hf_ref.save_pretrained(m, d, c, shards=2)
    bert_tokenizer_files(d, fast=True)
    gold["bert-cls.logits"] = hf_ref.from_pretrained(d)(ids, am, tt).detach()

    # gpt2: GPT2LMHeadModel, vocab.json + merges.txt
    d = os.path.join(OUT, "gpt2")
    os.makedirs(d)
    V = gpt2_tokenizer_files(d)
    c = dict(activation_function="gelu_new", architectures=["GPT2LMHeadModel"], attn_pdrop=0.1,
             bos_token_id=V - 1, embd_pdrop=0.1, eos_token_id=V - 1, initializer_range=0.02,
             layer_norm_epsilon=1e-05, model_type="gpt2", n_ctx=32, n_embd=32, n_head=4, n_inner=None,
             n_layer=2, n_positions=32, reorder_and_upcast_attn=False, resid_pdrop=0.1,
             scale_attn_by_inverse_layer_idx=False, scale_attn_weights=True, summary_activation=None,
             summary_first_dropout=0.1, summary_proj_to_labels=True, summary_type="cls_index",
             summary_use_proj=True, task_specific_params={"text-generation": {"do_sample": True, "max_length": 50}},
             torch_dtype="float32", transformers_version="4.41.2", use_cache=True, vocab_size=V)
    m = hf_ref.GPT2LMHeadModel(hf_ref.Cfg(c))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "ln" in n:
                p.add_(torch.randn_like(p) * 0.1)
    hf_ref.save_pretrained(m, d, c)
    gids = torch.randint(0, V, (2, 10))
    gam = torch.ones(2, 10, dtype=torch.int64)
    gam[1, 7:] = 0  # right padding (a left-padded first row would have no key to attend to)
    gold["gpt2.input_ids"], gold["gpt2.attention_mask"] = gids, gam
    gold["gpt2.logits"] = hf_ref.from_pretrained(d)(gids, gam).detach()

    stwrite.save(os.path.join(HERE, "hf_logits.safetensors"), gold)
    print("wrote", OUT, "and hf_logits.safetensors")


if __name__ == "__main__":
    main()
