"""A plain-torch reference for Hugging Face pretrained folders (Debian's python3-torch has no
`transformers`): BERT and GPT-2 written after transformers' modeling_bert.py and modeling_gpt2.py
(the eager attention path, module names, parameter names, initialisation and math), built from a
folder's config.json, loaded from its safetensors (single file or a sharded index) and saved back
in the layout `save_pretrained` writes.

What follows transformers exactly:
- BertEmbeddings: word + token_type, then + position embeddings (absolute), LayerNorm, dropout;
  nn.Embedding(padding_idx=pad_token_id) for the words.
- BertSelfAttention: q·kᵀ/√d + the extended mask (1 - mask) · finfo(f32).min, softmax, dropout;
  BertSelfOutput / BertOutput: LayerNorm(dropout(dense(h)) + residual); BertIntermediate:
  ACT2FN[hidden_act](dense(x)).
- BertPooler tanh(dense(h[:, 0])); BertForSequenceClassification: classifier(dropout(pooled));
  BertForMaskedLM (BertModel without pooler): cls.predictions.transform (dense, act, LayerNorm),
  decoder Linear without bias whose weight is the word embeddings and whose bias is
  cls.predictions.bias.
- GPT-2: wte + wpe, dropout, pre-LN blocks with Conv1D (in, out) weights, causal attention with
  the masked scores set to finfo(f32).min and the padding mask added as (1 - mask) · min, MLP
  c_fc → ACT2FN[activation_function] → c_proj, ln_f, lm_head tied to wte.
- ACT2FN: gelu (erf), gelu_new / gelu_pytorch_tanh / gelu_fast (tanh form), relu, silu, swish,
  tanh, sigmoid, linear.
- save_pretrained drops the tied names (cls.predictions.decoder.{weight,bias}, lm_head.weight);
  from_pretrained accepts their absence and re-ties; other missing names are an error here
  (transformers would initialise them and warn; a test wants to know).

Used by gen_hf.py (golden folders and logits) and by ../hf_ref_check.py (loads a folder the C
library exported and compares its logits)."""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MIN = torch.finfo(torch.float32).min

# ---------------------------------------------------------------------------------------------
# safetensors (read: numpy over the file; write: stwrite)
# ---------------------------------------------------------------------------------------------

_NP = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
       "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[base + a:base + b]
        if e["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=_NP[e["dtype"]])
        out[name] = torch.from_numpy(arr.copy().reshape(e["shape"]))
    return out


def read_folder_weights(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        out = {}
        for shard in sorted(set(wm.values())):
            for k, v in read_safetensors(os.path.join(folder, shard)).items():
                assert wm.get(k) == shard, f"{shard}: tensor {k} is not mapped to it"
                out[k] = v
        assert set(out) == set(wm), f"index lists tensors its shards lack: {set(wm) - set(out)}"
        return out
    return read_safetensors(os.path.join(folder, "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# activations (transformers' ACT2FN)
# ---------------------------------------------------------------------------------------------

def _gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACT2FN = {"gelu": F.gelu, "gelu_new": _gelu_new, "gelu_pytorch_tanh": _gelu_new, "gelu_fast": _gelu_new,
          "relu": F.relu, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
          "linear": lambda x: x}


class Cfg:
    """config.json as attributes, with transformers' defaults for the fields it may omit."""

    BERT = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0, classifier_dropout=None,
                position_embedding_type="absolute")
    GPT2 = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
                activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                layer_norm_epsilon=1e-5, initializer_range=0.02, scale_attn_weights=True,
                tie_word_embeddings=True)

    def __init__(self, d):
        self.raw = dict(d)
        base = self.BERT if d.get("model_type") == "bert" else self.GPT2
        for k, v in base.items():
            setattr(self, k, d.get(k, v))
        for k, v in d.items():
            setattr(self, k, v)
        if "id2label" in d:
            self.num_labels = len(d["id2label"])
        elif not hasattr(self, "num_labels"):
            self.num_labels = 2


# ---------------------------------------------------------------------------------------------
# BERT (modeling_bert.py)
# ---------------------------------------------------------------------------------------------

class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(c.max_position_embeddings).expand((1, -1)),
                             persistent=False)

    def forward(self, ids, tt):
        pos = self.position_ids[:, : ids.shape[1]]
        x = self.word_embeddings(ids) + self.token_type_embeddings(tt)
        x = x + self.position_embeddings(pos)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.H = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def forward(self, x, ext):
        B, T, C = x.shape
        D = C // self.H
        q, k, v = (t.view(B, T, self.H, D).transpose(1, 2) for t in (self.query(x), self.key(x), self.value(x)))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D) + ext
        p = self.dropout(nn.functional.softmax(s, dim=-1))
        return torch.matmul(p, v).permute(0, 2, 1, 3).reshape(B, T, C)


