#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (small valid files) into tests/fuzz/corpus/.
Run from anywhere: python3 tests/fuzz/make_corpus.py. The outputs are committed; rerun only to
change them. (gzip with mtime=0 keeps the bytes reproducible.)"""
import gzip
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx(type_code, dims, payload):
    return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", x) for x in dims) + payload


# IDX: MNIST-shaped images and labels (plain and gzip'd), and the other element types.
images = idx(0x08, [2, 28, 28], bytes((i * 37) & 255 for i in range(2 * 28 * 28)))
labels = idx(0x08, [10], bytes(range(10)))
out("idx", "images_2x28x28.idx", images)
out("idx", "labels_10.idx", labels)
out("idx", "images_2x28x28.idx.gz", gzip.compress(images, mtime=0))
out("idx", "labels_10.idx.gz", gzip.compress(labels, mtime=0))
out("idx", "i16_3x2.idx", idx(0x0B, [3, 2], struct.pack(">6h", 1, -2, 3, -4, 5, -6)))
out("idx", "i32_4.idx", idx(0x0C, [4], struct.pack(">4i", 1, 2, 3, 4)))
out("idx", "f32_2x2.idx", idx(0x0D, [2, 2], struct.pack(">4f", 0.5, 1.5, -2.0, 3.25)))
out("idx", "f64_1x1x1x2.idx", idx(0x0E, [1, 1, 1, 2], struct.pack(">2d", 1.0, -1.0)))
out("idx", "i8_empty.idx", idx(0x09, [0, 5], b""))


# Token files: 256 int32 header (magic, version, count; words 3..4 steer the fuzz target:
# byte 12 = seq_len - 1, byte 13 bit 0 = i64 output, bytes 16..17 = vocab_size), then tokens.
def tokens(version, toks, seq_len_m1=3, i64=0, vocab=0):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, version, len(toks)
    hdr[3] = seq_len_m1 | (i64 << 8)
    hdr[4] = vocab
    fmt = "<%dH" % len(toks) if version == 1 else "<%dI" % len(toks)
    return struct.pack("<256i", *hdr) + struct.pack(fmt, *toks)


out("tokens", "u16_20_T4.bin", tokens(1, [(i * 7919) % 50257 for i in range(20)]))
out("tokens", "u16_2_T1_vocab.bin", tokens(1, [7, 65535], seq_len_m1=0, vocab=300))
out("tokens", "u32_33_T8_i64.bin", tokens(2, [(i * 104729) % 4000000007 for i in range(33)], seq_len_m1=7, i64=1))
out("tokens", "u32_big_T2_i32.bin", tokens(2, [1, 2**31, 2**32 - 1, 5, 6], seq_len_m1=1))
out("tokens", "u16_empty.bin", tokens(1, []))


# safetensors: small valid files with several dtypes (the shared test vectors stay in ../shared).
import json


def st_file(tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


out("safetensors", "empty.safetensors", st_file([]))
out("safetensors", "several.safetensors", st_file([
    ("a", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
    ("b", "BF16", [3], struct.pack("<3H", 0x3f80, 0x4000, 0xc040)),
    ("c", "I64", [], struct.pack("<q", -7)),
    ("d", "U8", [0, 4], b""),
], {"format": "pt"}))

# SST-2 TSV: the GLUE train/dev header, the unlabelled test header, CRLF and a blank line.
out("tsv", "train.tsv", b"sentence\tlabel\nthe movie is good \t1\nnot a good film , \t0\n")
out("tsv", "test.tsv", b"index\tsentence\n0\tthe film\n1\tbad movies !\n")
out("tsv", "crlf.tsv", b"sentence\tlabel\r\nunable to s ' e \t0\r\n\r\n")

# Hugging Face tokenizer.json: the golden folders' WordPiece tokenizer.json, and their GPT-2
# vocabulary with merges as "a b" strings (tokenizers < 0.20) and as pairs.
import json  # noqa: E402

GOLD = os.path.join(HERE, "..", "golden", "hf")
with open(os.path.join(GOLD, "bert-cls", "tokenizer.json"), "rb") as f:
    out("hf_tokenizer", "wordpiece.json", f.read())
with open(os.path.join(GOLD, "gpt2", "vocab.json"), encoding="utf-8") as f:
    enc = json.load(f)
with open(os.path.join(GOLD, "gpt2", "merges.txt"), encoding="utf-8") as f:
    merges = [line.rstrip("\n") for line in f][1:]
tj = {"version": "1.0", "added_tokens": [{"id": 265, "content": "<|endoftext|>", "special": True}], "normalizer": None,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
      "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": enc, "merges": merges}}
out("hf_tokenizer", "bpe_strings.json", json.dumps(tj, ensure_ascii=False).encode())
tj["model"]["merges"] = [m.split(" ") for m in merges]
out("hf_tokenizer", "bpe_pairs.json", json.dumps(tj, ensure_ascii=False).encode())
