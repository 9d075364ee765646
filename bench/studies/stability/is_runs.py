"""Part (a) training runs: MiniRL on-policy with a low-precision inference engine, one correction per run.

Each step: copy pi to an FP8 (or bf16 / fp16) inference engine mu, sample G responses per prompt from mu, score
them with the chain reward, and take one MiniRL step (on-policy: pi_old = pi_theta, so only the correction of
rho = pi_old / mu differs between runs). Logged per step: KL(mu || pi_old) (k1, k3), entropy of pi at the sampled
prefixes, reward, and the fraction of tokens whose IS weight was truncated (TIS) or masked (IcePop, seq-MIS).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lab_models import CORRECTIONS_COMPARED, chain_reward, make_batch, quantized_copy, response_logp, sample, tiny_moe

from agentrl.objective import compute_advantages, policy_loss, token_entropy

LOGGED = ("kl_k1", "kl_k3", "entropy", "reward", "correction_truncated_frac", "correction_masked_frac",
          "is_weight_max")  # fmt: skip


@dataclass(frozen=True)
class TrainSetup:
    """One part-(a) training configuration.

    Attributes:
        weight_format: the inference engine's weight format (a key of `lab_models.WEIGHT_FORMATS`).
        steps: optimizer steps (one rollout batch each).
        lr: Adam learning rate.
        vocab: vocabulary size.
        response_len: tokens per response.
        n_prompts: prompts per batch.
        group: responses per prompt.
        head_std: LM-head init std (peaked next-token distributions, see `lab_models.tiny_moe`).
    """

    weight_format: str = "fp8_e4m3"
    steps: int = 120
    lr: float = 1e-3
    vocab: int = 16
    response_len: int = 8
    n_prompts: int = 8
    group: int = 8
    head_std: float = 0.3


def train_run(setup: TrainSetup, correction: str, seed: int) -> dict[str, list[float]]:
    """Train one tiny MoE with `correction`; the seed fixes the init and the first rollout for every correction.

    Returns:
        Per logged metric (`LOGGED`), its value at every step.
    """
    model = tiny_moe(seed, vocab=setup.vocab, embed_std=1.0, head_std=setup.head_std)
    opt = torch.optim.Adam(model.parameters(), lr=setup.lr)
    gen = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {key: [] for key in LOGGED}
    for _ in range(setup.steps):
        mu = quantized_copy(model, setup.weight_format)  # the inference engine, re-synced before every rollout
        prompts, groups = make_batch(setup.n_prompts, setup.group, setup.vocab, gen)
        seq = sample(mu, prompts, setup.response_len, gen)  # [B, P + R]
        with torch.no_grad():
            rollout_logp, _ = response_logp(mu, seq)  # [B, R] log mu
        rewards = chain_reward(seq)  # [B]
        adv = compute_advantages("group_mean", rewards, groups)  # [B]
        model.train()
        logp, logits = response_logp(model, seq)  # [B, R] with grad; on-policy, so old_logp = logp.detach()
        mask = torch.ones_like(logp, dtype=torch.bool)
        loss, metrics = policy_loss("minirl", logp, logp.detach(), rollout_logp, adv, mask,
                                    **CORRECTIONS_COMPARED[correction])  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics.update(reward=float(rewards.mean()), entropy=float(token_entropy(logits.detach()).mean()))
        for key in LOGGED:
            history[key].append(float(metrics[key]))
    return history
