"""Routing Replay for MoE models: fix which experts each token uses, let the router keep learning.

In an MoE policy the top-k expert choice is discrete: a tiny change in the router logits (a parameter update, or the
inference engine's different kernels and precision) can send a token to other experts, and then the token's
log-probability jumps. That inflates both gaps the policy gradient needs small [Zheng et al. 2025, §3.2]:
the staleness pi_theta / pi_old and the training-inference ratio pi_old / mu. Routing Replay fixes the experts:

- R2 replays the experts the *training* engine chose in the pi_old pass (record there, replay in every update).
- R3 replays the experts the *inference* engine chose at rollout (carried with the sample), in the pi_old pass and
  in every update.

Under replay only the expert *indices* are fixed. The gate weights are recomputed from the live router logits over
the fixed experts (softmax over the full logits, gathered at the replayed experts, renormalised when the model's
`norm_topk_prob` is set, exactly Qwen3-MoE's own formula), so gradients still reach the router.

While replaying, the live router's own top-k choice is in hand anyway: `replay()` counts how often it picks the same
expert SET as the replayed one (`ReplayAgreement`, the `router_agreement` definition), which tells how far the
training router has drifted from the routes it is made to follow (R3: the rollout's, R2: the pi_old pass's). It reads
the router's output and changes nothing in the forward or the backward.

Works on HF transformers 5.x Qwen3-MoE style routers: a module with `top_k`, `num_experts`, `norm_topk_prob` whose
forward takes flattened hidden states `[tokens, H]` and returns `(router_logits, topk_weights, topk_indices)`
(`Qwen3MoeTopKRouter`, at `model.layers[i].mlp.gate`). Replay is a stateless lookup by layer, so with gradient
checkpointing the recomputation in the backward pass routes the same way, provided the backward runs inside the
`replay()` context too.

Layouts:
    routes for a forward   [N, S, L, K] aligned with input_ids [N, S]; -1 = keep the live choice (padding)
    per-sample rollout     [prompt_len + gen_len - 1, L, K] over the unpadded sequence (vLLM / SGLang
                           `routed_experts`: the last token is never fed back, so it has no routing)
    storage dtype          uint8 when num_experts <= 256, else int16 (Qwen3-30B-A3B: 48 x 8 = 384 B per token)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from agentrl.training.backend import LossResult, Scored, ScoreRequest, UpdateRequest

__all__ = ["RoutingReplay", "RouteRecording", "GenerationRouteRecording", "ReplayAgreement", "pack_routes",
           "router_agreement", "RoutingStrategy", "DenseRouting", "LiveRouting", "R2Routing", "R3Routing",
           "routing_strategy", "RoutingReplayError", "REPLAY_AGREEMENT"]

LIVE = -1  # route entry meaning "use the router's own choice here"

REPLAY_AGREEMENT = "router_agreement_live_vs_replayed"
"""The metric of the update passes under replay: the share of (token, layer) pairs where the live router's top-k
expert set equals the replayed one (R3: the rollout engine's; R2: the pi_old pass's); None when nothing replays."""


def route_dtype(num_experts: int) -> torch.dtype:
    """The most compact integer dtype that stores expert indices `0 .. num_experts - 1`."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 32768:
        return torch.int16
    return torch.int32


@dataclass
class RouteRecording:
    """Expert choices captured during `RoutingReplay.record()`; read `.routes` after the forward.

    One entry per model forward call: its `(N, S)` input shape and, per MoE layer, the `[N * S, K]` indices.
    """

    num_layers: int
    dtype: torch.dtype
    calls: list[tuple[tuple[int, int], dict[int, Tensor]]] = field(default_factory=list)

    @property
    def routes(self) -> Tensor:
        """The routes of the last forward call, `[N, S, L, K]`, compact dtype."""
        if not self.calls:
            raise RuntimeError("nothing was recorded: run a forward pass inside RoutingReplay.record()")
        return self._call_routes(-1)

    def _call_routes(self, i: int) -> Tensor:
        (n, s), per_layer = self.calls[i]
        missing = [layer for layer in range(self.num_layers) if layer not in per_layer]
        if missing:
            raise RuntimeError(f"forward call {i} recorded no routing for MoE layers {missing}")
        stacked = torch.stack([per_layer[layer] for layer in range(self.num_layers)], dim=1)  # [N*S, L, K]
        return stacked.reshape(n, s, self.num_layers, -1).to(self.dtype)  # [N, S, L, K]


