#!/usr/bin/python3
"""Generates src/text/unicode_tables.c: the Unicode property tables the tokenizers need.

    apt-get install unicode-data          # Debian bookworm: Unicode 15.0.0 in /usr/share/unicode
    python3 tools/gen_unicode_tables.py > src/text/unicode_tables.c
    python3 tools/gen_unicode_tables.py --dir /path/to/UCD > ...   # any other UCD directory

Why the UCD files and not Python's `unicodedata`: the reference GPT-2 pre-tokenizer (the `regex`
module 2022.10.31 used by openai's encoder.py; tiktoken/HF agree) uses Unicode 15.0 for \\p{L} and
\\p{N}, while Debian's Python 3.11 `unicodedata` is Unicode 14.0, so letters and digits added in 15.0
(Kawi, CJK Extension H, ...) would be misclassified. The Unicode Character Database files are read
directly instead, so the tables follow whatever UCD version the files are (the version, taken from
the file headers, is written into the output and into cm_uni_version). Only the Python standard
library is needed; nothing here is needed to build or use the library, only to regenerate the table.
With Debian's unicode-data 15.0.0-1 the letter/number/space tables equal, range for range, what
`regex` 2022.10.31 (Debian python3-regex) matches for \\p{L} (659 ranges), \\p{N} (137) and \\s (10)
over all code points (checked when the table was regenerated), and every table agrees with Python
3.11's unicodedata on the code points Unicode 14 already assigned, except `cased`, which now is the
real Cased property (Python's Final_Sigma rule uses it; the old approximation missed e.g. U+00AA).

Sources (all in the UCD directory):
  UnicodeData.txt            general category (field 2), canonical combining class (field 3),
                             canonical decomposition (field 5 without a <tag>), simple lowercase
                             (field 13); "<..., First>"/"<..., Last>" pairs are expanded and
                             unlisted code points are Cn, as the UCD specifies.
  SpecialCasing.txt          unconditional full lowercase mappings (what Python's str.lower uses,
                             e.g. U+0130 -> "i" U+0307), which override field 13.
  PropList.txt               White_Space.
  DerivedCoreProperties.txt  Cased and Case_Ignorable (the properties CPython's str.lower uses for
                             its Final_Sigma rule).
The CJK ideograph blocks that BERT's `_is_chinese_char` lists literally are fixed by BERT's code.

Tables (all sorted, inclusive code point ranges, adjacent runs merged):
  letter    \\p{L}  = Lu Ll Lt Lm Lo            (GPT-2 regex)
  number    \\p{N}  = Nd Nl No                  (GPT-2 regex)
  space     White_Space                        (GPT-2 regex \\s: the `regex` module and tiktoken's
                                               fancy-regex both mean White_Space; Python's `re`
                                               also accepts U+001C..U+001F, `regex` does not)
  punct     P*                                 (BERT _is_punctuation, beside the ASCII ranges)
  control   C* (Cc Cf Cs Co Cn)                (BERT _is_control, minus \\t \\n \\r in code)
  zs        Zs                                 (BERT _is_whitespace, beside \\t \\n \\r and ' ')
  mn        Mn                                 (BERT accent stripping drops these after NFD)
  cjk       BERT's CJK blocks
  cased     Cased                              (Final_Sigma)
  case_ign  Case_Ignorable                     (Final_Sigma)
and the fold map for BERT uncased: for every code point c that is not Mn, not a surrogate and not a
Hangul syllable (those decompose algorithmically in code), fold(c) = NFD(lower(c)) with Mn
characters removed, listed when it differs from c. NFD is the full recursive canonical
decomposition followed by canonical ordering (stable sort of nonzero-ccc runs).
"""
import os
import re
import sys

MAX = 0x110000
DEFAULT_DIR = "/usr/share/unicode"

# BERT tokenization.py _is_chinese_char
CJK = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
       (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]

FILES = ["UnicodeData.txt", "SpecialCasing.txt", "PropList.txt", "DerivedCoreProperties.txt"]


def die(msg):
    sys.stderr.write("gen_unicode_tables.py: " + msg + "\n")
    sys.exit(1)


def data_lines(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                yield [x.strip() for x in line.split(";")]


def file_version(path):
    """The version in a UCD file's first line, e.g. '# PropList-15.0.0.txt' -> '15.0.0'."""
    with open(path, encoding="utf-8") as f:
        m = re.match(r"#\s*\S+?-(\d+\.\d+\.\d+)\.txt", f.readline())
    return m.group(1) if m else None


def read_property(path, name):
    """The set of code points with binary property `name` in a PropList-style file."""
    out = set()
    for fields in data_lines(path):
        if fields[1] != name:
            continue
        lo, _, hi = fields[0].partition("..")
        out.update(range(int(lo, 16), int(hi or lo, 16) + 1))
    if not out:
        die(f"{path} lists no code point with property {name}: is it a UCD PropList-style file?")
    return out


def read_unicode_data(path):
    cat = ["Cn"] * MAX
    ccc = [0] * MAX
    decomp = {}
    lower = {}
    first = None
    for fields in data_lines(path):
        if len(fields) != 15:
            die(f"{path}: expected 15 fields per line, got {len(fields)}: {';'.join(fields)}")
        cp = int(fields[0], 16)
        name = fields[1]
        if name.endswith(", First>"):
            first = cp
            continue
        lo = cp
        if name.endswith(", Last>"):
            if first is None:
                die(f"{path}: {name} at U+{cp:04X} without its First line")
            lo, first = first, None
        for c in range(lo, cp + 1):
            cat[c] = fields[2]
            ccc[c] = int(fields[3])
        if fields[5] and not fields[5].startswith("<"):
            decomp[cp] = [int(x, 16) for x in fields[5].split()]
        if fields[13]:
            lower[cp] = [int(fields[13], 16)]
    return cat, ccc, decomp, lower


def read_special_lower(path):
    """Unconditional full lowercase mappings (lines with no condition field)."""
    out = {}
    for fields in data_lines(path):
        if len(fields) > 4 and fields[4]:
            continue  # conditional (Final_Sigma, language-specific): not a plain mapping
        out[int(fields[0], 16)] = [int(x, 16) for x in fields[1].split()]
    return out


def ranges(pred):
    out = []
    start = None
    for cp in range(MAX):
        if pred(cp):
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, MAX - 1))
    return out


