"""`agentrl eval`'s config: `EvalConfig`, the root of ``agentrl eval``'s flags, and the sections only eval has.

Apart from `agentrl.recipes.evaluate` (which runs it and re-exports these names) so that building the command line
and its ``--help`` imports no engine: each field here is a flag (`agentrl.cli.flags`), its docstring the flag's help,
its default the command's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from agentrl.config import (
    HELD_OUT_SEED_START,
    ContextConfig,
    EngineConfig,
    EnvConfig,
    LogConfig,
    RewardConfig,
    RunnersConfig,
)
from agentrl.protocols.protocol import ProtocolRun  # at run time: the config is rebuilt from its type hints

__all__ = ["EVAL_SEED_OFFSET", "SAMPLING_KEYS", "EvalError", "EvalEnvConfig", "eval_env", "SamplingOverrides",
           "EvalConfig"]

EVAL_SEED_OFFSET = HELD_OUT_SEED_START
"""First eval task seed: far above the seeds training draws (0, 1, 2, ...), which the run's config keeps below it."""

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty")
"""The generation_config.json keys that set sampling (vLLM reads the same ones)."""


class EvalError(ValueError):
    """Bad evaluation input (unknown split, k larger than the samples per task, ...); the message says which."""


@dataclass
class EvalEnvConfig(EnvConfig):
    """The env an evaluation plays: `EnvConfig` on held-out task seeds, with eval's own episode budget."""

    seed_offset: int = EVAL_SEED_OFFSET
    """First task seed; eval's start far above the seeds training draws (0, 1, 2, ...), so no training task is
    replayed."""
    max_turns: int = 20
    """Model calls per episode (envs with their own step budget end sooner: WebShop 15, GUI 25)."""


def eval_env(env_id: str, kwargs: Mapping[str, Any] | None = None, *, max_turns: int | None = None,
             seed_offset: int | None = None) -> EvalEnvConfig:
    """The `env` section of an evaluation: `env_id` with `kwargs`; what is not given, `EvalEnvConfig`'s defaults."""
    given = {"max_turns": max_turns, "seed_offset": seed_offset}
    return EvalEnvConfig(id=env_id, kwargs=dict(kwargs or {}), **{k: v for k, v in given.items() if v is not None})


