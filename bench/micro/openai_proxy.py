r"""The OpenAI-compatible proxy (issue 29): its overhead against direct engine calls; what agents' sessions train on.

Part 1, overhead. The same chat prompts (math problems rendered with the family's template) are sampled two ways on
one engine (tiny-qwen3 or SmolLM2 on the HF engine): *direct*, the prompt ids submitted to the engine and polled in
this thread (the rollout loop's path); *proxy*, the official `openai` client's ``chat.completions.create`` against
`agentrl serve`'s server in this process (HTTP, JSON, the template, the parser, the recording); and, one call at a
time only, *server in process*, the server's own work without HTTP and the client. Rounds rotate the ways (the
machine is shared: only ratios measured in the same run mean anything), each round once with one call at a
time (latency per call) and once with `--concurrency` calls at once (tokens/s; concurrent proxy calls share the
engine's batches, direct calls are submitted together and polled as one batch). Greedy decoding, a fixed number of
new tokens per call (end-of-turn ignored by tiny-qwen3's random weights; SmolLM2 may stop early: tokens are counted).

Part 2, sessions. The example agent (`examples/math_tool_agent.py`: calculator tool, env feedback on wrong answers,
math ``mode=multi``, 3 attempts) plays episodes through the server; per template family it reports the fraction of
calls (after each session's first) whose prompt extends the previous call's prompt + reply token for token, why the
others re-rendered, and the trainer's tokens per episode with the calls merged where the prefix holds
(`trajectory_to_samples`) against one sample per call (what a proxy that never merges trains on). Policies:

* ``chatml``: SmolLM2-135M-Instruct, real weights (its template declares no tools: the agent's calls are answers).
* ``qwen3``, thinking off: tiny-qwen3 (random weights, the real Qwen3 template and tokenizer; the generation prompt
  pre-fills the empty think block, as for the real model).
* ``qwen3``, thinking on and off, *scripted*: no trained Qwen3 is available offline, and a random model writes no think
  blocks or tool calls, so an engine writes replies in Qwen3's format (think block, then a calculator call, a wrong
  boxed answer, the right one), one per call of a session. The agent, client, server, template and recorder are the
  real ones; only the replies are written. This is what the drift depends on: the template's rules and the agent's
  handling of history.

Holds when: the proxy's tokens/s is within 0.5x of direct at the concurrency given, and the drift fractions match the
families' rules (ChatML 1.0; Qwen3 thinking on drops earlier think blocks after a user feedback message; thinking off
drops every earlier empty think block).

    python bench/micro/openai_proxy.py --out docs/results/openai_proxy.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's agentrl, and bench.harness

from agentrl.chat.samples import trajectory_to_samples  # noqa: E402
from agentrl.engine import EngineSpec, build_engines  # noqa: E402
from agentrl.engine.base import EngineRequest, EngineResult, Generation, SamplingParams  # noqa: E402
from agentrl.models import load_model  # noqa: E402
from agentrl.rollout.agents import AgentRollout, load_agent  # noqa: E402
from agentrl.rollout.pool import EnvMaker  # noqa: E402
from agentrl.serve.engine_client import EngineClient  # noqa: E402
from agentrl.serve.server import PolicyServer, start_server  # noqa: E402
from agentrl.serve.sessions import Recorder, Renderer  # noqa: E402
from bench.harness import ROOT, script_path, write_json  # noqa: E402


def _prompts(n: int) -> list[list[dict[str, str]]]:
    import agentrl

    env = agentrl.make("math")
    out = []
    for seed in range(n):
        obs, _ = env.reset(seed=seed)
        out.append([{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}])
    return out


def overhead(model: str, rounds: int, calls: int, concurrency: int, max_tokens: int) -> dict:
    """Direct engine calls against proxy calls on the same prompts, alternating, in one process."""
    import openai

    policy = load_model(model)
    engine = build_engines(EngineSpec(kind="hf", batch_size=max(8, concurrency)), policy, share_module=True)
    renderer = Renderer(policy.tokenizer, family_hint=policy.family)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_tokens)
    client = EngineClient(engine, owns_engine=False)
    server = start_server(PolicyServer(client, Recorder(renderer), model, defaults=params, max_context_tokens=4096))
    api = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    conversations = _prompts(calls)
    prompt_ids = [renderer.encode(renderer.render(c, None)) for c in conversations]
    next_id = iter(range(10**9))

    def direct(batch: list[list[int]]) -> tuple[int, list[float]]:
        t0 = time.perf_counter()
        for ids in batch:
            engine.submit(EngineRequest(next(next_id), tuple(ids), params))
        results: list[EngineResult] = []
        while len(results) < len(batch):
            results += engine.poll()
        seconds = time.perf_counter() - t0
        return sum(len(r.generation.token_ids) for r in results), [seconds] * len(batch)

    def proxy_one(conv) -> tuple[int, float]:
        t0 = time.perf_counter()
        reply = api.chat.completions.create(model=model, messages=conv, temperature=0.0, max_tokens=max_tokens)
        return reply.usage.completion_tokens, time.perf_counter() - t0

    def in_process(conv) -> tuple[int, float]:
        # The server's work without HTTP and the client: checks, template, engine thread, parser, recording.
        t0 = time.perf_counter()
        _, choices, _, _ = server.server.chat({"messages": conv, "temperature": 0.0, "max_tokens": max_tokens}, None)
        return sum(len(c.record.generated_ids) for c in choices), time.perf_counter() - t0

    rows = {way: {"seq": [], "conc": []} for way in ("direct", "server_in_process", "proxy")}
    proxy_one(conversations[0])  # warm every path once (first HTTP connection, template compile)
    direct(prompt_ids[:1])
    for r in range(rounds):
        ways = ("direct", "server_in_process", "proxy")
        for way in ways[r % 3:] + ways[: r % 3]:
            # One call at a time: latency per call.
            tokens, lat, t0 = 0, [], time.perf_counter()
            for i in range(calls):
                if way == "direct":
                    n, s = direct([prompt_ids[i]])
                    s = s[0]
                else:
                    n, s = (proxy_one if way == "proxy" else in_process)(conversations[i])
                tokens += n
                lat.append(s)
            rows[way]["seq"].append({"tokens": tokens, "seconds": time.perf_counter() - t0,
                                     "latency_mean": statistics.mean(lat)})
            if way == "server_in_process":
                continue
            # `concurrency` calls at once: tokens/s.
            t0 = time.perf_counter()
            if way == "direct":
                tokens = 0
                for start in range(0, calls, concurrency):
                    tokens += direct(prompt_ids[start: start + concurrency])[0]
            else:
                with ThreadPoolExecutor(concurrency) as pool:
                    tokens = sum(n for n, _ in pool.map(proxy_one, conversations))
            rows[way]["conc"].append({"tokens": tokens, "seconds": time.perf_counter() - t0})
    server.stop()
    client.close()

    def summary(way: str) -> dict:
        seq, conc = rows[way]["seq"], rows[way]["conc"]
        out = {"latency_per_call_s": statistics.mean(x["latency_mean"] for x in seq),
               "tokens_per_s_sequential": sum(x["tokens"] for x in seq) / sum(x["seconds"] for x in seq),
               "rounds": rows[way]}
        if conc:
            out["tokens_per_s_concurrent"] = sum(x["tokens"] for x in conc) / sum(x["seconds"] for x in conc)
        return out

    d, p, inside = summary("direct"), summary("proxy"), summary("server_in_process")
    return {"model": model, "engine": "hf", "rounds": rounds, "calls_per_round": calls, "concurrency": concurrency,
            "max_tokens": max_tokens, "direct": d, "proxy": p, "server_in_process": inside,
            "latency_ratio_server_in_process_over_direct": inside["latency_per_call_s"] / d["latency_per_call_s"],
            "latency_ratio_proxy_over_direct": p["latency_per_call_s"] / d["latency_per_call_s"],
            "tokens_per_s_ratio_sequential": p["tokens_per_s_sequential"] / d["tokens_per_s_sequential"],
            "tokens_per_s_ratio_concurrent": p["tokens_per_s_concurrent"] / d["tokens_per_s_concurrent"]}


class QwenFormatWriter:
    """A scripted engine writing replies the way Qwen3 writes them, one script step per call of a session.

    Call 0: a calculator call; call 1 (after the tool's answer): a wrong boxed answer; call 2 (after the env's
    feedback, a user message): another answer. With thinking on each reply opens with a think block; with thinking
    off the generation prompt already holds the empty block, so the reply starts after it.
    """

    def __init__(self, tokenizer, thinking: bool):
        self.tokenizer, self.thinking, self.policy_version = tokenizer, thinking, 0
        self.pending: list[EngineRequest] = []
        self.calls: dict[int, int] = {}
        self._lock = threading.Lock()

    def _text(self, k: int) -> str:
        think = f"<think>\nStep {k}: work it out.\n</think>\n\n" if self.thinking else ""
        if k == 0:
            return think + ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n'
                            '</tool_call><|im_end|>')
        return think + f"The answer is \\boxed{{{1000 + k}}}.<|im_end|>"

    def submit(self, request: EngineRequest) -> None:
        with self._lock:
            self.pending.append(request)

    def poll(self, timeout=None) -> list[EngineResult]:
        with self._lock:
            pending, self.pending = self.pending, []
        out = []
        for req in pending:
            k = self.calls.get(req.session, 0)
            self.calls[req.session] = k + 1
            ids = tuple(self.tokenizer(self._text(k), add_special_tokens=False)["input_ids"])
            out.append(EngineResult(req.id, Generation(ids, (-1.0,) * len(ids), "stop"), self.policy_version))
        if not out:
            time.sleep(0.005)
        return out

    def update_weights(self, named_tensors, version: int) -> None:
        self.policy_version = version

    def metrics(self) -> dict:
        return {}

    def clear_cache(self) -> None:
        pass

    def close(self) -> None:
        pass


def sessions(label: str, policy, engine, chat_kwargs: dict, episodes: int, max_tokens: int) -> dict:
    """The example agent over `episodes` math tasks; drift and trainer tokens per episode."""
    fn = load_agent(str(ROOT / "examples" / "math_tool_agent.py") + ":run")
    rollout = AgentRollout(
        fn, engine, lambda: policy.model.state_dict().items(), policy.tokenizer,
        maker=EnvMaker("math", {"mode": "multi", "max_turns": 3}), rows=None,
        seeds_for_step=lambda s: list(range(episodes)), group_size=1, concurrency=4, timeout=600,
        sampling_for_step=lambda s: SamplingParams(max_new_tokens=max_tokens, seed=s), family_hint=policy.family,
        chat_kwargs=chat_kwargs, model_name=policy.name)
    reports = []
    original = rollout.policy.recorder.pop

    def keep(session):  # the rollout pops each finished session: keep its report beside
        log = original(session)
        if log is not None:
            reports.append(log.report())
        return log

    rollout.policy.recorder.pop = keep
    try:
        result = rollout.rollout(0)
    finally:
        rollout.close()
    merged = [sum(len(s.input_ids) for s in trajectory_to_samples(t, 0.0)) for t in result.trajectories]
    split = [sum(len(s.input_ids) for s in trajectory_to_samples(t, 0.0, per_turn=True))
             for t in result.trajectories]
    kinds: dict[str, int] = {}
    rules: dict[str, int] = {}
    for r in reports:
        for k, v in r.by_kind.items():
            kinds[k] = kinds.get(k, 0) + v
        for k, v in r.rules.items():
            rules[k] = rules.get(k, 0) + v
    later = sum(r.extended + r.rerendered for r in reports)
    return {"label": label, "family": rollout.policy.recorder.renderer.family_name, "chat_kwargs": chat_kwargs,
            "episodes": len(result.trajectories), "calls": sum(r.calls for r in reports),
            "calls_after_first": later,
            "extend_fraction": sum(r.extended for r in reports) / later if later else None,
            "by_kind": kinds, "rules": rules, "example_details": [d for r in reports for d in r.details][:3],
            "samples_per_episode": sum(len(trajectory_to_samples(t, 0.0)) for t in result.trajectories)
            / max(1, len(result.trajectories)),
            "trainer_tokens_per_episode_merged": statistics.mean(merged) if merged else None,
            "trainer_tokens_per_episode_split": statistics.mean(split) if split else None,
            "split_over_merged": statistics.mean(split) / statistics.mean(merged) if merged else None,
            "agent_failures": result.stats.failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-qwen3", help="Model for the overhead part.")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--skip-smollm2", action="store_true", help="Leave out the ChatML row (SmolLM2 weights).")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    results: dict = {"bench": script_path(__file__), "argv": sys.argv[1:], "machine": platform.machine(),
                     "note": "shared 2-core CPU box: ratios within one run only"}
    t0 = time.perf_counter()
    results["overhead"] = overhead(args.model, args.rounds, args.calls, args.concurrency, args.max_tokens)
    print(json.dumps({k: v for k, v in results["overhead"].items()
                      if k not in ("direct", "proxy", "server_in_process")}, indent=1), flush=True)
    rows = []
    tiny = load_model("tiny-qwen3")
    for thinking in (True, False):
        rows.append(sessions(f"qwen3 thinking {'on' if thinking else 'off'} (scripted Qwen3-format replies)", tiny,
                             QwenFormatWriter(tiny.tokenizer, thinking), {"enable_thinking": thinking},
                             args.episodes, 64))
        print(json.dumps(rows[-1]), flush=True)
    engine = build_engines(EngineSpec(kind="hf", batch_size=8), tiny, share_module=True)
    rows.append(sessions("qwen3 thinking off (tiny-qwen3, random weights)", tiny, engine,
                         {"enable_thinking": False}, args.episodes, 16))
    print(json.dumps(rows[-1]), flush=True)
    if not args.skip_smollm2:
        smol = load_model("smollm2-135m")
        engine = build_engines(EngineSpec(kind="hf", batch_size=8), smol, share_module=True)
        rows.append(sessions("chatml (SmolLM2-135M-Instruct, real weights)", smol, engine, {}, args.episodes, 48))
        print(json.dumps(rows[-1]), flush=True)
    results["sessions"] = rows
    results["seconds"] = time.perf_counter() - t0
    if args.out:
        write_json(args.out, results, end="\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
