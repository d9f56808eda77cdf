#!/usr/bin/env python3
"""bench.py SPARKMONO WORKDIR [REPEAT]: encode speed of `sparkmono tokenize` on English text.

The text is English prose found on any machine with Python and Debian: the Python reference
documentation shipped with the interpreter (pydoc_data topics), the license texts of
/usr/share/common-licenses and this repository's Markdown files, about 1 MB.  A byte-level
BPE of 32000 ids with the Llama-3 split pattern is trained on it with the Python tokenizers
package.  Measured, on one core: one pass over the text (the word cache cold), and REPEAT
(default 20) passes concatenated (the cache warm, as in a server that has seen text before),
both by `sparkmono tokenize --stats`, which times the encode alone (not the load or the
output) by the wall clock and by the thread's CPU time, five times (the machine may be shared: look at the spread).  For scale, the Python
package encodes the same text paragraph by paragraph with one thread.
"""
import glob
import os
import subprocess
import sys
import time

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


def english():
    import pydoc_data.topics as t
    parts = [t.topics[k] for k in sorted(t.topics)]
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    for p in sorted(glob.glob(os.path.join(root, "**", "*.md"), recursive=True)):
        with open(p, encoding="utf-8") as f:
            parts.append(f.read())
    return "\n\n".join(parts)


def stats(sm, tok, path):
    cmd = ["taskset", "-c", "0"] if subprocess.run(["which", "taskset"], capture_output=True).returncode == 0 else []
    r = subprocess.run(cmd + [sm, "tokenize", "--tokenizer", tok, "--text-file", path, "--stats"], capture_output=True)
    if r.returncode:
        sys.exit(r.stderr.decode())
    return r.stderr.decode().strip(), r.stdout.decode().strip()


def main():
    sm, work = sys.argv[1], sys.argv[2]
    rep = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    text = english()
    tokp = os.path.join(work, "bench_tokenizer.json")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated", invert=False),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text.split("\n\n"), trainers.BpeTrainer(
        vocab_size=32000, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(tokp)
    tok = Tokenizer.from_file(tokp)
    one, many = os.path.join(work, "english.txt"), os.path.join(work, "english_x%d.txt" % rep)
    with open(one, "w", encoding="utf-8") as f:
        f.write(text)
    with open(many, "w", encoding="utf-8") as f:
        f.write(text * rep)
    print(f"text: {len(text.encode())} bytes; tokenizer: {tok.get_vocab_size()} ids")
    line, ids = stats(sm, tokp, one)
    print("one pass, cold cache:", line)
    want = tok.encode(text, add_special_tokens=False).ids
    print("same ids as python:", ",".join(map(str, want)) == ids)
    paras = text.split("\n\n")
    t0, c0 = time.perf_counter(), time.process_time()
    for p in paras:
        tok.encode(p, add_special_tokens=False)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(f"python tokenizers, one pass paragraph by paragraph, one thread: {len(text.encode()) / dt / 1e6:.1f} MB/s "
          f"({len(text.encode()) / dc / 1e6:.1f} MB/s of CPU time)")
    for i in range(5):
        line, _ = stats(sm, tokp, many)
        print(f"{rep} passes, warm cache, run {i + 1}:", line)


if __name__ == "__main__":
    main()
