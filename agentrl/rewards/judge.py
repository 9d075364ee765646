"""Judged rewards: a judge model scores each finished episode through an OpenAI-compatible endpoint.

`JudgeReward` renders a rubric template with the episode's task (its first observation), its transcript (each turn's
action and the env's answer) and its rule reward, posts it to ``<endpoint>/chat/completions`` (any OpenAI-compatible
server: ``agentrl serve``, vLLM, a hosted API), and reads the score from the reply's one ``SCORE: <number>`` line. The
score, mapped from the rubric's scale to [0, 1], is combined with the rule reward by `agentrl.rewards.combine`.

What it guarantees:

* **A reward it did not get is never recorded.** A call that times out, cannot connect, gets an HTTP error, or
  answers without exactly one parsable score in the scale is retried (with backoff); after the retries the episode's
  score is a `JudgeFailure`, never 0, and so is any other error in a call (kind ``error``, logged with its traceback):
  no exception of a call ends the rollout. The rollout loop (`agentrl.rollout.loop`) then drops the episode's group
  and counts it (``judge_failures``), as it does for an env that keeps failing.
* **One call per distinct question.** The cache key is the model, its sampling settings, the scale and the rendered
  prompt (so: the same rubric and the same episode text); an identical episode judged while the first call is still
  in flight waits for that call. Every call is appended to ``judge_cache.jsonl`` in the run folder (its tokens, and
  the score and reply when it succeeded), so a resumed run reads the scores it already paid for, and its spent budget.
* **A bounded bill.** ``budget_calls`` and ``budget_tokens`` cap the run's calls (retries included) and tokens; a call
  past them is not made and counts as a failure (``judge_over_budget``). Past the budget every episode the judge has
  not scored yet would drop its group, so the rollout loop stops the run at the first one (`JudgeBudgetSpent`) rather
  than roll out steps (and refill rounds) for nothing.
* **The rollout never waits on one call.** Calls run on a thread pool (``concurrency``); the loop keeps stepping the
  other episodes and collects each verdict when it lands. Each call's connect and read phases time out after
  ``timeout`` seconds. The HTTP client is the standard library's (``urllib.request``: a base install has no other;
  proxies from the environment as usual, redirects not followed), one connection per call.

Departures from judge rewards elsewhere (verl's and SkyRL's reward-model hooks, ART's RULER): one episode per call
(RULER ranks a group together), and the strict score line instead of a JSON schema, which any chat model and any
OpenAI-compatible server can honour.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from agentrl.config import RUBRIC_FIELDS, ConfigError, JudgeConfig, RewardConfig, check_rubric
from agentrl.records import Trajectory
from agentrl.rewards.combine import CombinedReward, combine, passes_gate

__all__ = ["JudgeReward", "JudgeFailure", "JudgeBudgetSpent", "JudgeCounts", "JUDGE_CACHE", "DEFAULT_RUBRIC",
           "parse_score", "render_transcript", "render_prompt", "rubric_and_key"]

log = logging.getLogger(__name__)

JUDGE_CACHE = "judge_cache.jsonl"
"""The run folder's judge log: one JSON line per call made (tokens; score and reply when it succeeded)."""

DEFAULT_RUBRIC = """\
You are grading one episode of an AI agent working on a task in an environment.

The task, as the environment first stated it:
{task}

The episode, turn by turn (the agent's action, then the environment's answer):
{transcript}

The environment's own rule-based reward for this episode: {rule_reward}.

Judge how well the agent accomplished the task: correct and efficient actions that follow the task's instructions
score high; wrong, aimless, repeated or malformed actions score low. Write a short justification, then end your
reply with exactly one line of the form
SCORE: <number>
where <number> is between {scale_min} (worst) and {scale_max} (best)."""
"""The rubric used when ``reward.judge.rubric`` and ``rubric_file`` are both empty."""

