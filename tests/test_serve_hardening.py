"""`agentrl serve` against a hostile client (issue 38): each defect found by probing it, as a regression test.

Most tests run a fake engine (`Echo`: every request answered with one fixed reply, a given log-prob per token) behind
the real server, template and tokenizer (Qwen3's), so the HTTP, parsing, matching and recording code under test is
the shipped one; the concurrency test runs the real HF engine on tiny-qwen3.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")

from agentrl.engine.base import EngineResult, Generation, SamplingParams  # noqa: E402
from agentrl.recipes.serve import ServeConfig, ServeError  # noqa: E402
from agentrl.serve import sessions  # noqa: E402
from agentrl.serve.engine_client import EngineClient  # noqa: E402
from agentrl.serve.server import PolicyServer, ServerStartError, session_url, start_server  # noqa: E402
from agentrl.serve.sessions import Recorder, Renderer  # noqa: E402

USER = [{"role": "user", "content": "What is 2+2?"}]


class Echo:
    """A test double engine: answers every request with `reply` (tokenized), log-prob `logprob` a token.

    `gate`, when given, holds every poll until it is set (an engine busy for as long as the test likes).
    """

    def __init__(self, tokenizer, reply="It is 4.<|im_end|>", logprob=-0.5, gate=None):
        self.ids = tuple(tokenizer(reply, add_special_tokens=False)["input_ids"])
        self.logprob, self.gate, self.pending, self.policy_version = logprob, gate, [], 0

    def submit(self, request):
        self.pending.append(request)

    def poll(self, timeout=None):
        if self.gate is not None:
            self.gate.wait()
        out = [EngineResult(r.id, Generation(self.ids, (self.logprob,) * len(self.ids), "stop"), 0)
               for r in self.pending]
        self.pending = []
        return out

    def update_weights(self, named_tensors, version):
        self.policy_version = version

    def metrics(self):
        return {}

    def clear_cache(self):
        pass

    def close(self):
        pass


def _policy(tokenizer, engine=None, *, context=2048, recorder=None, **options):
    recorder = recorder or Recorder(Renderer(tokenizer, family_hint="qwen3"))
    return PolicyServer(EngineClient(engine or Echo(tokenizer)), recorder, "m",
                        defaults=SamplingParams(max_new_tokens=8), max_context_tokens=context, **options)


def _serve(tokenizer, engine=None, *, token="", context=2048, recorder=None, **options):
    return start_server(_policy(tokenizer, engine, context=context, recorder=recorder, **options), token=token)


@pytest.fixture(scope="module")
def echo(qwen3_tokenizer):
    running = _serve(qwen3_tokenizer)
    yield running
    running.close()


def _strict(text):
    """Parse JSON refusing NaN / Infinity (what a strict client does)."""
    def refuse(name):
        raise ValueError(f"non-finite constant {name} in an answer")
    return json.loads(text, parse_constant=refuse)


def _post(running, body, path="/chat/completions", headers=None):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)  # json.dumps writes NaN as NaN
    return httpx.post(f"{running.url}{path}", content=content, timeout=30,
                      headers={"Content-Type": "application/json", **(headers or {})})


# ---- numbers, ids, nesting -------------------------------------------------------------------------------------

@pytest.mark.parametrize("param", ["temperature", "presence_penalty", "repetition_penalty", "top_p",
                                   "frequency_penalty", "min_p"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_sampling_settings_are_refused_naming_the_param(echo, param, value):
    before = len(echo.server.recorder.sessions())
    reply = _post(echo, {"messages": USER, param: value})
    assert reply.status_code == 400, reply.text
    error = _strict(reply.text)["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert len(echo.server.recorder.sessions()) == before  # refused before a session or a record exists


def test_overflowing_numbers_and_nan_anywhere_are_refused(echo):
    huge = _post(echo, b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e400}')
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "temperature"
    nested = _post(echo, b'{"messages": [{"role": "user", "content": "x", "extra": [NaN]}]}')
    assert nested.status_code == 400 and "messages[0].extra[0]" in nested.json()["error"]["message"]
    digits = _post(echo, b'{"messages": [{"role": "user", "content": "x"}], "seed": 1' + b"0" * 5000 + b"}")
    assert digits.status_code == 400 and "Traceback" not in digits.text


def test_a_non_finite_logprob_from_the_engine_is_never_sent_nor_recorded(qwen3_tokenizer, tmp_path):
    record = tmp_path / "calls.jsonl"
    running = _serve(qwen3_tokenizer, Echo(qwen3_tokenizer, logprob=float("nan")), record_path=record)
    try:
        reply = _post(running, {"messages": USER, "logprobs": True})
        assert reply.status_code == 500 and _strict(reply.text)["error"]["code"] == "non_finite"
        stream = _post(running, {"messages": USER, "logprobs": True, "stream": True})
        assert stream.status_code == 500 and "NaN" not in stream.text
        assert not record.exists() or record.read_text() == ""
        assert all(not running.server.recorder.session(s).records for s in running.server.recorder.sessions())
    finally:
        running.close()


def test_answers_and_records_are_strict_json(echo, tmp_path):
    reply = _post(echo, {"messages": USER, "logprobs": True, "temperature": 0.7})
    assert reply.status_code == 200
    body = _strict(reply.text)
    assert all(isinstance(t["logprob"], float) for t in body["choices"][0]["logprobs"]["content"])
    stream = _post(echo, {"messages": USER, "stream": True, "logprobs": True})
    for line in stream.text.splitlines():
        if line.startswith("data: {"):
            _strict(line[6:])


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1, 2**70]}, "prompt"),
    ({"prompt": [1, -3]}, "prompt"),
    ({"prompt": [[1, 2**70]]}, "prompt"),
    ({"prompt": "x", "logit_bias": {str(2**70): 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 1000}}, "logit_bias"),
])
def test_token_ids_outside_the_vocabulary_are_refused(echo, body, param):
    reply = _post(echo, body, path="/completions")
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


@pytest.mark.parametrize("body, param", [
    ({"messages": USER, "n": 2**70}, "n"),
    ({"messages": USER, "seed": 2**70}, "seed"),
    ({"messages": USER, "top_k": -1}, "top_k"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "top_logprobs": 2**70, "logprobs": True}, "top_logprobs"),
    ({"messages": USER, "stop": ["x" * 5000]}, "stop"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x", "name": {"a": 1}}]}, "messages[0].name"),
])
def test_out_of_range_settings_are_refused_naming_the_param(echo, body, param):
    reply = _post(echo, body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_nesting_is_a_400(echo, depth):
    reply = _post(echo, '{"messages": ' + "[" * depth + "]" * depth + "}")
    assert reply.status_code == 400 and "nest" in reply.json()["error"]["message"]


def test_deep_tool_call_arguments_are_a_400(echo):
    args = "[" * 5000 + "]" * 5000
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "user", "content": "?"}]
    reply = _post(echo, {"messages": messages})
    assert reply.status_code in (200, 400) and reply.status_code != 500
    shallow_deep = "[" * 80 + "]" * 80
    messages[1]["tool_calls"][0]["function"]["arguments"] = shallow_deep
    reply = _post(echo, {"messages": messages})
    assert reply.status_code == 400 and "nest" in reply.json()["error"]["message"]


# ---- HTTP: headers, hosts, binds, tokens -----------------------------------------------------------------------

def _raw(running, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


def test_content_length_abc_is_a_400(echo):
    answer = _raw(echo, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n{}")
    assert answer.startswith(b"HTTP/1.1 400")


def test_a_body_over_the_limit_is_a_413_before_it_is_read(echo):
    answer = _raw(echo, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 999999999\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413")


def test_a_foreign_host_is_refused(echo):
    reply = httpx.get(f"{echo.url}/models", headers={"Host": "attacker.example"})
    assert reply.status_code == 421
    assert reply.json()["error"]["type"] == "invalid_request_error"  # OpenAI's shape, so the client reads it
    assert httpx.get(f"{echo.url}/models").status_code == 200


def test_binding_beyond_loopback_needs_a_token(qwen3_tokenizer):
    policy = _policy(qwen3_tokenizer)
    try:
        with pytest.raises(ServerStartError, match="--token"):
            start_server(policy, "0.0.0.0", 0)
    finally:
        policy.client.close()
    with pytest.raises(ServeError, match="AGENTRL_SERVE_TOKEN"):
        ServeConfig(model="tiny-qwen3", host="0.0.0.0")
    ServeConfig(model="tiny-qwen3", host="0.0.0.0", token="t")  # with a token it may


def test_cli_refuses_a_wide_bind_without_a_token():
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "serve", "--model", "tiny-qwen3", "--host", "0.0.0.0",
                           "--port", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--token" in done.stderr and "Traceback" not in done.stderr


def test_the_token_guards_every_route_but_health(qwen3_tokenizer):
    running = _serve(qwen3_tokenizer, token="s3cret")
    try:
        wrong = openai.OpenAI(base_url=session_url(running.address, "mine"), api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="m", messages=USER)
        right = openai.OpenAI(base_url=session_url(running.address, "mine"), api_key="s3cret", max_retries=0)
        assert right.chat.completions.create(model="m", messages=USER).choices[0].message.content
        assert httpx.get(f"{running.address}/health").status_code == 200  # open: a liveness probe
        report = f"{running.address}/agentrl/sessions/mine"
        assert httpx.get(report).status_code == 401
        assert httpx.get(report, headers={"Authorization": "Bearer guess"}).status_code == 401
        assert httpx.get(report, headers={"Authorization": "Bearer s3cret"}).json()["calls"] == 1
        assert httpx.get(f"{running.url}/models").status_code == 401
        assert httpx.post(f"{running.url}/completions", json={"prompt": "x"}).status_code == 401
        assert not running.server.recorder.find("anon") and running.server.recorder.sessions() == ["mine"]
    finally:
        running.close()


def test_anonymous_session_ids_are_unguessable(echo):
    ids = [_post(echo, {"messages": USER}).json()["agentrl"]["session"] for _ in range(3)]
    assert len(set(ids)) == 3
    assert all(re.fullmatch(r"anon-[A-Za-z0-9_-]{22}", s) for s in ids)
    for guess in ("anon-0", "anon-1", "anon-2"):
        assert httpx.get(f"{echo.address}/agentrl/sessions/{guess}").status_code == 404
    assert httpx.get(f"{echo.address}/agentrl/sessions/{ids[0]}").json()["calls"] == 1


def test_session_ids_are_bounded(echo):
    reply = _post(echo, {"messages": USER}, headers={"X-Session-Id": "s" * 300})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "session"


def test_agent_servers_refuse_anonymous_calls(qwen3_tokenizer):
    running = _serve(qwen3_tokenizer, anonymous=False)
    try:
        reply = _post(running, {"messages": USER})
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "session_required"
    finally:
        running.close()


# ---- concurrency -----------------------------------------------------------------------------------------------

def test_fifty_concurrent_streams_all_succeed_without_retries(tiny_qwen3):
    from agentrl.engine import EngineSpec, build_engines

    engine = build_engines(EngineSpec(kind="hf", batch_size=8), tiny_qwen3, share_module=True)
    running = _serve(tiny_qwen3.tokenizer, engine)
    start = threading.Barrier(50)

    def one(i):
        client = openai.OpenAI(base_url=session_url(running.address, f"c{i}"), api_key="unused", max_retries=0)
        start.wait()
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Hi {i}"}],
                                                     stream=True, max_tokens=4))
        return chunks[-1].choices[0].finish_reason

    try:
        with ThreadPoolExecutor(50) as pool:
            reasons = list(pool.map(one, range(50)))
        assert len(reasons) == 50 and all(r in ("stop", "length") for r in reasons)
        assert all(len(running.server.recorder.session(f"c{i}").records) == 1 for i in range(50))
    finally:
        running.close()


def test_health_answers_while_the_engine_is_busy(qwen3_tokenizer):
    gate = threading.Event()
    running = _serve(qwen3_tokenizer, Echo(qwen3_tokenizer, gate=gate))
    try:
        with ThreadPoolExecutor(4) as pool:
            waiting = [pool.submit(_post, running, {"messages": USER}) for _ in range(4)]
            time.sleep(0.3)  # the four calls now wait on the engine
            t0 = time.perf_counter()
            health = httpx.get(f"{running.address}/health", timeout=5)
            assert health.status_code == 200 and time.perf_counter() - t0 < 1.0
            assert not any(f.done() for f in waiting)
            gate.set()
            assert all(f.result().status_code == 200 for f in waiting)
    finally:
        gate.set()
        running.close()


# ---- prompt length, memory, matching cost ----------------------------------------------------------------------

class CountingTokenizer:
    """Wraps a tokenizer and counts its encode calls (to show a refusal came before any tokenizing)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tokenizer(*args, **kwargs)

    def encode(self, *args, **kwargs):
        self.calls += 1
        return self.tokenizer.encode(*args, **kwargs)

    def __len__(self):
        return len(self.tokenizer)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_a_two_million_character_prompt_is_refused_before_tokenizing(qwen3_tokenizer):
    renderer = Renderer(qwen3_tokenizer, family_hint="qwen3")
    counting = renderer.tokenizer = CountingTokenizer(qwen3_tokenizer)
    running = _serve(qwen3_tokenizer, recorder=Recorder(renderer), context=2048)
    try:
        big = "word " * 400_000  # 2M characters
        t0 = time.perf_counter()
        chat = _post(running, {"messages": [{"role": "user", "content": big}]})
        completion = _post(running, {"prompt": big}, path="/completions")
        elapsed = time.perf_counter() - t0
        for reply in (chat, completion):
            assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
        assert counting.calls == 0
        assert elapsed < 5.0  # generous: parsing 4 MB of JSON twice on a shared CI core
        assert running.server.recorder.sessions() == []
    finally:
        running.close()


