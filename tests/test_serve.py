"""``ster serve`` through the official ``openai`` client on 127.0.0.1.

The server runs as ``ster serve`` in a child process on a tiny random llama with a chat template
(test_chat_cmd.py's); its answers are checked against cold runs (``generate.generate``) and, for
per-request steering, against ``ster generate --vector``. Two cases need a model that writes a given
text (a tool call) or runs long (a disconnect): they run the same app in-process (uvicorn in a
thread) on a tiny model whose decoder is wrapped to favour a scripted next token; the HTTP path, the
reply parser and the response shapes are the real ones.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from ster_py.steering import SteeringVector, write_vector
from test_chat_cmd import CHAT_TEMPLATE, chat_model, cold_answer
from tiny import make_checkpoint, one_torch_thread  # noqa: F401 (autouse fixture)

import openai  # noqa: E402  (the test extra: the official client)

PROMPTS = [f"w{10 + i} w{20 + i} w{30 + i}" for i in range(8)]


def _request(base: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
             timeout: float = 120, response: bool = False):
    """(status, JSON document) of a raw HTTP request (http.client: bytes as given); with ``response``, the
    response's headers too."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request(method, path, body=body, headers={**({"content-type": "application/json"} if body is not None
                                                      else {}), **(headers or {})})
    r = conn.getresponse()
    doc = json.loads(r.read())
    conn.close()
    return (r.status, doc, r.headers) if response else (r.status, doc)


