#!/usr/bin/env python3
"""tokcmp.py SPARKMONO WORKDIR [NAME=TOKENIZER.json ...]: our tokenizer against the Python
`tokenizers` package, token for token.

Trains small byte-level BPE tokenizers with the package (fixed corpus, so the files are the
same every run) in the shapes real checkpoints ship: a regex Split + ByteLevel (Llama-3
pattern, merges as pairs, special and added tokens), GPT-2's ByteLevel alone (prefix space,
merges rewritten as "a b" strings), a GPT-4o-like pattern with ignore_merges, and a Sequence of
Splits with every delimiter behaviour.  Then a few thousand strings from a fixed seed
(scripts, CJK, emoji, combining marks, whitespace runs, digits, special tokens inside text,
the empty string, pieces longer than the cache holds) are encoded by both (`sparkmono
tokenize --batch`) and the ids compared; the ids, and random id sequences, are decoded by
both, with and without special tokens.  Extra NAME=FILE arguments (make-model's tokenizer)
get the same comparisons.  Prints PASS/FAIL lines (tests/cli_tokenizer.sh counts them).
A missing `tokenizers` package is a FAIL, never a skip.
"""
import json
import os
import random
import subprocess
import sys

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as ex:
    print(f"FAIL tok_python_package (python3 cannot import tokenizers: {ex}; "
          "make test installs it into build/venv, from tools/py-requirements.txt)")
    sys.exit(1)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
UP, LO = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
CONTR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{UP}*{LO}+{CONTR}|[^\r\n\p{{L}}\p{{N}}]?{UP}+{LO}*{CONTR}|\p{{N}}{{1,3}}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|end|>", "<|eot_id|>"]

WORDS = ("the of and to in is was that for it with as his on be at by I this had not are but from or have an they which "
         "one you were her all she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like our "
         "over man me even most made after also did many before must through back years where much your way well down "
         "should because each just those people Mr how too little state good very make world still own see men work long "
         "get here between both life being under never day same another know while last might us great old year off come "
         "since against go came right used take three lighthouse harbour tokenizer encoding internationalization").split()
PUNCT = list(".,;:!?()[]{}<>\"'`~@#$%^&*-_=+/\\|") + ["...", "--", "!?", "\"'", "'s", "'S", "'ll", "'RE", "'ſ", "n't"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "  \n", " \n ", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c",
          "\u0085", "\u2009", "\u200b", " " * 17, "\t\t", "\r", "\n\n\n  "]
UNI = ["日本語", "中文字符", "漢字かなカナ", "한국어", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🚀🚀", "e\u0301", "a\u0308\u0323",
       "ñ", "Å", "ﬁ", "привет", "Καλημέρα", "Σίσυφος", "مرحبا", "שלום", "नमस्ते", "สวัสดี", "ſ", "\u212a", "İ", "ß",
       "Ⅻ", "½", "²", "٣٤٥", "१२३", "\x00", "\x01", "\x7f", "\u00ad", "\ufeff", "\U0001d400", "𝔘𝔫𝔦", "ǅ", "ᾈ"]
SPECIAL_TEXT = SPECIALS + ["<|endoftext|>", "<tool>", "<|e", "<|end", "<|", "|>", "<|eot_id", "<|end_of_text|"]


def corpus(rng, n):
    """n lines of text for training: words, numbers, unicode and punctuation."""
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(3, 25)):
            r = rng.random()
            if r < 0.7:
                w = rng.choice(WORDS)
                parts.append(w.capitalize() if rng.random() < 0.15 else w.upper() if rng.random() < 0.03 else w)
            elif r < 0.8:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
            elif r < 0.9:
                parts.append(rng.choice(UNI))
            else:
                parts.append(rng.choice(PUNCT))
        out.append(" ".join(parts) + rng.choice([".", "!", "?", ",", ""]) + rng.choice(["\n", "\n\n", " "]))
    return out


def cases(rng, n):
    """n strings to compare, the edge cases first."""
    fixed = ["", " ", "\n", "a", "  ", "\r\n", "Hello world", " Hello", "Hello  world  ", "a" * 300, "a" * 4000,
             "ab" * 3000, " " * 300, "\n" * 50, "1" * 50, "!" * 40, "x" + " " * 40 + "y", "'s", "'S's", "don't WON'T",
             "<|end|>", "<|end|><|end|>", "<|end_of_text|>", "a<|end_of_text|>b", "<|e<|end|>", "<tool>", " <tool> ",
             "<|endoftext|>", "😀" * 30, "e\u0301" * 20, "日本語" * 40]
    fixed += SPECIAL_TEXT
    out = list(fixed)
    pools = [WORDS, PUNCT, SPACES, UNI, SPECIAL_TEXT]
    weights = [0.45, 0.15, 0.2, 0.15, 0.05]
    while len(out) < n:
        k = rng.randint(1, 14)
        s = []
        for _ in range(k):
            pool = rng.choices(pools, weights)[0]
            x = rng.choice(pool)
            if pool is WORDS and rng.random() < 0.2:
                x = x.capitalize() if rng.random() < 0.7 else x.upper()
            if rng.random() < 0.08:
                x = str(rng.randint(0, 10 ** rng.randint(1, 15)))
            s.append(x)
            s.append(rng.choice(["", "", " ", " ", " ", rng.choice(SPACES)]))
        out.append("".join(s))
    return out


