"""Judged rewards (issue 44, item 4): a scripted judge endpoint, its failures counted and retried, cache, budget,
weights and gates on hand-worked numbers, and judged rewards through the real rollout loop and scheduler.

The judge here is a real HTTP server on 127.0.0.1 (stdlib `http.server` in a thread) answering OpenAI chat
completions as each test scripts: scores, a hang past the client's timeout, garbage, HTTP errors. "Unreachable" is a
port that was just closed. Nothing leaves the machine.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentrl.config import ConfigError, JudgeConfig, RewardConfig, RunConfig, build_config
from agentrl.engine.base import Generation, SamplingParams
from agentrl.engine.requests import BatchedRequests
from agentrl.envs.core import TextEnv
from agentrl.records import Trajectory, Turn, load_trajectories, save_trajectories
from agentrl.rewards.combine import combine, passes_gate
from agentrl.rewards.judge import (
    DEFAULT_RUBRIC,
    JUDGE_CACHE,
    JudgeBudgetSpent,
    JudgeFailure,
    JudgeReward,
    parse_score,
    render_prompt,
    rubric_and_key,
)
from agentrl.rollout.loop import run_rollout
from agentrl.rollout.pool import EnvMaker, LocalPool
from agentrl.rollout.scheduler import RolloutScheduler

# -- a scripted judge endpoint ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hang:
    """Answer nothing for this long (past the client's timeout)."""

    seconds: float


@dataclass(frozen=True)
class Status:
    """Answer this HTTP status."""

    code: int


@dataclass(frozen=True)
class Raw:
    """Answer this body with status 200 (not an OpenAI chat completion)."""

    text: str


Reply = str | Hang | Status | Raw


class ScriptedJudge:
    """An OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 whose replies `answer(prompt, call_number)` picks.

    A str reply becomes a chat completion whose content it is, with ``usage.total_tokens`` = 100.
    """

    def __init__(self, answer: Callable[[str, int], Reply]):
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge._lock:
                    judge.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                    n = len(judge.requests)
                if self.path != "/v1/chat/completions":
                    return self._send(404, b'{"error": "no such route"}')
                reply = judge.answer(body["messages"][0]["content"], n)
                if isinstance(reply, Hang):
                    time.sleep(reply.seconds)
                    return self._send(200, b"{}")
                if isinstance(reply, Status):
                    return self._send(reply.code, b'{"error": "scripted"}')
                if isinstance(reply, Raw):
                    return self._send(200, reply.text.encode())
                payload = {"id": f"c{n}", "object": "chat.completion", "model": body["model"],
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100}}
                self._send(200, json.dumps(payload).encode())

            def _send(self, code: int, data: bytes) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    servers: list[ScriptedJudge] = []

    def start(answer: Callable[[str, int], Reply]) -> ScriptedJudge:
        servers.append(ScriptedJudge(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (the port was bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def make_judge(url: str, *, cache=None, sleeps: list[float] | None = None, weights: dict[str, Any] | None = None,
               rubric: str = DEFAULT_RUBRIC, **judge_kwargs: Any) -> JudgeReward:
    settings = dict(endpoint=url, model="judge-model", retries=2, backoff=0.05, timeout=5.0) | judge_kwargs
    return JudgeReward(RewardConfig(judge=JudgeConfig(**settings), **(weights or {})), rubric, cache,
                       sleep=sleeps.append if sleeps is not None else time.sleep)


def episode(seed: int = 0, action: str = "hello", rule: float = 1.0) -> Trajectory:
    turn = Turn((1, 2), (3,), (-0.1,), action, "the env's answer", rule)
    return Trajectory("t", seed, 0, (turn,), f"task {seed}", rule, True, True, False)


def score_of(line: str) -> Callable[[str, int], Reply]:
    return lambda prompt, n: f"The agent did fine.\n{line}"


# -- parsing and rendering ----------------------------------------------------------------------------------------


def test_the_score_line_is_parsed_strictly_and_mapped_to_the_unit_interval():
    assert parse_score("Reasoning...\nSCORE: 7", (0, 10)) == pytest.approx(0.7)
    assert parse_score("ok\n**Score:** 4.5\n", (1, 5)) == pytest.approx(0.875)
    assert parse_score("score = 10", (0, 10)) == 1.0
    assert parse_score("ok\r\nSCORE: 7\r\n", (0, 10)) == pytest.approx(0.7)  # CRLF line ends (found in review)
    for bad in ("no score here", "SCORE: 7\nSCORE: 8", "SCORE: 11", "SCORE: -1", "SCORE: seven", "The score: 7 of 10",
                "SCORE: nan", ""):
        with pytest.raises(JudgeFailure) as e:
            parse_score(bad, (0, 10))
        assert e.value.kind == "unparsable", bad


def test_the_rubric_gets_task_transcript_rule_reward_and_scale_and_leaves_other_braces():
    traj = Trajectory("t", 3, 0, (Turn((1,), (2,), (-0.1,), "go north", "you see a door", 0.0),
                                  Turn((1,), (2,), (-0.1,), "open door", "solved", 1.0)),
                      "find the exit", 1.0, True, True, False)
    prompt = render_prompt('T={task}\n{transcript}\nR={rule_reward} [{scale_min},{scale_max}] {"score": n} {other}',
                           traj, (0.0, 10.0))
    assert prompt == ('T=find the exit\n[turn 1] agent: go north\n[turn 1] environment: you see a door\n'
                      '[turn 2] agent: open door\n[turn 2] environment: solved\nR=1 [0,10] {"score": n} {other}')


# -- weights and gates on hand-worked numbers ------------------------------------------------------------------------


def test_weights_and_gate_compute_what_they_say():
    judged = JudgeConfig(endpoint="http://127.0.0.1:1/v1", model="m")
    cfg = RewardConfig(judged, rule_weight=0.5, judge_weight=2.0)
    assert combine(1.0, 0.7, cfg).reward == pytest.approx(0.5 * 1.0 + 2.0 * 0.7)  # 1.9
    assert combine(0.0, 0.25, cfg).reward == pytest.approx(0.5)
    gated = RewardConfig(judged, rule_weight=1.0, judge_weight=3.0, gate=1.0, below_gate=0.1)
    assert passes_gate(1.0, gated) and passes_gate(2.0, gated) and not passes_gate(0.99, gated)
    below = combine(0.5, None, gated)
    assert (below.reward, below.rule, below.judge) == (pytest.approx(0.5 + 3.0 * 0.1), 0.5, None)  # 0.8
    assert combine(1.0, 0.4, gated).reward == pytest.approx(1.0 + 1.2)
    with pytest.raises(ValueError, match="needs a judged score"):  # a score never obtained is never a number
        combine(1.0, None, gated)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        combine(1.0, 1.5, cfg)


# -- the scripted endpoint: scores, cache, failures, budget ----------------------------------------------------------


def test_a_scored_episode_asks_once_and_the_cache_answers_the_same_question(scripted, tmp_path):
    server = scripted(score_of("SCORE: 8"))
    judge = make_judge(server.url, cache=tmp_path / JUDGE_CACHE, temperature=0.0, max_reply_tokens=64)
    assert judge.submit(episode(0)).result(timeout=10) == pytest.approx(0.8)
    assert judge.submit(episode(0)).result(timeout=10) == pytest.approx(0.8)  # same rubric, same episode text
    assert server.calls == 1
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] is None
    assert request["body"]["model"] == "judge-model" and request["body"]["max_tokens"] == 64
    assert "[turn 1] agent: hello" in request["body"]["messages"][0]["content"]
    assert judge.submit(episode(0, action="other")).result(timeout=10) == pytest.approx(0.8)  # new text: new call
    assert server.calls == 2
    counts = judge.counts()
    assert (counts.episodes, counts.calls, counts.cache_hits, counts.tokens, counts.failed_calls) == (3, 2, 1, 200, 0)
    judge.close()

    # A resume reads the scores it paid for: no call; and a changed rubric is another question.
    again = make_judge(server.url, cache=tmp_path / JUDGE_CACHE, max_reply_tokens=64)
    assert again.submit(episode(0)).result(timeout=10) == pytest.approx(0.8)
    assert server.calls == 2 and again.counts().cache_hits == 1 and again.counts().calls == 0
    other = make_judge(server.url, cache=tmp_path / JUDGE_CACHE, max_reply_tokens=64,
                       rubric="Rate it.\n{transcript}\nSCORE: <0-10>")
    other.submit(episode(0)).result(timeout=10)
    assert server.calls == 3
    again.close()
    other.close()


def test_identical_episodes_judged_at_once_share_one_call(scripted):
    release = threading.Event()  # the endpoint answers only once every episode was submitted
    server = scripted(lambda prompt, n: (release.wait(30), "SCORE: 5")[1])
    judge = make_judge(server.url, concurrency=4)
    futures = [judge.submit(episode(1)) for _ in range(4)]
    assert not any(f.done() for f in futures) and all(f is futures[0] for f in futures)  # one call, in flight
    release.set()
    assert [f.result(timeout=10) for f in futures] == [0.5] * 4
    assert server.calls == 1 and judge.counts().cache_hits == 3
    judge.close()


def test_the_judge_needs_no_package_beyond_the_base_install(scripted, monkeypatch):
    """httpx is a dev dependency only: the judge's client is the standard library's."""
    monkeypatch.setitem(sys.modules, "httpx", None)  # `import httpx` raises ImportError
    server = scripted(score_of("SCORE: 8"))
    judge = make_judge(server.url)
    assert judge.submit(episode(0)).result(timeout=10) == pytest.approx(0.8)
    assert judge.counts().tokens == 100  # the endpoint's usage
    judge.close()


def test_a_usage_count_that_is_not_a_number_is_no_count(scripted):
    body = '{"choices": [{"message": {"content": "SCORE: 4"}}], "usage": {"total_tokens": NaN}}'
    server = scripted(lambda prompt, n: Raw(body))
    judge = make_judge(server.url)
    assert judge.submit(episode(0)).result(timeout=10) == pytest.approx(0.4)
    prompt = server.requests[0]["body"]["messages"][0]["content"]
    assert judge.counts().tokens == (len(prompt) + len("SCORE: 4")) // 4  # characters / 4, as without usage
    judge.close()


def test_any_other_error_in_a_call_is_a_counted_failure_and_drops_only_its_group(scripted, qwen3_tokenizer, caplog,
                                                                                tmp_path):
    server = scripted(by_task)
    judge = make_judge(server.url, cache=tmp_path / JUDGE_CACHE, retries=2, backoff=0.01)
    post = judge._post

    def broken_for_task_12(prompt: str):
        if "task 12" in prompt:
            raise ValueError("Invalid IPv6 URL")  # as urllib says of a URL it cannot read
        return post(prompt)

    judge._post = broken_for_task_12
    with caplog.at_level(logging.WARNING, logger="agentrl.rewards.judge"):
        result = run_rollout(LocalPool(_maker(), slots=6), "task", [10, 11, 12], 2, BatchedRequests(
            HelloEngine(qwen3_tokenizer)), qwen3_tokenizer, SamplingParams(temperature=0), max_turns=1, judge=judge)
    assert [t.group_id for t in result.trajectories] == [0, 0, 1, 1]
    assert result.stats.judge_failures == 1 and result.stats.dropped_groups == 1
    assert result.stats.failures[-1].startswith("judge_error (group 2, seed 12") and "Invalid IPv6" in \
        result.stats.failures[-1]
    counts = judge.counts()
    assert counts.retries == 0 and counts.failed_calls >= 1  # not retried: it would fail alike
    record = next(r for r in caplog.records if "judge call failed (error" in r.getMessage())
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)  # logged with its traceback
    lines = [json.loads(line) for line in (tmp_path / JUDGE_CACHE).read_text().splitlines()]
    assert [line.get("failed") for line in lines].count("error") == counts.failed_calls
    judge.close()


def test_a_closed_judge_fails_calls_cleanly(scripted):
    release = threading.Event()
    server = scripted(lambda prompt, n: (release.wait(30), "SCORE: 5")[1])
    judge = make_judge(server.url, concurrency=1)
    running, queued = judge.submit(episode(0)), judge.submit(episode(1))
    deadline = time.monotonic() + 10
    while server.calls < 1 and time.monotonic() < deadline:  # the first call reached the endpoint: in flight
        time.sleep(0.01)
    judge.close()
    judge.close()  # idempotent
    after = judge.submit(episode(2))  # the pool takes no more calls: a failed future, not the pool's RuntimeError
    release.set()
    assert running.result(timeout=10) == 0.5  # the call in flight ends
    for future in (queued, after):
        with pytest.raises(JudgeFailure, match="closed") as e:
            future.result(timeout=10)
        assert e.value.kind == "closed"
    assert server.calls == 1 and judge.counts().failed_calls == 0


@pytest.mark.parametrize("kind, answer, url", [
    ("timeout", lambda p, n: Hang(3.0), None),
    ("unparsable", score_of("I would rate this highly."), None),
    ("bad_response", lambda p, n: Raw("<html>proxy error</html>"), None),
    ("http_503", lambda p, n: Status(503), None),
    ("unreachable", None, "closed"),
])
def test_a_failing_judge_is_retried_with_backoff_then_counted_and_never_scored(scripted, tmp_path, kind, answer, url):
    server = scripted(answer) if answer is not None else None
    sleeps: list[float] = []
    judge = make_judge(server.url if server else closed_port_url(), cache=tmp_path / JUDGE_CACHE, sleeps=sleeps,
                       timeout=0.4, retries=2, backoff=0.05)
    future = judge.submit(episode(0))
    with pytest.raises(JudgeFailure) as e:
        future.result(timeout=20)
    assert e.value.kind == kind and "attempt 3 of 3" in str(e.value)
    assert sleeps == [0.05, 0.1]  # backoff doubles
    if server is not None:
        assert server.calls == 3
    counts = judge.counts()
    assert (counts.calls, counts.retries, counts.failed_calls, counts.over_budget) == (3, 2, 3, 0)
    lines = [json.loads(line) for line in (tmp_path / JUDGE_CACHE).read_text().splitlines()]
    assert [line.get("failed") for line in lines] == [kind] * 3 and all("score" not in line for line in lines)
    judge.close()


def test_a_judge_that_heals_within_the_retries_gives_its_score(scripted):
    server = scripted(lambda prompt, n: "no verdict, sorry" if n == 1 else "SCORE: 9")
    judge = make_judge(server.url, sleeps=[])
    assert judge.submit(episode(0)).result(timeout=10) == pytest.approx(0.9)
    assert server.calls == 2 and judge.counts().retries == 1 and judge.counts().failed_calls == 1
    judge.close()


def test_an_http_error_that_will_not_heal_is_not_retried(scripted):
    server = scripted(lambda prompt, n: Status(401))
    judge = make_judge(server.url, sleeps=[])
    with pytest.raises(JudgeFailure, match="HTTP 401") as e:
        judge.submit(episode(0)).result(timeout=10)
    assert e.value.kind == "http_401" and server.calls == 1
    judge.close()


def test_the_call_budget_stops_calls_and_counts_and_a_resume_continues_it(scripted, tmp_path):
    server = scripted(score_of("SCORE: 6"))
    judge = make_judge(server.url, cache=tmp_path / JUDGE_CACHE, budget_calls=2)
    assert judge.submit(episode(0)).result(timeout=10) == pytest.approx(0.6)
    assert judge.submit(episode(1)).result(timeout=10) == pytest.approx(0.6)
    with pytest.raises(JudgeFailure, match="budget of 2 calls") as e:
        judge.submit(episode(2)).result(timeout=10)
    assert e.value.kind == "over_budget" and server.calls == 2
    assert judge.submit(episode(1)).result(timeout=10) == pytest.approx(0.6)  # cached: free, even past the budget
    assert judge.counts().over_budget == 1 and judge.counts().calls == 2
    judge.close()
    resumed = make_judge(server.url, cache=tmp_path / JUDGE_CACHE, budget_calls=2)
    with pytest.raises(JudgeFailure, match="budget"):
        resumed.submit(episode(3)).result(timeout=10)
    assert server.calls == 2
    resumed.close()


def test_the_token_budget_stops_calls_once_spent(scripted):
    server = scripted(score_of("SCORE: 6"))  # 100 tokens a call, as the endpoint's usage says
    judge = make_judge(server.url, budget_tokens=150)
    judge.submit(episode(0)).result(timeout=10)
    judge.submit(episode(1)).result(timeout=10)  # 100 < 150 when it starts
    with pytest.raises(JudgeFailure, match="150 tokens is spent"):
        judge.submit(episode(2)).result(timeout=10)
    assert server.calls == 2 and judge.counts().tokens == 200
    judge.close()


def test_a_truncated_last_cache_line_is_skipped(scripted, tmp_path):
    server = scripted(score_of("SCORE: 3"))
    judge = make_judge(server.url, cache=tmp_path / JUDGE_CACHE)
    judge.submit(episode(0)).result(timeout=10)
    judge.close()
    with open(tmp_path / JUDGE_CACHE, "a") as f:
        f.write('{"key": "abc", "sco')
    again = make_judge(server.url, cache=tmp_path / JUDGE_CACHE)
    assert again.submit(episode(0)).result(timeout=10) == pytest.approx(0.3) and server.calls == 1
    # Found in review: the half line stayed, the next append continued it, and the resume after that refused the
    # whole file. The half line is dropped; a new call appends a line of its own and a third process reads both.
    assert again.submit(episode(1)).result(timeout=10) == pytest.approx(0.3) and server.calls == 2
    again.close()
    third = make_judge(server.url, cache=tmp_path / JUDGE_CACHE)
    assert [third.submit(episode(s)).result(timeout=10) for s in (0, 1)] == [pytest.approx(0.3)] * 2
    assert server.calls == 2 and third.counts().cache_hits == 2
    third.close()
    (tmp_path / JUDGE_CACHE).write_text('["a list"]\n')  # JSON, but not an entry: one line, not a traceback
    with pytest.raises(ConfigError, match="not a judge cache line"):
        make_judge(server.url, cache=tmp_path / JUDGE_CACHE)


def test_a_reply_without_text_still_spends_its_tokens(scripted):
    # Found in review: a reasoning judge that spends max_tokens thinking returns null content; its usage went
    # uncounted, so budget_tokens never stopped a judge that failed this way.
    body = '{"choices": [{"message": {"content": null}, "finish_reason": "length"}], "usage": {"total_tokens": 600}}'
    server = scripted(lambda prompt, n: Raw(body))
    judge = make_judge(server.url, retries=0, budget_tokens=1000)
    for seed in (0, 1):
        with pytest.raises(JudgeFailure, match="not text"):
            judge.submit(episode(seed)).result(timeout=10)
    with pytest.raises(JudgeFailure, match="1000 tokens is spent"):
        judge.submit(episode(2)).result(timeout=10)
    assert server.calls == 2 and judge.counts().tokens == 1200
    judge.close()


def test_a_reply_cut_at_its_token_limit_is_not_parsed(scripted):
    # Its last line is not the score it was asked to end with; a score line quoted from the episode earlier in it
    # (an agent writing "SCORE: 10" into its actions) must not count.
    body = json.dumps({"choices": [{"message": {"content": "The agent wrote\nSCORE: 10\nwhich is"},
                                    "finish_reason": "length"}]})
    server = scripted(lambda prompt, n: Raw(body))
    judge = make_judge(server.url, retries=0)
    with pytest.raises(JudgeFailure, match="cut at reward.judge.max_reply_tokens"):
        judge.submit(episode(0)).result(timeout=10)
    judge.close()


def test_the_api_key_comes_from_the_named_variable(scripted, monkeypatch):
    server = scripted(score_of("SCORE: 1"))
    cfg = RewardConfig(judge=JudgeConfig(endpoint=server.url, model="m", api_key_env="JUDGE_TEST_KEY"))
    with pytest.raises(ConfigError, match="JUDGE_TEST_KEY, which is not set"):
        JudgeReward.from_config(cfg, None)
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    judge = JudgeReward.from_config(cfg, None)
    judge.submit(episode(0)).result(timeout=10)
    assert server.requests[0]["auth"] == "Bearer sk-test"
    judge.close()
    assert JudgeReward.from_config(RewardConfig(), None) is None


def test_agentrl_serve_is_a_judge_endpoint(qwen3_tokenizer, monkeypatch):
    """This project's own OpenAI-compatible server (`agentrl serve`'s app) answers the judge, token included."""
    from agentrl.engine.base import EngineResult
    from agentrl.serve.engine_client import EngineClient
    from agentrl.serve.server import PolicyServer, start_server
    from agentrl.serve.sessions import Recorder, Renderer

    class Replies:
        """Answers each request with the next scripted text (a stand-in for the served model)."""

        def __init__(self, replies: list[str]):
            self.replies, self.pending, self.policy_version, self.prompts = list(replies), [], 0, []

        def submit(self, request):
            self.pending.append(request)

        def poll(self, timeout=None):
            out = []
            for req in self.pending:
                self.prompts.append(qwen3_tokenizer.decode(req.prompt))
                ids = tuple(qwen3_tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"])
                out.append(EngineResult(req.id, Generation(ids, (-0.5,) * len(ids), "stop"), 0))
            self.pending = []
            return out

        def metrics(self):
            return {}

        def close(self):
            pass

    engine = Replies(["Good work.\nSCORE: 7", "Hmm, hard to say.", "Second look.\nSCORE: 4"])
    policy = PolicyServer(EngineClient(engine), Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3")), "judge",
                          defaults=SamplingParams(max_new_tokens=32), max_context_tokens=2048)
    running = start_server(policy, token="serve-token")
    monkeypatch.setenv("JUDGE_SERVE_TOKEN", "serve-token")
    try:
        judge = JudgeReward.from_config(RewardConfig(judge=JudgeConfig(
            endpoint=running.url, model="judge", max_reply_tokens=32, retries=1, backoff=0.01,
            api_key_env="JUDGE_SERVE_TOKEN")), None)
        assert judge.submit(episode(0)).result(timeout=60) == pytest.approx(0.7)
        assert judge.submit(episode(1)).result(timeout=60) == pytest.approx(0.4)  # the reply without one is retried
        counts = judge.counts()
        assert (counts.calls, counts.retries, counts.failed_calls) == (3, 1, 1) and counts.tokens > 0
        assert "[turn 1] agent: hello" in engine.prompts[0] and "task 1" in engine.prompts[1]
        judge.close()
    finally:
        running.close()


# -- the config section ------------------------------------------------------------------------------------------


def test_the_reward_section_is_typed_and_checked_with_the_field_and_the_fix(tmp_path):
    cfg = build_config(RunConfig, {"reward.judge.endpoint": "http://127.0.0.1:8000/v1", "reward.judge.model": "m",
                                   "reward.judge.scale": [1, 5], "reward.gate": 1})
    assert cfg.reward.judge.scale == (1.0, 5.0) and cfg.reward.gate == 1.0
    for good in ("http://[::1]:8000/v1", "https://api.example.com/v1/", "http://localhost"):
        assert JudgeConfig(endpoint=good, model="m").endpoint == good
    bad = [
        ({"reward.judge.endpoint": "127.0.0.1:8000"}, r"reward.judge.endpoint must be an http:// or https://"),
        ({"reward.judge.endpoint": "ftp://127.0.0.1/v1"}, r"reward.judge.endpoint must be an http:// or https://"),
        ({"reward.judge.endpoint": "http://[::1:8000/v1"}, r"must be an http:// or https:// .*\(Invalid IPv6 URL\)"),
        ({"reward.judge.endpoint": "http://127.0.0.1:port/v1"}, r"must be an http:// .*\(Port could not be cast"),
        ({"reward.judge.endpoint": "http://127.0.0.1:70000/v1"}, r"must be an http:// .*\(Port out of range"),
        ({"reward.judge.endpoint": "http://127.0.0.1:0/v1"}, r"must be a URL with a port from 1 to 65535"),
        ({"reward.judge.endpoint": "http:///v1"}, r"reward.judge.endpoint must be a URL with a host"),
        ({"reward.judge.endpoint": "http://127.0.0.1:8000/v1/chat/completions"},
         r"reward.judge.endpoint must be the base URL, without /chat/completions \(which is appended\), "
         r"e.g. http://127.0.0.1:8000/v1, got"),
        ({"reward.judge.endpoint": "http://127.0.0.1:8000/v1?x=1"}, r"must be a base URL without \?query or #frag"),
        ({"reward.judge.endpoint": "http://127.0.0.1:8000/v1#top"}, r"must be a base URL without \?query or #frag"),
        ({"reward.judge.endpoint": "http://me:sk-secret@127.0.0.1/v1"},
         r"must be a URL without user:password@ .*api_key_env\), got '<the URL, credentials not repeated here>'"),
        ({"reward.judge.model": ""}, r"reward.judge.model must be the model name"),
        ({"reward.judge.endpoint": ""}, r"reward.judge.endpoint must be set"),
        ({"reward.judge.rubric": "Rate {transcrpt}"}, r"reward.judge.rubric must be a template whose placeholders"),
        ({"reward.judge.rubric": "Rate {task}"}, r"reward.judge.rubric must be a template that holds \{transcript\}"),
        ({"reward.judge.scale": [10, 0]}, r"reward.judge.scale must be two finite numbers, lowest first"),
        ({"reward.judge.timeout": 0}, r"reward.judge.timeout must be > 0"),
        ({"reward.judge.budget_calls": -1}, r"reward.judge.budget_calls must be >= 0"),
        ({"reward.rule_weight": -1.0}, r"reward.rule_weight must be a finite number >= 0"),
        ({"reward.rule_weight": 0.0, "reward.judge_weight": 0.0}, r"reward.judge_weight must be > 0 when"),
        ({"reward.below_gate": 2.0}, r"reward.below_gate must be in \[0, 1\]"),
        ({"agent.function": "m:f"}, r"reward.judge.endpoint must be empty with --agent"),
        ({"advantage.estimator": "gigpo"}, r"reward.judge.endpoint must be empty with advantage.estimator gigpo"),
    ]
    judged = {"reward.judge.endpoint": "http://x/v1", "reward.judge.model": "m"}
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            build_config(RunConfig, judged | overrides)
    with pytest.raises(ConfigError, match=r"reward.judge.endpoint must be set when reward.rule_weight, judge_weight"):
        build_config(RunConfig, {"reward.gate": 1})
    missing = JudgeConfig(endpoint="http://x/v1", model="m", rubric_file=str(tmp_path / "nope.txt"))
    with pytest.raises(ConfigError, match="reward.judge.rubric_file: cannot read"):
        rubric_and_key(missing)
    (tmp_path / "rubric.txt").write_text("Score {task} only")
    with pytest.raises(ConfigError, match=r"reward.judge.rubric_file must be a template that holds \{transcript\}"):
        rubric_and_key(JudgeConfig(endpoint="http://x/v1", model="m", rubric_file=str(tmp_path / "rubric.txt")))


# -- through the rollout loop and the scheduler ---------------------------------------------------------------------


class TaskEnv(TextEnv):
    """One turn: the rule reward is 1 for even seeds, 0 for odd ones."""

    system_prompt = "Answer the task."

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.seed = int(seed or 0)
        return f"task {self.seed}: greet", {}

    def step(self, action: str):
        reward = float(self.seed % 2 == 0)
        return "thanks", reward, True, False, {"success": reward > 0}

    def expert_action(self) -> str:
        return "hello"


class HelloEngine:
    """Always replies ``hello``."""

    def __init__(self, tokenizer):
        self.ids = tuple(tokenizer("hello", add_special_tokens=False)["input_ids"])
        self.ids += (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
        self.policy_version = 0

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        return [Generation(self.ids, tuple(-0.5 for _ in self.ids), "stop") for _ in prompts]

    def update_weights(self, named_tensors, version: int) -> None:
        self.policy_version = version

    def metrics(self) -> dict[str, float]:
        return {}

    def clear_cache(self) -> None:
        pass


def by_task(prompt: str, n: int) -> Reply:
    """Task 10 scores 8, task 11 scores 2, task 12 gets a reply without a score."""
    for task, reply in (("task 10", "SCORE: 8"), ("task 11", "SCORE: 2"), ("task 12", "Looks good to me.")):
        if task in prompt:
            return f"Reasoning.\n{reply}"
    return "SCORE: 0"


def _maker() -> EnvMaker:
    return EnvMaker("task", {}, entry_point=TaskEnv)


def test_run_rollout_records_judged_rewards_and_drops_the_group_it_could_not_judge(scripted, qwen3_tokenizer,
                                                                                   tmp_path):
    server = scripted(by_task)
    judge = make_judge(server.url, retries=1, backoff=0.01,
                       weights=dict(rule_weight=0.5, judge_weight=2.0))
    result = run_rollout(LocalPool(_maker(), slots=6), "task", [10, 11, 12], 2, BatchedRequests(
        HelloEngine(qwen3_tokenizer)), qwen3_tokenizer, SamplingParams(temperature=0), max_turns=1, judge=judge)
    trajs = result.trajectories
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]  # group 2 (task 12) was never judged: dropped whole
    assert [t.judge_reward for t in trajs] == pytest.approx([0.8, 0.8, 0.2, 0.2])
    assert [t.rule_reward for t in trajs] == [1.0, 1.0, 0.0, 0.0]
    assert [t.total_return for t in trajs] == pytest.approx([0.5 + 1.6] * 2 + [0.4] * 2)
    stats = result.stats
    assert (stats.judge_failures, stats.dropped_groups, stats.episodes_done) == (1, 1, 6)
    assert stats.failures and stats.failures[-1].startswith("judge_unparsable (group 2, seed 12")
    metrics = stats.metrics()
    # One call per distinct episode text (the two episodes of a group are identical), two for the failing one.
    assert metrics["judge_calls"] == 4 and metrics["judge_retries"] == 1 and metrics["judge_failed_calls"] == 2
    assert metrics["judge_cache_hits"] == 3 and metrics["judge_failures"] == 1 and metrics["judge_episodes"] == 6
    save_trajectories(trajs, tmp_path / "t.jsonl")
    assert [t.judge_reward for t in load_trajectories(tmp_path / "t.jsonl")] == pytest.approx([0.8, 0.8, 0.2, 0.2])
    judge.close()


def test_the_gate_keeps_episodes_below_it_from_the_judge(scripted, qwen3_tokenizer):
    server = scripted(by_task)
    judge = make_judge(server.url, weights=dict(rule_weight=1.0, judge_weight=1.0, gate=1.0, below_gate=0.0))
    result = run_rollout(LocalPool(_maker(), slots=4), "task", [10, 11], 2, BatchedRequests(
        HelloEngine(qwen3_tokenizer)), qwen3_tokenizer, SamplingParams(temperature=0), max_turns=1, judge=judge)
    assert [(t.rule_reward, t.judge_reward, t.total_return) for t in result.trajectories] == [
        (1.0, pytest.approx(0.8), pytest.approx(1.8))] * 2 + [(0.0, None, 0.0)] * 2
    assert all("task 11" not in r["body"]["messages"][0]["content"] for r in server.requests)
    assert result.stats.metrics()["judge_gated"] == 2 and server.calls == 1
    judge.close()


def test_without_a_judge_the_rollout_records_and_reports_as_before(qwen3_tokenizer):
    result = run_rollout(LocalPool(_maker(), slots=4), "task", [10, 11], 2, BatchedRequests(
        HelloEngine(qwen3_tokenizer)), qwen3_tokenizer, SamplingParams(temperature=0), max_turns=1)
    assert [t.total_return for t in result.trajectories] == [1.0, 1.0, 0.0, 0.0]
    assert all(t.judge_reward is None and t.rule_reward is None for t in result.trajectories)
    assert not any(key.startswith("judge_") for key in result.stats.metrics())


def test_async_scheduler_steps_carry_judged_rewards_and_the_cache_spares_repeated_tasks(scripted, qwen3_tokenizer,
                                                                                        tmp_path):
    server = scripted(by_task)
    cfg = RewardConfig(judge=JudgeConfig(endpoint=server.url, model="judge-model"))
    judge = JudgeReward.from_config(cfg, tmp_path)
    engine = BatchedRequests(HelloEngine(qwen3_tokenizer))
    sched = RolloutScheduler(
        "task", {}, engine, lambda: [], qwen3_tokenizer, seeds_for_step=lambda s: [10, 11],
        sampling_for_step=lambda s: SamplingParams(temperature=0), group_size=2, rollout_kwargs={"max_turns": 1},
        maker=_maker(), async_rollout=True, max_staleness=1, stop_step=2, judge=judge)
    try:
        first = sched.rollout(0)
        sched.updated(0)
        second = sched.rollout(1)
    finally:
        sched.close()
    for result in (first, second):
        assert [t.judge_reward for t in result.trajectories] == pytest.approx([0.8, 0.8, 0.2, 0.2])
        assert [t.total_return for t in result.trajectories] == pytest.approx([1.8, 1.8, 0.2, 0.2])
    assert first.stats.metrics()["judge_calls"] == 2 and second.stats.metrics()["judge_calls"] == 0
    assert second.stats.metrics()["judge_cache_hits"] == 4 and server.calls == 2
    assert len((tmp_path / JUDGE_CACHE).read_text().splitlines()) == 2


def test_a_spent_budget_stops_the_run_with_the_setting_and_the_way_on(scripted, qwen3_tokenizer, monkeypatch,
                                                                       tmp_path):
    """Past the budget every group would drop: the rollout stops at the first episode past it, and the run with it."""
    server = scripted(by_task)
    judge = make_judge(server.url, budget_calls=1)
    with pytest.raises(JudgeBudgetSpent, match=r"budget of 1 calls is spent \(reward.judge.budget_calls\)") as e:
        run_rollout(LocalPool(_maker(), slots=4), "task", [10, 11], 2, BatchedRequests(
            HelloEngine(qwen3_tokenizer)), qwen3_tokenizer, SamplingParams(temperature=0), max_turns=1, judge=judge)
    judge.close()
    assert judge.counts().calls == 1 and judge.counts().over_budget == 1  # the other call may still be on its way
    assert "resume it with a larger budget (--reward.judge.budget-calls N" in str(e.value)

    # `agentrl run` turns it into its one-line stop, in lockstep (raised as is) and async mode (the producer wraps it).
    from types import SimpleNamespace

    import agentrl.recipes.train as recipe
    from agentrl.recipes.train import TrainingError, train

    spent = e.value
    run = SimpleNamespace(start_step=0, out=tmp_path, restarts=0, close=lambda keep_ray=False: None)
    monkeypatch.setattr(recipe, "_start", lambda *args, **kwargs: run)
    for raised in (spent, RuntimeError(f"the rollout producer failed: {spent}")):
        def step(run, step, *, say, show, raised=raised):
            if isinstance(raised, JudgeBudgetSpent):
                raise raised
            raise raised from spent

        monkeypatch.setattr(recipe, "train_step", step)
        with pytest.raises(TrainingError, match=r"reward.judge.budget_calls.*\(step 0\); no checkpoint was saved"):
            train(RunConfig(output=str(tmp_path)), progress=False)
