"""Routing Replay as a strategy chosen once per run: how MoE experts are routed in the pi_old pass and the updates.

See `agentrl.routing_replay` for the mechanism and the paper. Per run, one of:

* `DenseRouting`: a dense model; nothing to route.
* `LiveRouting` (MoE, ``routing_replay: none``): the router routes live everywhere; the pi_old pass records the
  training router's experts only to report how often they agree with the rollout engine's (`router_agreement`).
* `R2Routing`: record the training router's experts in the pi_old pass, replay them in every update.
* `R3Routing`: replay the experts the inference engine chose at rollout, in the pi_old pass and every update.

The loop calls `score_request` / `scored` for every micro-batch of the pi_old pass and `update_request` for every
micro-batch of the updates; the strategy keeps what it needs between the two (R2's recorded routes) for one step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.routing_replay import pack_routes, router_agreement
from agentrl.training.backend import Scored, ScoreRequest, UpdateRequest

__all__ = ["RoutingStrategy", "DenseRouting", "LiveRouting", "R2Routing", "R3Routing", "routing_strategy",
           "RoutingReplayError"]


class RoutingReplayError(RuntimeError):
    """Routing Replay cannot run as configured (a dense model, or rollouts without expert routes)."""


def _rollout_routes(samples: Sequence, width: int) -> torch.Tensor:
    """The experts the inference engine chose, packed for a right-padded micro-batch `[n, S, L, K]`."""
    if any(s.routed_experts is None for s in samples):
        raise RoutingReplayError("R3 routing replay needs rollout routes, but the engine returned none for some "
                                 "samples")
    return pack_routes([torch.as_tensor(s.routed_experts) for s in samples], [0] * len(samples), width)


class DenseRouting:
    """A dense model: plain passes, no routing metric."""

    needs_old_policy_pass = False
    """The strategy reads the pi_old pass (R2 replays its experts, live routing measures agreement with it), so
    the update pass's own log-probs cannot stand in for it."""

    def begin_step(self, num_samples: int) -> None:
        """Forget the previous step."""

    def score_request(self, indices: Sequence[int], samples: Sequence, batch) -> ScoreRequest:
        """The pi_old request of the micro-batch holding `samples` (sample `indices` of the step)."""
        return ScoreRequest(batch)

    def scored(self, indices: Sequence[int], samples: Sequence, batch, result: Scored) -> None:
        """Take note of a micro-batch's pi_old pass."""

    def update_request(self, indices: Sequence[int], samples: Sequence, batch,
                       old_logp: torch.Tensor | None) -> UpdateRequest:
        """The update request of the micro-batch holding `samples` (`old_logp` None: the pass's own, detached)."""
        return UpdateRequest(batch, old_logp)

    def metrics(self) -> dict[str, float | None]:
        """The step's routing metrics."""
        return {"router_agreement": None}


class LiveRouting(DenseRouting):
    """An MoE model routed live; the pi_old pass records the training router's experts to measure agreement."""

    needs_old_policy_pass = True

    def begin_step(self, num_samples: int) -> None:
        """Forget the previous step's routes and agreement."""
        self.train_routes: list[torch.Tensor | None] = [None] * num_samples
        self.agree_sum, self.agree_n = 0.0, 0

    def score_request(self, indices, samples, batch) -> ScoreRequest:
        """Ask the backend to record the training router's choices."""
        return ScoreRequest(batch, record_routes=True)

    def scored(self, indices, samples, batch, result: Scored) -> None:
        """Keep the recorded routes (per sample, unpadded) and compare them with the rollout's."""
        routes = result.routes  # [n, S, L, K]
        for row, (i, s) in enumerate(zip(indices, samples)):
            self.train_routes[i] = routes[row, : len(s.input_ids) - 1]
        if all(s.routed_experts is not None for s in samples):
            engine_routes = _rollout_routes(samples, batch.input_ids.shape[1])  # [n, S, L, K], -1 on padding
            self.agree_sum += router_agreement(engine_routes, routes.to(engine_routes.dtype)) * len(samples)
            self.agree_n += len(samples)

    def metrics(self) -> dict[str, float | None]:
        """Mean fraction of (token, layer) expert sets on which the training and rollout routers agree."""
        return {"router_agreement": self.agree_sum / self.agree_n if self.agree_n else None}


class R2Routing(LiveRouting):
    """Replay the training router's pi_old experts in every update."""

    def update_request(self, indices, samples, batch, old_logp) -> UpdateRequest:
        """Replay the experts recorded for these samples in the pi_old pass."""
        routes = pack_routes([self.train_routes[i] for i in indices], [0] * len(indices), batch.input_ids.shape[1])
        return UpdateRequest(batch, old_logp, routes)


class R3Routing(DenseRouting):
    """Replay the rollout engine's experts in the pi_old pass and every update."""

    def score_request(self, indices, samples, batch) -> ScoreRequest:
        """Replay the rollout's experts in the pi_old pass: pi_old(. | e_mu)."""
        return ScoreRequest(batch, replay_routes=_rollout_routes(samples, batch.input_ids.shape[1]))

    def update_request(self, indices, samples, batch, old_logp) -> UpdateRequest:
        """Replay the rollout's experts in the update."""
        return UpdateRequest(batch, old_logp, _rollout_routes(samples, batch.input_ids.shape[1]))


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
