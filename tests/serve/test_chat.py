"""test_chat.py: /v1/chat/completions of `sparkmono serve` through the official `openai`
client: the make-model template rendered as Jinja2 renders it, the prompt tokenized without a
second bos, the answer equal to a completion of those ids (and to `sparkmono generate`),
streaming equal to the plain answer, 8 concurrent chats equal to each alone (greedy and
seeded), n choices (plain and streamed), logprobs in the chat shape equal to the completions
logprobs of the same ids and to a numpy log-softmax of `sparkmono logits`, content as a string,
a list of text parts or null, max_tokens's default (the rest of the context), a message's
name reaching the template, tools reaching it (with tool_choice "none"; the other choices,
which need tool calls parsed, a 400), bad messages and tools (400 naming the field), a
template's raise_exception (400 with its message), a directory without a template (400) and
one whose template is outside the supported subset (the server refuses to start: exit 2, one
line)."""
import copy
import json
import os
import shutil
import subprocess
import threading

import jinja2
import numpy as np
import openai
import pytest
import requests
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import TIMEOUT, Server, sse_events
from smtest import SM_BIN, generate_cli, log_softmax, raw_logits

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is the harbour like?"}],
    [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"}, {"role": "user", "content": "Three"}],
    [{"role": "user", "content": [{"type": "text", "text": "The quiet "}, {"type": "text", "text": "harbour"}]}],
    [{"role": "system", "content": "ünïcödé ✓"}, {"role": "user", "content": "tabs\tand\nnewlines"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}],
    [{"role": "user", "content": "The ship left at dawn."}],
    [{"role": "user", "content": "Count: 1 2 3"}],
]
MAX_TOKENS = [12, 9, 16, 5, 14, 11, 7, 13]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city, now.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def model_copy(src, d, template=None):
    """d: src's model (linked) with its tokenizer.json; tokenizer_config.json with template (None: no file)."""
    os.makedirs(d, exist_ok=True)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, f), d)
    os.symlink(os.path.abspath(os.path.join(src, "model.safetensors")), os.path.join(d, "model.safetensors"))
    if template is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": template}, f)
    return d


def flat(msgs):
    """The messages as the template sees them: text parts joined with "\\n" (vLLM's rule), a null
    content empty."""
    return [{**m, "content": m["content"] if isinstance(m.get("content"), str) else
             "\n".join(p["text"] for p in m["content"]) if m.get("content") is not None else ""} for m in msgs]


