"""`agentrl sft`: supervised fine-tuning on demonstrations, the warm start before RL.

Demonstrations come from the env's expert (`TextEnv.expert_action`), from a JSONL of trajectories saved by
`agentrl.records.save_trajectories` (a run's ``trajectories.jsonl``), or from a JSONL of chat conversations
(``{"messages": [{"role": ..., "content": ...}, ...]}`` per line). Every one of them becomes a `Trajectory` built
exactly as a rollout builds it: the same `ChatContext` renders each turn's prompt (history rewrites, new segments,
observation roles included), and each turn's `generated_ids` are the tokens the model would have emitted for the
expert's action, end-of-turn token included. `agentrl.chat.samples.trajectory_to_samples` then turns them into the very
samples RL trains on, so the loss mask is RL's: 1 exactly on the agent's own tokens.

The loss is the mean negative log-likelihood of those tokens over the batch (`sft_loss`). It runs through RL's
training backend (`agentrl.training.backend`, as a `LikelihoodObjective`): in this process (``trainers: 0``) or on
FSDP2 worker actors over Ray (``--trainers N``), which give the same update. A run folder gets
metrics.jsonl (one line per optimizer step), curves.png, checkpoint/ (the layout of `agentrl run`, so
``agentrl run --model RUN/checkpoint`` and ``agentrl eval --model RUN/checkpoint`` take it), sft_config.yaml,
config.yaml (its model, env, sampling and context sections in RL's layout: `agentrl eval` rebuilds the prompts from it),
sampling.json, summary.json and eval/ (held-out success through `agentrl.recipes.evaluate`).

Choices, and why:
    * Only successful expert episodes are kept: a demonstration that fails is not gold. How many were dropped is
      reported.
    * Every sample of a trajectory is one sequence; the loss divides by the loss tokens of the whole optimizer batch
      (a global denominator, as in the RL trainer), so neither the micro-batch grouping nor the number of trainer
      workers changes the gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import yaml

from agentrl.chat.context import ChatContext
from agentrl.chat.layout import resolve_context
from agentrl.chat.parsers import ToolCall
from agentrl.chat.samples import trajectory_to_samples
from agentrl.cluster import check_cpu_workers
from agentrl.config import (
    ConfigError,
    ContextConfig,
    EnvConfig,
    LogConfig,
    OptimConfig,
    SamplingConfig,
    TrainerConfig,
    load_yaml,
)
from agentrl.envs.core import TextEnv
from agentrl.envs.registry import short_name
from agentrl.records import Sample, Trajectory, Turn, load_trajectories
from agentrl.trackers.runlog import RunLog, clear_tracker_files
from agentrl.training.backend import TrainingBackend
from agentrl.training.metrics import plot_metrics
from agentrl.training.plan import TrainerPlan

__all__ = ["SFTConfig", "SFTError", "load_sft_config", "reply_ids", "expert_trajectory", "expert_demonstrations",
           "load_demonstrations", "conversation_trajectory", "sft_loss", "demonstration_nll", "run_sft",
           "plot_sft_curves"]


class SFTError(ValueError):
    """Bad SFT input (no demonstrations, a malformed data file, a bad setting); the message says which and how."""


@dataclass
class SFTConfig:
    """Everything `agentrl sft` needs: RL's sections where they mean the same, and the settings only SFT has.

    `env`, `sampling` and `context` are RL's (the same turn and context budgets, chat family, observation role and
    thinking mode, so demonstrations are rendered exactly as RL will render the episodes); `trainer` and `optim` are
    RL's too (workers, precision, micro-batch tokens, memory; AdamW), so SFT trains through the same backend.
    """

    MOVED: ClassVar[dict[str, str]] = {
        **{f"rollout.{k}": v for k, v in (("max_turns", "env.max_turns"), ("max_new_tokens", "sampling.max_new_tokens"),
                                           ("max_context_tokens", "context.max_context_tokens"))},
        **{k: f"trainer.{k}" for k in ("micro_batch_tokens", "micro_batch_size", "gradient_checkpointing",
                                        "memory_limit_gb", "dtype", "compute_dtype")},
        **{k: f"optim.{k}" for k in ("lr", "weight_decay", "grad_clip")},
        "trainers": "trainer.workers",
    }
    """Keys of the earlier flat layout and where they live now."""

    model: str = "smollm2-135m"
    """A built-in, a local Hugging Face folder (a checkpoint included) or a hub id."""
    env: EnvConfig = field(default_factory=EnvConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-5))
    data: str = ""
    """A JSONL of demonstrations (saved trajectories or chat messages); empty: the env's expert plays."""
    demos: int = 32
    """Expert episodes to play (train split seeds `env.seed_offset`, ...); unsuccessful ones are dropped."""
    epochs: int = 3
    """Passes over the demonstrations."""
    batch_size: int = 8
    """Samples per optimizer step."""
    warmup_steps: int = 2
    """Optimizer steps of linear learning-rate warm-up (then `optim.lr`, constant)."""
    val_demos: int = 0
    """Expert episodes on the held-out split (eval seeds) whose agent-token NLL is measured before and after training:
    a validation loss that costs one forward pass per episode, far less than `eval_episodes` rollouts."""
    max_seconds: float = 0.0
    """Wall-clock bound on the training loop (0 = none): the run stops after the step that crosses it, checkpoints
    and evaluates as usual, and says so in summary.json."""
    eval_episodes: int = 32
    """Held-out tasks to evaluate the checkpoint on (0 = skip)."""
    eval_temperature: float | None = None
    """Sampling temperature for the held-out evaluation; None = the model's official setting."""
    seed: int = 0
    """Seeds torch, the sample order and the evaluation sampler."""
    output: str = ""
    """Run folder; empty: a new ``runs/sft-<env>-<model>-<date>-<time>``."""
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("demos", "warmup_steps", "eval_episodes", "max_seconds", "val_demos"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.optim.n_minibatches != 1:
            raise ConfigError("optim.n_minibatches is RL's (updates per rollout batch); SFT steps once per batch_size")
        if self.trainer.gpus_per_worker:
            raise ConfigError("trainer.gpus_per_worker: SFT trainer workers run on CPU; leave it 0")
        if not self.data and self.demos < 1:
            raise ConfigError("demos must be >= 1 when no data file is given (the expert plays that many episodes)")


def load_sft_config(path: str | Path | None = None) -> SFTConfig:
    """Defaults, updated by the YAML file at `path` (if any); errors name the file and the key."""
    return load_yaml(SFTConfig, path, "SFT settings")


# ---- demonstrations -> trajectories ----------------------------------------------------------------------------


def _render(context: ChatContext, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    if context.family is not None:
        return context.family.render(messages, add_generation_prompt=add_generation_prompt, tools=context.tools,
                                     **context.chat_kwargs)
    extra = {"tools": context.tools} if context.tools else {}
    kwargs = {k: v for k, v in context.chat_kwargs.items() if k != "strftime_now"}  # as ChatContext renders
    return context.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                 **extra, **kwargs)


def _tool_call_of(context: ChatContext, action: str) -> ToolCall | None:
    """The function call an expert's action makes, when the context declares tools its family can call."""
    if not (context.tools and context.family is not None and context.family.max_tool_calls):
        return None
    try:
        value = json.loads(action)
    except (json.JSONDecodeError, TypeError):
        return None
    if isinstance(value, dict) and set(value) == {"name", "arguments"} and isinstance(value["arguments"], dict):
        return ToolCall(str(value["name"]), value["arguments"])
    return None


def reply_ids(context: ChatContext, content: str) -> list[int]:
    """The ids a model would generate for the assistant message `content` after the context's current prompt.

    In an env that declares tools (``info["tools"]``), an expert action that is a function call
    (``{"name": ..., "arguments": {...}}`` JSON, what `ChatContext.action_from_reply` gives the env) becomes the call
    written in the family's own tool-call syntax, so SFT teaches the model to call the tool, not to type JSON.

    The template says what a reply looks like: rendering the history plus the assistant message, minus the prompt
    (which ends with the generation header), is the reply text, cut after the end-of-turn marker. So a Qwen3 reply
    in thinking mode carries its (empty) ``<think>`` span, one in non-thinking mode does not, and ChatML replies end
    with ``<|im_end|>``, exactly as the engine would return them.

    Raises:
        SFTError: when the template does not render the reply after the prompt (it cannot be imitated token by token).
    """
    call = _tool_call_of(context, content)
    if call is not None:
        assert context.family is not None
        text = context.family.write_reply(context.messages, "", "", [call], tools=context.tools, **context.chat_kwargs)
        return context.tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = context.text
    full = _render(context, context.messages + [{"role": "assistant", "content": content}], False)
    if not full.startswith(prompt):
        raise SFTError(f"the {context.family_name} template does not render an assistant reply after the prompt it "
                       f"gives the model; cannot build demonstration tokens for {content[:60]!r}")
    reply = full[len(prompt):]
    markers = context.family.end_of_turn if context.family else (getattr(context.tokenizer, "eos_token", None),)
    ends = [reply.index(m) + len(m) for m in markers if m and m in reply]
    if ends:  # the first end-of-turn marker closes the reply; what the template adds after it is the next turn's
        reply = reply[: min(ends)]
    return context.tokenizer(reply, add_special_tokens=False)["input_ids"]


def expert_trajectory(env: TextEnv, env_id: str, seed: int, tokenizer, *, chat_kwargs: dict[str, Any] | None = None,
                      context_options: dict[str, Any] | None = None, max_turns: int = 50,
                      max_context_tokens: int = 4096) -> Trajectory:
    """Play one episode with the env's expert, recorded as the rollout would record a model playing it.

    Turns, truncation and the context budget follow `agentrl.rollout.loop.run_rollout`; the env receives the action text
    a model's reply would give it (`ChatContext.action_from_reply`), so the demonstration is exactly reproducible by the
    policy. Rollout log-probs are 0 (the expert is not a sampling distribution; SFT does not use them).
    """
    obs, info = env.reset(seed=seed)
    context = ChatContext(tokenizer, env.system_prompt, chat_kwargs, **(context_options or {}))
    prompt, new_segment = context.first_prompt(obs, info), False
    turns: list[Turn] = []
    success = terminated = truncated = False
    while True:
        generated = reply_ids(context, env.expert_action())
        action = context.action_from_reply(generated)
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, step_info = env.step(action)
        turns.append(Turn(tuple(prompt), tuple(generated), (0.0,) * len(generated), action, obs, float(reward),
                          new_segment=new_segment, env_seconds=time.perf_counter() - t0))
        if terminated or truncated:
            success = bool(step_info.get("success", False))
            break
        if len(turns) >= max_turns:
            truncated = True
            break
        prompt, new_segment = context.next_prompt(generated, obs)
        if len(prompt) > max_context_tokens:
            truncated = True
            break
    return Trajectory(env_id=env_id, seed=seed, group_id=seed, turns=tuple(turns), first_observation=context.goal,
                      total_return=sum(t.reward for t in turns), success=success, terminated=terminated,
                      truncated=truncated, task_type=str(info.get("task_type", "")))


def expert_demonstrations(make_env: Callable[[], TextEnv], env_id: str, seeds: Sequence[int], tokenizer,
                          **options: Any) -> list[Trajectory]:
    """One expert episode per seed (see `expert_trajectory` for `options`), successful or not."""
    env = make_env()
    try:
        return [expert_trajectory(env, env_id, int(seed), tokenizer, **options) for seed in seeds]
    finally:
        env.close()


def conversation_trajectory(messages: Sequence[dict[str, Any]], tokenizer, *, env_id: str = "conversation",
                            index: int = 0, chat_kwargs: dict[str, Any] | None = None,
                            context_options: dict[str, Any] | None = None) -> Trajectory:
    """A chat conversation as a trajectory; only the assistant messages carry loss.

    The shape: an optional system message, a user message, then assistant replies each followed by an observation
    (``user`` or ``tool``; the last reply may end the conversation).

    Raises:
        SFTError: a conversation that does not have that shape, saying where.
    """
    msgs = list(messages)
    system = ""
    if msgs and msgs[0].get("role") == "system":
        system = str(msgs.pop(0).get("content", ""))
    roles = [m.get("role") for m in msgs]
    if not msgs or roles[0] != "user" or "assistant" not in roles:
        raise SFTError(f"conversation {index}: expected [system], user, assistant, ... (got roles {roles})")
    context = ChatContext(tokenizer, system, chat_kwargs, **(context_options or {}))
    prompt, new_segment = context.first_prompt(str(msgs[0]["content"])), False
    turns: list[Turn] = []
    i = 1
    while i < len(msgs):
        if roles[i] != "assistant":
            raise SFTError(f"conversation {index}, message {i + 1}: expected an assistant reply, got {roles[i]!r}")
        generated = reply_ids(context, str(msgs[i]["content"]))
        action = context.action_from_reply(generated)
        observation = str(msgs[i + 1]["content"]) if i + 1 < len(msgs) else ""
        if i + 1 < len(msgs) and roles[i + 1] not in ("user", "tool"):
            raise SFTError(f"conversation {index}, message {i + 2}: expected user or tool after an assistant "
                           f"reply, got {roles[i + 1]!r}")
        turns.append(Turn(tuple(prompt), tuple(generated), (0.0,) * len(generated), action, observation, 0.0,
                          new_segment=new_segment))
        if i + 1 < len(msgs) - 1:  # another assistant reply follows: its prompt includes this observation
            prompt, new_segment = context.next_prompt(generated, observation, role=roles[i + 1])
        i += 2
    return Trajectory(env_id=env_id, seed=index, group_id=index, turns=tuple(turns), first_observation=context.goal,
                      total_return=0.0, success=True, terminated=True, truncated=False)


def load_demonstrations(path: str | Path, tokenizer, **options: Any) -> list[Trajectory]:
    """Read demonstrations from JSONL: saved trajectories (``{"turns": ...}``) or conversations (``{"messages"}``).

    Saved trajectories are used as they are (their ids must come from this model's tokenizer); conversations are
    rendered with `conversation_trajectory` (`options` are its keyword arguments).

    Raises:
        SFTError: a missing or malformed file, naming it and the line.
    """
    p = Path(path)
    if not p.is_file():
        raise SFTError(f"demonstrations file not found: {p}")
    lines = [(n, line) for n, line in enumerate(p.read_text().splitlines(), 1) if line.strip()]
    if not lines:
        raise SFTError(f"{p} holds no demonstrations")
    try:
        first = json.loads(lines[0][1])
    except json.JSONDecodeError as e:
        raise SFTError(f"{p}:{lines[0][0]}: not JSON ({e})") from None
    if isinstance(first, dict) and "turns" in first:
        try:
            trajectories = load_trajectories(p)
        except ValueError as e:
            raise SFTError(str(e)) from None
        vocab = len(tokenizer)
        for traj in trajectories:
            top = max((max(t.prompt_ids + t.generated_ids, default=0) for t in traj.turns), default=0)
            if top >= vocab:
                raise SFTError(f"{p}: trajectory seed {traj.seed} holds token id {top}, outside this tokenizer's "
                               f"vocabulary ({vocab}): it was saved with another model's tokenizer")
        return trajectories
    out = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SFTError(f"{p}:{n}: not JSON ({e})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise SFTError(f"{p}:{n}: expected a saved trajectory ({{\"turns\": ...}}) or a conversation "
                           f"({{\"messages\": [...]}})")
        try:
            out.append(conversation_trajectory(row["messages"], tokenizer, index=len(out), **options))
        except SFTError as e:
            raise SFTError(f"{p}:{n}: {e}") from None
    return out


# ---- the loss and the loop --------------------------------------------------------------------------------------


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Negative log-likelihood of the agent's tokens, summed over a micro-batch and divided by the batch's count.

    Args:
        logp: `[n, T]` log pi of each next token.
        loss_mask: `[n, T]` 1 on the agent's tokens.
        num_tokens: loss tokens in the whole optimizer batch (a global denominator, so micro-batching is exact).

    Returns:
        A scalar; summed over the micro-batches of a batch it is the batch's mean token NLL.
    """
    return -(logp * loss_mask).sum() / max(num_tokens, 1)  # []


def _lr_at(step: int, lr: float, warmup: int) -> float:
    return lr * min(1.0, (step + 1) / (warmup + 1)) if warmup else lr


def plot_sft_curves(metrics_path: Path, png_path: Path) -> None:
    """Plot the SFT loss (and the learning rate) per optimizer step into a PNG."""
    plot_metrics(metrics_path, png_path, [("loss", "loss (token NLL of the agent's turns)"), ("lr", "learning rate")],
                 f"agentrl sft: {metrics_path.parent.name}", columns=2)


def default_sft_dir(cfg: SFTConfig) -> Path:
    """A fresh folder for a run that named none: runs/sft-<env>-<model>-<date>-<time>."""
    model = Path(cfg.model).name if Path(cfg.model).exists() else cfg.model.replace("/", "_")
    return Path("runs") / f"sft-{short_name(cfg.env.id)}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"


def _context_kwargs(cfg: SFTConfig, policy) -> dict[str, Any]:
    """`chat_kwargs` and `context_options` for `expert_trajectory`, as RL passes them to its rollouts."""
    kwargs = cfg.context.rollout_kwargs(policy.family)
    return {"chat_kwargs": kwargs["chat_kwargs"], "context_options": kwargs["context_options"]}


def _demonstrations(cfg: SFTConfig, policy, out: Path) -> tuple[list[Trajectory], dict[str, Any]]:
    """The demonstrations to train on and a summary of where they came from."""
    import agentrl
    from agentrl.records import save_trajectories

    options = _context_kwargs(cfg, policy)
    if cfg.data:
        trajectories = load_demonstrations(cfg.data, policy.tokenizer, **options)
        source = {"source": cfg.data, "episodes": len(trajectories)}
    else:
        seeds = range(cfg.env.seed_offset, cfg.env.seed_offset + cfg.demos)
        played = expert_demonstrations(lambda: agentrl.make(cfg.env.id, **cfg.env.kwargs), cfg.env.id, seeds,
                                       policy.tokenizer, max_turns=cfg.env.max_turns,
                                       max_context_tokens=cfg.context.max_context_tokens, **options)
        trajectories = [t for t in played if t.success]
        source = {"source": "expert", "episodes": len(played), "dropped_unsuccessful": len(played) - len(trajectories)}
        if not trajectories:
            raise SFTError(f"the {cfg.env.id} expert solved none of {len(played)} episodes within "
                           f"max_turns={cfg.env.max_turns} and max_context_tokens="
                           f"{cfg.context.max_context_tokens}: raise those budgets")
    save_trajectories(trajectories, out / "demonstrations.jsonl", append=False)
    turns = [t for traj in trajectories for t in traj.turns]
    source |= {"kept": len(trajectories), "turns_mean": len(turns) / max(len(trajectories), 1),
               "agent_tokens_mean": sum(len(t.generated_ids) for t in turns) / max(len(trajectories), 1)}
    return trajectories, source


def _validation_samples(cfg: SFTConfig, policy) -> list[Sample]:
    """Samples of successful expert episodes on the env's held-out split, at the eval task seeds."""
    import agentrl
    from agentrl.recipes.evaluate import EVAL_SEED_OFFSET, resolve_split

    kwargs, _ = resolve_split(cfg.env.id, agentrl.spec(cfg.env.id).load(),
                              {k: v for k, v in cfg.env.kwargs.items() if k != "split"}, None)
    played = expert_demonstrations(lambda: agentrl.make(cfg.env.id, **kwargs), cfg.env.id,
                                   range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + cfg.val_demos), policy.tokenizer,
                                   max_turns=cfg.env.max_turns, max_context_tokens=cfg.context.max_context_tokens,
                                   **_context_kwargs(cfg, policy))
    return [s for t in played if t.success for s in trajectory_to_samples(t, 1.0) if s.num_loss_tokens]


def demonstration_nll(backend: TrainingBackend, samples: Sequence[Sample], pad_id: int, token_budget: int, *,
                      packed: bool = False) -> float:
    """Mean negative log-likelihood per agent token of `samples` under the backend's weights (no gradient).

    `packed`: padding-free micro-batches of `token_budget` real tokens (`trainer.packing`).
    """
    from agentrl.training.backend import ScoreRequest
    from agentrl.training.microbatch import collate, pack_by_tokens

    total = sum(s.num_loss_tokens for s in samples)
    batches = [collate([samples[i] for i in chunk], pad_id, packed=packed)
               for chunk in pack_by_tokens([len(s.input_ids) for s in samples], range(len(samples)), token_budget,
                                           packed=packed)]
    scored = backend.score([ScoreRequest(mb) for mb in batches])  # one call: trainer workers share the passes
    return sum(float(sft_loss(s.logp, mb.loss_mask, total)) for s, mb in zip(scored, batches))


def _build_backend(cfg: SFTConfig, policy, plan: TrainerPlan, stack: contextlib.ExitStack) -> TrainingBackend:
    """RL's backend from the `trainer` and `optim` sections and the trainer's plan: one process, or FSDP workers.

    Ray and the workers' devices are joined and reserved as RL does it (`agentrl.cluster.connect_ray`,
    `agentrl.training.placement.reserve_placement`); `stack` releases what this starts. Either backend holds the model
    and its AdamW, so the checkpoint has RL's layout exactly (``shards/`` with workers).
    """
    from agentrl.cluster import connect_ray
    from agentrl.training.factory import build_backend
    from agentrl.training.placement import reserve_placement

    if connect_ray(cfg.trainer):
        import ray

        stack.callback(ray.shutdown)
    placement = reserve_placement(cfg.trainer)
    if placement is not None:
        stack.callback(placement.close)
    # Every worker seeds torch with the run seed before loading, as this process did: random-init built-ins start
    # from the weights a one-process run starts from.
    backend = build_backend(cfg.trainer, cfg.optim, plan, policy=policy, source=cfg.model, placement=placement,
                            seed=cfg.seed)
    stack.callback(backend.close)
    if not backend.trains_in_place:
        policy.model.to("meta")  # the workers own the trained weights; a replica here would only cost memory
    return backend


def run_sft(cfg: SFTConfig, *, overwrite: bool = False, progress: bool = True) -> Path:
    """Fine-tune `cfg.model` on demonstrations; write the run folder and return it (see the module docstring).

    Raises:
        SFTError, ConfigError: bad input, before any training.
        ClusterError: Ray cannot place `cfg.trainer.workers` workers.
        TrainerFailure: a trainer worker died or failed (nothing was checkpointed).
    """
    import agentrl
    from agentrl.models import load_model
    from agentrl.training.plan import plan_trainer

    cfg, out = _prepare_run_folder(cfg, overwrite)
    torch.manual_seed(cfg.seed)
    t_start = time.perf_counter()

    policy = load_model(cfg.model, dtype=getattr(torch, cfg.trainer.dtype))
    model, tokenizer = policy.model, policy.tokenizer
    # `observation_role: auto` resolves exactly as RL resolves it, so demonstrations have RL's sample layout.
    context, _ = resolve_context(cfg.context, agentrl.spec(cfg.env.id).load(), tokenizer, policy.family)
    cfg = dataclasses.replace(cfg, context=context)
    (out / "sft_config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    # config.yaml in RL's layout: `agentrl eval --model RUN/checkpoint` rebuilds the trained-on prompts from it.
    (out / "config.yaml").write_text(yaml.safe_dump(
        {k: dataclasses.asdict(cfg)[k] for k in ("model", "env", "sampling", "context")}, sort_keys=False))
    trajectories, source = _demonstrations(cfg, policy, out)
    samples: list[Sample] = [s for traj in trajectories for s in trajectory_to_samples(traj, 1.0)]
    samples = [s for s in samples if s.num_loss_tokens > 0]
    t_data = time.perf_counter() - t_start

    validation = _validation_samples(cfg, policy) if cfg.val_demos else []
    # RL's trainer plan: gradient checkpointing when a pass of the token budget would not fit (a shared machine
    # OOM-killed a WebShop SFT pass of 4 x 1,350 tokens at 9 GB without it).
    plan = plan_trainer(cfg.trainer, model, longest_sample=max((len(x.input_ids) for x in samples), default=0))
    order = torch.Generator().manual_seed(cfg.seed)
    total_steps = cfg.epochs * math.ceil(len(samples) / cfg.batch_size)
    log = RunLog.open(out, cfg.log.trackers, dataclasses.asdict(cfg), project=cfg.log.project,
                      run_name=cfg.log.run_name, table_episodes=cfg.log.table_episodes)
    with contextlib.closing(log):
        if cfg.log.table_episodes:
            log.trajectories("demonstrations", 0, trajectories[: cfg.log.table_episodes])
        return _train_and_evaluate(cfg, policy, samples, validation, plan, order, log, out, progress,
                                   {"demonstrations": source, "samples": len(samples), "planned_steps": total_steps,
                                    "data_seconds": t_data}, t_start)


def _train_and_evaluate(cfg: SFTConfig, policy, samples: list[Sample], validation: list[Sample], plan: TrainerPlan,
                        order: torch.Generator, log: RunLog, out: Path, progress: bool, summary: dict[str, Any],
                        t_start: float) -> Path:
    """Train, checkpoint, plot, evaluate; write summary.json (`summary` holds what data preparation measured)."""
    from agentrl.training.checkpoint import TrainerState, save_checkpoint

    pad_id = policy.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else policy.tokenizer.eos_token_id
    with contextlib.ExitStack() as stack:  # trainer workers and a Ray started here end with the training
        backend = _build_backend(cfg, policy, plan, stack)
        budget = cfg.trainer.micro_batch_tokens
        packed = cfg.trainer.packing
        val_before = demonstration_nll(backend, validation, pad_id, budget, packed=packed) if validation else None
        step, out_of_time = _fit(cfg, backend, samples, pad_id, order, log, progress)
        t_train = time.perf_counter() - t_start - summary["data_seconds"]
        val_after = demonstration_nll(backend, validation, pad_id, budget, packed=packed) if validation else None
        save_checkpoint(out, backend, policy, TrainerState.capture(step - 1, backend.name, backend.world_size, order))
    # `agentrl eval RUN/checkpoint` reads the thinking mode the checkpoint was trained with from here.
    (out / "sampling.json").write_text(json.dumps({"chat_kwargs": cfg.context.chat_kwargs()}))
    plot_sft_curves(out / "metrics.jsonl", out / "curves.png")

    summary |= {"steps": step, "stopped_by_max_seconds": out_of_time, "train_seconds": t_train}
    if validation:
        summary["validation"] = {"samples": len(validation), "split_seeds_from": "eval (held-out split)",
                                 "nll_before": val_before, "nll_after": val_after}
    if cfg.eval_episodes:
        results = _evaluate_checkpoint(cfg, out, progress)
        log.eval(results, step=step)  # after the last training step (`step - 1`)
        summary["eval"] = {"success_rate": results["overall"]["success_rate"],
                           "reward_mean": results["overall"]["reward_mean"], "split": results["env"]["split"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return out


def _prepare_run_folder(cfg: SFTConfig, overwrite: bool) -> tuple[SFTConfig, Path]:
    """Check what can be refused before a model loads (folder, data file, workers, env arguments); make the folder.

    Returns:
        The config with its run folder named (a fresh one when it named none) and that folder.
    """
    import agentrl

    if not cfg.output:
        cfg = dataclasses.replace(cfg, output=str(default_sft_dir(cfg)))
    out = Path(cfg.output)
    if out.exists() and not out.is_dir():
        raise SFTError(f"cannot use {out} as the run folder: it is a file")
    if not overwrite and (out / "metrics.jsonl").exists():
        raise SFTError(f"{out} already holds a run; replace it with --overwrite or choose another --output")
    if cfg.data and not Path(cfg.data).is_file():
        raise SFTError(f"demonstrations file not found: {cfg.data}")
    try:
        check_cpu_workers(cfg.trainer)
    except ConfigError as e:
        raise SFTError(str(e)) from None
    agentrl.spec(cfg.env.id)
    try:
        agentrl.make(cfg.env.id, **cfg.env.kwargs).close()
    except (TypeError, ValueError, OSError) as e:
        raise SFTError(f"bad arguments for env {cfg.env.id!r} {dict(cfg.env.kwargs)}: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    clear_tracker_files(out)
    return cfg, out


def _fit(cfg: SFTConfig, backend: TrainingBackend, samples: list[Sample], pad_id: int, order: torch.Generator,
         log: RunLog, progress: bool) -> tuple[int, bool]:
    """The epochs: one optimizer step per `batch_size` samples, through the backend; a metrics line per step.

    Returns:
        The steps taken and whether `max_seconds` stopped the loop early.
    """
    from tqdm import tqdm

    from agentrl.training.backend import LikelihoodObjective, UpdateRequest
    from agentrl.training.microbatch import collate, pack_by_tokens

    lengths = [len(s.input_ids) for s in samples]
    batches_per_epoch = math.ceil(len(samples) / cfg.batch_size)
    budget, packed = cfg.trainer.micro_batch_tokens, cfg.trainer.packing
    step, t_loop = 0, time.perf_counter()
    bar = tqdm(total=cfg.epochs * batches_per_epoch, disable=not progress, desc=f"sft {cfg.env.id} x {cfg.model}",
               unit="step")
    for epoch in range(cfg.epochs):
        perm = torch.randperm(len(samples), generator=order).tolist()
        for b in range(batches_per_epoch):
            if cfg.max_seconds and time.perf_counter() - t_loop > cfg.max_seconds:
                bar.close()
                return step, True
            t0 = time.perf_counter()
            members = perm[b * cfg.batch_size : (b + 1) * cfg.batch_size]
            batch = [samples[i] for i in members]
            num_tokens = sum(s.num_loss_tokens for s in batch)
            lr = _lr_at(step, cfg.optim.lr, cfg.warmup_steps)
            requests = [UpdateRequest(collate([samples[i] for i in chunk], pad_id, packed=packed), None)
                        for chunk in pack_by_tokens(lengths, members, budget, cfg.trainer.micro_batch_size,
                                                    packed=packed)]
            done = backend.accumulate(requests, LikelihoodObjective(sft_loss, num_tokens))
            if not all(r.finite for r in done):
                raise SFTError(f"non-finite SFT loss at step {step}: lower lr (now {cfg.optim.lr})")
            loss_sum = sum(r.metrics["loss"] for r in done)  # the batch's mean token NLL
            grad_norm = backend.step(cfg.optim.grad_clip, lr)
            row = {"step": step, "epoch": epoch, "loss": loss_sum, "lr": lr, "grad_norm": grad_norm,
                   "samples": len(batch), "loss_tokens": num_tokens,
                   "tokens": sum(len(s.input_ids) for s in batch), "step_seconds": time.perf_counter() - t0}
            log.metrics(row)  # metrics.jsonl, then the trackers
            bar.update(1)
            bar.set_postfix({"loss": f"{loss_sum:.3f}"})
            step += 1
    bar.close()
    return step, False


def _evaluate_checkpoint(cfg: SFTConfig, out: Path, progress: bool) -> dict[str, Any]:
    """The checkpoint on `eval_episodes` held-out tasks, with the run's context and budgets (``out/eval``).

    Returns:
        The results (as saved in ``out/eval/results.json``).
    """
    from agentrl.recipes.evaluate import EvalConfig, eval_env, evaluate

    overrides = {} if cfg.eval_temperature is None else {"temperature": cfg.eval_temperature}
    env = eval_env(cfg.env.id, {k: v for k, v in cfg.env.kwargs.items() if k != "split"}, max_turns=cfg.env.max_turns)
    results = evaluate(EvalConfig(
        model=str(out / "checkpoint"), env=env, episodes=cfg.eval_episodes,
        max_new_tokens=cfg.sampling.max_new_tokens, max_context_tokens=cfg.context.max_context_tokens,
        seed=cfg.seed, thinking=cfg.context.enable_thinking,
        context=cfg.context, sampling_overrides=overrides, output=str(out / "eval")), progress=progress)
    return results