def _vector(model_dir: Path, path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    dirs = {i: (lambda v: (v / np.linalg.norm(v)).astype(np.float32))(rng.standard_normal(64)) for i in (0, 1, 2)}
    return write_vector(SteeringVector(str(model_dir), None, 64, "test", "manual", dirs), path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base url, model dir, {vector name: file}) of a ``ster serve`` child process."""
    root = tmp_path_factory.mktemp("serve")
    model_dir = chat_model(root / "model")
    vectors = {"calm": _vector(model_dir, root / "calm.json", 1), "bold": _vector(model_dir, root / "bold.json", 2)}
    proc = subprocess.Popen([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model",
                             str(model_dir), "--port", "0", "-q", "--name", "tiny",
                             *[a for k, v in vectors.items() for a in ("--vector", f"{k}={v}")]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() is not None else "")
    yield line.split()[2], model_dir, vectors
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def loaded(served):
    return load_model(str(served[1]))


def _messages(prompt: str, system: str | None = "w40 w41") -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def test_models_lists_the_one_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_completion_equals_a_cold_run_and_counts_the_reuse(client, loaded):
    first = client.chat.completions.create(model="tiny", messages=_messages(PROMPTS[0]), max_tokens=6)
    second = client.chat.completions.create(model="tiny", messages=_messages(PROMPTS[1]), max_tokens=6)
    for reply, prompt in ((first, PROMPTS[0]), (second, PROMPTS[1])):
        answer, ids = cold_answer(loaded, _messages(prompt), 6)
        assert reply.choices[0].message.content == answer and reply.choices[0].message.role == "assistant"
        assert reply.usage.prompt_tokens == len(ids)
        assert reply.choices[0].finish_reason in ("stop", "length")
    # the second shares the system message and the user header with the first: "w3 w40 w41 w6 w4"
    assert second.usage.prompt_tokens_details.cached_tokens == 5


def test_streamed_chat_completion_equals_the_whole_one(client, loaded):
    stream = client.chat.completions.create(model="tiny", messages=_messages(PROMPTS[2]), max_tokens=8, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer, ids = cold_answer(loaded, _messages(PROMPTS[2]), 8)
    assert text == answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.prompt_tokens == len(ids) and chunks[-1].usage.completion_tokens >= 1


def test_text_completion_and_logprobs(client, loaded):
    reply = client.completions.create(model="tiny", prompt="w7 w8 w9", max_tokens=5, logprobs=3)
    ids = loaded.tokenizer.encode("w7 w8 w9", add_special_tokens=True)
    gen = generate(loaded.decoder, ids, Sampling(max_new_tokens=5, logprobs=3), loaded.stop_ids())
    want = loaded.tokenizer.decode([t for t in gen.ids if t not in loaded.stop_ids()], skip_special_tokens=False)
    assert reply.choices[0].text == want
    # the completions' own logprobs shape (the openai client reads tokens / token_logprobs / top_logprobs)
    lp = reply.choices[0].logprobs
    # each token's own piece: this word-level tokenizer (no decoder) puts a space between tokens
    pieces = [" " + loaded.tokenizer.id_to_token(e["id"]) for e in gen.logprobs]
    assert lp.tokens == pieces and lp.token_logprobs == pytest.approx([e["logprob"] for e in gen.logprobs])
    assert [len(top) for top in lp.top_logprobs] == [3] * len(pieces)
    # where each token's piece begins in prompt + text (the first one's space is not in the text)
    assert lp.text_offset == [len("w7 w8 w9") + max(0, len("".join(pieces[:k])) - 1) for k in range(len(pieces))]
    chat = client.chat.completions.create(model="tiny", messages=_messages(PROMPTS[3]), max_tokens=4, logprobs=True,
                                          top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
    for t in content:   # the chosen token is greedy: the most likely one
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob) and t.logprob <= 0


def test_per_request_steering_equals_generate_vector(client, served, loaded):
    _, model_dir, vectors = served
    got = {}
    for name in ("calm", "bold", None):
        extra = {} if name is None else {"steering": {"vector": name, "strength": 6.0}}
        reply = client.chat.completions.create(model="tiny", messages=_messages(PROMPTS[4], None), max_tokens=8,
                                               extra_body=extra)
        got[name] = reply.choices[0].message.content
        if name is None:
            continue
        r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "generate", "--model",
                            str(model_dir), "--prompt", PROMPTS[4], "--vector", str(vectors[name]), "--strength", "6",
                            "--max-new-tokens", "8", "--json", "-q"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        ids = [t for t in json.loads(r.stdout)["ids"] if t not in loaded.stop_ids()]
        assert got[name] == loaded.tokenizer.decode(ids, skip_special_tokens=False)
    assert got["calm"] != got["bold"]   # each request got its own vector
    assert got[None] in (got["calm"], got["bold"]) or len(set(got.values())) == 3


@pytest.mark.parametrize("path, extra, words", [
    ("/v1/chat/completions", {"frequency_penalty": 0.5}, "frequency_penalty 0.5 is not supported"),
    ("/v1/chat/completions", {"presence_penalty": 2}, "presence_penalty 2 is not supported"),
    ("/v1/chat/completions", {"tool_choice": "required"}, 'tool_choice "required" is not supported'),
    ("/v1/chat/completions", {"parallel_tool_calls": False}, "parallel_tool_calls false is not supported"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "never reads tools, so they would not reach the model; send no tools, or use a model whose chat template "
     "takes them"),
    ("/v1/chat/completions", {"chat_template_kwargs": {"add_vision_id": True}}, 'not "add_vision_id"'),
    ("/v1/chat/completions", {"temprature": 0.5}, 'unrecognized request field "temprature"'),
    ("/v1/chat/completions", {"echo": True}, "it belongs to /v1/completions"),
    ("/v1/completions", {"echo": True}, "echo true is not supported"),
    ("/v1/completions", {"suffix": "w9"}, 'suffix "w9" is not supported'),
    ("/v1/completions", {"best_of": 3}, "best_of 3 is not supported"),
    ("/v1/completions", {"messages": []}, "it belongs to /v1/chat/completions"),
])
def test_fields_it_cannot_honour_are_refused(served, path, extra, words):
    """A field the server would otherwise ignore gets a 400 naming it; the neutral values pass."""
    base = {"messages": [{"role": "user", "content": "w5"}]} if path.endswith("chat/completions") else \
        {"prompt": "w5 w6"}
    code, doc = _request(served[0], "POST", path, json.dumps({**base, **extra, "max_tokens": 2}).encode())
    assert code == 400 and words in doc["error"]["message"], doc
    assert doc["error"]["param"] == next(iter(extra)) and doc["error"]["type"] == "invalid_request_error"
    neutral = {"frequency_penalty": 0, "presence_penalty": 0.0, "user": "u", "tool_choice": "auto",
               "parallel_tool_calls": True, "chat_template_kwargs": {}, "metadata": {"k": "v"}} \
        if path.endswith("chat/completions") else {"echo": False, "suffix": "", "best_of": 1, "frequency_penalty": 0}
    code, doc = _request(served[0], "POST", path, json.dumps({**base, **neutral, "max_tokens": 2}).encode())
    assert code == 200, doc


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (b"[]", 400, "JSON object"),
    (json.dumps({"messages": []}).encode(), 400, "empty"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "steering": {"vector": "nope"}}).encode(), 400,
     "no vector named 'nope'"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "max_tokens": -1}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "thinking": True}).encode(), 400,
     "no thinking switch"),
    (json.dumps({"messages": [{"role": "user", "content": " ".join(["w5"] * 400)}]}).encode(), 400,
     "longer than the context"),
    (b"[" * 100000 + b"]" * 100000, 400, "more than 64 deep"),     # issue 17: was a RecursionError, HTTP 500
    # integers longer than a float holds were an OverflowError, HTTP 500 (a breaker, seventeenth session)
    (b'{"messages": [{"role": "user", "content": "w5"}], "top_k": 1' + b"0" * 400 + b"}", 400,
     "top_k must be an integer of at most 2**63"),
    (b'{"messages": [{"role": "user", "content": "w5"}], "temperature": 1' + b"0" * 400 + b"}", 400, "temperature"),
    (b'{"messages": [{"role": "user", "content": "w5"}], "logit_bias": {"5": 1' + b"0" * 400 + b"}}", 400,
     "logit_bias: the bias of id 5"),
    (b'{"messages": [{"role": "user", "content": "w5"}], "steering": {"vector": "calm", "strength": 1' + b"0" * 400
     + b"}}", 400, "steering.strength must be a number"),
    (b'{"messages": [{"role": "user", "content": "w5"}], "seed": 1' + b"0" * 400 + b"}", 400, "seed must be"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "n": True}).encode(), 400, "n must be 1"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "n": 1.0}).encode(), 400, "n must be 1"),
    (b'{"messages": [{"role": "user", "content": "w5"}], "tools": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400,
     "more than 64 deep"),
    # a lone surrogate echoed back was a 500 with a traceback (a tester's finding)
    (b'{"messages": [{"role": "user", "content": "w5"}], "\\ud800": 1}', 400,
     "lone UTF-16 surrogate (an escape such as \\ud800 that is no character) in the key '\\ud800'"),
    (b'{"messages": [{"role": "x\\ud800", "content": "w5"}]}', 400,
     "no character) in messages[0].role; send valid Unicode text"),
    # ignored fields were a place to park memory while queued (8 MiB of {} is ~200 MB of objects)
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "metadata": [{}] * 70000}).encode(), 400,
     "more than 65536"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "metadata": {"k": [{}]}}).encode(), 400,
     "metadata must be an object of at most 16 string values"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}],
                 "metadata": {str(i): "v" for i in range(17)}}).encode(), 400, "metadata must be"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "user": [{}]}).encode(), 400,
     "user must be a string"),
    # fields that were ignored silently
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "top_logprobs": 2}).encode(), 400,
     'top_logprobs needs "logprobs": true'),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "logprobs": 3}).encode(), 400,
     "logprobs must be true or false on /v1/chat/completions"),
    (b'{"messages": [{"role": "user", "content": "w5"}], "max_tokens": 1e300}', 400, "max_tokens must be an integer"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "max_completion_tokens": -5}).encode(), 400,
     "max_completion_tokens must be 0 or more"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "stream_options": {"include_usage": True}}).encode(),
     400, 'stream_options applies to streamed replies only: send "stream": true'),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "stream": True, "stream_options": []}).encode(), 400,
     "stream_options must be an object"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}], "stream": True,
                 "stream_options": {"include_usage": 1}}).encode(), 400, "include_usage must be a boolean"),
    (json.dumps({"messages": [{"role": "user", "content": "w5"}],
                 "steering": {"vector": "calm", "strenght": 2}}).encode(), 400, 'steering: unknown key "strenght"'),
    # null content where OpenAI refuses it too; a text part without its text
    (json.dumps({"messages": [{"role": "user", "content": None}]}).encode(), 400,
     'message 0 ("user") has null content'),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}]}).encode(), 400,
     'is of type "text" but its "text" is missing'),
])
def test_bad_requests_get_openai_shaped_errors(served, body, status, words):
    code, doc = _request(served[0], "POST", "/v1/chat/completions", body)
    assert code == status, doc
    err = doc["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error" and len(err["message"]) < 1000


@pytest.mark.parametrize("extra, words", [
    ({"prompt": ["w5", "w6"]}, "a batch of 2 prompts is not supported"),
    ({"prompt": [504, 3575]}, "token-id prompts are not supported"),
    ({"prompt": [[5, 6]]}, "token-id prompts are not supported"),
    ({"prompt": " \n\t"}, "prompt is only whitespace"),     # was continued, though generate and chat refuse it
    ({"prompt": "w5", "logprobs": 2, "top_logprobs": 2}, 'top_logprobs needs "logprobs": true'),
])
def test_completions_prompts_it_cannot_take(served, extra, words):
    """A batch or token ids were told 'prompt must be a non-empty string' (a new user's finding)."""
    code, doc = _request(served[0], "POST", "/v1/completions", json.dumps({"max_tokens": 2, **extra}).encode())
    assert code == 400 and words in doc["error"]["message"], doc
    assert doc["error"]["param"] == list(extra)[-1]


def test_models_retrieve(client):
    """GET /v1/models/{id} (the openai client's models.retrieve) was a 404 for every id."""
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("other")
    assert e.value.body["code"] == "model_not_found" and "'tiny'" in e.value.body["message"]


def test_null_content_of_a_tool_calling_assistant_is_empty_text(tmp_path):
    """OpenAI's assistant message with tool_calls and content null is read as empty text: a template that
    adds content to a string failed on it with a raw template error (a new user's finding)."""
    from ster_py.conversation import Session
    from ster_py.server import Server

    path = chat_model(tmp_path / "model")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}w4 {{ m.content + ' ' }}w6 {% endfor %}"
                            "{% if add_generation_prompt %}w5 {% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    loaded = load_model(str(path))
    server = Server(Session(loaded), "m")
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [{"role": "user", "content": "w11"}, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "w12"}]
    reply = server.run(server.parse({"messages": messages, "max_tokens": 3}, True))
    answer, ids = cold_answer(loaded, [dict(m, content=m["content"] or "") for m in messages], 3)
    assert reply.text == answer and reply.prompt_ids == ids


