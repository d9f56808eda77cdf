"""conftest.py: fixtures of the `sparkmono serve` tests: the tiny model with its tokenizer.json
and without one (smtest.py), and servers started on a free port (`--port 0`, the port
read from the server's first line) and stopped with SIGTERM, whose exit status must be 0."""
import json
import os
import re
import signal
import subprocess
import time

import pytest
import requests

from smtest import SM_BIN, ids_only, make_model

TIMEOUT = 60  # seconds any one request may take on a slow machine


class Server:
    """A running `sparkmono serve` and its log (stderr, in a file)."""

    def __init__(self, model_dir, tmp, *args):
        self.log_path = os.path.join(tmp, "serve-%d.log" % time.monotonic_ns())
        self.log = open(self.log_path, "w")
        cmd = [SM_BIN, "serve", model_dir, "--port", "0", "--threads", "2", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://([^ ]+):(\d+)/v1", line)
        if not m:
            self.proc.kill()
            raise RuntimeError("server did not start: %r; log: %s" % (line, self.read_log()))
        self.port = int(m.group(2))
        self.url = "http://127.0.0.1:%d" % self.port
        self.name = re.search(r"model '([^']+)'", line).group(1)

    def read_log(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def health(self):
        return requests.get(self.url + "/health", timeout=TIMEOUT, headers={"Connection": "close"}).json()

    def wait_idle(self, seconds=10):
        """True once nothing runs or waits (within seconds)."""
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            h = self.health()
            if h["running"] == 0 and h["queued"] == 0:
                return True
            time.sleep(0.05)
        return False

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signal the server and return its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "hung"
        self.proc.stdout.close()
        self.log.close()
        return rc

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="session")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="session")
def model_dir(tmp):
    """The tiny model with its tokenizer.json."""
    return make_model(os.path.join(tmp, "tiny"))


@pytest.fixture(scope="session")
def ids_dir(tmp, model_dir):
    """The same model without a tokenizer: token-id prompts only."""
    return ids_only(model_dir, os.path.join(tmp, "tiny-ids"))


@pytest.fixture(scope="session")
def hf_tok(model_dir):
    """The model's tokenizer.json read by the `tokenizers` package (the reference of text)."""
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


@pytest.fixture(scope="session")
def server(tmp, ids_dir):
    """The main server: token-id prompts, 4 requests a step, a queue of 4, 64 KiB bodies."""
    s = Server(ids_dir, tmp, "--max-requests", "4", "--queue", "4", "--max-body", "65536")
    yield s
    assert s.stop() == 0, s.read_log()


@pytest.fixture(scope="session")
def text_server(tmp, model_dir):
    s = Server(model_dir, tmp, "--max-requests", "4", "--model-name", "tiny-text")
    yield s
    assert s.stop() == 0, s.read_log()


def sse_events(resp):
    """The data payloads of a server-sent event stream, in order ("[DONE]" kept as a string)."""
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            data = line[6:].decode()
            yield data if data == "[DONE]" else json.loads(data)