# One line "SCORE: 7" (case-insensitive), markdown emphasis around it tolerated; nothing else on the line.
_SCORE_LINE = re.compile(r"^[ \t>*_#`]*score[ \t*_`]*[:=][ \t*_`]*([-+]?\d+(?:\.\d+)?)[ \t*_`.]*$",
                         re.IGNORECASE | re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{(" + "|".join(RUBRIC_FIELDS) + r")\}")
_RETRIED_STATUS = (408, 429)  # and every 5xx: the server may answer the same request later


class JudgeFailure(Exception):
    """The judge's score for an episode could not be obtained.

    Attributes:
        kind: ``timeout``, ``unreachable``, ``http_<status>``, ``bad_response`` (not an OpenAI chat completion),
            ``unparsable`` (no single score line in the scale), ``over_budget``, ``error`` (any other exception in
            the call: a bug or an unforeseen reply; the exception is its ``__cause__``) or ``closed`` (the judge was
            closed before the call started).
        retry: whether another call may succeed (False for over_budget, error, closed and for HTTP errors such as
            401 or 404).
    """

    def __init__(self, kind: str, message: str, retry: bool = True):
        super().__init__(message)
        self.kind, self.retry = kind, retry


class JudgeBudgetSpent(RuntimeError):
    """The run's judge budget is spent, so the run stops.

    Past the budget every episode the judge has not scored yet would drop its group: each step (each refill round
    too) would roll out its tasks for nothing. The rollout loop raises this at the first episode past the budget;
    ``agentrl run`` stops with its message, which names the setting and the way on (a resume with a larger budget);
    ``agentrl eval`` with its own (`failure`, and a rerun with a larger budget).

    Attributes:
        failure: the ``over_budget`` failure, whose message names the setting that was spent.
    """

    def __init__(self, failure: JudgeFailure):
        self.failure = failure
        super().__init__(f"{failure}: past it every episode the judge has not scored before would drop its group, so "
                         f"the run stops; resume it with a larger budget (--reward.judge.budget-calls N or "
                         f"--reward.judge.budget-tokens N on the resume command; 0 = no limit)")


@dataclass(frozen=True)
class JudgeCounts:
    """The judge's counters (cumulative over the run; subtract two to get a rollout's).

    Attributes:
        episodes: episodes that passed the gate and were asked for a score.
        gated: episodes below the gate, never sent.
        cache_hits: episodes answered from the cache, or by an identical call already in flight.
        calls: HTTP calls made (retries included).
        retries: calls that repeated a failed one.
        failed_calls: calls that failed (timeout, unreachable, HTTP error, a reply without a score).
        over_budget: calls not made because the run's budget was spent.
        tokens: tokens the calls used (the endpoint's ``usage``, else characters / 4).
        seconds: wall time of the calls, summed.
    """

    episodes: int = 0
    gated: int = 0
    cache_hits: int = 0
    calls: int = 0
    retries: int = 0
    failed_calls: int = 0
    over_budget: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def __sub__(self, other: JudgeCounts) -> JudgeCounts:
        return JudgeCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def metrics(self) -> dict[str, float]:
        """The counters as ``judge_<name>`` numbers for metrics.jsonl."""
        return {f"judge_{f.name}": float(getattr(self, f.name)) for f in fields(self)}


def parse_score(reply: str, scale: tuple[float, float]) -> float:
    """The score of a judge's reply, mapped from `scale` to [0, 1].

    Strict: the reply must hold exactly one line ``SCORE: <number>`` (markdown emphasis around it is tolerated) and
    the number must lie in the scale. Anything else is a failed reply, not a guess.

    Raises:
        JudgeFailure: kind ``unparsable``.
    """
    reply = reply.replace("\r\n", "\n").replace("\r", "\n")  # a CRLF reply: `$` matches only before "\n"
    found = _SCORE_LINE.findall(reply)
    excerpt = reply.strip()[-160:].replace("\n", " | ")
    if len(found) != 1:
        raise JudgeFailure("unparsable", f"{'no' if not found else len(found)} 'SCORE: <number>' line(s) in the "
                                         f"reply (...{excerpt!r})")
    low, high = scale
    score = float(found[0])
    if not (math.isfinite(score) and low <= score <= high):
        raise JudgeFailure("unparsable", f"score {found[0]} is outside the scale [{low:g}, {high:g}]")
    return (score - low) / (high - low)


def render_transcript(traj: Trajectory) -> str:
    """The episode as the judge reads it: each turn's action, then the env's answer."""
    lines = []
    for i, turn in enumerate(traj.turns, 1):
        lines += [f"[turn {i}] agent: {turn.action}", f"[turn {i}] environment: {turn.observation}"]
    return "\n".join(lines)


def render_prompt(template: str, traj: Trajectory, scale: tuple[float, float]) -> str:
    """The rubric `template` with its placeholders filled from `traj` (``{task}``, ``{transcript}``, ...).

    Only the placeholders of `agentrl.config.RUBRIC_FIELDS` are replaced; other braces stay as written.
    """
    values = {"task": traj.first_observation, "transcript": render_transcript(traj),
              "rule_reward": f"{traj.total_return:g}", "scale_min": f"{scale[0]:g}", "scale_max": f"{scale[1]:g}"}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


class JudgeReward:
    """Scores finished episodes with a judge model, for the rollout loop (`agentrl.rollout.loop.run_rollout`).

    `submit` returns at once with a future of the episode's score on [0, 1] (None: below the gate, not judged); the
    future raises `JudgeFailure` when the score could not be obtained. `reward` combines a score with the rule reward.
    Thread-safe: the async rollout producer and the trainer may read `counts` while calls are in flight.

    Args:
        cfg: the run's ``reward`` section: the judge's endpoint, model, retries, timeout and budget
            (``cfg.judge``), and the weights and gate that combine its score with the rule reward.
        rubric: the template (already checked by `agentrl.config.check_rubric`).
        cache_path: the on-disk cache (`JUDGE_CACHE` in the run folder); read when it exists, appended to on every
            call. None: in memory only.
        api_key: sent as a bearer token ("" : none).
        sleep: how backoff waits (tests replace it).
    """

    @classmethod
    def from_config(cls, cfg: RewardConfig, run_dir: str | Path | None) -> JudgeReward | None:
        """The judge the run's ``reward`` section asks for (None when no endpoint is set).

        Raises:
            ConfigError: an unreadable or malformed rubric file, or an API-key variable that is not set.
        """
        if not cfg.judge.enabled:
            return None
        rubric, api_key = rubric_and_key(cfg.judge)
        return cls(cfg, rubric, Path(run_dir) / JUDGE_CACHE if run_dir is not None else None, api_key=api_key)

    def __init__(self, cfg: RewardConfig, rubric: str, cache_path: Path | None = None, *, api_key: str = "",
                 sleep: Callable[[float], None] = time.sleep):
        if not cfg.judge.enabled:
            raise ValueError("a JudgeReward needs reward.judge.endpoint")
        self.reward_cfg, self.cfg, self.rubric = cfg, cfg.judge, rubric
        self.url = cfg.judge.endpoint.rstrip("/") + "/chat/completions"
        self.cache_path, self.api_key, self.sleep = cache_path, api_key, sleep
        self._lock = threading.Lock()
        self._cache: dict[str, float] = {}
        self._in_flight: dict[str, Future] = {}
        self._counts = JudgeCounts()
        self._spent_calls, self._spent_tokens = 0, 0  # the run's, a resume's earlier calls included
        self._closed = False
        # Redirects refused: urllib would repeat a redirected POST as a GET without its body.
        self._opener = urllib.request.build_opener(_NoRedirect)
        self._pool = ThreadPoolExecutor(max_workers=cfg.judge.concurrency, thread_name_prefix="judge")
        if cache_path is not None and cache_path.exists():
            self._load(cache_path)

    # -- the rollout's view ------------------------------------------------------------------------------------

    def submit(self, traj: Trajectory) -> Future:
        """A future of `traj`'s judged score on [0, 1], or of None when its rule reward is below the gate.

        The future's `result()` raises `JudgeFailure` when the score could not be obtained.
        """
        if not passes_gate(traj.total_return, self.reward_cfg):
            self._count(gated=1)
            return _done(None)
        prompt = render_prompt(self.rubric, traj, self.cfg.scale)
        key = self._key(prompt)
        with self._lock:
            self._counts = _plus(self._counts, episodes=1)
            if self._closed:  # the pool takes no more calls: a failure the loop handles, not the pool's RuntimeError
                return _failed(JudgeFailure("closed", "the judge was closed (the run is ending)", retry=False))
            if key in self._cache:
                self._counts = _plus(self._counts, cache_hits=1)
                return _done(self._cache[key])
            if key in self._in_flight:
                self._counts = _plus(self._counts, cache_hits=1)
                return self._in_flight[key]
            future = self._pool.submit(self._score, key, prompt)
            self._in_flight[key] = future
            return future

    def reward(self, rule: float, score: float | None) -> CombinedReward:
        """The episode's reward from its rule reward and the score `submit` gave (`agentrl.rewards.combine`)."""
        return combine(rule, score, self.reward_cfg)

    def counts(self) -> JudgeCounts:
        """The counters so far in the run (this process's calls; the budget also counts a resume's earlier ones)."""
        with self._lock:
            return self._counts

    def close(self) -> None:
        """Stop taking calls (idempotent): a call not started yet fails at once (kind ``closed``); one in flight ends.

        Under the lock, so a `submit` or a call racing it sees either the open judge or the closed one.
        """
        with self._lock:
            self._closed = True
            # Not cancel_futures: a cancelled future raises CancelledError in the loop; a queued call fails cleanly.
            self._pool.shutdown(wait=False)

    # -- one question: retries around calls ----------------------------------------------------------------------

    def _score(self, key: str, prompt: str) -> float:
        try:
            last: JudgeFailure | None = None
            attempts = 0
            for attempt in range(1 + self.cfg.retries):
                attempts = attempt + 1
                try:
                    if attempt:
                        with self._lock:  # before the wait: a retry that cannot call is not one
                            self._refuse_if_spent_or_closed()
                        self._count(retries=1)
                        self.sleep(self.cfg.backoff * 2 ** (attempt - 1))
                    return self._call(key, prompt)
                except JudgeFailure as e:
                    last = e
                    if e.kind == "over_budget":
                        self._count(over_budget=1)
                    elif e.kind != "closed":  # no call was made
                        self._count(failed_calls=1)
                        log.warning("judge call failed (%s, attempt %d of %d): %s", e.kind, attempt + 1,
                                    1 + self.cfg.retries, e, exc_info=e.__cause__ if e.kind == "error" else None)
                    if not e.retry:
                        break
            assert last is not None
            if last.kind in ("over_budget", "closed"):  # the run's state, not this call's: no attempt count
                raise last
            raise JudgeFailure(last.kind, f"{last} (attempt {attempts} of {1 + self.cfg.retries})", retry=False)
        finally:
            with self._lock:
                self._in_flight.pop(key, None)

    def _call(self, key: str, prompt: str) -> float:
        """One HTTP call: its budget, the request, the parse; the call (and its score) go to the on-disk cache."""
        cfg = self.cfg
        with self._lock:
            self._refuse_if_spent_or_closed()
            self._spent_calls += 1
            self._counts = _plus(self._counts, calls=1)
        t0 = time.perf_counter()
        tokens, reply, score, failure = 0, "", None, None
        try:
            body = self._post(prompt)
            # Counted before the reply is read: a reply without usable text (a reasoning judge that spent its
            # max_tokens thinking returns null content) still cost its tokens.
            usage = _usage_of(body)
            tokens = usage if usage is not None else len(prompt) // 4
            reply = _reply_of(body)
            tokens = usage if usage is not None else (len(prompt) + len(reply)) // 4
            score = parse_score(reply, cfg.scale)
        except JudgeFailure as e:
            failure = e
        except Exception as e:  # noqa: BLE001 - e.g. a URL urllib refuses: a failed call, never the rollout's end
            failure = JudgeFailure("error", f"{type(e).__name__}: {e}", retry=False)
            failure.__cause__ = e
        with self._lock:
            self._spent_tokens += tokens
            self._counts = _plus(self._counts, tokens=tokens, seconds=time.perf_counter() - t0)
            if score is not None:
                self._cache[key] = score
            self._append({"key": key, "score": score, "tokens": tokens, "reply": reply} if score is not None
                         else {"tokens": tokens, "failed": failure.kind if failure else ""})
        if failure is not None:
            raise failure
        return score

    def _post(self, prompt: str) -> Any:
        """The endpoint's JSON answer to one chat completion request."""
        headers = {"Content-Type": "application/json", "User-Agent": "agentrl-judge"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = {"model": self.cfg.model, "messages": [{"role": "user", "content": prompt}],
                   "temperature": self.cfg.temperature, "max_tokens": self.cfg.max_reply_tokens}
        post = urllib.request.Request(self.url, data=json.dumps(request).encode(), headers=headers, method="POST")
        # HTTPError < URLError < OSError and TimeoutError < OSError: the order of these clauses matters. The timeout
        # holds for connecting and for each read; a read that times out raises TimeoutError itself, a connect wrapped.
        try:
            with self._opener.open(post, timeout=self.cfg.timeout) as response:
                status, data = response.status, response.read()
        except urllib.error.HTTPError as e:
            status = e.code
            raise JudgeFailure(f"http_{status}", f"{self.url} answered HTTP {status}: {_error_body(e)!r}",
                               retry=status in _RETRIED_STATUS or status >= 500) from None
        except TimeoutError as e:
            raise JudgeFailure("timeout", f"no answer from {self.url} within {self.cfg.timeout:g} s "
                                          f"({type(e).__name__})") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise JudgeFailure("timeout", f"no connection to {self.url} within {self.cfg.timeout:g} s") from None
            raise JudgeFailure("unreachable", f"cannot reach {self.url}: {e.reason}") from None
        except (OSError, http.client.HTTPException) as e:  # the connection broke mid-answer
            raise JudgeFailure("unreachable", f"lost the connection to {self.url}: {type(e).__name__}: {e}") from None
        if status != 200:
            raise JudgeFailure(f"http_{status}", f"{self.url} answered HTTP {status}: {data[:200]!r}", retry=False)
        try:
            return json.loads(data)
        except ValueError:
            raise JudgeFailure("bad_response", f"{self.url} answered with no JSON: "
                                               f"{data[:200].decode(errors='replace')!r}") from None

    # -- cache ---------------------------------------------------------------------------------------------------

    def _refuse_if_spent_or_closed(self) -> None:
        """Raise `JudgeFailure` ``closed`` or ``over_budget`` when no call may be made now (call with the lock held)."""
        cfg = self.cfg
        if self._closed:
            raise JudgeFailure("closed", "the judge was closed (the run is ending)", retry=False)
        if cfg.budget_calls and self._spent_calls >= cfg.budget_calls:
            raise JudgeFailure("over_budget", f"the run's judge budget of {cfg.budget_calls} calls is spent "
                                              f"(reward.judge.budget_calls)", retry=False)
        if cfg.budget_tokens and self._spent_tokens >= cfg.budget_tokens:
            raise JudgeFailure("over_budget", f"the run's judge budget of {cfg.budget_tokens} tokens is spent "
                                              f"({self._spent_tokens} used; reward.judge.budget_tokens)", retry=False)

    def _key(self, prompt: str) -> str:
        c = self.cfg
        what = [c.model, c.temperature, c.max_reply_tokens, list(c.scale), prompt]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()

    def _load(self, path: Path) -> None:
        """Read the scores and the spent budget of the calls an earlier process of this run made."""
        lines = path.read_text().splitlines(keepends=True)
        for lineno, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
                    raise ValueError("not an entry")
            except ValueError:  # json.JSONDecodeError is one
                if lineno == len(lines) and not line.endswith("\n"):  # cut short by a kill mid-write
                    log.warning("%s:%d: dropping a truncated last line", path, lineno)
                    with open(path, "r+b") as f:  # so the next append starts a line of its own
                        f.truncate(sum(len(x.encode()) for x in lines[:-1]))
                    break
                raise ConfigError(f"{path}:{lineno}: not a judge cache line; delete the file to start the judge's "
                                  f"cache and budget afresh") from None
            self._spent_calls += 1
            self._spent_tokens += int(entry.get("tokens", 0))
            if entry.get("score") is not None:
                self._cache[entry["key"]] = float(entry["score"])

    def _append(self, entry: dict[str, Any]) -> None:
        if self.cache_path is not None:
            with open(self.cache_path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def _count(self, **deltas: float) -> None:
        with self._lock:
            self._counts = _plus(self._counts, **deltas)


def rubric_and_key(cfg: JudgeConfig) -> tuple[str, str]:
    """The rubric template (inline, from its file, or `DEFAULT_RUBRIC`) and the API key (or "") a judge uses.

    Set-up calls it before any model loads, so a bad file or a missing key is refused early.

    Raises:
        ConfigError: an unreadable or malformed rubric file, or an ``api_key_env`` variable that is not set.
    """
    rubric = cfg.rubric or DEFAULT_RUBRIC
    if cfg.rubric_file:
        try:
            rubric = Path(cfg.rubric_file).read_text()
        except OSError as e:
            raise ConfigError(f"reward.judge.rubric_file: cannot read {cfg.rubric_file} ({e.strerror or e}); give "
                              f"an existing file, or the rubric inline as reward.judge.rubric") from None
        check_rubric(rubric, "reward.judge.rubric_file")
    api_key = ""
    if cfg.api_key_env:
        api_key = os.environ.get(cfg.api_key_env, "")
        if not api_key:
            raise ConfigError(f"reward.judge.api_key_env names {cfg.api_key_env}, which is not set: export it with "
                              f"the endpoint's key, or leave api_key_env empty for an endpoint without one")
    return rubric, api_key


def _plus(counts: JudgeCounts, **deltas: float) -> JudgeCounts:
    return JudgeCounts(**{f.name: getattr(counts, f.name) + deltas.get(f.name, 0) for f in fields(counts)})


def _done(value: float | None) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _failed(failure: JudgeFailure) -> Future:
    future: Future = Future()
    future.set_exception(failure)
    return future


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as its HTTP status (an error), as for any non-200 answer."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _error_body(error: urllib.error.HTTPError) -> str:
    """The start of an HTTP error's body ("" when it cannot be read)."""
    try:
        return error.read()[:200].decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return ""
    finally:
        error.close()


def _reply_of(body: Any) -> str:
    """The first choice's text of an OpenAI chat completion.

    Raises:
        JudgeFailure: ``bad_response`` (not a chat completion, or no text), ``unparsable`` (the reply was cut at its
            token limit: its last line is not the score it was asked to end with, and a score line quoted from the
            episode earlier in it must not count).
    """
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeFailure("bad_response", f"not an OpenAI chat completion: {json.dumps(body)[:200]}") from None
    if not isinstance(content, str):
        raise JudgeFailure("bad_response", f"the reply's content is not text: {content!r:.200}")
    if isinstance(choice, dict) and choice.get("finish_reason") == "length":
        raise JudgeFailure("unparsable", "the reply was cut at reward.judge.max_reply_tokens before it ended "
                                         f"(...{content.strip()[-120:]!r}); raise the limit")
    return content


def _usage_of(body: Any) -> int | None:
    """The total tokens an OpenAI chat completion reports (None when it reports none)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    # JSON's NaN and Infinity parse as floats: a count that is not a finite number is no count.
    counted = isinstance(total, (int, float)) and not isinstance(total, bool) and math.isfinite(total)
    return int(total) if counted else None