@pytest.mark.parametrize("headers, status, words", [
    ({"content-type": "text/plain"}, 415, "Content-Type: application/json"),
    ({"content-type": "application/x-www-form-urlencoded"}, 415, "Content-Type: application/json"),
    ({"origin": "http://evil.example"}, 403, "--allow-origin"),
    ({"host": "evil.example:8080"}, 403, "DNS rebinding"),
])
def test_browser_pages_and_rebinding_are_refused(served, headers, status, words):
    """Any web page could POST text/plain to the local server, and read its replies through DNS rebinding
    (a tester's finding); the server's own origin and JSON pass."""
    body = json.dumps({"messages": [{"role": "user", "content": "w5"}], "max_tokens": 2}).encode()
    code, doc = _request(served[0], "POST", "/v1/chat/completions", body, headers)
    assert code == status and words in doc["error"]["message"], doc
    code, doc = _request(served[0], "POST", "/v1/chat/completions", body,
                         {"origin": served[0], "content-type": "application/json; charset=utf-8"})
    assert code == 200, doc


def test_streamed_logprobs_come_with_their_chunks(client):
    """Each streamed chunk carries its own tokens' logprobs (they were null on every chunk and all in the
    last one); together they are the whole reply's."""
    kw = dict(model="tiny", messages=_messages(PROMPTS[5]), max_tokens=6, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    got = []
    for c in client.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        entries = c.choices[0].logprobs.content if c.choices[0].logprobs is not None else []
        if c.choices[0].delta.content:
            assert [e.token.strip() for e in entries] == c.choices[0].delta.content.split()   # one word, one token
        got += entries
    assert [e.token for e in got] == [e.token for e in whole]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in whole], abs=1e-4)
    assert all(len(e.top_logprobs) == 2 for e in got)
    kw = dict(model="tiny", prompt="w7 w8 w9", max_tokens=5, logprobs=2)
    whole = client.completions.create(**kw).choices[0].logprobs
    tokens, offsets = [], []
    for c in client.completions.create(stream=True, **kw):
        lp = c.choices[0].logprobs
        if c.choices[0].text:
            assert lp is not None and [t.strip() for t in lp.tokens] == c.choices[0].text.split()
        if lp is not None:
            tokens += lp.tokens
            offsets += lp.text_offset
    assert tokens == whole.tokens and offsets == whole.text_offset


def test_template_errors_do_not_show_the_model_path(tmp_path):
    """A template error told the client the server's model path ("chat template of /root/.cache/...")."""
    from ster_py.conversation import Session
    from ster_py.server import Server
    from ster_py.server_request import RequestError

    path = chat_model(tmp_path / "model")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% if messages[0].role == 'boom' %}{{ raise_exception('no boom') }}{% endif %}" + \
        CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    server = Server(Session(load_model(str(path))), "m")
    with pytest.raises(RequestError) as e:
        server.run(server.parse({"messages": [{"role": "boom", "content": "w5"}]}, True))
    assert str(e.value) == "the model's chat template, line 1 refused the conversation: no boom"


def test_text_parts_are_read_as_their_text(client, loaded):
    """content as a list of text parts (OpenAI's other form) is the parts' texts joined by newlines."""
    parts = [{"type": "text", "text": "w11 w12"}, {"type": "text", "text": "w13"}]
    got = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=4)
    answer, ids = cold_answer(loaded, [{"role": "user", "content": "w11 w12\nw13"}], 4)
    assert got.choices[0].message.content == answer and got.usage.prompt_tokens == len(ids)


def test_health_answers_ok(served):
    """llama.cpp's server answers GET /health with {"status": "ok"} (load balancers and readiness probes ask
    it); ster serve had no such endpoint (404)."""
    code, doc = _request(served[0], "GET", "/health")
    assert code == 200 and doc == {"status": "ok"}
    code, doc = _request(served[0], "POST", "/health", b"{}")
    assert code == 405 and "not allowed" in doc["error"]["message"]


def test_unknown_paths_and_methods(served):
    code, doc = _request(served[0], "GET", "/v1/nothing")
    assert code == 404 and doc["error"]["message"].startswith("no such endpoint")
    code, doc = _request(served[0], "GET", "/v1/chat/completions")
    assert code == 405 and "not allowed" in doc["error"]["message"]


def test_bounded_load(client, loaded, capsys):
    """200 requests from 8 concurrent clients (one model: they queue): none fails, none is lost or mixed
    up (each answer equals its prompt's cold run), within a time limit."""
    want = {p: cold_answer(loaded, _messages(p), 4)[0] for p in PROMPTS}
    latencies: list[float] = []

    def one(i: int):
        prompt = PROMPTS[i % len(PROMPTS)]
        t0 = time.perf_counter()
        reply = client.chat.completions.create(model="tiny", messages=_messages(prompt), max_tokens=4)
        latencies.append(time.perf_counter() - t0)
        return prompt, reply.choices[0].message.content

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(200)))
    wall = time.perf_counter() - t0
    assert wall < 300
    assert len(results) == 200 and all(text == want[p] for p, text in results)
    q = statistics.quantiles(latencies, n=20)
    with capsys.disabled():
        print(f"\nload: 200 requests, 8 clients, {wall:.1f} s, {200 / wall:.1f} req/s, "
              f"p50 {statistics.median(latencies) * 1000:.0f} ms, p95 {q[18] * 1000:.0f} ms")


# --- in-process cases: a scripted next token ----------------------------------------------------


class Scripted:
    """A decoder whose last logit row strongly favours ``follow[last id]`` (a bigram script)."""

    def __init__(self, inner, follow: dict[int, int]):
        self.inner, self.spec, self.follow = inner, inner.spec, follow

    def new_cache(self, *args):
        return self.inner.new_cache(*args)

    def forward(self, ids, cache, **kw):
        out = self.inner.forward(ids, cache, **kw)
        nxt = self.follow.get(int(np.asarray(ids)[-1]))
        if nxt is not None:
            out = out.copy()
            out[-1, nxt] += 1000.0
        return out