@dataclass
class GenerationRouteRecording(RouteRecording):
    """Expert choices captured around `model.generate` (prefill, then one forward per decode step)."""

    def per_sample(self, attention_mask: Tensor, gen_lengths: Sequence[int] | Tensor) -> list[Tensor]:
        """Split the recorded routing into one compact array per sample, aligned to its unpadded sequence.

        Args:
            attention_mask: `[N, P]` prompt attention mask passed to `generate` (LEFT padding).
            gen_lengths: generated tokens per sample, EOS included, padding after EOS excluded.

        Returns:
            Per sample, a `[prompt_len + gen_len - 1, L, K]` tensor in the compact dtype (the vLLM layout).
        """
        if attention_mask[:, -1].eq(0).any():
            raise ValueError("generation route recording needs LEFT padding (attention_mask[:, -1] must be all 1)")
        steps = [self._call_routes(i) for i in range(len(self.calls))]  # each [N, S_i, L, K]
        if any(s.shape[0] != attention_mask.shape[0] for s in steps):
            raise ValueError("recorded forward calls have a batch size different from attention_mask")
        full = torch.cat(steps, dim=1)  # [N, P + decode_steps, L, K]
        prompt_lens = attention_mask.sum(dim=1).tolist()
        padded_len = attention_mask.shape[1]
        out = []
        for i, (p_len, g_len) in enumerate(zip(prompt_lens, list(gen_lengths), strict=True)):
            g_len = int(g_len)
            end = padded_len + g_len - 1  # the last generated token is never fed back in
            if end > full.shape[1]:
                raise ValueError(f"sample {i}: gen_length {g_len} exceeds the {full.shape[1] - padded_len + 1} "
                                 "tokens generated while recording")  # fmt: skip
            out.append(full[i, padded_len - int(p_len) : end].clone())  # [p_len + g_len - 1, L, K]
        return out


@dataclass
class ReplayAgreement:
    """How often the live router chose the replayed experts, counted during one `RoutingReplay.replay()` context.

    The `router_agreement` definition: a (token, layer) pair agrees when the live router's top-k expert SET equals the
    replayed one; pairs whose replayed entry keeps the live choice (-1: padding, a sequence's last token) are not
    compared. Each forward call counts once: a gradient-checkpointing recompute in the backward is not counted again.

    Attributes:
        agreed: pairs that agree (a 0-dim tensor on the forward's device while counting, so no layer waits on the
            device; `counts` reads it).
        compared: pairs compared.
    """

    agreed: Tensor | float = 0.0
    compared: Tensor | float = 0.0

    def add(self, same: Tensor, valid: Tensor) -> None:
        """Count one layer of one forward: `same` / `valid` are bool `[tokens]`."""
        self.agreed = self.agreed + (same & valid).sum()
        self.compared = self.compared + valid.sum()

    def counts(self) -> tuple[float, float]:
        """`(agreed, compared)` as floats."""
        return float(self.agreed), float(self.compared)

    @property
    def fraction(self) -> float | None:
        """`agreed / compared`, or None when nothing was compared."""
        agreed, compared = self.counts()
        return agreed / compared if compared else None


