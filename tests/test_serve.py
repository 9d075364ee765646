"""`agentrl serve`: the official `openai` client against the server on tiny-qwen3; recording, masks and drift.

Two engines: the real HF engine on tiny-qwen3 (wrapped in a spy that keeps what it was given and what it sampled, to
check that the records are exactly that), and a scripted engine that answers given texts (a random tiny model never
writes a tool call or a think block, and the drift cases need replies of a known shape).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from agentrl.engine.base import EngineResult, Generation, SamplingParams  # noqa: E402
from agentrl.serve.engine_client import EngineClient  # noqa: E402
from agentrl.serve.server import PolicyServer, session_url, start_server  # noqa: E402
from agentrl.serve.sessions import Recorder, Renderer  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object",
                                                          "properties": {"expression": {"type": "string"}},
                                                          "required": ["expression"]}}}]


class Spy:
    """A real engine, with every request and result kept."""

    def __init__(self, engine):
        self.engine, self.requests, self.results = engine, {}, {}

    @property
    def policy_version(self):
        return self.engine.policy_version

    def submit(self, request):
        self.requests[request.id] = request
        self.engine.submit(request)

    def poll(self, timeout=None):
        out = self.engine.poll(timeout)
        for r in out:
            self.results[r.request_id] = r
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


class Scripted:
    """Answers each request with the next scripted text, tokenized, log-prob -0.5 a token (a test double)."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.pending, self.policy_version = tokenizer, list(replies), [], 0
        self.prompts = []

    def submit(self, request):
        self.pending.append(request)

    def poll(self, timeout=None):
        out = []
        for req in self.pending:
            self.prompts.append(req.prompt)
            ids = tuple(self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"])
            out.append(EngineResult(req.id, Generation(ids, (-0.5,) * len(ids), "stop"), self.policy_version))
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


def _serve(engine, tokenizer, **options):
    recorder = Recorder(Renderer(tokenizer, family_hint="qwen3", chat_kwargs=options.pop("chat_kwargs", None)))
    policy = PolicyServer(EngineClient(engine), recorder, "tiny-qwen3",
                          defaults=SamplingParams(max_new_tokens=12), max_context_tokens=options.pop("context", 2048),
                          **options)
    return start_server(policy)


@pytest.fixture(scope="module")
def real(tiny_qwen3):
    from agentrl.engine import EngineSpec, build_engines

    spy = Spy(build_engines(EngineSpec(kind="hf", batch_size=8), tiny_qwen3, share_module=True))
    running = _serve(spy, tiny_qwen3.tokenizer)
    yield running, spy
    running.close()


def _client(running, session):
    return openai.OpenAI(base_url=session_url(running.address, session), api_key="unused", max_retries=0)


def test_chat_logprobs_and_n_are_what_the_engine_sampled(real):
    running, spy = real
    reply = _client(running, "rec").chat.completions.create(
        model="tiny-qwen3", messages=[{"role": "user", "content": "What is 2+2?"}], logprobs=True, n=2, seed=3,
        max_tokens=7, temperature=0.8)
    assert len(reply.choices) == 2 and reply.usage.completion_tokens == 14
    records = running.server.recorder.session("rec").records
    assert [r.choice for r in records] == [0, 1]
    by_prompt = [(spy.requests[i].prompt, spy.results[i].generation) for i in spy.results
                 if spy.requests[i].prompt == records[0].prompt_ids]
    assert len(by_prompt) == 2
    for rec, choice in zip(records, reply.choices):
        sampled = next(g for p, g in by_prompt if g.token_ids == rec.generated_ids)
        assert rec.logprobs == sampled.logprobs
        assert [t.logprob for t in choice.logprobs.content] == list(sampled.logprobs)
        assert spy.requests[next(i for i in spy.results if spy.results[i].generation is sampled)].params.temperature \
            == 0.8
    assert records[0].prompt_text.endswith("<|im_start|>assistant\n")


def test_streaming_gives_the_same_message_as_the_records(real):
    running, _ = real
    stream = _client(running, "stream").chat.completions.create(
        model="tiny-qwen3", messages=[{"role": "user", "content": "Hi"}], stream=True,
        stream_options={"include_usage": True}, max_tokens=6)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert text == running.server.recorder.session("stream").records[0].content


def test_completions_endpoint_takes_text_or_ids(real):
    running, _ = real
    client = _client(running, "cmpl")
    out = client.completions.create(model="tiny-qwen3", prompt="Hello", max_tokens=4, logprobs=0)
    rec = running.server.recorder.session("cmpl").records[0]
    assert out.choices[0].logprobs.token_logprobs == list(rec.logprobs) and len(rec.generated_ids) == 4
    again = client.completions.create(model="tiny-qwen3", prompt=list(rec.prompt_ids + rec.generated_ids),
                                      max_tokens=3)
    assert again.usage.prompt_tokens == len(rec.prompt_ids) + 4
    assert running.server.recorder.session("cmpl").records[1].drift == "extends"


def test_weights_update_by_version(real, tiny_qwen3):
    running, _ = real
    client = _client(running, "versions")
    running.server.client.update_weights(list(tiny_qwen3.model.state_dict().items()), 3)
    try:
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        assert reply.system_fingerprint == "agentrl-v3"
        assert running.server.recorder.session("versions").records[0].policy_version == 3
    finally:
        running.server.client.update_weights(list(tiny_qwen3.model.state_dict().items()), 0)


@pytest.mark.parametrize("kwargs, param", [
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3, "logprobs": True}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 99}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "tools": TOOLS}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4096}, "max_tokens"),
])
def test_bad_requests_get_openai_error_bodies(real, kwargs, param):
    running, _ = real
    with pytest.raises(openai.BadRequestError) as err:
        _client(running, "bad").chat.completions.create(model="m", **kwargs)
    assert err.value.status_code == 400
    assert err.value.body["type"] == "invalid_request_error" and err.value.body["param"] == param
    assert "Traceback" not in err.value.body["message"]