class BertOut(nn.Module):  # BertSelfOutput and BertOutput
    def __init__(self, i, c):
        super().__init__()
        self.dense = nn.Linear(i, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, h, res):
        return self.LayerNorm(self.dropout(self.dense(h)) + res)


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
        self.act = ACT2FN[c.hidden_act]

    def forward(self, x):
        return self.act(self.dense(x))


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
        for layer in self.layer:
            x = layer(x, ext)
        return x


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, h):
        return torch.tanh(self.dense(h[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c, add_pooling_layer=True):
        super().__init__()
        self.embeddings, self.encoder = BertEmbeddings(c), BertEncoder(c)
        self.pooler = BertPooler(c) if add_pooling_layer else None

    def forward(self, ids, am=None, tt=None):
        if am is None:
            am = torch.ones_like(ids)
        if tt is None:
            tt = torch.zeros_like(ids)
        ext = (1.0 - am[:, None, None, :].float()) * MIN
        return self.encoder(self.embeddings(ids, tt), ext)


class BertPreTrainedModel(nn.Module):
    def _init_weights(self, m):  # transformers' BertPreTrainedModel._init_weights
        r = self.config.initializer_range
        if isinstance(m, nn.Linear):
            m.weight.data.normal_(mean=0.0, std=r)
            if m.bias is not None:
                m.bias.data.zero_()
        elif isinstance(m, nn.Embedding):
            m.weight.data.normal_(mean=0.0, std=r)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            m.bias.data.zero_()
            m.weight.data.fill_(1.0)


class BertForSequenceClassification(BertPreTrainedModel):
    tied = ()

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.bert = BertModel(c)
        p = c.classifier_dropout if c.classifier_dropout is not None else c.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(c.hidden_size, c.num_labels)
        self.apply(self._init_weights)

    def forward(self, ids, am=None, tt=None):
        h = self.bert(ids, am, tt)
        return self.classifier(self.dropout(self.bert.pooler(h)))


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.act = ACT2FN[c.hidden_act]
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.act(self.dense(x)))


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


class BertForMaskedLM(BertPreTrainedModel):
    tied = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.bert = BertModel(c, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(c)
        self.apply(self._init_weights)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, ids, am=None, tt=None):
        return self.cls(self.bert(ids, am, tt))


# ---------------------------------------------------------------------------------------------
# GPT-2 (modeling_gpt2.py)
# ---------------------------------------------------------------------------------------------

class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        P = c.n_positions
        self.register_buffer("bias", torch.tril(torch.ones((P, P), dtype=torch.bool)).view(1, 1, P, P),
                             persistent=False)
        self.C, self.H = c.n_embd, c.n_head
        self.c_attn, self.c_proj = Conv1D(3 * self.C, self.C), Conv1D(self.C, self.C)
        self.attn_dropout, self.resid_dropout = nn.Dropout(c.attn_pdrop), nn.Dropout(c.resid_pdrop)

    def forward(self, x, ext):
        b, t, _ = x.shape
        D = self.C // self.H
        q, k, v = self.c_attn(x).split(self.C, dim=2)
        q, k, v = (z.view(b, t, self.H, D).permute(0, 2, 1, 3) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        causal = self.bias[:, :, :t, :t]
        w = torch.where(causal, w, torch.full([], MIN, dtype=w.dtype))
        if ext is not None:
            w = w + ext
        w = self.attn_dropout(nn.functional.softmax(w, dim=-1))
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(b, t, self.C)
        return self.resid_dropout(self.c_proj(a))


class GPT2MLP(nn.Module):
    def __init__(self, inner, c):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(inner, c.n_embd), Conv1D(c.n_embd, inner)
        self.act, self.dropout = ACT2FN[c.activation_function], nn.Dropout(c.resid_pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        inner = c.n_inner if c.n_inner is not None else 4 * c.n_embd
        self.ln_1 = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.mlp = GPT2MLP(inner, c)

    def forward(self, x, ext):
        x = x + self.attn(self.ln_1(x), ext)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.n_positions, c.n_embd)
        self.drop = nn.Dropout(c.embd_pdrop)
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)

    def forward(self, ids, am=None):
        ext = None if am is None else (1.0 - am[:, None, None, :].float()) * MIN
        pos = torch.arange(ids.shape[1])[None]
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for blk in self.h:
            x = blk(x, ext)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    tied = ("lm_head.weight",)

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        for name, p in self.named_parameters():  # GPT2PreTrainedModel._init_weights
            if name.endswith("c_proj.weight"):
                p.data.normal_(mean=0.0, std=c.initializer_range / math.sqrt(2 * c.n_layer))
            elif "ln" in name.split(".")[-2]:
                p.data.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("weight"):
                p.data.normal_(mean=0.0, std=c.initializer_range)
            else:
                p.data.zero_()
        if c.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids, am=None, tt=None):
        return self.lm_head(self.transformer(ids, am))