@dataclass(frozen=True, eq=False)
class SamplingOverrides(Mapping[str, Any]):
    """Sampling settings that replace the model's official ones; unset (None) keeps the official value.

    As a mapping it holds the settings that are set, which is what `official_sampling` takes as ``overrides``.
    """

    temperature: float | None = None
    """Sampling temperature (0 = greedy)."""
    top_p: float | None = None
    """Nucleus sampling mass (1 = off)."""
    top_k: int | None = None
    """Top-k sampling (0 = off)."""
    min_p: float | None = None
    """Min-p sampling (0 = off)."""
    repetition_penalty: float | None = None
    """Repetition penalty (1 = off)."""
    presence_penalty: float | None = None
    """Presence penalty (0 = off)."""
    frequency_penalty: float | None = None
    """Frequency penalty (0 = off)."""

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> SamplingOverrides:
        """The overrides in `settings` (setting name -> value; None values count as unset).

        Raises:
            EvalError: a name that is not a sampling setting.
        """
        if isinstance(settings, SamplingOverrides):
            return settings
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise EvalError(f"unknown sampling setting {unknown[0]!r}; known: {', '.join(SAMPLING_KEYS)}")
        return cls(**settings)

    def _set(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __getitem__(self, key: str) -> Any:
        """The value of a setting that is set (KeyError otherwise)."""
        return self._set()[key]

    def __iter__(self):
        """The names of the settings that are set, in field order."""
        return iter(self._set())

    def __len__(self) -> int:
        """How many settings are set."""
        return len(self._set())

    def __repr__(self) -> str:
        """``SamplingOverrides(temperature=0.2)``: the settings that are set."""
        return f"SamplingOverrides({', '.join(f'{k}={v!r}' for k, v in self.items())})"


@dataclass(frozen=True)
class EvalConfig:
    """What `agentrl eval` runs: RL's `env`, `engine`, `runners`, `context`, `reward` and `log` sections, and its own.

    Every field is a flag of ``agentrl eval`` (`agentrl.cli.flags`): ``--episodes``, ``--env.max-turns``, ...
    """

    model: str
    """A built-in (smollm2-135m, tiny-qwen3), a run's ``checkpoint/`` folder, or a hub id."""
    env: EvalEnvConfig = field(default_factory=EvalEnvConfig)
    """The env, its arguments, the first task seed and the model calls per episode. `EvalEnvConfig` starts at the
    held-out seeds (`EVAL_SEED_OFFSET`): an `EnvConfig` given here keeps its own seed offset (RL's 0 unless it says
    otherwise)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The engine kind (``auto``: vLLM where it serves the model, else HF; the results record the kind used; the
    sampler seed reproduces results within one kind, not across), replicas (more than one runs them as Ray actors, as
    ``agentrl run --engines`` does), precision (empty: the model's) and batch size."""
    runners: RunnersConfig = field(default_factory=RunnersConfig)
    """Concurrent env runners in Ray actors, as in training (0 = envs in this process)."""
    context: ContextConfig | None = None
    """How prompts are built (a mapping of `ContextConfig` fields); unset: the training run's own (from
    ``RUN/config.yaml`` when `model` is ``RUN/checkpoint``), else the defaults."""
    split: str | None = None
    """Held-out split; unset: ``test`` where the env has splits."""
    episodes: int = 32
    """Tasks (env seeds) to evaluate."""
    ks: tuple[int, ...] = (1,)
    """The k of pass@k to report, comma-separated (``--k 1,4,8``)."""
    samples_per_task: int | None = None
    """Episodes per task (n of pass@k); unset: the largest k."""
    max_new_tokens: int = 256
    """New tokens per turn. Eval samples at the model's official settings, not the training sampler's, so this is
    eval's own budget rather than RL's `sampling` section."""
    max_context_tokens: int = 4096
    """An episode whose prompt grows past this is truncated; eval's own, so that every model compared (a base model
    has no run to take one from) plays under the same budget."""
    seed: int = 0
    """Sampler seed (the same seed gives the same results)."""
    thinking: bool | None = None
    """Force thinking on or off; unset: what the checkpoint trained with, else the family's default."""
    sampling_overrides: SamplingOverrides = field(default_factory=SamplingOverrides)
    """Settings that replace the model's official sampling (``--temperature 1.0``), each recorded as a flag's."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """How each episode is scored: the env's rule reward, or combined with a judge model's score, with the flags of
    ``agentrl run`` (``--reward.judge.endpoint URL --reward.judge.model NAME``, weights, gate, budget;
    `agentrl.rewards.judge`). With `reward_from_run` on, an evaluation of ``RUN/checkpoint`` scores as the run
    trained: its config.yaml's ``reward`` section, ``--reward.*`` flags given on top of it changing it key by key.
    Judged scores are cached in the output folder (``judge_cache.jsonl``), so a rerun into it pays only for episodes
    it has not judged; the budget counts every call made into that folder. An episode whose judgement failed is
    never scored: its task is left out, as training drops its group, and counted."""
    reward_from_run: bool = False
    """Score an evaluation of ``RUN/checkpoint`` with the training run's judge (its config.yaml's ``reward``
    section) when no judge is given. Off by default because a run folder may come from anyone: its judge section
    names an endpoint the episodes are sent to, an environment variable sent there as the bearer token, and a
    rubric file read from this machine. Turn it on (``--reward-from-run``) for runs you trust; off, the env's rule
    reward alone, and the evaluation prints the run's judge and this flag."""
    ray_address: str | None = None
    """Ray cluster to join for env runners and engines (as in training); unset: the one ``RAY_ADDRESS`` names, else a
    local Ray when needed."""
    output: str = "runs/eval"
    """Folder for results.json, report.html and trajectories.jsonl."""
    confidence: float = 0.95
    """Level of every interval."""
    transcripts: int = 6
    """Sampled episodes shown in the report."""
    log: LogConfig = field(default_factory=LogConfig)
    """Experiment trackers that also get the results, the settings and the episodes (`agentrl.trackers`)."""
    protocol: ProtocolRun | None = field(default=None, metadata={"flag": False})
    """The named protocol this evaluation runs (``--protocol NAME``; build the config with `from_protocol`), with
    the overrides given on top of it; None = no protocol. Under a protocol the env's arguments are the protocol's
    (not the training run's), its sampling replaces the model's official settings, and the panel's fingerprint is
    checked before the model loads."""

    def __post_init__(self) -> None:
        # A plain mapping ({"temperature": 1.0}, as callers and YAML give it) becomes the typed overrides.
        object.__setattr__(self, "sampling_overrides", SamplingOverrides.of(self.sampling_overrides))

    @property
    def n(self) -> int:
        """Samples per task."""
        return self.samples_per_task if self.samples_per_task is not None else max(self.ks)

    def validate(self) -> None:
        """Raise `EvalError` naming the first bad field (the sections check their own fields when built)."""
        if self.episodes < 1:
            raise EvalError(f"--episodes must be >= 1, got {self.episodes}")
        if not self.ks or min(self.ks) < 1:
            raise EvalError(f"--k must list positive integers, got {list(self.ks)}")
        if self.n < max(self.ks):
            raise EvalError(f"pass@{max(self.ks)} needs at least {max(self.ks)} samples per task, "
                            f"got --samples-per-task {self.n}")
        if self.max_new_tokens < 1 or self.max_context_tokens < 1:
            raise EvalError(f"--max-new-tokens and max_context_tokens must be >= 1, got {self.max_new_tokens}, "
                            f"{self.max_context_tokens}")
        if not 0 < self.confidence < 1:
            raise EvalError(f"confidence must be in (0, 1), got {self.confidence}")