TOOL_WORDS = ["<tool_call>", '{"name":', '"get_weather",', '"arguments":', '{"city":', '"Paris"}}', "</tool_call>",
              "w_loop"]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """A tiny model with tool markup in its vocabulary (ids 100...) and a 4096-position context,
    served in a thread; yields (base url, Server)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ster_py.conversation import Session
    from ster_py.server import Server

    path = tmp_path_factory.mktemp("tools")
    make_checkpoint(path, "llama", max_position_embeddings=4096)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 128)}}
    for i, word in enumerate(TOOL_WORDS):
        del vocab[f"w{100 + i}"]
        vocab[word] = 100 + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    template = "{% if tools %}<tool_call> </tool_call> {% endif %}" + CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=template)))
    loaded = load_model(str(path))
    # after the generation prompt (w5): the call, then </s>
    chain = [5, *range(100, 107), 2]
    follow = dict(zip(chain, chain[1:]))
    loaded.decoder = Scripted(loaded.decoder, follow)
    server = Server(Session(loaded), "tools")
    with _in_thread(server) as url:
        yield url, server


@contextlib.contextmanager
def _in_thread(server):
    """``server`` (a ``Server``) on uvicorn in a thread, on a free loopback port; yields its base url."""
    with _hardened(server) as url:
        yield url


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_tool_call_parsed_into_tool_calls(in_process):
    client = openai.OpenAI(base_url=in_process[0] + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="tools", messages=[{"role": "user", "content": "w9"}],
                                           tools=TOOLS, max_tokens=20)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(model="tools", messages=[{"role": "user", "content": "w9"}],
                                                 tools=TOOLS, max_tokens=20, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == \
        [(0, "get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # without tools the same reply is text
    plain = client.chat.completions.create(model="tools", messages=[{"role": "user", "content": "w9"}], max_tokens=20)
    assert plain.choices[0].message.content.startswith("<tool_call>") and not plain.choices[0].message.tool_calls


@contextlib.contextmanager
def looping(server, delay: float = 0.0):
    """The in-process model writes w_loop forever (for 3000 tokens, ``delay`` seconds per step); yields the
    list of replies the session made, restored after."""
    seen = []
    original = server.session.reply
    decoder = server.session.loaded.decoder

    def recording(*args, **kw):
        reply = original(*args, **kw)
        seen.append(reply)
        return reply

    def slow(*args, **kw):
        time.sleep(delay)
        return Scripted.forward(decoder, *args, **kw)

    server.session.reply = recording
    saved = dict(decoder.follow)
    decoder.follow.clear()
    decoder.follow.update({5: 107, 107: 107})   # w_loop after the generation prompt, forever
    decoder.forward = slow
    try:
        yield seen
    finally:
        del decoder.forward
        server.session.reply = original
        decoder.follow.clear()
        decoder.follow.update(saved)


def _cancelled_then_served(url: str, seen: list, body: dict) -> None:
    """The abandoned reply stopped early ("cancelled"), and the server answers the next request."""
    t0 = time.time()
    while not seen and time.time() - t0 < 60:
        time.sleep(0.05)
    assert seen and seen[0].finish_reason == "cancelled" and len(seen[0].generation.ids) < 3000
    code, doc = _request(url, "POST", "/v1/chat/completions", json.dumps(dict(body, stream=False, max_tokens=3)).encode())
    assert code == 200 and doc["choices"][0]["finish_reason"] == "length"


LOOP_REQUEST = {"model": "tools", "messages": [{"role": "user", "content": "w9"}], "max_tokens": 3000}


def test_disconnect_mid_stream_stops_the_generation(in_process):
    url, server = in_process
    with looping(server) as seen:
        body = dict(LOOP_REQUEST, stream=True)
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        r = conn.getresponse()
        got = [r.fp.readline().decode() for _ in range(12)]   # the answer streams...
        conn.close()
        assert any("w_loop" in line for line in got)
        _cancelled_then_served(url, seen, body)   # ...and the client went away: the generation stops


def test_disconnect_before_a_whole_reply_stops_the_generation(in_process):
    """Not streamed: the server polls the connection while the reply is made, so a client that gives up
    (a timeout) stops its generation and frees the one-at-a-time lock for the next request."""
    url, server = in_process
    with looping(server, delay=0.002) as seen:   # 3000 tokens take 6 s or more: the 1 s timeout comes first
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=1)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(LOOP_REQUEST),
                     headers={"content-type": "application/json"})
        with pytest.raises(TimeoutError):
            conn.getresponse()
        conn.close()
        _cancelled_then_served(url, seen, LOOP_REQUEST)


@pytest.mark.real
def test_smollm2_served_plain_text(smollm2_gguf):
    """The real file served: streamed and whole chat completions are plain text (no tool calls), equal
    to each other and to a cold run."""
    proc = subprocess.Popen([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model",
                             str(smollm2_gguf), "--port", "0", "-q"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on ")
        client = openai.OpenAI(base_url=line.split()[2] + "/v1", api_key="unused", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model="x", messages=messages, max_tokens=12)
        chunks = list(client.chat.completions.create(model="x", messages=messages, max_tokens=12, stream=True))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    loaded = load_model(str(smollm2_gguf))
    answer, ids = cold_answer(loaded, messages, 12)
    assert whole.choices[0].message.content == answer and "Paris" in answer
    assert not whole.choices[0].message.tool_calls and whole.usage.prompt_tokens == len(ids)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


@pytest.fixture(scope="module")
def served_draft(tmp_path_factory):
    """(base url, target dir) of ``ster serve --draft`` beside a drafter of the same vocabulary and other
    weights and depth."""
    root = tmp_path_factory.mktemp("serve_draft")
    target = chat_model(root / "target")
    drafter = root / "drafter"
    make_checkpoint(drafter, "llama", seed=5, num_hidden_layers=1)
    proc = subprocess.Popen([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model",
                             str(target), "--port", "0", "-q", "--name", "tiny", "--draft", str(drafter),
                             "--draft-max", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() is not None else "")
    yield line.split()[2], target
    proc.terminate()
    proc.wait(timeout=30)


def test_served_with_a_drafter_equals_greedy_decoding(served_draft):
    """``ster serve --draft``: replies equal plain greedy decoding of the target (cold runs), the usage
    counts the drafter's proposals, and a request with a temperature is refused (400, param temperature)."""
    base, target = served_draft
    loaded = load_model(str(target))
    for prompt in PROMPTS[:2]:
        status, doc = _request(base, "POST", "/v1/chat/completions", json.dumps(
            {"model": "tiny", "messages": _messages(prompt), "max_tokens": 10}).encode())
        assert status == 200, doc
        answer, ids = cold_answer(loaded, _messages(prompt), 10)
        assert doc["choices"][0]["message"]["content"] == answer and doc["usage"]["prompt_tokens"] == len(ids)
        details = doc["usage"]["draft_tokens_details"]
        assert details["drafted"] > 0 and 0 <= details["accepted"] <= details["drafted"]
    status, doc = _request(base, "POST", "/v1/completions", json.dumps(
        {"model": "tiny", "prompt": "w3 w4", "max_tokens": 4, "temperature": 0.7}).encode())
    assert status == 400 and doc["error"]["param"] == "temperature" and "--draft" in doc["error"]["message"]


@pytest.mark.parametrize("args, words", [
    (["--vector", "calm"], "--vector takes NAME=FILE"),
    (["--port", "70000"], "--port must be 0 to 65535"),
    (["--draft-max", "4"], "--draft-max needs --draft"),
    (["--vector", "a=/nonexistent/v.json"], "/nonexistent/v.json"),
    (["--host", ""], "--host is empty; give 127.0.0.1 (this machine only) or, to listen on every interface, 0.0.0.0"),
    (["--name", os.fsdecode(b"caf\xe9")], "--name 'caf\\udce9' is not valid UTF-8 text"),   # every reply was a 500
    (["--name", ""], "--name is empty; give the model id clients will see"),   # served replies naming model ""
    (["--name", " "], "--name is only whitespace"),
    (["--allow-origin", "evil.example"], "--allow-origin takes an origin such as https://app.example"),
    (["--allow-origin", "http://app.example/page"], "no path"),
    # origins no browser sends were accepted, and their pages refused (403) for ever
    (["--allow-origin", "https://user@app.example"], "'https://user@app.example': it has a user name ('user' before @)"),
    (["--allow-origin", "https://app.example:99999"], "its port '99999' is not a number from 1 to 65535"),
    (["--allow-origin", "https://app.example:0"], "its port '0' is not a number from 1 to 65535"),
    (["--allow-origin", "https://\u00fc.example"], "browsers send the punycode (xn--) form: give that "
                                                     "(https://xn--tda.example, Python's IDNA encoding of it)"),
    (["--allow-origin", "https://app.example/"], "no path, not even /"),
    (["--max-queue", "-1"], "--max-queue must be 0 or more"),
])
def test_serve_refusals_before_loading(args, words, tmp_path):
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model",
                        str(tmp_path / "absent"), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr


