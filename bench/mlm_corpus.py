#!/usr/bin/python3
"""A larger masked-LM corpus than the text we ship, from English text in Debian's own packages
(no other source is reachable here), one text a line: WordNet 3.0's glosses and example sentences
(wordnet-base, 117,659 synsets), the GNU Collaborative International Dictionary of English's
entries (dict-gcide: Webster's 1913 with WordNet's additions; pronunciations, etymologies and
source tags stripped; 244,222 entries) and the fortune cookies of `fortunes` (13,493) — 6.4 M
words. The packages are downloaded and unpacked in WORKDIR, not installed (scripts/gpu-bundle runs
this too):

  /usr/bin/python3 bench/mlm_corpus.py --download WORKDIR CORPUS/corpus.txt

or, from packages already unpacked (or installed: ROOT /):

  /usr/bin/python3 bench/mlm_corpus.py ROOT CORPUS/corpus.txt

Then add CORPUS/corpus.txt to the masked-LM run's train_loader.dataset.path (docs/PERFORMANCE.md,
"A larger corpus from Debian's packages")."""
import glob, gzip, os, re, shutil, subprocess, sys

PACKAGES = ("wordnet-base", "dict-gcide", "fortunes")
args = sys.argv[1:]
download = args[:1] == ["--download"]
if download:
    args = args[1:]
if len(args) != 2:
    sys.exit("usage: mlm_corpus.py [--download WORKDIR | UNPACKED_ROOT] OUT.txt (see the top of this file)")
root = args[0]  # where the packages are unpacked (/ when installed)
if download:  # apt-get download into WORKDIR, unpacked under WORKDIR/x
    os.makedirs(root, exist_ok=True)
    try:
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=root, check=True, capture_output=True, text=True)
        for deb in sorted(glob.glob(os.path.join(root, "*.deb"))):
            subprocess.run(["dpkg", "-x", deb, os.path.join(root, "x")], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        said = (getattr(e, "stderr", "") or "").strip()
        sys.exit(f"mlm_corpus.py: could not download and unpack {' '.join(PACKAGES)} in {root}: {e}\n{said}")
    root = os.path.join(root, "x")
out_path = args[1]
out = open(out_path + ".part", "w")  # renamed when complete
n = {"wordnet": 0, "gcide": 0, "fortunes": 0}

# WordNet: "offset lex_filenum ss_type w_cnt word lex_id ... | gloss; \"example\"; ..."
for pos in ("noun", "verb", "adj", "adv"):
    for line in open(os.path.join(root, "usr/share/wordnet/data." + pos), encoding="latin-1"):
        if line.startswith("  ") or "|" not in line:
            continue
        head, gloss = line.split("|", 1)
        f = head.split()
        cnt = int(f[3], 16)
        words = [re.sub(r"\(.*\)$", "", f[4 + 2 * i]).replace("_", " ") for i in range(cnt)]
        parts = [p.strip().strip('"') for p in gloss.strip().split(";") if p.strip()]
        text = ", ".join(words) + ": " + "; ".join(parts)
        out.write(text + "\n")
        n["wordnet"] += 1

# GCIDE: entries are paragraphs; "Head \pron\, pos. [etym.]" then numbered senses and quotations
raw = gzip.open(os.path.join(root, "usr/share/dictd/gcide.dict.dz"), "rt", encoding="utf-8", errors="replace").read()
body = raw.split("Begin file 1 of 26", 1)[1]
for para in re.split(r"\n\s*\n", body):
    t = " ".join(l.strip() for l in para.splitlines())
    t = re.sub(r"\[(1913 Webster|PJC|WordNet 1\.5|Century Dict\.|Webster 1913 Suppl\.)[^\]]*\]", " ", t)
    t = re.sub(r"\\[^\\]*\\", " ", t)  # pronunciations
    t = re.sub(r"\[[^\]]*\]", " ", t)  # etymologies, labels
    t = re.sub(r"--[A-Z][\w. ]*", " ", t)  # quotation sources
    t = t.replace("{", "").replace("}", "").replace("\"", "")
    t = re.sub(r"\s+", " ", t).strip()
    if len(t.split()) < 4 or t.startswith("Begin file") or "GCIDE" in t:
        continue
    out.write(t + "\n")
    n["gcide"] += 1

# fortunes: texts separated by lines of "%"
fd = os.path.join(root, "usr/share/games/fortunes")
for name in sorted(os.listdir(fd)):
    p = os.path.join(fd, name)
    if "." in name or not os.path.isfile(p) or "art" in name:
        continue
    for t in open(p, encoding="latin-1").read().split("\n%\n"):
        t = re.sub(r"\s+", " ", t).strip()
        if len(t.split()) >= 4:
            out.write(t + "\n")
            n["fortunes"] += 1
out.close()
os.replace(out_path + ".part", out_path)
if download:  # the corpus is all that is kept
    shutil.rmtree(root)
    for deb in glob.glob(os.path.join(args[0], "*.deb")):
        os.remove(deb)
print(n)
