"""What an eval protocol is: the frozen settings a comparison between two evaluations depends on, and their hash.

An `EvalProtocol` pins, as data: the env and its arguments (step limit included), the split, the task panel (its seeds
and a fingerprint of the tasks they give, which is the env's version as far as the panel is concerned), the model calls
per episode, the context and token budgets, every sampling setting and the sampler seed, the samples per task, and the
interval methods. Its hash (`EvalProtocol.hash`) covers every setting after loading, not the description or the
provenance. `ProtocolRun` is a protocol as one evaluation ran it, with the command line's overrides. The shipped
protocols and how a file is read: `agentrl.protocols.registry`.

Choices, and why:
    * Every setting must be written out: a missing key is refused rather than taken from a default, so a default
      changing in the code cannot move a protocol silently (it would change the hash and fail the pin).
    * The panel is ``seed_offset, seed_offset + 1, ...``: a pure function of the protocol, whatever the runner count,
      engine replicas or batch size. Each episode's sampler seed is a function of its place in the panel (see
      `agentrl.recipes.evaluate._collect`), so with an engine that seeds per request (vLLM) the samples do not
      depend on them either.
    * The fingerprint hashes the first observation of every panel task; evaluation recomputes it before the model
      loads (milliseconds to seconds) and refuses to run a protocol whose env no longer gives the same tasks.
    * Sampling under a protocol ignores the model's ``generation_config.json``: the protocol names every value.
    * Thinking may be left to the model family's default (``thinking: null``): the chat template decides, and the
      results record what was used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ProtocolError", "EvalProtocol", "ProtocolEnv", "ProtocolTasks", "ProtocolContext", "ProtocolSampling",
    "ProtocolIntervals", "ProtocolRun", "OVERRIDABLE", "panel_fingerprint",
]

OVERRIDABLE = ("episodes", "ks", "samples_per_task", "env_kwargs", "split", "max_turns", "max_new_tokens",
               "seed_offset", "seed", "thinking", "sampling")
"""Protocol settings a command line may change; a result so made is labelled "NAME + overrides"."""


class ProtocolError(ValueError):
    """A protocol that cannot be found or read; the message names the file or the name and what to do."""


@dataclass(frozen=True)
class ProtocolEnv:
    """The env under test.

    Attributes:
        id: registry id.
        kwargs: constructor arguments, the env's own step limit (``max_steps``) included; ``split`` goes in `split`.
        split: held-out split (as the env names it, e.g. ALFWorld's ``valid_seen``); None for envs without splits.
        max_turns: model calls per episode.
    """

    id: str
    kwargs: Mapping[str, Any]
    split: str | None
    max_turns: int


@dataclass(frozen=True)
class ProtocolTasks:
    """The pinned task panel and how often each task is played.

    Attributes:
        seed_offset: the first task seed.
        count: tasks in the panel (seeds ``seed_offset .. seed_offset + count - 1``).
        samples_per_task: episodes per task (n of pass@k).
        ks: the k of pass@k reported.
        fingerprint: sha256 of the panel's first observations (`panel_fingerprint`); empty = not pinned.
    """

    seed_offset: int
    count: int
    samples_per_task: int
    ks: tuple[int, ...]
    fingerprint: str

    def seeds(self) -> tuple[int, ...]:
        """The panel's task seeds, in order."""
        return tuple(range(self.seed_offset, self.seed_offset + self.count))


@dataclass(frozen=True)
class ProtocolContext:
    """Prompt and token budgets.

    Attributes:
        max_context_tokens: an episode whose prompt would grow past this is truncated.
        max_new_tokens: per turn.
        recap_actions: `agentrl.config.ContextConfig.recap_actions` (0 = none).
        history: `agentrl.config.ContextConfig.history` (``template`` or ``as_sampled``).
    """

    max_context_tokens: int
    max_new_tokens: int
    recap_actions: int
    history: str


@dataclass(frozen=True)
class ProtocolSampling:
    """Every sampling setting, the sampler seed and the thinking mode (None = the model family's default)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int
    thinking: bool | None

    def values(self) -> dict[str, float]:
        """The settings the engine receives (`agentrl.recipes.evaluate.SAMPLING_KEYS`)."""
        return {k: v for k, v in asdict(self).items() if k not in ("seed", "thinking")}


@dataclass(frozen=True)
class ProtocolIntervals:
    """How every reported number's interval is computed.

    Attributes:
        success: success rates (``wilson``).
        means: mean reward, turns, tokens (``student-t``).
        pass_at_k: pass@k over tasks (``bootstrap-percentile``).
        confidence: level of every interval.
    """

    success: str
    means: str
    pass_at_k: str
    confidence: float


@dataclass(frozen=True)
class EvalProtocol:
    """One named protocol, as loaded from ``NAME.yaml``.

    Attributes:
        name: the protocol's name (the file's stem for shipped ones).
        description: one paragraph: what it measures.
        provenance: where each setting comes from (papers, files read, results it reproduces) and known departures.
        env, tasks, context, sampling, intervals: the settings; see each class.
        path: the file it was read from (not hashed).
    """

    name: str
    description: str
    provenance: Mapping[str, Any]
    env: ProtocolEnv
    tasks: ProtocolTasks
    context: ProtocolContext
    sampling: ProtocolSampling
    intervals: ProtocolIntervals
    path: str = field(default="", compare=False)

    def settings(self) -> dict[str, Any]:
        """Every setting, as plain data (what the hash covers)."""
        return {"env": asdict(self.env), "tasks": asdict(self.tasks), "context": asdict(self.context),
                "sampling": asdict(self.sampling), "intervals": asdict(self.intervals)}

    @property
    def hash(self) -> str:
        """sha256 of the settings as canonical JSON (sorted keys): the protocol's identity beside its name."""
        canonical = json.dumps(self.settings(), sort_keys=True, separators=(",", ":"), default=list)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def env_kwargs(self) -> dict[str, Any]:
        """The env's constructor arguments, the split included (as `agentrl.make` takes them)."""
        return {**self.env.kwargs, **({"split": self.env.split} if self.env.split else {})}

    def fingerprint_now(self) -> str:
        """The panel's fingerprint as this machine's env gives it (compare with ``tasks.fingerprint``)."""
        import agentrl

        env = agentrl.make(self.env.id, **self.env_kwargs())
        try:
            return panel_fingerprint(env, self.tasks.seeds())
        finally:
            env.close()

    def summary(self) -> str:
        """One line for listings: env, split, tasks, step limit, temperature."""
        e, t, s = self.env, self.tasks, self.sampling
        split = f"/{e.split}" if e.split else ""
        steps = e.kwargs.get("max_steps", e.max_turns)
        return (f"{e.id}{split}, {t.count} tasks x {t.samples_per_task} from seed {t.seed_offset:,}, "
                f"{steps} steps, T={s.temperature:g}")