# --- limits against abusive clients, and the command's start and stop ----------------------------


@contextlib.contextmanager
def _hardened(server, **options):
    """``server`` (a ``Server``) behind ``uvicorn_server`` in a thread, as ``ster serve`` runs it; yields
    its base url. ``max_connections`` goes to uvicorn_server, the rest to build_app."""
    from ster_py.server import build_app, uvicorn_server

    cap = options.pop("max_connections", None)
    runner = uvicorn_server(server, build_app(server, **options), max_connections=cap, log_level="error")
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not runner.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        runner.should_exit = True
        thread.join(timeout=30)


def _connect(url: str, data: bytes = b"") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(data)
    return s


def _closed(s: socket.socket) -> bytes | None:
    """What the server sent before closing ``s`` (b"" for nothing), or None while it stays open."""
    s.settimeout(0.2)
    got = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return got
            got += chunk
    except (TimeoutError, socket.timeout):
        return None
    except ConnectionResetError:
        return got


def test_slow_clients_and_many_connections_are_bounded(in_process, monkeypatch):
    """A connection that sends its headers or body slowly was held forever, and ~10k of them starved every
    other client (a tester's finding): headers and body must come in time, and past the connection cap
    the longest-waiting connection is closed for a new one."""
    import ster_py.server as module

    monkeypatch.setattr(module, "HEADER_TIMEOUT", 0.5)
    monkeypatch.setattr(module, "BODY_TIMEOUT", 0.5)
    _, server = in_process
    with _hardened(server, max_connections=3) as url:
        partial = _connect(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        body = _connect(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                             b"application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\":")
        time.sleep(1.5)
        assert _closed(partial) == b""
        reply = _closed(body)
        assert reply is not None and reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in reply
        monkeypatch.setattr(module, "HEADER_TIMEOUT", 60.0)
        idle = [_connect(url) for _ in range(8)]
        time.sleep(0.5)
        code, doc = _request(url, "GET", "/v1/models", timeout=10)
        assert code == 200 and doc["data"][0]["id"] == "tools"
        states = [_closed(s) for s in idle]
        assert states[:6] == [b""] * 6 and states[7] is None   # the oldest made room; the newest stay
        for s in [partial, body, *idle]:
            s.close()


def test_the_queue_is_bounded(in_process):
    """Requests waiting for their turn were unbounded (each holding its body; 20 bodies of 8 MiB took the
    process from 0.8 to 4.7 GB): past max_queue a request gets a 503 in OpenAI's shape with Retry-After."""
    url, server = in_process
    saved = server.max_queue
    server.max_queue = 0
    try:
        with looping(server, delay=0.002) as seen:
            host, port = url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request("POST", "/v1/chat/completions", body=json.dumps(dict(LOOP_REQUEST, stream=True)),
                         headers={"content-type": "application/json"})
            r = conn.getresponse()
            r.fp.readline()   # generating: the lock is held
            code, doc, headers = _request(url, "POST", "/v1/chat/completions", json.dumps(
                dict(LOOP_REQUEST, max_tokens=2)).encode(), timeout=5, response=True)
            assert code == 503 and headers["Retry-After"] == "5", doc
            assert doc["error"]["code"] == "queue_full" and "--max-queue" in doc["error"]["message"]
            conn.close()
            _cancelled_then_served(url, seen, LOOP_REQUEST)
        assert server.admitted == 0
    finally:
        server.max_queue = saved


def test_a_client_leaving_mid_upload_is_not_an_error(in_process):
    """A client that closed while sending its body logged 'Exception in ASGI application' and a
    ClientDisconnect traceback."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        s = _connect(in_process[0], b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                    b"application/json\r\nContent-Length: 100000\r\n\r\n{\"messages\":")
        time.sleep(0.3)
        s.close()
        time.sleep(0.5)
        code, _ = _request(in_process[0], "GET", "/v1/models")
    finally:
        logger.removeHandler(handler)
    assert code == 200 and [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []


def test_allowed_origins_get_cors(in_process):
    """--allow-origin lets a web page of that origin call the server (preflight and CORS headers); other
    origins stay refused."""
    _, server = in_process
    with _hardened(server, allow_origins=("http://app.example",)) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "origin": "http://app.example", "access-control-request-method": "POST",
            "access-control-request-headers": "content-type, authorization"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        body = json.dumps({"messages": [{"role": "user", "content": "w9"}], "max_tokens": 2}).encode()
        code, doc, headers = _request(url, "POST", "/v1/chat/completions", body, {"origin": "http://app.example"},
                                      response=True)
        assert code == 200 and headers["access-control-allow-origin"] == "http://app.example", doc
        code, doc = _request(url, "POST", "/v1/chat/completions", body, {"origin": "http://other.example"})
        assert code == 403 and "'http://other.example'" in doc["error"]["message"]


def test_log_lines_are_one_each_and_not_a_flood(capsys):
    """uvicorn and asyncio logged a traceback per failed accept in a tight loop (483k in 40 s with
    'Too many open files'): one line per message, no traceback, repeats within 10 s counted, not printed."""
    from ster_py.cli_serve import _OneLine

    logger = logging.getLogger("test_serve.one_line")
    logger.propagate = False
    logger.addHandler(_OneLine())
    try:
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            for _ in range(1000):
                logger.error("socket.accept() out of system resource", exc_info=True)
    finally:
        logger.handlers.clear()
    err = capsys.readouterr().err
    assert err.startswith("error: socket.accept() out of system resource: OSError: [Errno 24] Too many open files (")
    assert err.count("\n") == 1 and "Traceback" not in err


def _serve_process(model_dir: Path, *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model",
                             str(model_dir), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, "http://127.0.0.1:" + line.split()[2].rpartition(":")[2]


def test_a_drafting_servers_request_log_counts_the_drafted_tokens(tmp_path):
    """`ster serve --draft`'s request lines said nothing of the drafter, where `ster generate --draft` says "34 of
    42 drafted tokens accepted": each line says it now, as the reply's usage.draft_tokens_details counts them."""
    make_checkpoint(tmp_path / "base", "llama")
    make_checkpoint(tmp_path / "drafter", "llama", seed=5, num_hidden_layers=1)
    proc, url = _serve_process(tmp_path / "base", "--draft", str(tmp_path / "drafter"), "--draft-max", "3")
    try:
        code, doc = _request(url, "POST", "/v1/completions", json.dumps({"prompt": "w5 w6", "max_tokens": 6}).encode())
        assert code == 200, doc
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    details, n = doc["usage"]["draft_tokens_details"], doc["usage"]["completion_tokens"]
    assert details["drafted"] > 0, details
    line = (f"127.0.0.1 POST /v1/completions 200 2+{n} tokens ({details['accepted']} of {details['drafted']} "
            "drafted tokens accepted) ")
    assert re.search("^" + re.escape(line) + r"\d+\.\d\d s$", err, re.M), err


def test_base_model_on_every_interface_with_a_request_log(tmp_path):
    """A base model on /v1/chat/completions got CLI advice (ster generate --chat-template off); the start
    names the chat endpoint as unavailable, warns of a non-loopback address, and each request is a line
    on stderr (nothing was logged); SIGTERM ends it with "terminated" and status 143."""
    make_checkpoint(tmp_path / "base", "llama")
    proc, url = _serve_process(tmp_path / "base", "--host", "0.0.0.0", "--name", "base")
    try:
        code, doc = _request(url, "POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "w5"}]}).encode())
        assert code == 400 and "send the raw text to /v1/completions" in doc["error"]["message"], doc
        assert "ster generate" not in doc["error"]["message"]
        code, doc = _request(url, "POST", "/v1/completions", json.dumps({"prompt": "w5 w6", "max_tokens": 2}).encode(),
                             {"host": "elsewhere.example"})   # not on loopback: any Host name
        assert code == 200, doc
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.splitlines()[-1] == "terminated", err
    assert "warning: listening on 0.0.0.0, not loopback: anyone who can reach this machine" in err
    assert "note: the model has no chat template (a base model): /v1/chat/completions refuses requests" in err
    assert re.search(r"^127\.0\.0\.1 POST /v1/chat/completions 400 \d+\.\d\d s$", err, re.M), err
    assert re.search(r"^127\.0\.0\.1 POST /v1/completions 200 2\+2 tokens \d+\.\d\d s$", err, re.M), err
    assert "Traceback" not in err


@pytest.mark.parametrize("sig, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_stopping_mid_stream(tmp_path, sig, status, word):
    """Ctrl-C or SIGTERM during a stream printed 'Cancel 1 running task(s)' and a CancelledError traceback,
    and exited 0: the stream ends with an error event, then the one line and 128 + the signal."""
    path = chat_model(tmp_path / "model")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, max_position_embeddings=4096)))
    proc, url = _serve_process(path, "-q")
    try:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/chat/completions", headers={"content-type": "application/json"}, body=json.dumps(
            {"messages": [{"role": "user", "content": "w9"}], "max_tokens": 4000, "stream": True,
             "logit_bias": {"2": -100}}))
        r = conn.getresponse()
        assert r.status == 200 and all(r.readline() for _ in range(6))   # streaming
        proc.send_signal(sig)
        rest = r.read().decode()
    finally:
        if proc.poll() is None:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    last = [line for line in rest.splitlines() if line.startswith("data: ")][-1]
    assert json.loads(last.removeprefix("data: "))["error"]["code"] == "server_shutting_down"
    assert proc.returncode == status and err == word + "\n", err