def _rss_mib():
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def test_memory_after_a_thousand_calls_stays_under_the_cap(qwen3_tokenizer, tmp_path):
    cap = 8 * 2**20
    record = tmp_path / "calls.jsonl"
    recorder = Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3"), max_bytes=cap)
    running = _serve(qwen3_tokenizer, recorder=recorder, context=16384, record_path=record)
    text = " ".join(f"word{i % 97}" for i in range(1500))  # ~10k characters, ~3k tokens
    try:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            for i in range(20):  # warm-up: allocator pools, tokenizer caches, the template
                client.post("/chat/completions", json={"messages": [{"role": "user", "content": f"{i} {text}"}]})
            rss0 = _rss_mib()
            for i in range(1000):
                reply = client.post("/chat/completions",
                                    json={"messages": [{"role": "user", "content": f"{i} {text}"}]})
                assert reply.status_code == 200
                assert recorder.bytes_kept <= cap + 2**20  # the cap, plus at most the call being recorded
            growth = _rss_mib() - rss0
        health = httpx.get(f"{running.address}/health").json()
        assert health["sessions_evicted"] >= 900 and health["sessions_evicted_unsaved"] == 0
        assert health["bytes_kept"] <= cap + 2**20
        assert len(record.read_text().splitlines()) == 1020  # every evicted call is on disk
        # Uncapped, the same calls grow RSS by ~100 MiB (measured; the recorder's estimate says ~190 MiB).
        assert growth < 48, f"RSS grew {growth:.0f} MiB over 1000 calls with an {cap >> 20} MiB cap"
    finally:
        running.close()


