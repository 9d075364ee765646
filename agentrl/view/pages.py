"""What each page of `agentrl view` shows, as plain data for its Jinja template (shared by the app and the export).

Pages are rendered on the server; the browser only draws the curves (uPlot), colours tokens by the chosen value
and polls for new metrics rows. Every value that came from a run (env text, model replies, config) reaches the page
through Jinja's autoescaping or as JSON inside ``<script type="application/json">`` (with ``<`` escaped), so a reply
that contains HTML is shown, never run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from agentrl.view.runs import EpisodeRow, RunFolder

__all__ = ["Links", "LIVE_LINKS", "EpisodeFilter", "render", "eval_block", "overview_page", "episodes_page",
           "episode_page", "compare_page", "token_view", "TOKEN_MODES"]

_HERE = Path(__file__).resolve().parent

TOKEN_MODES = ("loss_mask", "sampler_logprob", "trainer_logprob", "mismatch", "is_weight", "advantage", "entropy")
"""What tokens can be coloured by (``mismatch`` is trainer minus sampler log-prob)."""

_TOKEN_ARRAYS = ("loss_mask", "sampler_logprob", "trainer_logprob", "is_weight", "is_masked", "advantage", "entropy")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass(frozen=True)
class Links:
    """Where links point: URLs of the live app, or anchors inside one exported file.

    Attributes:
        export: True for the static export (anchors, data inlined, no polling).
    """

    export: bool = False

    def overview(self) -> str:
        """The curves page."""
        return "#overview" if self.export else "/"

    def episodes(self, run: int) -> str:
        """A run's episode browser."""
        return f"#run{run}-episodes" if self.export else f"/run/{run}/episodes"

    def episode(self, run: int, index: int) -> str:
        """One episode."""
        return f"#run{run}-ep{index}" if self.export else f"/run/{run}/episode/{index}"

    def compare(self, a: int, b: int) -> str:
        """Two runs side by side."""
        return "#compare" if self.export else f"/compare?a={a}&b={b}"


LIVE_LINKS = Links()


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
                             autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson_safe"] = to_json_script
    env.filters["num"] = fmt_number
    return env


def render(template: str, **context: Any) -> str:
    """Render one of the viewer's templates."""
    return _environment().get_template(template).render(**context)


def to_json_script(value: Any) -> str:
    """JSON for a ``<script type="application/json">`` block: strict (NaN as null) and unable to close the tag."""
    text = json.dumps(_json_safe(value), separators=(",", ":"))
    return jinja2.utils.markupsafe.Markup(text.replace("<", "\\u003c").replace(">", "\\u003e")
                                          .replace("&", "\\u0026"))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def fmt_number(x: Any, digits: int = 4) -> str:
    """A number for a table cell: 4 significant digits, "-" for none."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _runs_header(runs: Sequence[RunFolder]) -> list[dict[str, Any]]:
    return [{"index": r.index, "name": r.name, "path": str(r.path)} for r in runs]


# ---------------------------------------------------------------------------------------------------- overview


def _eval_block(run: RunFolder) -> dict[str, Any] | None:
    results, problem = run.results()
    if results is None:
        return {"problem": problem} if problem else None
    return eval_block(results)


def eval_block(results: Mapping[str, Any]) -> dict[str, Any]:
    """An eval's results for the page: summary, protocol, tables with intervals, chart data, transcripts."""
    from agentrl.view.eval_report import eval_charts, metrics_table, settings_table, transcript_html

    protocol = results.get("protocol")
    tasks, env = results["tasks"], results["env"]
    markup = jinja2.utils.markupsafe.Markup  # the report's tables escape every value they hold
    return {
        "problem": "", "env": env["id"], "model": results["model"]["name"], "created": results.get("created", ""),
        "summary": (f"{tasks['episodes']} tasks (seeds from {tasks['seed_offset']:,}"
                    f"{', split ' + str(env['split']) if env.get('split') else ''}) x {tasks['samples_per_task']} "
                    f"samples, up to {tasks['max_turns']} turns each"),
        "level": round(100 * results.get("confidence", 0.95)),
        "protocol": ({"label": protocol["label"], "hash": protocol["hash"][:12],
                      "panel": str(protocol.get("panel_fingerprint"))[:12]} if protocol else None),
        "metrics_table": markup(metrics_table(results)), "settings_table": markup(settings_table(results)),
        "charts": eval_charts(results),
        "transcripts": [markup(transcript_html(t)) for t in results.get("transcripts", [])],
    }


