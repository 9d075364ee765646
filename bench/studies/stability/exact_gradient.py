"""Exact gradient bias of each training-inference correction, by enumerating every response.

The paper's argument [Zheng et al. 2025, §3] is about the gradient, not about a collapse: the token-level surrogate
with the IS weight pi/mu on each token is a first-order approximation of the true gradient of J(theta) = E_{y~pi}[R]
when the samples come from mu; dropping the weight leaves an error of first order in the mismatch, keeping it an
error of second order. With a vocabulary of V and responses of R tokens there are only V^R responses per prompt,
so both sides can be computed exactly, with no sampling noise:

    true gradient      g* = grad sum_y pi(y) R(y)                          (what on-policy sampling estimates)
    estimator mean     E_mu[g_c] = grad sum_y mu(y) * loss_c(y)            (what correction c converges to)

`E_mu[g_c]` runs the project's own `policy_loss("minirl", ..., correction=...)` over all responses with the
advantage `A(y) = R(y) - E_mu[R]` scaled by `mu(y)`: the loss is linear in the advantage and the clip mask only
reads its sign, so this is exactly the expectation of one sample's gradient. Untruncated sequence-level IS is
unbiased (its bias is ~0 here: a check of the enumeration itself).

Only the last token's distribution is read from the final position's softmax, so the forward runs over the V^(R-1)
prefixes, not the V^R responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lab_models import CORRECTIONS_COMPARED, PROMPT_LEN, SEQUENCE_IS, response_logp
from torch.nn.functional import cosine_similarity

from agentrl.objective import compute_advantages, policy_loss


@dataclass(frozen=True)
class EnumeratedResponses:
    """Every response to each prompt with its log-probs.

    Attributes:
        seq: prompt + response token ids, `[Np * V^R, P + R]`, prompt-major.
        logp: per-token log-probs of the responses, `[Np * V^R, R]` (with grad when the model has it).
        n_prompts: Np; each prompt owns a contiguous block of V^R rows.
    """

    seq: torch.Tensor
    logp: torch.Tensor
    n_prompts: int


@dataclass(frozen=True)
class CorrectionBias:
    """How far one correction's gradient is from the exact on-policy gradient.

    Attributes:
        cosine: cosine between the correction's expected gradient E_mu[g_c] and g*.
        relative_bias: ||E_mu[g_c] - g*|| / ||g*||.
        batch_cosine_mean: mean cosine between one sampled batch's gradient and g* (bias and variance together).
        batch_cosine_std: its std over the sampled batches.
    """

    cosine: float
    relative_bias: float
    batch_cosine_mean: float
    batch_cosine_std: float


def enumerate_responses(model: torch.nn.Module, prompts: torch.Tensor, vocab: int, response_len: int
                        ) -> EnumeratedResponses:  # fmt: skip
    """Run `model` over every response of `response_len` tokens to each prompt.

    Args:
        model: a causal LM over `vocab` tokens.
        prompts: `[Np, P]` prompt ids.
        vocab: vocabulary size V.
        response_len: R; V^(R-1) prefixes per prompt go through the model.

    Returns:
        The enumerated responses.
    """
    n_prompts = prompts.shape[0]
    prefixes = torch.cartesian_prod(*[torch.arange(vocab)] * (response_len - 1)).reshape(-1, response_len - 1)
    n_prefix = prefixes.shape[0]  # V^(R-1)
    seq = torch.cat([prompts.repeat_interleave(n_prefix, 0), prefixes.repeat(n_prompts, 1)], dim=1)  # [Np*M, P+R-1]
    logits = model(seq).logits[:, PROMPT_LEN - 1 :].float()  # [Np*M, R, V]: the last position predicts token R
    log_probs = torch.log_softmax(logits, -1)  # [Np*M, R, V]
    head = log_probs[:, :-1].gather(-1, seq[:, PROMPT_LEN:, None]).squeeze(-1)  # [Np*M, R-1]
    head = head[:, None, :].expand(-1, vocab, -1)  # [Np*M, V, R-1], shared by the V last tokens
    logp = torch.cat([head, log_probs[:, -1, :, None]], dim=-1).reshape(-1, response_len)  # [Np*M*V, R]
    last = torch.arange(vocab).view(1, vocab, 1).expand(seq.shape[0], -1, -1)  # [Np*M, V, 1]
    full = torch.cat([seq[:, None, :].expand(-1, vocab, -1), last], dim=-1).reshape(-1, seq.shape[1] + 1)
    return EnumeratedResponses(seq=full, logp=logp, n_prompts=n_prompts)


def gradient_bias(model: torch.nn.Module, mu: torch.nn.Module, prompts: torch.Tensor, vocab: int,
                  response_len: int, reward_fn, group: int, n_batches: int, batch_seed: int
                  ) -> tuple[dict[str, float], dict[str, CorrectionBias]]:  # fmt: skip
    """Exact and sampled gradient error of every correction in `CORRECTIONS_COMPARED` (and sequence-level IS).

    Args:
        model: the training policy pi (float32), at theta = theta_old (on-policy).
        mu: the inference copy that samples.
        prompts: `[Np, P]`.
        vocab: vocabulary size.
        response_len: response length R.
        reward_fn: `seq [B, P + R] -> [B]`.
        group: responses per prompt in a sampled batch.
        n_batches: sampled batches per correction for the batch cosine.
        batch_seed: seed of the sampled batches; every correction sees the same batches (common random numbers,
            so the differences between corrections are not sampling noise).

    Returns:
        `(mismatch, biases)`: the exact mismatch `{"kl_k3": E_mu[k3] per token, "kl_k1": E_mu[log mu - log pi]
        per token}`, and per correction name a `CorrectionBias`.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    pi_all = enumerate_responses(model, prompts, vocab, response_len)
    with torch.no_grad():
        mu_all = enumerate_responses(mu, prompts, vocab, response_len)
    rewards = reward_fn(pi_all.seq)  # [N]
    n_rows = rewards.shape[0]
    per_prompt = n_rows // pi_all.n_prompts
    pi_seq = pi_all.logp.sum(1).exp()  # [N], pi(y), with grad
    mu_seq = mu_all.logp.sum(1).exp()  # [N], mu(y)

    true_grad = _flat_grad(-(pi_seq * rewards).sum() / pi_all.n_prompts, params)
    log_rho = (pi_all.logp.detach() - mu_all.logp).double()  # [N, R], log pi / mu per token
    weight = mu_seq.double()[:, None] / (pi_all.n_prompts * response_len)  # [N, 1], mu(y) per token, averaged
    mismatch = {"kl_k3": float((weight * (log_rho.exp() - 1 - log_rho)).sum()),
                "kl_k1": float((weight * -log_rho).sum())}  # fmt: skip

    baseline = (mu_seq * rewards).view(pi_all.n_prompts, per_prompt).sum(1).repeat_interleave(per_prompt)  # [N]
    # seq-mean-token-sum divides by the N rows; scaling by N / Np turns the row mean into sum_y mu(y) per prompt.
    scaled_adv = (rewards - baseline) * mu_seq * n_rows / pi_all.n_prompts  # [N]
    mask = torch.ones_like(pi_all.logp, dtype=torch.bool)
    mu_by_prompt = mu_seq.view(pi_all.n_prompts, per_prompt)  # [Np, V^R]
    biases = {}
    for name, options in {**CORRECTIONS_COMPARED, "seq_is": SEQUENCE_IS}.items():
        loss, _ = policy_loss("minirl", pi_all.logp, pi_all.logp.detach(), mu_all.logp, scaled_adv, mask, **options)
        expected = _flat_grad(loss, params)
        gen = torch.Generator().manual_seed(batch_seed)
        batch_cos = [
            float(cosine_similarity(_batch_gradient(model, pi_all, mu_all, mu_by_prompt, reward_fn, group, gen,
                                                    options, params), true_grad, dim=0))
            for _ in range(n_batches)
        ]  # fmt: skip
        batch = torch.tensor(batch_cos)
        biases[name] = CorrectionBias(
            cosine=float(cosine_similarity(expected, true_grad, dim=0)),
            relative_bias=float((expected - true_grad).norm() / true_grad.norm()),
            batch_cosine_mean=float(batch.mean()),
            batch_cosine_std=float(batch.std()),
        )
    return mismatch, biases


def _batch_gradient(model, pi_all, mu_all, mu_by_prompt, reward_fn, group, gen, options, params) -> torch.Tensor:
    """One training batch: `group` responses per prompt drawn from mu, group-mean advantages, MiniRL gradient."""
    per_prompt = mu_by_prompt.shape[1]
    picks = torch.multinomial(mu_by_prompt, group, replacement=True, generator=gen)  # [Np, G]
    rows = (picks + torch.arange(mu_by_prompt.shape[0])[:, None] * per_prompt).reshape(-1)  # [Np*G]
    seq = pi_all.seq[rows]  # [B, P + R]
    logp, _ = response_logp(model, seq)  # [B, R], a fresh forward with its own graph
    groups = torch.arange(mu_by_prompt.shape[0]).repeat_interleave(group)
    adv = compute_advantages("group_mean", reward_fn(seq), groups)  # [B]
    mask = torch.ones_like(logp, dtype=torch.bool)
    loss, _ = policy_loss("minirl", logp, logp.detach(), mu_all.logp[rows], adv, mask, **options)
    return _flat_grad(loss, params)


def _flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)])