def render_jinja2(model_dir, msgs, tools=None, add_generation_prompt=True, **kwargs):
    """As transformers' apply_chat_template renders (its tojson keeps non-ASCII and the key order),
    with the messages as vLLM hands them over: each tool call's arguments parsed from its JSON;
    kwargs: more template variables (chat_template_kwargs, documents)."""
    msgs = copy.deepcopy(msgs)
    for m in msgs:
        for c in m.get("tool_calls") or []:
            if isinstance(c.get("function", {}).get("arguments"), str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    kwargs.setdefault("documents", None)
    return env.from_string(cfg["chat_template"]).render(messages=flat(msgs), add_generation_prompt=add_generation_prompt,
                                                         tools=tools, bos_token=cfg["bos_token"], eos_token=cfg["eos_token"],
                                                         **kwargs)


@pytest.fixture(scope="module")
def chat_server(tmp, model_dir):
    s = Server(model_dir, tmp, "--max-requests", "8", "--model-name", "tiny-chat")
    yield s
    assert s.stop() == 0, s.read_log()


@pytest.fixture(scope="module")
def prompts(model_dir, hf_tok):
    """Each conversation's prompt ids: Jinja2's rendering, tokenized with no special tokens added."""
    out = []
    for msgs in CONVERSATIONS:
        text = render_jinja2(model_dir, msgs)
        with open(os.path.join(model_dir, "m.json"), "w") as f:
            json.dump(msgs, f)
        mine = subprocess.run([SM_BIN, "template", model_dir, "--messages", os.path.join(model_dir, "m.json")],
                              capture_output=True, check=True).stdout.decode()
        assert mine == text  # sparkmono template == Jinja2 on make-model's template
        out.append(hf_tok.encode(text, add_special_tokens=False).ids)
    return out


def chat(c, name, msgs, max_tokens, **kw):
    kw.setdefault("temperature", 0)
    return c.chat.completions.create(model=name, messages=msgs, max_tokens=max_tokens, **kw)


def stream_text(c, name, msgs, n, **kw):
    kw.setdefault("temperature", 0)
    roles, text, finish = [], "", None
    for ch in c.chat.completions.create(model=name, messages=msgs, max_tokens=n, stream=True, **kw):
        assert ch.object == "chat.completion.chunk" and ch.id.startswith("chatcmpl-")
        if ch.choices:
            d = ch.choices[0].delta
            if d.role:
                roles.append(d.role)
            text += d.content or ""
            finish = ch.choices[0].finish_reason or finish
    return roles, text, finish


def test_chat_equals_completion_and_generate(chat_server, model_dir, prompts):
    c = chat_server.client()
    for msgs, n, ids in zip(CONVERSATIONS[:4], MAX_TOKENS, prompts):
        assert ids[0] == 1 and ids[1] != 1  # <|bos|> once: the template writes it, nothing adds another
        r = chat(c, chat_server.name, msgs, n)
        ch = r.choices[0]
        assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and ch.message.role == "assistant"
        assert r.usage.prompt_tokens == len(ids)
        ref = generate_cli(model_dir, ids, n)
        comp = c.completions.create(model=chat_server.name, prompt=ids, max_tokens=n, temperature=0)
        assert comp.choices[0].token_ids == ref
        assert ch.message.content == comp.choices[0].text
        assert r.usage.completion_tokens == len(ref)
        assert ch.finish_reason == ("length" if len(ref) == n else "stop")


def test_stream_equals_plain(chat_server):
    c = chat_server.client()
    for msgs, n in zip(CONVERSATIONS, MAX_TOKENS):
        plain = chat(c, chat_server.name, msgs, n).choices[0]
        roles, text, finish = stream_text(c, chat_server.name, msgs, n)
        assert roles == ["assistant"] and text == plain.message.content and finish == plain.finish_reason
    body = {"model": chat_server.name, "messages": CONVERSATIONS[0], "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    r = requests.post(chat_server.url + "/v1/chat/completions", json=body, stream=True, timeout=TIMEOUT)
    ev = list(sse_events(r))
    assert ev[-1] == "[DONE]" and ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert ev[-2]["choices"] == [] and ev[-2]["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 1234, "top_p": 0.9}])
def test_concurrent_equals_alone(chat_server, sampling):
    c = chat_server.client()
    alone = [chat(c, chat_server.name, m, n, **sampling).choices[0].message.content
             for m, n in zip(CONVERSATIONS, MAX_TOKENS)]
    together = [None] * len(CONVERSATIONS)

    def one(i):
        together[i] = chat(c, chat_server.name, CONVERSATIONS[i], MAX_TOKENS[i], **sampling).choices[0].message.content

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(CONVERSATIONS))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert together == alone


HI = [{"role": "user", "content": "hi"}]
BAD = [  # (body, the error's param, words of its message)
    ({"messages": "hi"}, "messages", "'messages' must be a non-empty list"),
    ({"messages": []}, "messages", "'messages' must be a non-empty list"),
    ({"messages": ["hi"]}, "messages[0]", "messages[0] must be an object"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role", "messages[0].role must be a string"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": 3}]},
     "messages[2].content", "messages[2].content must be a string or a list of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[1].type", "messages[0].content[1].type is 'image_url'; this model takes text only"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text",
     "messages[0].content[0].text must be a string"),
    ({"messages": [{"role": "user", "content": ["a"]}]}, "messages[0].content[0]", "messages[0].content[0] must be an object"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content",
     "messages[0].content must be a string or a list of text parts (null only for an assistant message)"),
    ({"messages": [{"role": "user", "content": "a", "name": 3}]}, "messages[0].name", "messages[0].name must be a string"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "messages[0].content must be a string or a list of text parts"),
    ({}, "messages", "'messages' is required"),
    ({"messages": HI, "prompt": "x"}, "prompt", "'prompt' is not a field of chat completions"),
    ({"messages": HI, "temperature": -1}, "temperature", "temperature"),
    ({"messages": HI, "top_logprobs": 2}, "top_logprobs", "'top_logprobs' needs 'logprobs': true"),
    ({"messages": HI, "logprobs": False, "top_logprobs": 0}, "top_logprobs", "'top_logprobs' needs 'logprobs': true"),
    ({"messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "'top_logprobs' must be an integer in [0, 20]"),
    ({"messages": HI, "logprobs": 3}, "logprobs", "'logprobs' must be true or false"),
    ({"messages": HI, "echo": True}, "echo", "'echo' is not supported by chat completions"),
    ({"messages": HI, "n": 100}, "n", "'n' is 100; this server takes at most 72 choices"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"messages": HI, "tools": {"type": "function"}}, "tools", "tools must be a list"),
    ({"messages": HI, "tools": [{"type": "retrieval"}]}, "tools[0].type", "must be \"function\""),
    ({"messages": HI, "tools": [{"type": "function"}]}, "tools[0].function", "must be an object with a 'name'"),
    ({"messages": HI, "tools": [TOOL, {"type": "function", "function": {"name": "a b"}}]}, "tools[1].function.name",
     "must be 1 to 64 of a-z"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters", "must be an object (a JSON Schema)"),
    ({"messages": HI, "tools": [TOOL]}, "tool_choice", "'tools' without 'tool_choice' (\"auto\") needs tool calls parsed"),
    ({"messages": HI, "tools": [TOOL], "tool_choice": "auto"}, "tool_choice", "tool_choice \"auto\" needs tool calls"),
    ({"messages": HI, "tools": [TOOL], "tool_choice": "required"}, "tool_choice", "send \"tool_choice\": \"none\""),
    ({"messages": HI, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tool_choice", "tool_choice naming a function needs"),
    ({"messages": HI, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice", "names the function 'other', which is not among 'tools'"),
    ({"messages": HI, "tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"messages": HI, "tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "must be \"none\", \"auto\""),
    ({"messages": HI, "tools": [TOOL], "tool_choice": "none", "parallel_tool_calls": "yes"}, "parallel_tool_calls",
     "must be true or false"),
]


def test_bad_messages(chat_server):
    for body, param, want in BAD:
        body = {"model": chat_server.name, **body}
        r = requests.post(chat_server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        e = r.json()["error"]
        assert r.status_code == 400 and e["param"] == param and want in e["message"], (body, e)
        assert "\n" not in e["message"], e
    with pytest.raises(openai.BadRequestError):
        chat_server.client().chat.completions.create(model=chat_server.name, messages=[{"role": "user", "content": 5}])


def chat_lp_entries(content):
    """The chat shape's logprobs entries as plain tuples (token, logprob, bytes, [(token, logprob, bytes)])."""
    return [(t.token, t.logprob, t.bytes, [(a.token, a.logprob, a.bytes) for a in t.top_logprobs]) for t in content]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 4}])
def test_chat_logprobs(chat_server, model_dir, prompts, tmp, sampling):
    """logprobs / top_logprobs in OpenAI's chat shape: the same numbers as the completions logprobs
    of the rendered ids (and the same token texts), a numpy log-softmax of the raw logits of each
    prefix, the alternatives in order; bytes are the token text's UTF-8; a stream's chunks carry
    the same entries, in order."""
    K, N = 3, 6
    c = chat_server.client()
    msgs, ids = CONVERSATIONS[0], prompts[0]
    r = c.chat.completions.create(model=chat_server.name, messages=msgs, max_tokens=N, logprobs=True, top_logprobs=K,
                                  **sampling)
    content = r.choices[0].logprobs.content
    comp = c.completions.create(model=chat_server.name, prompt=ids, max_tokens=N, logprobs=K, **sampling).choices[0]
    gen = comp.token_ids
    assert r.choices[0].message.content == comp.text and len(content) == len(gen)
    assert [t.token for t in content] == comp.logprobs.tokens
    assert [t.logprob for t in content] == comp.logprobs.token_logprobs
    for j, t in enumerate(content):
        assert t.bytes == list(t.token.encode()) and len(t.top_logprobs) == K
        assert {a.token for a in t.top_logprobs} <= set(comp.logprobs.top_logprobs[j])
        ref = log_softmax(raw_logits(model_dir, tmp, ids + gen[:j]).astype(np.float32).astype(np.float64))
        assert abs(t.logprob - ref[gen[j]]) < 1e-4, (j, t.logprob, ref[gen[j]])
        best = np.argsort(-ref, kind="stable")[:K]
        assert np.allclose([a.logprob for a in t.top_logprobs], ref[best], atol=1e-4), j
    got = []
    for ch in c.chat.completions.create(model=chat_server.name, messages=msgs, max_tokens=N, logprobs=True,
                                        top_logprobs=K, stream=True, **sampling):
        if ch.choices and ch.choices[0].logprobs:
            got += chat_lp_entries(ch.choices[0].logprobs.content)
    assert got == chat_lp_entries(content)
    plain = c.chat.completions.create(model=chat_server.name, messages=msgs, max_tokens=N, logprobs=True, **sampling)
    assert [(t.token, t.logprob, t.top_logprobs) for t in plain.choices[0].logprobs.content] == \
        [(t.token, t.logprob, []) for t in content]  # top_logprobs 0 (left out): the ids alone
    assert chat(c, chat_server.name, msgs, N, **sampling).choices[0].logprobs is None


def test_chat_n(chat_server):
    """n choices of a chat: greedy all equal to n = 1; seeded reproducible, choice i == n = 1 with
    seed + i; a stream's text a choice == the plain answer's."""
    c = chat_server.client()
    msgs = CONVERSATIONS[1]
    one = chat(c, chat_server.name, msgs, 8).choices[0].message.content
    r = chat(c, chat_server.name, msgs, 8, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2] and all(ch.message.content == one for ch in r.choices)
    kw = dict(n=3, temperature=1.0, seed=77)
    r = chat(c, chat_server.name, msgs, 8, **kw)
    texts = [ch.message.content for ch in r.choices]
    assert texts == [ch.message.content for ch in chat(c, chat_server.name, msgs, 8, **kw).choices]
    assert texts == [chat(c, chat_server.name, msgs, 8, temperature=1.0, seed=77 + i).choices[0].message.content
                     for i in range(3)]
    assert len(set(texts)) > 1, texts
    got, roles, fins = [""] * 3, [0] * 3, [0] * 3
    for ch in c.chat.completions.create(model=chat_server.name, messages=msgs, max_tokens=8, stream=True, **kw):
        for x in ch.choices:
            got[x.index] += x.delta.content or ""
            roles[x.index] += x.delta.role == "assistant"
            fins[x.index] += x.finish_reason is not None
    assert got == texts and roles == [1, 1, 1] and fins == [1, 1, 1]


def test_content_forms(tmp, model_dir, hf_tok):
    """A list of text parts is the same conversation as its texts joined with "\\n"; an assistant's
    null content is the empty string; a message's name reaches the template (rendered as Jinja2
    renders it)."""
    tpl = ("{% for m in messages %}<|{{ m.role }}|>{% if m.name %}({{ m.name }}){% endif %}{{ m.content }}"
           "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    d = model_copy(model_dir, os.path.join(tmp, "named"), tpl)
    s = Server(d, tmp)
    try:
        c = s.client()
        parts = [{"role": "user", "content": [{"type": "text", "text": "The quiet"}, {"type": "text", "text": "harbour"}]}]
        joined = [{"role": "user", "content": "The quiet\nharbour"}]
        a, b = chat(c, s.name, parts, 6), chat(c, s.name, joined, 6)
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.usage.prompt_tokens == b.usage.prompt_tokens
        for msgs in [parts, [{"role": "user", "content": "hi", "name": "ada"}],
                     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}, {"role": "user", "content": "x"}],
                     [{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "user", "content": "x", "name": "bo"}]]:
            ids = hf_tok.encode(render_jinja2(d, msgs), add_special_tokens=False).ids
            r = chat(c, s.name, msgs, 6)
            assert r.usage.prompt_tokens == len(ids), msgs
            comp = c.completions.create(model=s.name, prompt=ids, max_tokens=6, temperature=0)
            assert r.choices[0].message.content == comp.choices[0].text, msgs
        named = chat(c, s.name, [{"role": "user", "content": "hi", "name": "ada"}], 1)
        assert named.usage.prompt_tokens > chat(c, s.name, [{"role": "user", "content": "hi"}], 1).usage.prompt_tokens
    finally:
        assert s.stop() == 0


def test_tools_reach_the_template(tmp, model_dir, hf_tok):
    """tools with tool_choice "none" reach the template as transformers passes them (rendered as
    Jinja2 renders them, tojson included), with a history of an assistant's tool_calls (null
    content) and the tool's answer; the answer is the completion of those ids.  Without tools
    the same template renders its tool-free branch."""
    tpl = ("{% if tools %}<|tools|>{% for t in tools %}{{ t.function.name }}: {{ t.function.description }} "
           "{{ t.function.parameters | tojson }}\n{% endfor %}{% endif %}"
           "{% for m in messages %}<|{{ m.role }}|>{% if m.tool_calls %}{% for c in m.tool_calls %}"
           "<call>{{ c.function.name }}({{ c.function.arguments }})</call>{% endfor %}{% endif %}"
           "{% if m.role == 'tool' %}[{{ m.tool_call_id }}] {% endif %}{{ m.content }}{{ eos_token }}{% endfor %}"
           "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    d = model_copy(model_dir, os.path.join(tmp, "tools"), tpl)
    s = Server(d, tmp)
    second = {"type": "function", "function": {"name": "echo-2", "parameters": {"type": "object", "properties": {}}}}
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "ünïcödé 4 °C"}]
    try:
        c = s.client()
        for msgs, tools in [(history, [TOOL, second]), (history[:1], [TOOL]), (history, None)]:
            text = render_jinja2(d, msgs, tools)
            assert ("<|tools|>" in text) == bool(tools)
            ids = hf_tok.encode(text, add_special_tokens=False).ids
            kw = dict(tools=tools, tool_choice="none", parallel_tool_calls=False) if tools else {}
            r = chat(c, s.name, msgs, 6, **kw)
            assert r.usage.prompt_tokens == len(ids), (msgs, tools)
            comp = c.completions.create(model=s.name, prompt=ids, max_tokens=6, temperature=0)
            assert r.choices[0].message.content == comp.choices[0].text
            assert not r.choices[0].message.tool_calls
        r = requests.post(s.url + "/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": history, "tools": [], "max_tokens": 4})
        assert r.status_code == 200, r.text  # no tools: tool_choice's default is "none"
    finally:
        assert s.stop() == 0


def test_tool_history_as_vllm_renders_it(tmp, model_dir, hf_tok):
    """As vLLM hands them to the template: a tool call's arguments (a JSON text in the API) as the
    object they hold (a template prints or walks it), arguments that are not JSON a 400 naming
    them, and tools: [] an empty list (not none)."""
    tpl = ("{% if tools is not none %}<tools {{ tools | length }}>{% endif %}"
           "{% for m in messages %}<|{{ m.role }}|>{% for c in m.tool_calls or [] %}"
           "<call>{{ c.function.name }} {{ c.function.arguments.city }} {{ c.function.arguments | tojson }}</call>"
           "{% endfor %}{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    d = model_copy(model_dir, os.path.join(tmp, "toolhist"), tpl)
    s = Server(d, tmp)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "n": [1, 2]}'}}
    history = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "4 C"}]
    try:
        c = s.client()
        for msgs, tools in [(history, None), (history, [])]:
            text = render_jinja2(d, msgs, tools)
            assert "<call>get_weather Oslo {" in text and ("<tools 0>" in text) == (tools is not None), text
            body = {"messages": msgs, "max_tokens": 2, "temperature": 0}
            if tools is not None:
                body["tools"] = tools
            r = requests.post(s.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] == len(hf_tok.encode(text, add_special_tokens=False).ids), text
        bad = copy.deepcopy(history)
        bad[1]["tool_calls"][0]["function"]["arguments"] = "{city: Oslo"
        r = requests.post(s.url + "/v1/chat/completions", json={"messages": bad, "max_tokens": 2}, timeout=TIMEOUT)
        assert r.status_code == 400 and "messages[1].tool_calls[0].function.arguments" in r.text, r.text
        del c
    finally:
        assert s.stop() == 0