def test_raw_bad_bodies_and_routes(real):
    running, _ = real
    bad_json = httpx.post(f"{running.url}/chat/completions", content=b"{not json",
                          headers={"Content-Type": "application/json"})
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    # A web page's "simple" POST (no CORS preflight) is not JSON: refused before the policy runs (found in review).
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        plain = httpx.post(f"{running.url}/chat/completions", headers={"Content-Type": kind} if kind else {},
                           content=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        assert plain.status_code == 415 and "Content-Type: application/json" in plain.json()["error"]["message"], kind
    missing = httpx.post(f"{running.url}/embeddings", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    long = httpx.post(f"{running.url}/chat/completions",
                      json={"messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 8})
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    assert httpx.get(f"{running.url}/models").json()["data"][0]["id"] == "tiny-qwen3"


def test_header_names_the_session(real):
    running, _ = real
    client = openai.OpenAI(base_url=running.url, api_key="unused", default_headers={"X-Session-Id": "by-header"})
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    report = httpx.get(f"{running.address}/agentrl/sessions/by-header").json()
    assert report["calls"] == 1 and report["records"] == 1


# ---- tool calls, thinking, history edits (scripted replies) -----------------------------------------------------

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call><|im_end|>'
THINK_CALL = '<think>\nadd them\n</think>\n\n' + CALL
ANSWER = "<think>\ndone\n</think>\n\nThe answer is 4.<|im_end|>"


def _tool_loop(client, tools=TOOLS, edit=None, follow_up="user"):
    """An agent as people write them: append the reply message, answer its call, ask again."""
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is 2+2?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=tools)
    message = first.choices[0].message
    messages.append(message)
    messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "4"})
    second = client.chat.completions.create(model="m", messages=messages, tools=tools)
    message = second.choices[0].message
    messages.append(message)
    if follow_up == "user":
        messages.append({"role": "user", "content": "Thanks. And 3+3?"})
    else:
        messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "6"})
    if edit is not None:
        messages = edit(messages)
    client.chat.completions.create(model="m", messages=messages, tools=tools)
    return first, second


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_reach_the_client_and_the_prefix_holds(qwen3_tokenizer, stream):
    engine = Scripted(qwen3_tokenizer, [THINK_CALL, CALL, ANSWER])
    running = _serve(engine, qwen3_tokenizer)
    try:
        client = _client(running, "tools")
        messages = [{"role": "user", "content": "What is 2+2?"}]
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
            deltas = [c.choices[0].delta for c in chunks]
            name = next(d.tool_calls[0].function.name for d in deltas if d.tool_calls)
            args = "".join(d.tool_calls[0].function.arguments or "" for d in deltas if d.tool_calls)
            assert name == "calc" and json.loads(args) == {"expression": "2+2"}
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
            return
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls[0].function.name == "calc"
        assert json.loads(choice.message.tool_calls[0].function.arguments) == {"expression": "2+2"}
        assert choice.message.reasoning_content == "add them"  # an extra field the official client keeps
        messages += [choice.message, {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id,
                                      "content": "4"}]
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        rec = running.server.recorder.session("tools").records
        assert rec[1].drift == "extends" and rec[1].parent == 0
        assert rec[1].prompt_ids[: len(rec[0].prompt_ids) + len(rec[0].generated_ids)] == \
            rec[0].prompt_ids + rec[0].generated_ids
    finally:
        running.close()


def _session(engine_replies, tokenizer, edit=None, chat_kwargs=None, follow_up="user"):
    engine = Scripted(tokenizer, engine_replies)
    running = _serve(engine, tokenizer, chat_kwargs=chat_kwargs)
    try:
        _tool_loop(_client(running, "s"), edit=edit, follow_up=follow_up)
        return running.server.recorder.session("s"), engine
    finally:
        running.close()


