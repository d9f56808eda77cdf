"""smtest.py: what the serve tests (tests/serve) and the binding's tests (tests/python) share:
the sparkmono binary, the tiny model (with the tokenizer.json make-model writes beside it, or
without one), and `sparkmono generate` as the reference of every output.  SM_BIN is the
binary (default build/sparkmono)."""
import os
import shutil
import subprocess

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