def overview_page(runs: Sequence[RunFolder], links: Links = LIVE_LINKS) -> dict[str, Any]:
    """The curves of every run overlaid, each run's plan, config, eval results and what it lacks."""
    cards = []
    for run in runs:
        cards.append({
            "index": run.index, "name": run.name, "path": str(run.path), "problems": run.problems,
            "lacks": run.lacks(), "plan": run.text("plan.json"), "config": run.text("config.yaml"),
            "episodes": len(run.episodes()), "eval": _eval_block(run),
        })
    data = {"runs": [{"index": r.index, "name": r.name, "rows": r.metrics()} for r in runs]}
    # A training run opened before its first step still gets the curves block (empty): its script polls, so the
    # steps appear as they are written. Eval folders have no steps to wait for.
    waiting = not links.export and any(not row["rows"] and not (r.path / "results.json").exists()
                                       for r, row in zip(runs, data["runs"]))
    return {"title": "agentrl view: " + ", ".join(r.name for r in runs), "runs": _runs_header(runs),
            "cards": cards, "curves": data, "links": links, "live": not links.export, "waiting": waiting}


# ---------------------------------------------------------------------------------------------------- episodes


@dataclass(frozen=True)
class EpisodeFilter:
    """The episode browser's filters; None (or "") means no filter.

    Attributes:
        step: trainer step.
        group: group id.
        task_type: task type.
        success: "yes" or "no".
        min_reward: lowest return shown.
        max_reward: highest return shown.
        policy_version: the weights' version that sampled it.
        staleness: step - policy version.
        flag: one of ``cut``, ``drift``, ``rerender``, ``truncated``, or ``any`` of them.
        recorded: "yes": only episodes with recorded token values.
    """

    step: int | None = None
    group: int | None = None
    task_type: str = ""
    success: str = ""
    min_reward: float | None = None
    max_reward: float | None = None
    policy_version: int | None = None
    staleness: int | None = None
    flag: str = ""
    recorded: str = ""

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> tuple[EpisodeFilter, list[str]]:
        """Filters from URL query values, and a message per value that could not be read (then ignored)."""
        errors, values = [], {}
        for name, kind in (("step", int), ("group", int), ("min_reward", float), ("max_reward", float),
                           ("policy_version", int), ("staleness", int)):
            text = (query.get(name) or "").strip()
            if text:
                try:
                    values[name] = kind(text)
                except ValueError:
                    errors.append(f"{name}={text[:40]!r} is not a{'n integer' if kind is int else ' number'}: "
                                  "ignored")
        for name, allowed in (("success", ("yes", "no")), ("flag", ("cut", "drift", "rerender", "truncated", "any")),
                              ("recorded", ("yes",))):
            text = (query.get(name) or "").strip()
            if text and text not in allowed:
                errors.append(f"{name}={text[:40]!r} is not one of {', '.join(allowed)}: ignored")
            elif text:
                values[name] = text
        if query.get("task_type"):
            values["task_type"] = str(query["task_type"])[:200]
        return cls(**values), errors

    def keep(self, e: EpisodeRow, recorded: set[tuple[int, int, int, int]]) -> bool:
        """Whether episode `e` passes every filter."""
        flags = set(e.flags) | ({"truncated"} if e.truncated else set())
        return ((self.step is None or e.step == self.step) and (self.group is None or e.group_id == self.group)
                and (not self.task_type or e.task_type == self.task_type)
                and (not self.success or e.success == (self.success == "yes"))
                and (self.min_reward is None or e.reward >= self.min_reward)
                and (self.max_reward is None or e.reward <= self.max_reward)
                and (self.policy_version is None or e.policy_version == self.policy_version)
                and (self.staleness is None or e.staleness == self.staleness)
                and (not self.flag or (bool(flags) if self.flag == "any" else self.flag in flags))
                and (not self.recorded or e.key in recorded))

    def query(self) -> dict[str, Any]:
        """The filters as form values."""
        return {k: ("" if v is None else v) for k, v in self.__dict__.items()}


def _advantages(run: RunFolder, group: Sequence[EpisodeRow]) -> dict[int, tuple[float | None, str]]:
    """Each episode's advantage and where it came from: recorded by the trainer, else reward minus the group mean."""
    out: dict[int, tuple[float | None, str]] = {}
    mean = sum(e.reward for e in group) / len(group)
    recorded = run.recorded_keys()
    for e in group:
        value = None
        if e.key in recorded:
            for sample in run.token_samples(e):
                loss = [a for a, m in zip(sample.get("advantage") or [], sample.get("loss_mask") or []) if m]
                if loss and loss[0] is not None:
                    value = float(loss[0])
                    break
        out[e.index] = (value, "recorded") if value is not None else (e.reward - mean, "r - group mean")
    return out


def episodes_page(run: RunFolder, flt: EpisodeFilter, errors: Sequence[str] = (), links: Links = LIVE_LINKS,
                  limit: int = 400) -> dict[str, Any]:
    """The episode browser: filtered episodes, grouped by (step, policy version, group), side by side."""
    recorded = run.recorded_keys()
    episodes = run.episodes()
    kept = [e for e in episodes if flt.keep(e, recorded)]
    shown = kept[-limit:]  # the newest: a live run's last steps are what one looks at
    groups: dict[tuple[int, int, int], list[EpisodeRow]] = {}
    for e in shown:
        groups.setdefault((e.step, e.policy_version, e.group_id), []).append(e)
    all_by_group: dict[tuple[int, int, int], list[EpisodeRow]] = {}
    for e in episodes:
        if (e.step, e.policy_version, e.group_id) in groups:
            all_by_group.setdefault((e.step, e.policy_version, e.group_id), []).append(e)
    cards = []
    for key in sorted(groups, reverse=True):
        adv = _advantages(run, all_by_group[key])
        cards.append({"step": key[0], "policy_version": key[1], "group": key[2], "episodes": [
            e.to_json() | {"advantage": adv[e.index][0], "advantage_source": adv[e.index][1],
                           "recorded": e.key in recorded, "href": links.episode(run.index, e.index)}
            for e in groups[key]]})
    return {"run": {"index": run.index, "name": run.name}, "filter": flt.query(), "errors": list(errors),
            "total": len(episodes), "kept": len(kept), "shown": len(shown), "groups": cards,
            "task_types": sorted({e.task_type for e in episodes if e.task_type}),
            "steps": sorted({e.step for e in episodes}), "problems": run.problems, "lacks": run.lacks(),
            "links": links}


# ---------------------------------------------------------------------------------------------------- one episode


def _decoder(tokenizer: Any) -> Callable[[int], str]:
    cache: dict[int, str] = {}

    def piece(token: int) -> str:
        if token not in cache:
            if tokenizer is None:
                cache[token] = f"[{token}]"
            else:
                try:
                    cache[token] = tokenizer.decode([token], skip_special_tokens=False)
                except Exception:  # noqa: BLE001 - an id outside the vocabulary is shown as an id
                    cache[token] = f"[{token}]"
        return cache[token]

    return piece


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    if tokenizer is None:
        return " ".join(str(i) for i in ids)
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def _derived_samples(trajectory: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The samples an episode trains as, rebuilt from its turns (for runs without token_values.jsonl).

    A sample is the first turn's prompt and reply, then each later turn's new prompt tokens and reply, until a turn
    whose prompt does not extend the sequence so far (``new_segment``) starts the next one: the rule
    `agentrl.records.Sample` documents. Only the loss mask and the sampler's log-probs are known.
    """
    samples: list[dict[str, Any]] = []
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    for turn in trajectory["turns"]:
        prompt = list(turn["prompt_ids"])
        if ids and (turn.get("new_segment") or prompt[:len(ids)] != ids):
            samples.append({"token_ids": ids, "loss_mask": mask, "sampler_logprob": logprobs})
            ids, mask, logprobs = [], [], []
        new = prompt[len(ids):]
        ids, mask, logprobs = ids + new, mask + [0] * len(new), logprobs + [None] * len(new)
        ids += list(turn["generated_ids"])
        mask += [1] * len(turn["generated_ids"])
        logprobs += [float(x) for x in turn["rollout_logprobs"]]
    if ids:
        samples.append({"token_ids": ids, "loss_mask": mask, "sampler_logprob": logprobs})
    for i, s in enumerate(samples):
        s["sample"] = i
    return samples


def token_view(sample: Mapping[str, Any], piece: Callable[[int], str]) -> dict[str, Any]:
    """One sample's tokens for the page: text pieces, the loss-mask classes, and the value arrays (JSON)."""
    ids = [int(t) for t in sample["token_ids"]]
    n = len(ids)
    arrays: dict[str, list[Any]] = {}
    for name in _TOKEN_ARRAYS:
        values = sample.get(name)
        arrays[name] = list(values)[:n] + [None] * max(0, n - len(values)) if values is not None else [None] * n
    mask = [1 if m else 0 for m in arrays["loss_mask"]]
    masked = [bool(m) for m in arrays["is_masked"]]
    tokens = [{"id": t, "text": piece(t), "loss": mask[i] == 1, "masked": masked[i]} for i, t in enumerate(ids)]
    present = [name for name in _TOKEN_ARRAYS if any(v is not None for v in arrays[name])]
    return {"sample": int(sample.get("sample", 0)), "tokens": tokens, "loss_tokens": sum(mask),
            "masked_tokens": sum(masked), "arrays": {"ids": ids, **arrays}, "present": present}


def _rerender_reason(prev: Sequence[int], prompt: Sequence[int], piece: Callable[[int], str]) -> str:
    """Where a turn's prompt leaves the sequence so far, in words."""
    common = 0
    for a, b in zip(prev, prompt):
        if a != b:
            break
        common += 1
    if common == len(prev):
        return "the prompt extends the sequence so far (split requested by the context policy)"
    was = "".join(piece(t) for t in prev[common:common + 12])
    now = "".join(piece(t) for t in prompt[common:common + 12])
    return (f"the template re-rendered history: the prompt leaves the sequence so far at token {common} of "
            f"{len(prev)}: it was {was!r}, the template now writes {now!r}")


def _screenshots(run: RunFolder, index: int, turn: int) -> list[str]:
    folder = run.path / "screenshots"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.glob(f"ep{index}_turn{turn}.*")
                  if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))