class RoutingReplay:
    """Record and replay the top-k expert choices of every MoE router in `model`.

    Example (R2):
        rr = RoutingReplay(model)
        with torch.no_grad(), rr.record() as rec:
            old_logits = model(input_ids).logits          # pi_old pass
        for minibatch in ...:
            with rr.replay(rec.routes[rows]):
                loss = ...model(input_ids[rows])...
                loss.backward()                           # inside: gradient checkpointing recomputes

    Example (R3): pack the rollout routes with `pack_routes` and replay them in the pi_old pass and the updates.

    Args:
        model: a transformers MoE model whose routers follow the Qwen3-MoE router interface.

    Raises:
        ValueError: when the model has no such router.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.gates: list[nn.Module] = [m for _, m in model.named_modules() if _is_topk_router(m)]
        if not self.gates:
            raise ValueError(
                f"{type(model).__name__} has no MoE router with top_k / num_experts / norm_topk_prob returning "
                "(logits, weights, indices); Routing Replay supports Qwen3-MoE style models"
            )
        self.num_layers = len(self.gates)
        self.top_k = int(self.gates[0].top_k)
        self.num_experts = int(self.gates[0].num_experts)
        self.dtype = route_dtype(self.num_experts)
        self._handles: list[Any] = []

    # -- recording ---------------------------------------------------------------------------------------------------

    @contextmanager
    def record(self) -> Iterator[RouteRecording]:
        """Capture each router's top-k indices; `.routes` of the yielded recording is `[N, S, L, K]`."""
        recording = RouteRecording(self.num_layers, self.dtype)
        with self._recording(recording):
            yield recording

    @contextmanager
    def record_generation(self) -> Iterator[GenerationRouteRecording]:
        """Capture routing across `model.generate(...)` (left padding, KV cache); see `per_sample`."""
        recording = GenerationRouteRecording(self.num_layers, self.dtype)
        with self._recording(recording):
            yield recording

    @contextmanager
    def _recording(self, recording: RouteRecording) -> Iterator[None]:
        self._ensure_idle()

        def on_model_call(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            recording.calls.append((_input_shape(args, kwargs), {}))

        def make_gate_hook(layer: int):
            def on_gate(_module: nn.Module, _inputs: tuple, output: tuple) -> None:
                if not recording.calls:
                    raise RuntimeError("a router ran outside a model forward; record around the whole model call")
                shape, per_layer = recording.calls[-1]
                # A gradient-checkpointing recompute runs the router again for the same call: keep the first.
                if layer not in per_layer:
                    per_layer[layer] = output[2].detach().to("cpu", copy=True)  # [N*S, K]

            return on_gate

        with self._hooks(on_model_call, make_gate_hook):
            yield

    # -- replay ------------------------------------------------------------------------------------------------------

    @contextmanager
    def replay(self, routes: Tensor, *, measure: bool = True) -> Iterator[ReplayAgreement]:
        """Route every token through the experts in `routes`, with gate weights from the live router logits.

        Use it around the forward AND the backward (gradient checkpointing recomputes the forward in backward). The
        yielded `ReplayAgreement` counts how often the live router's own top-k matched the replayed experts.

        Args:
            routes: `[N, S', L, K]` integer expert indices, S' <= S of the forward's input (missing trailing
                positions and -1 entries keep the live choice). uint8 routes cannot hold -1: they replay fully.
            measure: count the agreement (False leaves the `ReplayAgreement` at 0; the routing is the same either
                way).

        Raises:
            ValueError: on a shape that does not match the model or the forward's input, or an expert index out
                of range.
        """
        self._ensure_idle()
        if routes.dim() != 4 or routes.shape[2] != self.num_layers or routes.shape[3] != self.top_k:
            raise ValueError(
                f"routes must be [N, S, L={self.num_layers}, K={self.top_k}]; got {tuple(routes.shape)}"
            )
        routes = routes.to(torch.long)
        if (routes >= self.num_experts).any():
            raise ValueError(f"routes hold expert indices >= num_experts={self.num_experts}")
        current: dict[str, Any] = {}
        agreement = ReplayAgreement()

        def on_model_call(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            current["shape"] = _input_shape(args, kwargs)
            current["measured"] = set()  # the layers this call has counted

        def make_gate_hook(layer: int):
            def on_gate(module: nn.Module, _inputs: tuple, output: tuple) -> tuple[Tensor, Tensor, Tensor]:
                logits, _, live_idx = output  # [N*S, E], [N*S, K], [N*S, K]
                n, s = current["shape"]
                replayed = _fit_routes(routes[:, :, layer, :], n, s).to(live_idx.device)  # [N*S, K]
                use_live = (replayed < 0).any(dim=-1, keepdim=True)  # [N*S, 1]
                idx = torch.where(use_live, live_idx, replayed.clamp(min=0))  # [N*S, K]
                weights = replay_gate_weights(logits, idx, module.norm_topk_prob)  # [N*S, K]
                # A gradient-checkpointing recompute runs the router again for the same call: count the first.
                if measure and layer not in current["measured"]:
                    current["measured"].add(layer)
                    with torch.no_grad():  # integer indices only: nothing here reaches the graph
                        same = (live_idx.sort(dim=-1).values == idx.sort(dim=-1).values).all(dim=-1)  # [N*S]
                        agreement.add(same, ~use_live[:, 0])
                return logits, weights, idx

            return on_gate

        with self._hooks(on_model_call, make_gate_hook):
            yield agreement

    @contextmanager
    def _hooks(self, on_model_call, make_gate_hook) -> Iterator[None]:
        """Install the model pre-hook (one per forward call) and one hook per router; remove them on exit.

        The pre-hook sits on the backbone (``get_decoder()``), which every forward goes through: the full model's, and
        the trainer's, which runs the backbone alone and projects onto the vocabulary itself.
        """
        backbone = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model
        self._handles.append(backbone.register_forward_pre_hook(on_model_call, with_kwargs=True))
        self._handles += [g.register_forward_hook(make_gate_hook(i)) for i, g in enumerate(self.gates)]
        try:
            yield
        finally:
            self._remove_hooks()

    def _ensure_idle(self) -> None:
        if self._handles:
            raise RuntimeError("RoutingReplay contexts cannot be nested; leave the current record()/replay() first")

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def replay_gate_weights(logits: Tensor, idx: Tensor, norm_topk_prob: bool) -> Tensor:
    """Gate weights for fixed experts from live router logits (differentiable in `logits`).

    Args:
        logits: `[tokens, E]` router logits.
        idx: `[tokens, K]` expert indices to use.
        norm_topk_prob: renormalise the K weights to sum to 1 (Qwen3-MoE default), else full-softmax values.

    Returns:
        `[tokens, K]` weights in the dtype of `logits`.
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)  # [tokens, E]
    weights = probs.gather(1, idx)  # [tokens, K]
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


def pack_routes(samples: Sequence[Tensor], offsets: Sequence[int], total_len: int) -> Tensor:
    """Place per-sample routing arrays into one `[N, total_len, L, K]` replay tensor, -1 elsewhere.

    Args:
        samples: per sample, `[len_i, L, K]` (e.g. `GenerationRouteRecording.per_sample` or vLLM's
            `routed_experts`), position 0 = the first real token.
        offsets: where each sample's first real token sits in the padded batch (the left-pad length; 0 for right
            padding).
        total_len: the padded sequence length S of the training forward.

    Returns:
        `[N, total_len, L, K]` int16 tensor; -1 (keep live) on padding and on the never-routed last token.
    """
    if not samples:
        raise ValueError("pack_routes needs at least one sample")
    _, num_layers, top_k = samples[0].shape
    out = torch.full((len(samples), total_len, num_layers, top_k), LIVE, dtype=torch.int16)
    for i, (routes, offset) in enumerate(zip(samples, offsets, strict=True)):
        if routes.shape[1:] != (num_layers, top_k):
            raise ValueError(f"sample {i} routes have shape {tuple(routes.shape)}, expected [*, {num_layers}, {top_k}]")
        if offset + routes.shape[0] > total_len:
            raise ValueError(f"sample {i}: offset {offset} + {routes.shape[0]} routed tokens > total_len {total_len}")
        out[i, offset : offset + routes.shape[0]] = torch.as_tensor(routes).to(torch.int16)
    return out


def router_agreement(a: Tensor, b: Tensor, mask: Tensor | None = None) -> float:
    """Fraction of (token, layer) pairs whose top-k expert SETS are identical in `a` and `b`.

    Args:
        a: `[..., L, K]` expert indices (e.g. rollout routes).
        b: same shape (e.g. the training engine's routes).
        mask: optional bool `[...]` selecting the tokens to compare; entries with -1 in either are skipped.

    Returns:
        Agreement in [0, 1] (1.0 when nothing is comparable).
    """
    if a.shape != b.shape:
        raise ValueError(f"route arrays differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    sa, sb = a.to(torch.long).sort(dim=-1).values, b.to(torch.long).sort(dim=-1).values  # [..., L, K]
    same = (sa == sb).all(dim=-1)  # [..., L]
    valid = ((sa >= 0).all(dim=-1)) & ((sb >= 0).all(dim=-1))  # [..., L]
    if mask is not None:
        valid = valid & mask.bool().unsqueeze(-1)
    total = int(valid.sum())
    return float((same & valid).sum()) / total if total else 1.0


def _is_topk_router(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("top_k", "num_experts", "norm_topk_prob")) and isinstance(
        getattr(module, "weight", None), nn.Parameter
    )


def _input_shape(args: tuple, kwargs: dict) -> tuple[int, int]:
    x = kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
    if x is None and args:
        x = args[0]
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise RuntimeError("could not read the [N, S] input shape of the model call (pass input_ids or inputs_embeds)")
    return int(x.shape[0]), int(x.shape[1])


def _fit_routes(layer_routes: Tensor, n: int, s: int) -> Tensor:
    """`[N, S', K]` routes for one layer -> `[n * s, K]` for a forward of shape (n, s); pads with -1 (live)."""
    if layer_routes.shape[0] != n or layer_routes.shape[1] > s:
        raise ValueError(
            f"replay routes cover [{layer_routes.shape[0]}, {layer_routes.shape[1]}] tokens but the forward input is "
            f"[{n}, {s}]; pass the routes of exactly this (micro-)batch"
        )
    if layer_routes.shape[1] < s:
        pad = torch.full((n, s - layer_routes.shape[1], layer_routes.shape[2]), LIVE, dtype=layer_routes.dtype)
        layer_routes = torch.cat([layer_routes, pad], dim=1)
    return layer_routes.reshape(n * s, -1)


# ---- the per-run strategy: how the pi_old pass and the updates route ---------------------------------------------
# Routing Replay as a strategy chosen once per run: how MoE experts are routed in the pi_old pass and the updates.
#
# The mechanism and the paper are above (`RoutingReplay`). Per run, one of:
#
# * `DenseRouting`: a dense model; nothing to route.
# * `LiveRouting` (MoE, ``routing_replay: none``): the router routes live everywhere; the pi_old pass records the
#   training router's experts only to report how often they agree with the rollout engine's (`router_agreement`).
# * `R2Routing`: record the training router's experts in the pi_old pass, replay them in every update.
# * `R3Routing`: replay the experts the inference engine chose at rollout, in the pi_old pass and every update.
#
# The loop calls `score_request` / `scored` for every micro-batch of the pi_old pass, `update_request` for every
# micro-batch of the updates and `updated` with each one's result; the strategy keeps what it needs between them (R2's
# recorded routes, the agreement counts) for one step.
# Routes cross the backend laid out like the micro-batch's forward input (`MicroBatch.forward_layout`: padded rows, or
# one packed row), and are kept per sample in between, so the pi_old pass and the updates may group the samples into
# different micro-batches, packed or not.
#
# Metrics of an MoE run (`metrics()`), both the share of (token, layer) pairs whose top-k expert SETS agree, padding
# and each sequence's last token left out (`router_agreement` the function):
# * `router_agreement`: the training router in the pi_old pass vs the rollout engine (none and R2, when the engine
#   returned its experts; the mean over micro-batches, weighted by their samples); None under R3, whose pi_old pass
#   replays the engine's experts.
# * `router_agreement_live_vs_replayed` (`REPLAY_AGREEMENT`): in the update passes, the live router's own top-k vs
#   the experts replayed (R3: the rollout engine's, R2: the pi_old pass's), pooled over all the step's update passes:
#   how far the router being trained has drifted from the routes it is made to follow. None when routed live.
#   Under R3 its first mini-batch reads what `router_agreement` reads under none (training router vs engine, same
#   weights), except that the layers before each router ran the replayed experts instead of the live ones.



class RoutingReplayError(RuntimeError):
    """Routing Replay cannot run as configured (a dense model, or rollouts without expert routes)."""


def _rollout_routes(samples: Sequence, batch) -> torch.Tensor:
    """The experts the inference engine chose, laid out like the micro-batch's forward input.

    `[n, S, L, K]` for right-padded rows, `[1, L_packed, L, K]` for a packed one (`MicroBatch.forward_layout`); -1
    (live) on padding and on each sample's last token, which the engine never routed.
    """
    if any(s.routed_experts is None for s in samples):
        raise RoutingReplayError("R3 routing replay needs rollout routes, but the engine returned none for some "
                                 "samples")
    return batch.forward_layout([torch.as_tensor(s.routed_experts) for s in samples])


class DenseRouting:
    """A dense model: plain passes, no routing metric."""

    needs_old_policy_pass = False
    """The strategy reads the pi_old pass (R2 replays its experts, live routing measures agreement with it), so
    the update pass's own log-probs cannot stand in for it."""

    def begin_step(self, num_samples: int) -> None:
        """Forget the previous step."""
        self.replay_agreed, self.replay_compared = 0.0, 0.0

    def score_request(self, indices: Sequence[int], samples: Sequence, batch) -> ScoreRequest:
        """The pi_old request of the micro-batch holding `samples` (sample `indices` of the step)."""
        return ScoreRequest(batch)

    def scored(self, indices: Sequence[int], samples: Sequence, batch, result: Scored) -> None:
        """Take note of a micro-batch's pi_old pass."""

    def update_request(self, indices: Sequence[int], samples: Sequence, batch,
                       old_logp: torch.Tensor | None) -> UpdateRequest:
        """The update request of the micro-batch holding `samples` (`old_logp` None: the pass's own, detached)."""
        return UpdateRequest(batch, old_logp)

    def updated(self, result: LossResult) -> None:
        """Take note of a micro-batch's update pass: how often its live router agreed with the replayed experts."""
        self.replay_agreed += result.routes_agreed
        self.replay_compared += result.routes_compared

    def replay_agreement(self) -> float | None:
        """The step's update passes: agreed / compared (live vs replayed experts), None when nothing replayed."""
        return self.replay_agreed / self.replay_compared if self.replay_compared else None

    def metrics(self) -> dict[str, float | None]:
        """The step's routing metrics (a dense model: none)."""
        return {"router_agreement": None}


class LiveRouting(DenseRouting):
    """An MoE model routed live; the pi_old pass records the training router's experts to measure agreement."""

    needs_old_policy_pass = True

    def begin_step(self, num_samples: int) -> None:
        """Forget the previous step's routes and agreement."""
        super().begin_step(num_samples)
        self.train_routes: list[torch.Tensor | None] = [None] * num_samples
        self.agree_sum, self.agree_n = 0.0, 0

    def score_request(self, indices, samples, batch) -> ScoreRequest:
        """Ask the backend to record the training router's choices."""
        return ScoreRequest(batch, record_routes=True)

    def scored(self, indices, samples, batch, result: Scored) -> None:
        """Keep the recorded routes (per sample, unpadded) and compare them with the rollout's."""
        routes = result.routes  # [n, S, L, K] padded, [1, L_packed, L, K] packed: the forward's layout
        for i, s, own in zip(indices, samples, batch.per_sample(routes)):
            self.train_routes[i] = own[: len(s.input_ids) - 1]
        if all(s.routed_experts is not None for s in samples):
            engine_routes = _rollout_routes(samples, batch)  # the same layout, -1 on padding and last tokens
            self.agree_sum += router_agreement(engine_routes, routes.to(engine_routes.dtype)) * len(samples)
            self.agree_n += len(samples)

    def metrics(self) -> dict[str, float | None]:
        """The step's routing metrics.

        `router_agreement`: the mean fraction of (token, layer) expert sets on which the training router (pi_old pass)
        and the rollout's agree; `REPLAY_AGREEMENT`: the live router vs the replayed experts in the updates (R2; None
        when routed live).
        """
        return {"router_agreement": self.agree_sum / self.agree_n if self.agree_n else None,
                REPLAY_AGREEMENT: self.replay_agreement()}


class R2Routing(LiveRouting):
    """Replay the training router's pi_old experts in every update."""

    def update_request(self, indices, samples, batch, old_logp) -> UpdateRequest:
        """Replay the experts recorded for these samples in the pi_old pass."""
        return UpdateRequest(batch, old_logp, batch.forward_layout([self.train_routes[i] for i in indices]))


class R3Routing(DenseRouting):
    """Replay the rollout engine's experts in the pi_old pass and every update."""

    def score_request(self, indices, samples, batch) -> ScoreRequest:
        """Replay the rollout's experts in the pi_old pass: pi_old(. | e_mu)."""
        return ScoreRequest(batch, replay_routes=_rollout_routes(samples, batch))

    def update_request(self, indices, samples, batch, old_logp) -> UpdateRequest:
        """Replay the rollout's experts in the update."""
        return UpdateRequest(batch, old_logp, _rollout_routes(samples, batch))

    def metrics(self) -> dict[str, float | None]:
        """The step's routing metrics.

        `REPLAY_AGREEMENT`: how often the live router in the updates chose the rollout engine's experts;
        `router_agreement` is None (the pi_old pass replays those experts).
        """
        return {"router_agreement": None, REPLAY_AGREEMENT: self.replay_agreement()}


RoutingStrategy = DenseRouting
"""The strategy interface (every strategy is a `DenseRouting` with some methods replaced)."""


def routing_strategy(mode: str, is_moe: bool, model_name: str = "the model") -> DenseRouting:
    """The strategy for `loss.routing_replay` = `mode` (none / r2 / r3) on a dense or MoE model.

    Raises:
        RoutingReplayError: r2 / r3 on a dense model.
    """
    if mode != "none" and not is_moe:
        raise RoutingReplayError(f"routing_replay={mode!r} needs an MoE model; {model_name} is dense")
    if not is_moe:
        return DenseRouting()
    return {"none": LiveRouting, "r2": R2Routing, "r3": R3Routing}[mode]()