def test_over_the_cap_sessions_spill_to_a_file_or_are_counted(qwen3_tokenizer, tmp_path):
    spill = tmp_path / "serve-run" / "evicted.jsonl"  # its folder is made on the first eviction
    recorder = Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3"), max_sessions=2, spill_path=spill)
    policy = _policy(qwen3_tokenizer, recorder=recorder)
    try:
        for name in ("a", "b", "c", "a"):
            policy.chat({"messages": USER}, name)
        assert recorder.sessions() == ["c", "a"] and recorder.evicted == 2 and recorder.evicted_unsaved == 0
        saved = [json.loads(line) for line in spill.read_text().splitlines()]
        assert [r["session"] for r in saved] == ["a", "b"]
    finally:
        policy.client.close()
    lost = Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3"), max_sessions=1)
    lost.session("x")
    lost.session("y")
    assert lost.evicted == 1 and lost.evicted_unsaved == 1


def test_agentrl_serve_without_record_spills_evicted_sessions_into_a_run_folder():
    from agentrl.recipes.serve import evicted_path

    path = evicted_path()
    assert path.parts[0] == "runs" and path.parent.name.startswith("serve-") and path.suffix == ".jsonl"


def test_a_session_over_its_call_cap_is_refused(qwen3_tokenizer):
    recorder = Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3"), max_calls_per_session=3)
    running = _serve(qwen3_tokenizer, recorder=recorder)
    try:
        client = openai.OpenAI(base_url=session_url(running.address, "long"), api_key="unused", max_retries=0)
        for _ in range(3):
            client.chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=USER)
        assert err.value.body["code"] == "session_full"
    finally:
        running.close()