def test_template_fields(tmp, model_dir, hf_tok):
    """The template fields vLLM takes: chat_template_kwargs (e.g. enable_thinking), documents,
    add_generation_prompt and continue_final_message, rendered as Jinja2 renders them; a request's
    own chat_template and contradictory or misshapen fields are 400s naming the field."""
    tpl = ("{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
           "{% for d in documents or [] %}<doc {{ d.title }}>{% endfor %}"
           "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
           "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    d = model_copy(model_dir, os.path.join(tmp, "tfields"), tpl)
    s = Server(d, tmp)
    msgs = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Sure, hi and"}]
    docs = [{"title": "a", "text": "x"}, {"title": "b", "text": "y"}]

    def tokens(body):
        r = requests.post(s.url + "/v1/chat/completions", json=dict(body, messages=msgs, max_tokens=2), timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    def want(text):
        return len(hf_tok.encode(text, add_special_tokens=False).ids)

    try:
        assert tokens({}) == want(render_jinja2(d, msgs))
        assert tokens({"chat_template_kwargs": {"enable_thinking": False}, "documents": docs}) == \
            want(render_jinja2(d, msgs, enable_thinking=False, documents=docs))
        assert tokens({"add_generation_prompt": False}) == want(render_jinja2(d, msgs, add_generation_prompt=False))
        cont = render_jinja2(d, msgs, add_generation_prompt=False)
        cont = cont[:cont.rindex("Sure, hi and") + len("Sure, hi and")]  # transformers' continue_final_message
        assert tokens({"continue_final_message": True, "add_generation_prompt": False}) == want(cont)
        for body, field in [({"chat_template": "{{ messages }}"}, "chat_template"),
                            ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
                            ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
                            ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
                            ({"documents": "x"}, "documents"), ({"add_generation_prompt": "yes"}, "add_generation_prompt")]:
            r = requests.post(s.url + "/v1/chat/completions", json=dict(body, messages=msgs, max_tokens=2), timeout=TIMEOUT)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (body, r.text)
    finally:
        assert s.stop() == 0


def test_chat_template_flag(tmp, model_dir, hf_tok):
    """serve --chat-template FILE (as vLLM's) renders with that file over the directory's
    template; a missing or unsupported file stops the start with one line and exit 2."""
    d = model_copy(model_dir, os.path.join(tmp, "ctflag"), "{{ 'DIRECTORY' }}")
    f = os.path.join(tmp, "mine.jinja")
    with open(f, "w") as fh:
        fh.write("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
    s = Server(d, tmp, "--chat-template", f)
    msgs = [{"role": "user", "content": "Hello there"}]
    try:
        r = requests.post(s.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        text = "[user] Hello there\n[assistant]"
        assert r.json()["usage"]["prompt_tokens"] == len(hf_tok.encode(text, add_special_tokens=False).ids)
    finally:
        assert s.stop() == 0
    bad = os.path.join(tmp, "bad.jinja")
    with open(bad, "w") as fh:
        fh.write("{{ x | nosuchfilter }}")
    for path, says in [(os.path.join(tmp, "missing.jinja"), "--chat-template"), (bad, "bad.jinja")]:
        p = subprocess.run([SM_BIN, "serve", d, "--port", "0", "--chat-template", path], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_default_max_tokens(tmp, model_dir):
    """A chat without max_tokens runs to the end of the context (OpenAI's and vLLM's chat; not
    completions' 16), max_completion_tokens is max_tokens, and completions keep their 16."""
    s = Server(model_dir, tmp, "--max-len", "64")
    try:
        c = s.client()
        r = c.chat.completions.create(model=s.name, messages=CONVERSATIONS[0], temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == 64, r.usage
        r = c.chat.completions.create(model=s.name, messages=CONVERSATIONS[0], temperature=0, max_completion_tokens=5,
                                      extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5, r.usage
        r = c.completions.create(model=s.name, prompt=[5, 6, 7], temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 16, r.usage
    finally:
        assert s.stop() == 0


def test_raise_exception_is_400(tmp, model_dir):
    tpl = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System messages are not supported "
           "by this template') }}{% endif %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}<|assistant|>")
    s = Server(model_copy(model_dir, os.path.join(tmp, "raising"), tpl), tmp)
    try:
        r = requests.post(s.url + "/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]})
        assert r.status_code == 400 and r.json()["error"]["message"] == "System messages are not supported by this template"
        ok = chat(s.client(), s.name, [{"role": "user", "content": "y"}], 3)
        assert ok.choices[0].finish_reason in ("length", "stop")
    finally:
        assert s.stop() == 0


def test_no_template_is_400(tmp, model_dir):
    s = Server(model_copy(model_dir, os.path.join(tmp, "notemplate")), tmp)
    try:
        r = requests.post(s.url + "/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "ships no chat template" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("tpl,want", [
    ("{% for m in messages %}\n{{ m.content | wordcount }}{% endfor %}", "line 2 col 16: unsupported filter 'wordcount'"),
    ("{% include 'x.jinja' %}", "line 1 col 4: unsupported tag 'include'"),
    ("{% if messages %}{{ messages[0] }", "'{{' is never closed"),
])
def test_unsupported_template_refused_at_start(tmp, model_dir, tpl, want):
    d = model_copy(model_dir, os.path.join(tmp, "bad%d" % abs(hash(tpl))), tpl)
    r = subprocess.run([SM_BIN, "serve", d, "--port", "0"], capture_output=True, timeout=TIMEOUT)
    err = r.stderr.decode().strip()
    assert r.returncode == 2 and err.count("\n") == 0 and want in err and "tokenizer_config.json: chat_template" in err, err
    r = subprocess.run([SM_BIN, "check", d], capture_output=True, timeout=TIMEOUT)
    err = r.stderr.decode().strip()
    assert r.returncode == 2 and err.count("\n") == 0 and want in err, err
