"""BERT's uncased WordPiece tokenization in plain Python (no torch): the basic tokenizer (lower,
strip accents, split on whitespace and punctuation) and greedy longest-match-first WordPiece.
Shared by tests/golden/gen_hf_sst2.py and bench/hf_probe.py; the C tokenizer (src/text) is
checked against Hugging Face's own vectors elsewhere."""
import unicodedata


def is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def basic(text):
    """BERT's basic tokenizer, uncased: lower, strip accents, split on whitespace and punctuation."""
    out = []
    for word in text.lower().split():
        word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
        cur = ""
        for ch in word:
            if is_punct(ch):
                if cur:
                    out.append(cur)
                out.append(ch)
                cur = ""
            else:
                cur += ch
        if cur:
            out.append(cur)
    return out


def wordpiece(word, vocab):
    if len(word) > 100:
        return ["[UNK]"]
    out, start = [], 0
    while start < len(word):
        end, cur = len(word), None
        while start < end:
            s = word[start:end] if start == 0 else "##" + word[start:end]
            if s in vocab:
                cur = s
                break
            end -= 1
        if cur is None:
            return ["[UNK]"]
        out.append(cur)
        start = end
    return out

