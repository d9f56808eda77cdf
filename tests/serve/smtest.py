"""smtest.py: what the serve tests (tests/serve) and the binding's tests (tests/python) share:
the sparkmono binary, the tiny model (with the tokenizer.json make-model writes beside it, or
without one), `sparkmono generate` as the reference of every output and `sparkmono logits`
with a numpy log-softmax as the reference of logprobs.  SM_BIN is the binary (default
build/sparkmono)."""
import os
import shutil
import subprocess

import numpy as np

SM_BIN = os.environ.get("SM_BIN", "build/sparkmono")


def make_model(d):
    """The tiny model (V = 512; <|pad|> 0, <|bos|> 1, <|eos|> 2) and its tokenizer.json in d."""
    subprocess.run([SM_BIN, "make-model", "--quiet", "--preset", "tiny", "--experts", "mxfp4", "--seed", "1",
                    "--out", d], check=True)
    return d


def generate_cli(model_dir, prompt, max_tokens, *extra):
    """The ids `sparkmono generate` emits for prompt alone (the reference of every comparison)."""
    out = subprocess.run(
        [SM_BIN, "generate", "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
         "--max-tokens", str(max_tokens), "--threads", "2", *extra],
        capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("ids: "))
    return [int(x) for x in line[5:].split(",")]


def ids_only(model_dir, d):
    """d: model_dir's model (linked) without its tokenizer.json: prompts are token ids only."""
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(model_dir, "config.json"), d)
    os.symlink(os.path.abspath(os.path.join(model_dir, "model.safetensors")), os.path.join(d, "model.safetensors"))
    return d


def raw_logits(model_dir, tmp, ids):
    """The raw f32 logits of the last row of prefix ids (the CLI's logits command), as float64."""
    out = os.path.join(tmp, "lg.npy")
    subprocess.run([SM_BIN, "logits", "--model", model_dir, "--prompt-ids", ",".join(map(str, ids)), "--out", out,
                    "--threads", "2"], check=True, capture_output=True)
    return np.load(out)[-1].astype(np.float64)


def log_softmax(row):
    """The logprobs of row's finite entries (an id the model cannot pick is left out)."""
    row = row[np.isfinite(row)]
    m = row.max()
    return row - m - np.log(np.exp(row - m).sum())