def test_masks_cover_exactly_the_sampled_tokens(qwen3_tokenizer):
    # Tool results only (no new user query): Qwen3 keeps the reasoning, every call extends the previous one.
    log, engine = _session([THINK_CALL, THINK_CALL, CALL], qwen3_tokenizer, follow_up="tool")
    report = log.report()
    assert report.extended == 2 and report.rerendered == 0 and report.restored == 1 + 2  # per call, summed
    samples = log.samples(advantage=1.0)
    assert len(samples) == 1
    (sample,) = samples
    sampled = [t for r in log.records for t in r.generated_ids]
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == sampled
    assert [lp for lp, m in zip(sample.rollout_logprobs, sample.loss_mask) if m] == [-0.5] * len(sampled)
    assert list(sample.input_ids[: len(engine.prompts[-1])]) == list(engine.prompts[-1])


def test_qwen3_dropping_think_is_split_and_explained(qwen3_tokenizer):
    # The third call follows a real user query: Qwen3's template drops the earlier <think> blocks.
    log, _ = _session([THINK_CALL, ANSWER, CALL], qwen3_tokenizer)
    report = log.report()
    assert report.extended == 1 and report.rerendered == 1
    assert report.by_kind == {"extends": 1, "template": 1}
    assert list(report.rules) and next(iter(report.rules)).startswith("qwen3:")
    assert "think" in report.details[0]
    samples = log.samples(advantage=1.0)
    assert len(samples) == 2
    assert sum(s.num_loss_tokens for s in samples) == sum(len(r.generated_ids) for r in log.records)


def test_thinking_off_drops_empty_think_blocks(qwen3_tokenizer):
    empty_call = "<think>\n\n</think>\n\n" + CALL
    log, _ = _session([empty_call, empty_call, empty_call], qwen3_tokenizer,
                      chat_kwargs={"enable_thinking": False})
    report = log.report()
    assert report.by_kind.get("template", 0) >= 1 and report.rules


def _drop_tool_result(messages):
    return [m for m in messages if not (isinstance(m, dict) and m.get("role") == "tool")]


def _rewrite_tool_result(messages):
    return [dict(m, content="four") if isinstance(m, dict) and m.get("role") == "tool" else m for m in messages]


@pytest.mark.parametrize("edit, words", [(_drop_tool_result, "dropped"), (_rewrite_tool_result, "rewritten")])
def test_agent_history_edits_split_and_are_reported(qwen3_tokenizer, edit, words):
    log, _ = _session([CALL, CALL, CALL], qwen3_tokenizer, edit=edit)
    report = log.report()
    assert report.by_kind == {"extends": 1, "agent_edit": 1}
    assert words in report.details[0] and "message 3 (tool)" in report.details[0]
    samples = log.samples(advantage=0.5)
    assert len(samples) == 2 and all(s.advantage == 0.5 for s in samples)
    assert sum(s.num_loss_tokens for s in samples) == sum(len(r.generated_ids) for r in log.records)


def test_cli_serves_the_official_client(tmp_path):
    record = tmp_path / "calls.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve", "--model", "tiny-qwen3", "--engine", "hf",
                             "--port", "0", "--max-tokens", "4", "--record", str(record)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        deadline = time.time() + 120
        while " at http" not in line and time.time() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        url = line.split(" at ", 1)[1].split(";", 1)[0]
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": "Hi"}])
        assert reply.usage.completion_tokens == 4
        saved = [json.loads(x) for x in record.read_text().splitlines()]
        assert len(saved) == 1 and len(saved[0]["generated_ids"]) == 4 and saved[0]["policy_version"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_n_choices_branch_and_the_chosen_one_merges(qwen3_tokenizer):
    engine = Scripted(qwen3_tokenizer, ["first.<|im_end|>", "second.<|im_end|>", "third.<|im_end|>"])
    running = _serve(engine, qwen3_tokenizer)
    try:
        client = _client(running, "n")
        messages = [{"role": "user", "content": "Pick one."}]
        reply = client.chat.completions.create(model="m", messages=messages, n=2)
        messages += [reply.choices[1].message, {"role": "user", "content": "Go on."}]
        client.chat.completions.create(model="m", messages=messages)
        log = running.server.recorder.session("n")
    finally:
        running.close()
    assert [r.parent for r in log.records] == [-1, -1, 1]
    assert log.report().by_kind == {"extends": 1}
    lengths = [len(r.generated_ids) for r in log.records]
    assert [s.num_loss_tokens for s in log.samples(advantage=1.0)] == [lengths[0], lengths[1] + lengths[2]]


def test_recorder_forgets_the_oldest_sessions(qwen3_tokenizer):
    recorder = Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3"), max_sessions=2)
    for name in ("a", "b", "c"):
        recorder.session(name)
    assert recorder.sessions() == ["b", "c"]


@pytest.mark.parametrize("args, says", [(["--model", "tiny-qwen3", "--port", "70000"], "port must be in 0..65535"),
                                        (["--model", "tiny-qwen", "--port", "0"], "Did you mean 'tiny-qwen3'")])
def test_serve_bad_input_is_one_line(args, says):
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "serve", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