# ---------------------------------------------------------------------------------------------
# from_pretrained / save_pretrained
# ---------------------------------------------------------------------------------------------

CLASSES = {"BertForMaskedLM": BertForMaskedLM, "BertForSequenceClassification": BertForSequenceClassification,
           "GPT2LMHeadModel": GPT2LMHeadModel}


def load_config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return Cfg(json.load(f))


def from_pretrained(folder, cls_name=None, new_heads=()):
    """The model class cls_name (default: config.json's architectures[0]) with the folder's weights.
    Names in the file that the model lacks are an error unless they belong to another head of the
    same family (cls.*, bert.pooler.*, classifier.*: transformers warns and drops them); missing
    names are an error unless tied or listed in new_heads (glob prefixes)."""
    c = load_config(folder)
    cls_name = cls_name or c.architectures[0]
    model = CLASSES[cls_name](c)
    sd = read_folder_weights(folder)
    prefix = "transformer." if cls_name.startswith("GPT2") else "bert."
    fixed = {}
    for k, v in sd.items():
        if prefix == "transformer." and not k.startswith(("transformer.", "lm_head.")):
            k = prefix + k
        if prefix == "bert." and k.startswith(("embeddings.", "encoder.", "pooler.")):
            k = prefix + k
        fixed[k] = v.float()
    own = model.state_dict()
    unused = [k for k in fixed if k not in own]
    other_heads = ("cls.", "bert.pooler.", "classifier.")
    bad = [k for k in unused if not k.startswith(other_heads)]
    assert not bad, f"{folder}: unexpected tensors {bad}"
    missing = [k for k in own if k not in fixed and k not in model.tied and not k.startswith(tuple(new_heads))]
    assert not missing, f"{folder}: missing tensors {missing}"
    model.load_state_dict({k: v for k, v in fixed.items() if k in own}, strict=False)
    if getattr(c, "tie_word_embeddings", True):
        if cls_name == "BertForMaskedLM":
            model.cls.predictions.decoder.weight = model.bert.embeddings.word_embeddings.weight
        elif cls_name == "GPT2LMHeadModel":
            model.lm_head.weight = model.transformer.wte.weight
    return model.eval()


def state_dict_to_save(model):
    """model.state_dict() less the tied names, as save_pretrained drops them."""
    return {k: v for k, v in model.state_dict().items() if k not in model.tied}


def save_pretrained(model, folder, config, shards=1):
    """config.json (config, a dict) and the weights: model.safetensors, or `shards` files
    model-0000k-of-0000N.safetensors with model.safetensors.index.json, as transformers names them."""
    import stwrite
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    sd = state_dict_to_save(model)
    if shards == 1:
        stwrite.save(os.path.join(folder, "model.safetensors"), sd, {"format": "pt"})
        return
    names = sorted(sd)
    per = (len(names) + shards - 1) // shards
    wm, total = {}, 0
    for s in range(shards):
        part = {k: sd[k] for k in names[s * per:(s + 1) * per]}
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        stwrite.save(os.path.join(folder, fn), part, {"format": "pt"})
        for k, v in part.items():
            wm[k] = fn
            total += v.numel() * v.element_size()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2, sort_keys=True)
        f.write("\n")