@dataclass(frozen=True)
class ProtocolRun:
    """A protocol as an evaluation ran it: the protocol and what the command line changed.

    Attributes:
        protocol: the protocol.
        overrides: setting -> value given on top of it (empty: the protocol as named).
    """

    protocol: EvalProtocol
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``NAME``, or ``NAME + overrides`` when anything was changed: a result never claims a protocol it left."""
        return self.protocol.name + (" + overrides" if self.overrides else "")

    def to_dict(self, fingerprint: str) -> dict[str, Any]:
        """What results.json records under ``protocol``."""
        return {"name": self.protocol.name, "hash": self.protocol.hash, "label": self.label,
                "overrides": dict(self.overrides), "panel_fingerprint": fingerprint,
                "pinned_fingerprint": self.protocol.tasks.fingerprint, "settings": self.protocol.settings()}


def panel_fingerprint(env, seeds: Sequence[int]) -> str:
    """sha256 over each task's seed and first observation: the same on every machine iff the env gives the same tasks.

    Args:
        env: an env made with the protocol's arguments (``agentrl.make(protocol.env.id, **kwargs)``); it is reset once
            per seed, in this process, without a model (milliseconds per task for the built-in envs).
        seeds: the panel's task seeds.
    """
    digest = hashlib.sha256()
    for seed in seeds:
        observation, _ = env.reset(seed=int(seed))
        digest.update(f"{int(seed)}\t{hashlib.sha256(observation.encode()).hexdigest()}\n".encode())
    return digest.hexdigest()
