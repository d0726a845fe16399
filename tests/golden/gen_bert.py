"""Golden values for the BERT zoo models (tests/test_golden_bert.c), from PyTorch on CPU.

A minimal BERT written with plain torch (Debian's python3-torch 1.13; transformers is not needed)
with Hugging Face's module tree, parameter names and math (transformers' modeling_bert.py):
word + position + token-type embeddings (nn.Embedding with padding_idx = pad_token_id) then
LayerNorm; post-LN layers with exact (erf) GELU; the extended attention mask
(1 - mask)[:, None, None, :] * torch.finfo(float32).min added to the scores, as transformers >= 4
(older versions added -10000; both give exactly zero weight to padded keys in f32, which is what
the C attention's key padding mask does: the script checks the two agree); the pooler
tanh(dense(h[:, 0])) and classifier; the MLM head transform (dense, GELU, LayerNorm) and a decoder
whose weight is the word embedding matrix and whose bias is cls.predictions.bias.

Writes, for a tiny config (vocab 100, hidden 32, 2 layers, 4 heads, intermediate 64, max_pos 32):
  bert_mlm.safetensors  BertForMaskedLM weights as Hugging Face stores them (with the tied aliases
                        cls.predictions.decoder.{weight,bias} and the bert.embeddings.position_ids
                        buffer, which loaders must ignore)
  bert_cls.safetensors  BertForSequenceClassification weights (with position_ids)
  bert.safetensors      the batch (with padding), and for "mlm" and "cls": logits, loss and the
                        gradient of every parameter ("<tag>.grad.<HF name>"); the parameter counts
                        of bert-base-uncased ("count.cls", "count.mlm") from torch.
Dropout is off (p = 0, eval-free math). Run from the repo root: /usr/bin/python3 tests/golden/gen_bert.py
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class Cfg:
    def __init__(self, **kw):
        self.vocab_size, self.hidden_size, self.num_hidden_layers = 30522, 768, 12
        self.num_attention_heads, self.intermediate_size = 12, 3072
        self.max_position_embeddings, self.type_vocab_size = 512, 2
        self.layer_norm_eps, self.pad_token_id, self.num_labels = 1e-12, 0, 2
        self.__dict__.update(kw)


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.register_buffer("position_ids", torch.arange(c.max_position_embeddings).expand((1, -1)))

    def forward(self, ids, tt):
        pos = self.position_ids[:, : ids.shape[1]]
        x = self.word_embeddings(ids) + self.token_type_embeddings(tt) + self.position_embeddings(pos)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.H = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x, ext):
        B, T, C = x.shape
        D = C // self.H
        q, k, v = (t.view(B, T, self.H, D).transpose(1, 2) for t in (self.query(x), self.key(x), self.value(x)))
        s = q @ k.transpose(-1, -2) / math.sqrt(D) + ext
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


class BertOut(nn.Module):  # BertSelfOutput and BertOutput
    def __init__(self, i, c):
        super().__init__()
        self.dense = nn.Linear(i, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, h, res):
        return self.LayerNorm(self.dense(h) + res)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self, self.output = BertSelfAttention(c), BertOut(c.hidden_size, c)

    def forward(self, x, ext):
        return self.output(self.self(x, ext), x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention, self.intermediate = BertAttention(c), BertIntermediate(c)
        self.output = BertOut(c.intermediate_size, c)

    def forward(self, x, ext):
        h = self.attention(x, ext)
        return self.output(self.intermediate(h), h)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c.num_hidden_layers)])

    def forward(self, x, ext):
        for l in self.layer:
            x = l(x, ext)
        return x


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h):
        return torch.tanh(self.dense(h[:, 0]))


MASK_MIN = torch.finfo(torch.float32).min


class BertModel(nn.Module):
    def __init__(self, c, pooler):
        super().__init__()
        self.embeddings, self.encoder = BertEmbeddings(c), BertEncoder(c)
        self.pooler = BertPooler(c) if pooler else None

    def forward(self, ids, am, tt, neg=MASK_MIN):
        ext = (1.0 - am[:, None, None, :].float()) * neg
        return self.encoder(self.embeddings(ids, tt), ext)


class BertForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c, True)
        self.classifier = nn.Linear(c.hidden_size, c.num_labels)

    def forward(self, ids, am, tt, neg=MASK_MIN):
        return self.classifier(self.bert.pooler(self.bert(ids, am, tt, neg)))


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = BertPredictionHeadTransform(c)
        self.decoder = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, x):
        return self.decoder(self.transform(x))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = BertLMPredictionHead(c)

    def forward(self, x):
        return self.predictions(x)


class BertForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c, False)
        self.cls = BertOnlyMLMHead(c)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, ids, am, tt, neg=MASK_MIN):
        return self.cls(self.bert(ids, am, tt, neg))


def n_params(m):
    return sum(p.numel() for p in m.parameters())  # tied parameters once


def randomise(m):
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))


# bert-base-uncased counts, to check cm_bert_count_params against torch
base = Cfg()
count_cls, count_mlm = n_params(BertForSequenceClassification(base)), n_params(BertForMaskedLM(base))
assert count_cls == 109483778, count_cls
print("bert-base-uncased parameters: classifier", count_cls, "masked LM", count_mlm)

torch.manual_seed(20240607)
c = Cfg(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, type_vocab_size=2, num_labels=3)
B, L = 3, 10
ids = torch.randint(5, c.vocab_size, (B, L))
am = torch.ones(B, L, dtype=torch.int32)
am[1, 7:] = 0
am[2, 4:] = 0
ids[am == 0] = c.pad_token_id
ids[0, 3] = c.pad_token_id  # a [PAD] id at an attended position: padding_idx keeps its row's gradient 0
tt = torch.zeros(B, L, dtype=torch.int32)
tt[0, 5:] = 1
tt[1, 4:7] = 1
labels = torch.full((B, L), -100, dtype=torch.int64)
for b, i in [(0, 1), (0, 6), (0, 9), (1, 2), (1, 5), (2, 3)]:
    labels[b, i] = int(torch.randint(0, c.vocab_size, ()))
label = torch.tensor([2, 0, 1], dtype=torch.int64)

out = {"input_ids": ids.int(), "attention_mask": am, "token_type_ids": tt, "labels": labels, "label": label,
       "count.cls": torch.tensor([count_cls]), "count.mlm": torch.tensor([count_mlm])}

for tag, cls_, loss_fn in [
    ("mlm", BertForMaskedLM, lambda lo: F.cross_entropy(lo.view(-1, c.vocab_size), labels.view(-1))),
    ("cls", BertForSequenceClassification, lambda lo: F.cross_entropy(lo.view(-1, c.num_labels), label.view(-1))),
]:
    m = cls_(c)
    randomise(m)
    # the old -10000 mask gives the same result: padded keys get exactly zero weight either way
    with torch.no_grad():
        assert torch.equal(m(ids, am, tt), m(ids, am, tt, -10000.0))
    logits = m(ids, am, tt)
    loss = loss_fn(logits)
    loss.backward()
    out[f"{tag}.logits"], out[f"{tag}.loss"] = logits, loss.reshape(1)
    for name, p in m.named_parameters():
        out[f"{tag}.grad.{name}"] = p.grad
    sd = dict(m.state_dict())  # Hugging Face's keys, tied aliases and position_ids included
    if tag == "mlm":
        assert "cls.predictions.decoder.weight" in sd and "cls.predictions.decoder.bias" in sd
        assert m.bert.embeddings.word_embeddings.weight.grad[c.pad_token_id].abs().sum() > 0  # from the decoder
    stwrite.save(os.path.join(HERE, f"bert_{tag}.safetensors"), {k: v.clone() for k, v in sd.items()},
                 {"format": "pt"})
    print(tag, "loss", loss.item(), "params", n_params(m))

path = os.path.join(HERE, "bert.safetensors")
stwrite.save(path, out)
for f in ("bert.safetensors", "bert_mlm.safetensors", "bert_cls.safetensors"):
    print("wrote", f, os.path.getsize(os.path.join(HERE, f)), "bytes")


def check_c_file(p, cls_):
    """Loads a file the C library saved into the torch model, strictly (a manual check:
    /usr/bin/python3 tests/golden/gen_bert.py --check FILE mlm|cls)."""
    from_c = {}
    import json
    import struct
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
        from_c[k] = t
    m = cls_(c)
    m.load_state_dict(from_c, strict=False) if "--lenient" in sys.argv else m.load_state_dict(
        {**from_c, "bert.embeddings.position_ids": m.bert.embeddings.position_ids}, strict=True)
    print("torch loaded", p, "strictly:", len(from_c), "tensors")


if len(sys.argv) >= 4 and sys.argv[1] == "--check":
    check_c_file(sys.argv[2], BertForMaskedLM if sys.argv[3] == "mlm" else BertForSequenceClassification)
