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


def _request(base: str, method: str, path: str, body: bytes | None = None):
    """(status, JSON document) of a raw HTTP request (http.client: bytes as given)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request(method, path, body=body, headers={"content-type": "application/json"} if body is not None else {})
    r = conn.getresponse()
    doc = json.loads(r.read())
    conn.close()
    return r.status, doc


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
    pieces = [loaded.tokenizer.decode([e["id"]], skip_special_tokens=False) for e in gen.logprobs]
    assert lp.tokens == pieces and lp.token_logprobs == pytest.approx([e["logprob"] for e in gen.logprobs])
    assert [len(top) for top in lp.top_logprobs] == [3] * len(pieces)
    assert lp.text_offset == [len("w7 w8 w9") + len("".join(pieces[:k])) for k in range(len(pieces))]
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
     "never reads tools"),
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
])
def test_bad_requests_get_openai_shaped_errors(served, body, status, words):
    code, doc = _request(served[0], "POST", "/v1/chat/completions", body)
    assert code == status, doc
    err = doc["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error" and len(err["message"]) < 1000


def test_text_parts_are_read_as_their_text(client, loaded):
    """content as a list of text parts (OpenAI's other form) is the parts' texts joined by newlines."""
    parts = [{"type": "text", "text": "w11 w12"}, {"type": "text", "text": "w13"}]
    got = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=4)
    answer, ids = cold_answer(loaded, [{"role": "user", "content": "w11 w12\nw13"}], 4)
    assert got.choices[0].message.content == answer and got.usage.prompt_tokens == len(ids)


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
    import uvicorn
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ster_py.conversation import Session
    from ster_py.server import Server, build_app

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
    sock = socket.create_server(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(build_app(server), log_level="error"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    srv.should_exit = True
    thread.join(timeout=30)


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
])
def test_serve_refusals_before_loading(args, words, tmp_path):
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model",
                        str(tmp_path / "absent"), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr
