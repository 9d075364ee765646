"""Run folders read live for `agentrl view`: what each file holds, re-read only where it grew.

A run folder is written while the viewer reads it, so every JSONL file is read incrementally: from the byte offset
reached last time, complete lines only (a line the trainer is still writing waits for its newline). A file that
shrank was rewritten (``--overwrite``): it is read again from the start. A line that is not what it should be is
skipped and named (``metrics.jsonl:7: ...``) in `RunFolder.problems`, so one bad line never hides a whole run.

Episodes are kept as a few numbers each (`EpisodeRow`) plus the byte offset of their line, so a run whose
trajectories take gigabytes is browsed without holding them; one episode is read from its offset when it is shown.
The per-token values (``token_values.jsonl``, one line per recorded sample) are indexed the same way and joined to
episodes on (step, policy version, group, index of the episode among the step's episodes of that group, in the
order trajectories.jsonl lists them: how the trainer counts them).
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ViewError", "EpisodeRow", "RunFolder", "open_runs", "RUN_FILES"]

RUN_FILES = ("metrics.jsonl", "trajectories.jsonl", "results.json", "config.yaml", "plan.json")
"""Files that make a folder a run folder (any one of them): training runs, eval folders, runs just started."""

TOKEN_FILE = "token_values.jsonl"
"""The per-token values the trainer records for a few samples per step."""


class ViewError(ValueError):
    """A run folder cannot be viewed (missing, not a run folder); the message names it and the fix."""


@dataclass(frozen=True)
class EpisodeRow:
    """The few numbers the episode browser filters on, for one line of trajectories.jsonl.

    Attributes:
        index: the episode's position in trajectories.jsonl (0-based, its id in URLs).
        step: the trainer step that trained on it (the key of metrics.jsonl; the policy version for evals and runs
            saved before trajectories recorded it).
        policy_version: the step whose weights sampled it.
        group_id: its group (episodes of one task) within the rollout.
        episode: its index among the step's episodes of its group, in file order (the key token_values.jsonl joins
            on).
        seed: the task's reset seed.
        task_type: the env's task type ("" when none).
        reward: total return.
        success: the env's verdict.
        turns: model calls.
        tokens: generated tokens.
        truncated: a budget ran out.
        flags: what stands out: ``cut`` (a reply hit max_new_tokens), ``drift`` (re-tokenizing a reply changed
            it), ``rerender`` (the template re-rendered history: the episode trains as several samples).
        offset: byte offset of its line.
    """

    index: int
    step: int
    policy_version: int
    group_id: int
    episode: int
    seed: int
    task_type: str
    reward: float
    success: bool
    turns: int
    tokens: int
    truncated: bool
    flags: tuple[str, ...]
    offset: int

    @property
    def staleness(self) -> int:
        """Steps between the weights that sampled it and the update that used it."""
        return self.step - self.policy_version

    @property
    def key(self) -> tuple[int, int, int, int]:
        """(step, policy version, group, episode): how token_values.jsonl names it."""
        return (self.step, self.policy_version, self.group_id, self.episode)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the JSON endpoints and the export."""
        return {"index": self.index, "step": self.step, "policy_version": self.policy_version,
                "group_id": self.group_id, "episode": self.episode, "seed": self.seed, "task_type": self.task_type,
                "reward": self.reward, "success": self.success, "turns": self.turns, "tokens": self.tokens,
                "truncated": self.truncated, "staleness": self.staleness, "flags": list(self.flags)}


@dataclass
class _Tail:
    """Where the incremental read of one JSONL file stands."""

    offset: int = 0
    lineno: int = 0
    size: int = 0


@dataclass
class _State:
    metrics: list[dict[str, Any]] = field(default_factory=list)
    episodes: list[EpisodeRow] = field(default_factory=list)
    group_counts: dict[tuple[int, int], int] = field(default_factory=dict)
    samples: dict[tuple[int, int, int, int], list[int]] = field(default_factory=dict)
    tails: dict[str, _Tail] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


class RunFolder:
    """One run folder (a training run or an `agentrl eval` output), read live.

    Args:
        path: the folder.
        index: its position on the command line (its id in URLs).

    Raises:
        ViewError: the folder does not exist or holds none of `RUN_FILES`.
    """

    def __init__(self, path: str | Path, index: int = 0):
        path = Path(path).expanduser()
        if path.is_file():  # `agentrl view runs/x/metrics.jsonl` means its folder
            path = path.parent
        # A run about to start is refused too (a mistyped path must not wait forever); the message says when to retry.
        starting = ("; a run just started writes config.yaml once its model is loaded: start the viewer after that, "
                    "it then shows each step as the run writes it")
        if not path.is_dir():
            raise ViewError(f"run folder {path} not found; pass a folder written by `agentrl run` or `agentrl eval`"
                            f"{starting}")
        if not any((path / name).exists() for name in RUN_FILES):
            raise ViewError(f"{path} is not a run folder (none of {', '.join(RUN_FILES)}); pass a folder written by "
                            f"`agentrl run` or `agentrl eval`{starting}")
        self.path = path.resolve()
        self.index = index
        self.name = path.name if path.name not in ("", ".") else str(self.path)
        self._lock = threading.Lock()  # uvicorn serves requests from a thread pool: one refresh at a time
        self._state = _State()
        self._tokenizer: Any = None
        self._tokenizer_tried = False

    # ------------------------------------------------------------------ incremental reads

    def _new_lines(self, name: str) -> list[tuple[int, int, str]]:
        """(line number, byte offset, text) of the complete lines `name` gained since the last call."""
        path = self.path / name
        tail = self._state.tails.setdefault(name, _Tail())
        try:
            size = path.stat().st_size
        except OSError:
            return []
        if size < tail.size:  # rewritten: start over
            self._reset(name)
            tail = self._state.tails.setdefault(name, _Tail())
        if size == tail.offset:
            tail.size = size
            return []
        with open(path, "rb") as f:
            f.seek(tail.offset)
            chunk = f.read(size - tail.offset)
        out = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break  # a line still being written: read it when its newline arrives
            tail.lineno += 1
            out.append((tail.lineno, tail.offset + start, chunk[start:end].decode("utf-8", "replace")))
            start = end + 1
        tail.offset += start
        tail.size = size
        return out

    def _reset(self, name: str) -> None:
        state = self._state
        state.tails.pop(name, None)
        state.problems.pop(name, None)
        if name == "metrics.jsonl":
            state.metrics = []
        elif name == "trajectories.jsonl":
            state.episodes, state.group_counts = [], {}
        elif name == TOKEN_FILE:
            state.samples = {}

    def _problem(self, name: str, lineno: int, message: str) -> None:
        found = self._state.problems.setdefault(name, [])
        if len(found) < 20:  # a file of garbage is named by its first lines, not a page of them
            found.append(f"{name}:{lineno}: {message}")

    def refresh(self) -> None:
        """Read what the run's JSONL files gained since the last call."""
        with self._lock:
            for lineno, _, text in self._new_lines("metrics.jsonl"):
                row = self._json_line("metrics.jsonl", lineno, text)
                if row is None:
                    continue
                if "event" in row:  # trainer restarts and the like: not a step
                    continue
                if not isinstance(row.get("step"), int):
                    self._problem("metrics.jsonl", lineno, "not a metrics row (no integer 'step')")
                    continue
                self._state.metrics.append(row)
            for lineno, offset, text in self._new_lines("trajectories.jsonl"):
                d = self._json_line("trajectories.jsonl", lineno, text)
                if d is not None:
                    self._add_episode("trajectories.jsonl", lineno, offset, d)
            for lineno, offset, text in self._new_lines(TOKEN_FILE):
                d = self._json_line(TOKEN_FILE, lineno, text)
                if d is None:
                    continue
                try:
                    key = (int(d["step"]), int(d["policy_version"]), int(d["group_id"]), int(d["episode"]))
                except (KeyError, TypeError, ValueError) as e:
                    self._problem(TOKEN_FILE, lineno, f"not a token-values line ({type(e).__name__}: {e})")
                    continue
                self._state.samples.setdefault(key, []).append(offset)

    def _json_line(self, name: str, lineno: int, text: str) -> dict[str, Any] | None:
        if not text.strip():
            return None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            self._problem(name, lineno, f"not JSON ({e.msg} at column {e.colno})")
            return None
        if not isinstance(d, dict):
            self._problem(name, lineno, f"not a JSON object (a {type(d).__name__})")
            return None
        return d

    def _add_episode(self, name: str, lineno: int, offset: int, d: dict[str, Any]) -> None:
        state = self._state
        try:
            turns = d["turns"]
            version = int(d.get("policy_version", 0))
            step = int(d["train_step"]) if d.get("train_step") is not None else version
            group = int(d["group_id"])
            flags = []
            if any(t.get("finish_reason") == "length" for t in turns):
                flags.append("cut")
            if any(t.get("roundtrip_drift") for t in turns):
                flags.append("drift")
            if any(t.get("new_segment") for t in turns[1:]):
                flags.append("rerender")
            key = (step, group)  # as the trainer counts them (agentrl.training.token_values.episode_indices)
            row = EpisodeRow(
                index=len(state.episodes), step=step, policy_version=version, group_id=group,
                episode=state.group_counts.get(key, 0), seed=int(d["seed"]), task_type=str(d.get("task_type", "")),
                reward=float(d["total_return"]), success=bool(d["success"]), turns=len(turns),
                tokens=sum(len(t["generated_ids"]) for t in turns), truncated=bool(d.get("truncated", False)),
                flags=tuple(flags), offset=offset)
        except (KeyError, TypeError, ValueError) as e:
            self._problem(name, lineno, f"not a saved trajectory ({type(e).__name__}: {e})")
            return
        state.group_counts[key] = row.episode + 1
        state.episodes.append(row)

    # ------------------------------------------------------------------ what the pages read

    @property
    def problems(self) -> list[str]:
        """Lines that could not be read, named by file and line number."""
        self.refresh()
        return [p for found in self._state.problems.values() for p in found]

    def metrics(self, since: int = 0) -> list[dict[str, Any]]:
        """The metrics rows from the `since`-th on (event lines left out), non-finite numbers as None."""
        self.refresh()
        rows = self._state.metrics[since:]
        return [{k: (_finite(v) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]

    def episodes(self) -> list[EpisodeRow]:
        """Every episode read so far, in file order."""
        self.refresh()
        return list(self._state.episodes)

    def episode(self, index: int) -> dict[str, Any]:
        """The saved trajectory of episode `index`, as written (plain JSON).

        Raises:
            KeyError: no such episode.
        """
        self.refresh()
        if not 0 <= index < len(self._state.episodes):
            raise KeyError(index)
        with open(self.path / "trajectories.jsonl", "rb") as f:
            f.seek(self._state.episodes[index].offset)
            return json.loads(f.readline())

    def token_samples(self, row: EpisodeRow) -> list[dict[str, Any]]:
        """The recorded token values of an episode's samples (sorted by sample index; empty when none)."""
        self.refresh()
        out = []
        with self._lock:
            offsets = list(self._state.samples.get(row.key, ()))
        if not offsets:
            return []
        with open(self.path / TOKEN_FILE, "rb") as f:
            for offset in offsets:
                f.seek(offset)
                out.append(json.loads(f.readline()))
        return sorted(out, key=lambda s: s.get("sample", 0))

    def recorded_keys(self) -> set[tuple[int, int, int, int]]:
        """The (step, policy version, group, episode) of every episode with recorded token values."""
        self.refresh()
        return set(self._state.samples)

    @property
    def has_token_values(self) -> bool:
        """Whether the run records per-token values (runs from before the viewer do not)."""
        return (self.path / TOKEN_FILE).exists()

    def text(self, name: str, limit: int = 200_000) -> str | None:
        """A small file of the run as text (config.yaml, plan.json), None when absent."""
        path = self.path / name
        if not path.is_file():
            return None
        return path.read_text(encoding="utf-8", errors="replace")[:limit]

    def results(self) -> tuple[dict[str, Any] | None, str]:
        """The eval results (results.json) and, when it cannot be read, why."""
        path = self.path / "results.json"
        if not path.is_file():
            return None, ""
        try:
            results = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            return None, f"results.json:{e.lineno}: not valid JSON ({e.msg})"
        missing = [k for k in ("overall", "episodes", "sampling", "env", "tasks") if k not in results]
        if missing:
            return None, f"results.json: not an agentrl eval result (missing {', '.join(missing)})"
        return results, ""

    def lacks(self) -> list[str]:
        """What this folder does not hold that the viewer could show, in words."""
        out = []
        if not (self.path / "metrics.jsonl").exists() and not (self.path / "results.json").exists():
            out.append("no metrics.jsonl yet: no curves")
        if not (self.path / "trajectories.jsonl").exists():
            out.append("no trajectories.jsonl: no episodes (the run was started with save_trajectories: false?)")
        elif not self.has_token_values:
            out.append("no token_values.jsonl: tokens are shown with their loss mask and the sampler's log-probs "
                       "only (the run predates per-token recording, or recorded none); trainer log-probs, IS "
                       "weights, advantages and entropies need a run that records them")
        return out

    def model_name(self) -> str:
        """The model the run trained or evaluated (config.yaml's ``model``, results.json's model name)."""
        config = self.text("config.yaml") or ""
        for line in config.splitlines():
            if line.startswith("model:"):
                return line.split(":", 1)[1].strip().strip("'\"")
        results, _ = self.results()
        return str(results["model"]["name"]) if results else ""

    def tokenizer(self) -> Any:
        """The run's tokenizer, to show token text (None when it cannot be loaded without a network)."""
        if self._tokenizer_tried:
            return self._tokenizer
        self._tokenizer_tried = True
        self._tokenizer = _load_tokenizer(self.path, self.model_name())
        return self._tokenizer


def _load_tokenizer(run: Path, model: str) -> Any:
    """The checkpoint's tokenizer, else the model's when it is a built-in or a local folder (never the network)."""
    try:
        from transformers import AutoTokenizer

        for folder in (run / "checkpoint", Path(model).expanduser() if model else None):
            if folder is not None and (folder / "tokenizer_config.json").is_file():
                return AutoTokenizer.from_pretrained(str(folder))
        if model.startswith("tiny-qwen3"):
            from agentrl.models import load_qwen3_tokenizer

            return load_qwen3_tokenizer()
        if model:
            return AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure means the same: show ids without text
        return None
    return None


def open_runs(paths: list[str | Path]) -> list[RunFolder]:
    """`RunFolder`s for `paths`, in order.

    Raises:
        ViewError: one of them is missing or not a run folder (the first such is named); no paths given.
    """
    if not paths:
        raise ViewError("name at least one run folder: agentrl view RUN [RUN ...]")
    return [RunFolder(p, i) for i, p in enumerate(paths)]