def episode_page(run: RunFolder, index: int, links: Links = LIVE_LINKS) -> dict[str, Any]:
    """One episode turn by turn, and its samples' tokens.

    Raises:
        KeyError: no episode `index`.
    """
    row = run.episodes()[index] if 0 <= index < len(run.episodes()) else None
    if row is None:
        raise KeyError(index)
    trajectory = run.episode(index)
    tokenizer = run.tokenizer()
    piece = _decoder(tokenizer)
    turns = []
    prev: list[int] = []
    for t, turn in enumerate(trajectory["turns"]):
        reply = _decode(tokenizer, turn["generated_ids"])
        rerender = ""
        if t > 0 and (turn.get("new_segment") or list(turn["prompt_ids"][:len(prev)]) != prev):
            rerender = _rerender_reason(prev, turn["prompt_ids"], piece)
        turns.append({
            "number": t + 1, "prompt": _decode(tokenizer, turn["prompt_ids"]), "prompt_tokens": len(turn["prompt_ids"]),
            "reply": reply, "reply_tokens": len(turn["generated_ids"]), "action": turn.get("action", ""),
            "observation": turn.get("observation", ""), "reward": turn.get("reward"),
            "finish_reason": turn.get("finish_reason", ""), "drift": turn.get("roundtrip_drift", ""),
            "rerender": rerender, "tool_calls": [c.strip() for c in _TOOL_CALL.findall(reply)],
            "screenshots": [f"/files/{run.index}/screenshots/{name}" for name in _screenshots(run, index, t)],
            "generate_seconds": turn.get("generate_seconds"), "env_seconds": turn.get("env_seconds"),
        })
        prev = list(turn["prompt_ids"]) + list(turn["generated_ids"])
    recorded = run.token_samples(row)
    samples = recorded or _derived_samples(trajectory)
    shots_note = ""
    if not any(t["screenshots"] for t in turns):  # say why, where a GUI run could have shown the screens
        if (run.path / "screenshots").is_dir():
            shots_note = ("no screenshots of this episode: the run saves them for a few episodes per step "
                          "(screenshots_per_step)")
        elif trajectory.get("env_id") == "gui":
            shots_note = ("this folder holds no screenshots: training runs save them for screenshots_per_step "
                          "episodes per step when the GUI env's screenshots setting is on")
    return {"run": {"index": run.index, "name": run.name}, "uid": f"{run.index}-{index}", "episode": row.to_json(),
            "turns": turns, "screenshots_note": shots_note,
            "first_observation": trajectory.get("first_observation", ""), "env_id": trajectory.get("env_id", ""),
            "samples": [token_view(s, piece) for s in samples], "recorded": bool(recorded),
            "has_token_file": run.has_token_values, "tokenizer": tokenizer is not None, "modes": TOKEN_MODES,
            "links": links, "prev": index - 1 if index > 0 else None,
            "next": index + 1 if index + 1 < len(run.episodes()) else None}


# ---------------------------------------------------------------------------------------------------- compare


def _flatten_yaml(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = json.dumps(value)

    walk("", data)
    return out


def compare_page(a: RunFolder, b: RunFolder, links: Links = LIVE_LINKS) -> dict[str, Any]:
    """Two runs side by side: the settings that differ, the last metrics row of each, their eval results."""
    ca, cb = _flatten_yaml(a.text("config.yaml")), _flatten_yaml(b.text("config.yaml"))
    settings = [(k, ca.get(k, "-"), cb.get(k, "-")) for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    ma, mb = a.metrics(), b.metrics()
    last_a, last_b = (ma[-1] if ma else {}), (mb[-1] if mb else {})
    keys = [k for k in dict.fromkeys([*last_a, *last_b]) if k != "step"]
    metrics = [(k, last_a.get(k), last_b.get(k)) for k in keys]
    evals = []
    ra, _ = a.results()
    rb, _ = b.results()
    if ra and rb:
        from agentrl.eval_compare import compare_results

        for r in compare_results(ra, rb, float(ra.get("confidence", 0.95))):
            evals.append((r.metric, r.a.format(), r.b.format(), f"{r.diff.estimate:+.4g} [{r.diff.low:+.4g}, "
                                                                 f"{r.diff.high:+.4g}]", r.method, r.significant))
    return {"a": {"index": a.index, "name": a.name, "steps": len(ma)},
            "b": {"index": b.index, "name": b.name, "steps": len(mb)},
            "settings": settings, "metrics": metrics, "evals": evals, "links": links}
