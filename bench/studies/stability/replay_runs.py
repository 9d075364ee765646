"""Part (b) runs: router agreement and mismatch KL with no replay, R2 and R3 at N mini-batch updates per rollout.

The inference engine mu is the float32 model with Gaussian noise on its routers (a stand-in for an FP8 /
different-kernel router). For each rollout batch the update forward either routes live (no replay), replays the
experts the training engine chose in the pi_old pass (R2), or replays the experts mu chose at rollout (R3); the
batch is split into N mini-batches with one Adam step each, so the later mini-batches are off-policy. Logged: the
agreement between the experts each update used and the rollout's, and KL(mu || pi_theta) (k3) seen by each update.
"""

from __future__ import annotations

import torch
from lab_models import make_batch, perturbed_router_copy, prompt_class_reward, response_logp, sample, tiny_moe

from agentrl.objective import compute_advantages, policy_loss
from agentrl.training.routing_replay import RoutingReplay, router_agreement

VOCAB, RESPONSE_LEN = 64, 8


def replay_run(mode: str, n_minibatches: int, rollouts: int, lr: float, seed: int, router_noise: float
               ) -> dict[str, float]:  # fmt: skip
    """One configuration of part (b).

    Args:
        mode: "none", "R2" or "R3".
        n_minibatches: N, optimizer steps per rollout batch (N = 1 is on-policy).
        rollouts: rollout batches.
        lr: Adam learning rate.
        seed: init and sampling seed.
        router_noise: std of the noise on mu's router weights.

    Returns:
        Means over all updates: `router_agreement`, `mismatch_kl_k3` (KL(mu || pi_theta)), `first_minibatch_kl_k3`
        (the same for the first mini-batch only) and `staleness_kl_k1` (mean log pi_old - log pi_theta).
    """
    model = tiny_moe(seed, vocab=VOCAB)
    rr = RoutingReplay(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    agreements, kls, first_kls, stale = [], [], [], []
    for _ in range(rollouts):
        mu = perturbed_router_copy(model, router_noise, gen)
        prompts, groups = make_batch(8, 8, VOCAB, gen)
        seq = sample(mu, prompts, RESPONSE_LEN, gen)
        with torch.no_grad(), RoutingReplay(mu).record() as rollout_rec:
            rollout_logp, _ = response_logp(mu, seq)
        rollout_routes = rollout_rec.routes  # [B, S, L, K], carried with the sample (R3)
        model.eval()
        with torch.no_grad():
            if mode == "R3":
                with rr.replay(rollout_routes):
                    old_logp, _ = response_logp(model, seq)
                train_routes = rollout_routes
            else:
                with rr.record() as old_rec:
                    old_logp, _ = response_logp(model, seq)
                train_routes = old_rec.routes if mode == "R2" else None
        adv = compute_advantages("group_mean", prompt_class_reward(seq), groups)
        model.train()
        size = seq.shape[0] // n_minibatches
        for k in range(n_minibatches):
            rows = slice(k * size, (k + 1) * size)
            with rr.replay(train_routes[rows]) if train_routes is not None else rr.record() as used:
                logp, _ = response_logp(model, seq[rows])
                mask = torch.ones_like(logp, dtype=torch.bool)
                loss, _ = policy_loss("minirl", logp, old_logp[rows], rollout_logp[rows], adv[rows], mask)
                opt.zero_grad()
                loss.backward()
            routes_used = train_routes[rows] if train_routes is not None else used.routes
            agreements.append(router_agreement(routes_used[:, :-1], rollout_routes[rows, :-1]))
            log_ratio = (logp.detach() - rollout_logp[rows]).double()  # log pi_theta / mu
            kl = float((log_ratio.exp() - 1 - log_ratio).mean())  # k3 of KL(mu || pi_theta)
            kls.append(kl)
            if k == 0:
                first_kls.append(kl)
            stale.append(float((old_logp[rows] - logp.detach()).mean()))
            opt.step()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"router_agreement": mean(agreements), "mismatch_kl_k3": mean(kls), "first_minibatch_kl_k3": mean(first_kls),
            "staleness_kl_k1": mean(stale)}  # fmt: skip