def emit_ranges(name, rs):
    print(f"const cm_uni_range cm_uni_{name}[] = {{")
    line = "   "
    for lo, hi in rs:
        item = f" {{0x{lo:X}, 0x{hi:X}}},"
        if len(line) + len(item) > 100:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")
    print(f"const size_t cm_uni_{name}_n = {len(rs)};\n")


def main():
    udir = DEFAULT_DIR
    args = sys.argv[1:]
    if args[:1] == ["--dir"] and len(args) == 2:
        udir = args[1]
    elif args:
        die("usage: gen_unicode_tables.py [--dir UCD_DIRECTORY] > src/text/unicode_tables.c")
    missing = [f for f in FILES if not os.path.isfile(os.path.join(udir, f))]
    if missing:
        die(f"missing {', '.join(missing)} in {udir}. Install the Unicode Character Database with "
            f"`apt-get install unicode-data` (Debian bookworm ships Unicode 15.0.0 in {DEFAULT_DIR}), "
            f"or pass --dir with a directory holding the UCD files.")
    path = {f: os.path.join(udir, f) for f in FILES}
    versions = {f: file_version(path[f]) for f in FILES if f not in ("UnicodeData.txt",)}
    version = versions["DerivedCoreProperties.txt"]
    if version is None or any(v != version for v in versions.values()):
        die(f"UCD files in {udir} disagree on (or lack) their version: {versions}")

    cat, ccc, decomp, lower = read_unicode_data(path["UnicodeData.txt"])
    lower.update(read_special_lower(path["SpecialCasing.txt"]))
    white = read_property(path["PropList.txt"], "White_Space")
    cased = read_property(path["DerivedCoreProperties.txt"], "Cased")
    case_ign = read_property(path["DerivedCoreProperties.txt"], "Case_Ignorable")

    def nfd_raw(cp, out):
        if 0xAC00 <= cp <= 0xD7A3:  # Hangul syllable: algorithmic
            s = cp - 0xAC00
            out += [0x1100 + s // 588, 0x1161 + (s % 588) // 28] + ([0x11A7 + s % 28] if s % 28 else [])
        elif cp in decomp:
            for d in decomp[cp]:
                nfd_raw(d, out)
        else:
            out.append(cp)

    def nfd(cps):
        out = []
        for cp in cps:
            nfd_raw(cp, out)
        i = 0  # canonical ordering: stable sort of each run of nonzero combining classes
        while i < len(out):
            if ccc[out[i]] == 0:
                i += 1
                continue
            j = i
            while j < len(out) and ccc[out[j]] != 0:
                j += 1
            out[i:j] = sorted(out[i:j], key=lambda c: ccc[c])
            i = j
        return out

    print(f"/* Generated by tools/gen_unicode_tables.py from the Unicode Character Database {version}")
    print(f" * ({udir}: UnicodeData.txt, SpecialCasing.txt, PropList.txt, DerivedCoreProperties.txt;")
    print(" * Debian package unicode-data). Unicode 15.0 is what GPT-2's reference pre-tokenizer (the")
    print(" * `regex` module 2022.10.31) uses. Do not edit; rerun the script instead (see its docstring).")
    print(" * See src/text/unicode.h for what each table means. */")
    print('#include "text/unicode.h"\n')
    print(f'const char cm_uni_version[] = "{version}";\n')
    emit_ranges("letter", ranges(lambda cp: cat[cp][0] == "L"))
    emit_ranges("number", ranges(lambda cp: cat[cp][0] == "N"))
    emit_ranges("space", ranges(lambda cp: cp in white))
    emit_ranges("punct", ranges(lambda cp: cat[cp][0] == "P"))
    emit_ranges("control", ranges(lambda cp: cat[cp][0] == "C"))
    emit_ranges("zs", ranges(lambda cp: cat[cp] == "Zs"))
    emit_ranges("mn", ranges(lambda cp: cat[cp] == "Mn"))
    emit_ranges("cjk", sorted(CJK))
    emit_ranges("cased", ranges(lambda cp: cp in cased))
    emit_ranges("case_ign", ranges(lambda cp: cp in case_ign))

    pool = []
    entries = []
    for cp in range(MAX):
        if cat[cp] in ("Mn", "Cs") or 0xAC00 <= cp <= 0xD7A3:
            continue
        f = [c for c in nfd(lower.get(cp, [cp])) if cat[c] != "Mn"]
        if f != [cp]:
            b = "".join(chr(c) for c in f).encode("utf-8")
            entries.append((cp, len(pool), len(b)))
            pool.extend(b)
    print("const cm_uni_fold cm_uni_fold_map[] = {")
    line = "   "
    for cp, off, n in entries:
        item = f" {{0x{cp:X}, {off}, {n}}},"
        if len(line) + len(item) > 100:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")
    print(f"const size_t cm_uni_fold_map_n = {len(entries)};\n")
    print("const uint8_t cm_uni_fold_pool[] = {")
    for i in range(0, len(pool), 24):
        print("    " + ", ".join(str(x) for x in pool[i:i + 24]) + ",")
    print("};")


if __name__ == "__main__":
    main()