def train(path, pre, vocab, data, specials=SPECIALS, added=(), decoder=None):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoder or decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials), show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(data, tr)
    if added:
        tok.add_tokens([AddedToken(a, special=False, normalized=True) for a in added])
    tok.save(path)


def edit(path, fn):
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    fn(j)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def make_tokenizers(work, rng):
    data = corpus(rng, 4000)
    tk = {}
    p = tk["llama3"] = os.path.join(work, "llama3.json")
    train(p, pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated", invert=False),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
          1500, data, added=["<tool>", "<|e"])
    p = tk["gpt2"] = os.path.join(work, "gpt2.json")
    train(p, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), 1200, data, specials=["<|endoftext|>"])
    edit(p, lambda j: j["model"].__setitem__("merges", [" ".join(m) if isinstance(m, list) else m
                                                        for m in j["model"]["merges"]]))
    p = tk["gpt4o"] = os.path.join(work, "gpt4o.json")
    train(p, pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(GPT4O), "isolated", invert=False),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
          2000, data)
    edit(p, lambda j: j["model"].__setitem__("ignore_merges", True))
    p = tk["behaviors"] = os.path.join(work, "behaviors.json")
    train(p, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), "merged_with_next", invert=False),
        pre_tokenizers.Split("-", "removed", invert=False),
        pre_tokenizers.Split(Regex(r"[,.;]"), "merged_with_previous", invert=False),
        pre_tokenizers.Split(Regex(r"\s+"), "contiguous", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]), 800, data)
    p = tk["inverted"] = os.path.join(work, "inverted.json")
    train(p, pre_tokenizers.Sequence([  # Oniguruma's ^ and $ are line anchors
        pre_tokenizers.Split(Regex(r"^\s?\p{L}|\p{L}$"), "isolated", invert=False),
        pre_tokenizers.Split(Regex(r"\p{L}+|\n"), "removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 600, data)
    return tk


def run_batch(sm, tok, lines, work, skip=False):
    """sparkmono tokenize --batch over JSON lines; its output lines parsed, or an error string."""
    inp = os.path.join(work, "batch.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for x in lines:
            f.write(json.dumps(x) + "\n")
    cmd = [sm, "tokenize", "--tokenizer", tok, "--batch", inp] + (["--skip-special"] if skip else [])
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        return f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[:300]}"
    out = r.stdout.decode("utf-8").split("\n")
    if out and out[-1] == "":
        out.pop()
    if len(out) != len(lines):
        return f"{len(out)} output lines for {len(lines)} inputs"
    return [json.loads(x) for x in out]


def compare(name, want, got, inputs):
    if isinstance(got, str):
        print(f"FAIL {name} ({got})")
        return
    bad = [i for i in range(len(want)) if want[i] != got[i]]
    if not bad:
        print(f"PASS {name} ({len(want)} cases)")
        return
    print(f"FAIL {name} ({len(bad)} of {len(want)} cases differ)")
    for i in bad[:5]:
        print(f"  input {inputs[i]!r:.200}\n    python {want[i]!r:.200}\n    ours   {got[i]!r:.200}")


def check(sm, name, path, texts, rng, work, lossless):
    tok = Tokenizer.from_file(path)
    enc = [tok.encode(s, add_special_tokens=False).ids for s in texts]
    compare(f"encode_{name}", enc, run_batch(sm, path, texts, work), texts)
    compare(f"decode_{name}", [tok.decode(x, skip_special_tokens=False) for x in enc],
            run_batch(sm, path, enc, work), enc)
    # random id sequences: partial UTF-8 sequences, specials anywhere
    ids = sorted(tok.get_vocab(with_added_tokens=True).values())
    seqs = [[rng.choice(ids) for _ in range(rng.randint(0, 24))] for _ in range(600)]
    compare(f"decode_random_{name}", [tok.decode(x, skip_special_tokens=False) for x in seqs],
            run_batch(sm, path, seqs, work), seqs)
    compare(f"decode_skip_special_{name}", [tok.decode(x, skip_special_tokens=True) for x in seqs],
            run_batch(sm, path, seqs, work, skip=True), seqs)
    # round trip through our own decoder: the text back, exactly (where nothing is added or removed)
    got = run_batch(sm, path, enc, work) if lossless else None
    if lossless and not isinstance(got, str):
        bad = [i for i in range(len(texts)) if got[i] != texts[i]]
        if bad:
            print(f"FAIL roundtrip_{name} ({len(bad)} texts do not come back, e.g. {texts[bad[0]]!r:.100})")
        else:
            print(f"PASS roundtrip_{name} ({len(texts)} texts)")


def main():
    if len(sys.argv) < 3:
        print("FAIL tok_usage (tokcmp.py SPARKMONO WORKDIR [NAME=FILE ...])")
        return 1
    sm, work = sys.argv[1], sys.argv[2]
    rng = random.Random(20261203)
    tks = make_tokenizers(work, rng)
    for a in sys.argv[3:]:
        k, v = a.split("=", 1)
        tks[k] = v
    texts = cases(random.Random(7), 3000)
    for name, path in tks.items():  # gpt2 adds a prefix space, behaviors and inverted remove text
        check(sm, name, path, texts, random.Random(11), work, name not in ("gpt2", "behaviors", "inverted"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