def test_call_300_costs_no_more_matching_work_than_call_10(qwen3_tokenizer, monkeypatch):
    """A session of 300 calls, each a fresh conversation of the same size (a sub-agent's calls): the work to match a
    call against the session's history must not grow with that history."""
    keys = {"n": 0}
    real_key = sessions._reply_key

    def counted_key(*args):
        keys["n"] += 1
        return real_key(*args)

    monkeypatch.setattr(sessions, "_reply_key", counted_key)
    recorder = Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3"))
    policy = _policy(qwen3_tokenizer, recorder=recorder, context=16384)
    cost = {}
    try:
        for i in range(1, 301):
            keys["n"] = 0
            before = dict(recorder.work)
            messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": f"Task {i:03d}."}]
            policy.chat({"messages": messages}, "sub-agents")
            work = {k: v - before.get(k, 0) for k, v in recorder.work.items()}
            cost[i] = (keys["n"], work.get("prefix_lookups", 0), work.get("compared_chars", 0),
                       work.get("encoded_chars", 0))
        # Replies restored: one key per record made (old code: one per earlier record, every call).
        assert cost[300][0] <= cost[10][0] + 1
        for a, b in zip(cost[300][1:], cost[10][1:]):
            assert a <= b + 8, (cost[10], cost[300])
        # A growing conversation: each call extends the last; only the new tail is tokenized.
        messages = [{"role": "user", "content": "Start."}]
        for i in range(300):
            before = dict(recorder.work)
            reply = policy.chat({"messages": messages}, "chain")[1][0].record
            messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": f"Go {i}."}]
            assert reply.drift in ("first", "extends")
            if i in (10, 299):
                work = {k: v - before.get(k, 0) for k, v in recorder.work.items()}
                cost[("chain", i)] = work
                # Linear in the new call: its prompt hashed once, one earlier record compared.
                assert work["hashed_bytes"] <= len(reply.prompt_text.encode())
                assert work["compared_chars"] <= len(reply.prompt_text)
        assert cost[("chain", 299)]["encoded_chars"] <= cost[("chain", 10)]["encoded_chars"] + 8
    finally:
        policy.client.close()