def test_served_with_an_adapter_answers_as_generate_adapter_does(tmp_path):
    """serve --adapter loads the model as generate and chat do (a new user had to tune merge first to serve a
    LoRA): a chat completion is generate --adapter's greedy answer to the same message, not the base model's."""
    from test_chat_cmd import _peft_adapter

    model_dir = chat_model(tmp_path / "model")
    cfg = json.loads((model_dir / "config.json").read_text())
    adapter = _peft_adapter(tmp_path / "peft", str(model_dir), cfg["hidden_size"], cfg["intermediate_size"])
    ster = [sys.executable, "-c", "from ster_py.cli import main; main()"]
    answers = []
    for extra in (["--adapter", str(adapter)], []):
        r = subprocess.run([*ster, "generate", "--model", str(model_dir), "-p", "w10 w11", "--max-new-tokens", "6",
                            "--json", "-q", *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        answers.append(json.loads(r.stdout)["text"])
    assert answers[0] != answers[1]   # the adapter changes the answer
    proc = subprocess.Popen([*ster, "serve", "--model", str(model_dir), "--port", "0", "-q", "--adapter", str(adapter)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() is not None else "")
        client = openai.OpenAI(base_url=line.split()[2] + "/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w10 w11"}],
                                               max_tokens=6, temperature=0)
        assert reply.choices[0].message.content == answers[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_logprobs_cover_only_the_content(in_process):
    """The end token that ended a reply (</s>, not in its content) had a logprobs entry, and so had tokens
    cut off at a stop string: the entries are those of the tokens whose text is (at least in part) in the
    content, streamed or not. (A token's text in the reply here begins with its space.)"""
    client = openai.OpenAI(base_url=in_process[0] + "/v1", api_key="unused", max_retries=0)
    for stop, n, tokens in ((None, 7, 8), ([" </tool_call>"], 6, 7), ([' "Paris"}}'], 5, 6), (["Paris"], 6, 6)):
        kw = dict(model="tools", messages=[{"role": "user", "content": "w9"}], max_tokens=20, logprobs=True,
                  stop=stop)
        reply = client.chat.completions.create(**kw)
        assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens == tokens
        entries = reply.choices[0].logprobs.content
        assert [e.token.strip() for e in entries] == TOOL_WORDS[:n], reply
        streamed = [e.token.strip() for c in client.chat.completions.create(stream=True, **kw)
                    if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert streamed == TOOL_WORDS[:n]
        text = client.completions.create(model="tools", prompt="w5", max_tokens=20, logprobs=1, stop=stop)
        assert [t.strip() for t in text.choices[0].logprobs.tokens] == TOOL_WORDS[:n]


#: A SentencePiece-style reply (▁ words, "€" in three byte-fallback tokens) after a reasoning block.
SPM_REPLY = ["<think>", "▁plan", "</think>", "▁Hello", "▁remote", "<0xE2>", "<0x82>", "<0xAC>", "▁world", "</s>"]


class Boosted(Scripted):
    """``Scripted``, and after some ids a few other ids raised too (close alternatives)."""

    def __init__(self, inner, follow: dict[int, int], extra: dict[int, dict[int, float]]):
        super().__init__(inner, follow)
        self.extra = extra

    def forward(self, ids, cache, **kw):
        out = np.array(super().forward(ids, cache, **kw))
        for i, bonus in self.extra.get(int(np.asarray(ids)[-1]), {}).items():
            out[-1, i] += bonus
        return out


@pytest.fixture(scope="module")
def spm_served(tmp_path_factory):
    """A tiny model with a Llama-2-style tokenizer (▁ words, byte fallback, a decoder that strips the leading
    space) and a reasoning template, scripted to write ``SPM_REPLY`` (after the chat prompt's w5, or after a
    raw prompt "go": from ▁Hello on); after ▁remote the byte tokens <0xE3> and <0xC3> come close to the chosen
    <0xE2>. Yields (base url, LoadedModel)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from ster_py.conversation import Session
    from ster_py.server import Server

    path = tmp_path_factory.mktemp("spm")
    make_checkpoint(path, "llama", vocab_size=320, max_position_embeddings=512)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for word in ["w3", "w4", "w5", "w6", "go", *SPM_REPLY]:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<s>", "</s>", "<think>", "</think>"])
    tok.save(str(path / "tokenizer.json"))
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    template = "{% if false %}<think></think>{% endif %}" + CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=template)))
    loaded = load_model(str(path))
    chain = [vocab[w] for w in ["w5", *SPM_REPLY]]
    follow = {**dict(zip(chain, chain[1:])), vocab["go"]: vocab["▁Hello"]}
    extra = {vocab["▁remote"]: {vocab["<0xE3>"]: 999.0, vocab["<0xC3>"]: 998.0}}
    loaded.decoder = Boosted(loaded.decoder, follow, extra)
    with _in_thread(Server(Session(loaded), "spm")) as url:
        yield url, loaded


def test_logprobs_tokens_are_their_own_pieces(spm_served):
    """A SentencePiece decoder strips the space a text begins with; decoding each token alone lost the
    space of every word-initial ▁ token ("remote" for ▁remote, bytes b"remote"), and a byte token of "€"
    read U+FFFD, one character each, so text_offset went past the text's end. Each token is its own piece
    (llama.cpp's token_to_piece: " remote", b"\\xe2"), the pieces joined are the text (but for its first
    space), and text_offset is where each piece begins in prompt + text (the byte tokens at the "€")."""
    client = openai.OpenAI(base_url=spm_served[0] + "/v1", api_key="unused", max_retries=0)
    text = "Hello remote€ world"
    for stream in (False, True):
        kw = dict(model="spm", prompt="go", max_tokens=20, logprobs=0)
        if stream:
            tokens, offsets, got = [], [], ""
            for c in client.completions.create(stream=True, **kw):
                got += c.choices[0].text
                if c.choices[0].logprobs is not None:
                    tokens += c.choices[0].logprobs.tokens
                    offsets += c.choices[0].logprobs.text_offset
        else:
            choice = client.completions.create(**kw).choices[0]
            tokens, offsets, got = choice.logprobs.tokens, choice.logprobs.text_offset, choice.text
        assert got == text
        assert tokens == [" Hello", " remote", "\ufffd", "\ufffd", "\ufffd", " world"]
        assert offsets == [2 + k for k in (0, 5, 12, 12, 12, 13)]
        assert ("go" + text)[offsets[1]:offsets[1] + 7] == " remote" and all(o <= len("go" + text) for o in offsets)
    content = client.chat.completions.create(model="spm", messages=[{"role": "user", "content": "w3"}],
                                             max_tokens=20, logprobs=True).choices[0].logprobs.content
    assert [bytes(e.bytes) for e in content] == [b" Hello", b" remote", b"\xe2", b"\x82", b"\xac", b" world"]
    assert [e.token for e in content] == [" Hello", " remote", "\ufffd", "\ufffd", "\ufffd", " world"]
    assert b"".join(bytes(e.bytes) for e in content) == b" " + text.encode()


def test_a_reply_cut_inside_a_character_ends_before_it(spm_served):
    """max_tokens ending a reply inside "€" (after its byte token <0xE2>, or <0xE2><0x82>) made it end in
    U+FFFD, streamed or not; as llama.cpp's server, only whole characters are sent: the cut one is left out."""
    client = openai.OpenAI(base_url=spm_served[0] + "/v1", api_key="unused", max_retries=0)
    for cut in (1, 2):   # of the character's three bytes
        for stream in (False, True):
            kw = dict(model="spm", prompt="go", max_tokens=2 + cut)
            got = ("".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)) if stream
                   else client.completions.create(**kw).choices[0].text)
            assert got == "Hello remote", (cut, stream, got)
            kw = dict(model="spm", messages=[{"role": "user", "content": "w3"}], max_tokens=5 + cut)
            if stream:
                chunks = list(client.chat.completions.create(stream=True, **kw))
                got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            else:
                choice = client.chat.completions.create(**kw).choices[0]
                got, finish = choice.message.content, [choice.finish_reason]
            assert got == "Hello remote" and finish == ["length"], (cut, stream, got, finish)


def test_completion_top_logprobs_keep_alternatives_that_decode_alike(spm_served):
    """top_logprobs is keyed by text: the byte tokens <0xE2>, <0xE3>, <0xC3> all decoded to U+FFFD and
    collapsed into one key holding the last (lowest) value. A piece that is not UTF-8 is keyed as OpenAI
    keys it, "bytes:\\xe2"; the chosen token's own logprob is there."""
    client = openai.OpenAI(base_url=spm_served[0] + "/v1", api_key="unused", max_retries=0)
    lp = client.completions.create(model="spm", prompt="go", max_tokens=20, logprobs=3).choices[0].logprobs
    top = lp.top_logprobs[2]   # after ▁remote
    assert list(top) == ["bytes:\\xe2", "bytes:\\xe3", "bytes:\\xc3"], top
    assert top["bytes:\\xe2"] == pytest.approx(lp.token_logprobs[2]) and top["bytes:\\xe2"] > top["bytes:\\xc3"]
    assert list(lp.top_logprobs[0])[0] == " Hello"


def test_chat_logprobs_leave_out_the_reasoning(spm_served):
    """Chat logprobs had entries for <think>, the reasoning tokens and </think>, which are not in
    ``content`` (the reasoning is in reasoning_content): they cover the content's tokens only, streamed
    or not."""
    client = openai.OpenAI(base_url=spm_served[0] + "/v1", api_key="unused", max_retries=0)
    kw = dict(model="spm", messages=[{"role": "user", "content": "w3"}], max_tokens=20, logprobs=True)
    reply = client.chat.completions.create(**kw)
    message = reply.choices[0].message
    assert message.content == "Hello remote€ world" and message.reasoning_content.strip() == "plan"
    content = reply.choices[0].logprobs.content
    assert [e.token for e in content][:2] == [" Hello", " remote"] and len(content) == 6
    streamed = [e.token for c in client.chat.completions.create(stream=True, **kw)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == [e.token for e in content]


def test_generate_json_logprobs_carry_each_tokens_bytes(spm_served, tmp_path):
    """``ster generate --json --logprobs`` entries had no ``bytes``, so a token inside a character read only
    U+FFFD: each entry (and each alternative) has its token's own bytes and their text; one entry per
    generated id, the end token included."""
    loaded = spm_served[1]
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "generate", "--model",
                        str(loaded.resolved.root), "--prompt", "go w3 w4", "--chat-template", "off",
                        "--max-new-tokens", "12", "--logprobs", "2", "--json", "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    tok = loaded.tokenizer
    assert [e["id"] for e in doc["logprobs"]] == doc["ids"]
    for e in doc["logprobs"]:
        for t in [e, *e["top"]]:
            assert t["bytes"] == list(tok.token_bytes(t["id"])) and t["token"] == tok.token_text(t["id"])
    # random weights over a vocabulary of byte tokens: some token or alternative is part of a character
    assert any(len(t["bytes"]) == 1 and t["bytes"][0] >= 0x80 and t["token"] == "\ufffd"
               for e in doc["logprobs"] for t in [e, *e["top"]])


def test_private_network_preflights_are_answered(in_process):
    """A preflight with Access-Control-Request-Private-Network (Chrome's, for a page calling a local
    server) got a plain-text 400 'Disallowed CORS private-network': an allowed origin's is answered as
    its other preflights, with Access-Control-Allow-Private-Network; another origin's is refused (403)."""
    _, server = in_process
    with _hardened(server, allow_origins=("http://app.example",)) as url:
        host, port = url.removeprefix("http://").split(":")
        for origin, status in (("http://app.example", 200), ("http://other.example", 403)):
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("OPTIONS", "/v1/chat/completions", headers={
                "origin": origin, "access-control-request-method": "POST",
                "access-control-request-headers": "content-type", "access-control-request-private-network": "true"})
            r = conn.getresponse()
            body = r.read()
            conn.close()
            assert r.status == status, body
            if status == 200:
                assert r.headers["access-control-allow-private-network"] == "true"
                assert r.headers["access-control-allow-origin"] == origin
            else:
                assert json.loads(body)["error"]["code"] == "origin_not_allowed"


def test_a_full_queue_of_one_says_request_is(in_process):
    """The 503 of a queue of one said '1 requests are waiting'."""
    _, server = in_process
    saved = server.max_queue, server.admitted
    server.max_queue, server.admitted = 1, 2
    try:
        assert "the server is busy: 1 request is waiting for their turn" in str(server._busy(1))
        server.max_queue, server.admitted = 2, 3
        assert "the server is busy: 2 requests are waiting" in str(server._busy(1))
        # --max-queue 0 said "0 requests are waiting for their turn" (a new user's finding)
        server.max_queue, server.admitted = 0, 1
        assert str(server._busy(1)) == ("the server is busy with another request and queues none "
                                        "(ster serve --max-queue 0); retry later")
    finally:
        server.max_queue, server.admitted = saved


@pytest.mark.parametrize("headers, words", [
    ([("Host", "localhost:8080, evil.example")], "is not one host[:port]"),
    ([("Host", "localhost:8080 evil.example")], "is not one host[:port]"),
    ([("Host", "127.0.0.1"), ("Origin", "http://127.0.0.1"), ("Origin", "http://evil.example")],
     "2 Origin headers"),
    ([("Host", "127.0.0.1"), ("Origin", "http://evil.example"), ("Origin", "http://127.0.0.1")],
     "2 Origin headers"),
])
def test_a_host_header_list_and_repeated_origins_are_refused(in_process, headers, words):
    """'Host: localhost:PORT, evil' passed the loopback check (its name was read as 'localhost') and of two
    Origin headers only the first was checked: a Host header that is not one host[:port], and more than one
    Host or Origin header, are a 400."""
    host, port = in_process[0].removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("GET", "/v1/models", skip_host=True, skip_accept_encoding=True)
    for name, value in headers:
        conn.putheader(name, value)
    conn.endheaders()
    r = conn.getresponse()
    doc = json.loads(r.read())
    conn.close()
    assert r.status == 400 and words in doc["error"]["message"], doc
    code, doc = _request(in_process[0], "GET", "/v1/models", headers={"host": f"localhost:{port}"})
    assert code == 200, doc


def test_allow_origin_is_compared_as_browsers_send_origins(in_process):
    """--allow-origin https://App.Example (or :443, or http://...:80) was compared as written with the
    Origin a browser sends (lowercase host, no default port), so the page was refused (403) for ever:
    both sides are normalized (scheme and host lowercased, the default port dropped)."""
    from ster_py.cli_serve import _origin

    _, server = in_process
    body = json.dumps({"messages": [{"role": "user", "content": "w9"}], "max_tokens": 1}).encode()
    with _hardened(server, allow_origins=("https://App.Example:443", "http://Other.Example:80")) as url:
        for origin, status in (("https://app.example", 200), ("https://APP.example", 200), ("http://other.example", 200),
                               ("https://app.example:443", 200), ("http://app.example", 403),
                               ("https://app.example:8443", 403), ("null", 403)):
            code, doc, headers = _request(url, "POST", "/v1/chat/completions", body, {"origin": origin}, response=True)
            assert code == status, (origin, doc)
            if status == 200:   # the browser compares it with its own Origin: the header as sent
                assert headers["access-control-allow-origin"] == origin
            else:
                assert doc["error"]["code"] == "origin_not_allowed"
    assert [_origin(o) for o in ("HTTPS://App.Example:443", "http://app.example:80", "http://[0:0::1]:3000", "*")] == \
        ["https://app.example", "http://app.example", "http://[::1]:3000", "*"]


def test_preflights_for_other_methods_are_refused_in_openai_shape(in_process):
    """A preflight of an allowed origin for a method other than GET/POST got starlette's plain-text 400
    'Disallowed CORS method': a 403 in OpenAI's error shape, as another origin's preflight gets."""
    _, server = in_process
    with _hardened(server, allow_origins=("http://app.example",)) as url:
        code, doc, headers = _request(url, "OPTIONS", "/v1/chat/completions", headers={
            "origin": "http://app.example", "access-control-request-method": "PUT",
            "access-control-request-headers": "content-type"}, response=True)
    assert code == 403 and headers["content-type"] == "application/json", doc
    assert doc["error"]["type"] == "permission_error" and doc["error"]["code"] == "method_not_allowed"
    assert "send 'PUT' requests; the server answers GET and POST only" in doc["error"]["message"]


def test_the_start_line_names_the_address_bound(tmp_path):
    """--host localhost listens on 127.0.0.1 only, and the start line said http://localhost:PORT (a client
    trying ::1 first was refused): it names the address bound."""
    make_checkpoint(tmp_path / "base", "llama")
    proc = subprocess.Popen([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model",
                             str(tmp_path / "base"), "--port", "0", "--host", "localhost", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split()[2]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), (line, proc.stderr.read() if proc.poll() is not None else "")
        assert _request(url, "GET", "/v1/models")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _raw_post(base: str, path: str, body: dict) -> tuple[int, str, bytes]:
    """(status, content type, body bytes) of a POST, read whole (a stream too)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    r = conn.getresponse()
    out = (r.status, r.headers.get("content-type", ""), r.read())
    conn.close()
    return out


@pytest.mark.parametrize("path, field", [("/v1/chat/completions", "messages"), ("/v1/completions", "prompt")])
def test_a_prompt_longer_than_the_context_is_refused_before_a_stream_starts(served, path, field):
    """A streamed request whose prompt the context cannot hold got a 200, a role chunk, then an error event,
    while the same request not streamed got a 400 (a new user's finding): the prompt is built before the
    response starts, and both get the same 400."""
    words = " ".join(["w5"] * 400)   # 400 tokens, the tiny model's context is 256
    body = {"messages": [{"role": "user", "content": words}]} if field == "messages" else {"prompt": words}
    whole = _raw_post(served[0], path, body)
    streamed = _raw_post(served[0], path, dict(body, stream=True))
    assert streamed == whole and whole[0] == 400 and whole[1] == "application/json", streamed
    err = json.loads(whole[2])["error"]
    assert "longer than the context of 256 positions" in err["message"], err
    assert err["code"] == "context_length_exceeded" and err["param"] == field


def test_a_stream_the_client_left_is_logged_499_with_its_tokens(in_process):
    """A streaming client that disconnected was logged '200 0.60 s' (no token counts; a non-streamed one is
    '499 37+56 tokens'): the log line waits for the generation to stop and says 499 with the tokens made,
    while a stream read to its end stays 200."""
    _, server = in_process
    lines: list[str] = []
    with _hardened(server, log=lines.append) as url, looping(server) as seen:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(dict(LOOP_REQUEST, stream=True)),
                     headers={"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and any("w_loop" in r.fp.readline().decode() for _ in range(12))
        conn.close()
        t0 = time.time()
        while not lines and time.time() - t0 < 60:
            time.sleep(0.05)
        assert seen and seen[0].finish_reason == "cancelled"
        prompt, made = len(seen[0].prompt_ids), len(seen[0].generation.ids)
        assert re.fullmatch(rf"127\.0\.0\.1 POST /v1/chat/completions 499 {prompt}\+{made} tokens \d+\.\d\d s",
                            lines[0]), lines
        chunks = list(openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0).chat.completions.create(
            model="tools", messages=LOOP_REQUEST["messages"], max_tokens=3, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        t0 = time.time()
        while len(lines) < 2 and time.time() - t0 < 60:
            time.sleep(0.05)
        assert re.fullmatch(r"127\.0\.0\.1 POST /v1/chat/completions 200 \d+\+3 tokens \d+\.\d\d s", lines[1]), lines
