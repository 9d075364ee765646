"""Log-probabilities of the sampled tokens and the entropy, without ever holding a `[batch, positions, vocab]` tensor.

A causal LM's last step is a projection of each hidden state `h_t` (width H) onto the vocabulary (V rows):
``z_t = W h_t``. For a Qwen-size vocabulary (V = 151,669) the float32 logits of one 4k-token sequence take 2.5 GB,
and a micro-batch of eight of them does not fit in a laptop. But the trainer needs only two numbers per position,
and only at positions that carry loss:

    logp_t = z_t[y_t] - logsumexp(z_t)                      (log pi of the token that was sampled)
    H_t    = logsumexp(z_t) - sum_v softmax(z_t)_v z_t,v     (entropy)

So we run the backbone to get hidden states, gather the positions the loss mask selects, and project them onto the
vocabulary a chunk of positions at a time. The backward pass is written out by hand (`_ChunkedHead`); past a memory
budget (`KEEP_BYTES`) it recomputes each chunk's logits instead of keeping them, so peak memory stays at one chunk's
`[chunk, V]` logits in both directions however long the sequences are:

    d logp_t / d z_t = onehot(y_t) - p_t
    d H_t / d z_t    = -p_t * (log p_t + H_t)
    d z_t / d h_t    = W,  d z_t / d W = h_t

Values and gradients equal the full computation (tests check 1e-5).
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.training.microbatch import MicroBatch
from agentrl.training.packing import packed_hidden_states, use_packing

__all__ = ["token_logprobs", "head_logprobs", "full_logprobs", "chunk_positions", "CHUNK_BYTES", "KEEP_BYTES"]

CHUNK_BYTES = 128 * 2**20
"""Float32 logits of one chunk: the backward holds about four such `[chunk, V]` tensors at its peak."""

KEEP_BYTES = 1 * 2**30
"""Up to this many bytes of chunk log-softmaxes are kept for the backward instead of recomputed: below it the pass
costs what the plain full-logits pass costs (no second projection); above it memory stays flat at one chunk."""


def chunk_positions(vocab_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Positions per chunk so that one chunk's float32 logits take `chunk_bytes` (151k vocab: 221; 49k: 682)."""
    return max(16, chunk_bytes // (4 * vocab_size))

# Config attributes of model families whose logits are not the plain projection of the last hidden state.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _chunk_stats(h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor):
    """Float32 logits of one chunk `[c, V]`, their log-softmax, and the target log-probs `[c]`."""
    logits = torch.nn.functional.linear(h, weight, bias).float()  # [c, V]
    logp_all = torch.log_softmax(logits, dim=-1)  # [c, V]
    return logp_all, logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [c, V], [c]


class _ChunkedHead(torch.autograd.Function):
    """`(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (logp [N], entropy [N])`, chunked both ways."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk: int, with_entropy: bool, keep_bytes: int):
        n = hidden.shape[0]
        logp = hidden.new_zeros(n, dtype=torch.float32)  # [N]
        entropy = hidden.new_zeros(n, dtype=torch.float32)  # [N]
        keep = n * weight.shape[0] * 4 <= keep_bytes  # the caller passes 0 when no backward will come
        kept = []
        for s in range(0, n, chunk):
            logp_all, chosen = _chunk_stats(hidden[s : s + chunk], weight, bias, targets[s : s + chunk])
            logp[s : s + chunk] = chosen
            if with_entropy:
                entropy[s : s + chunk] = -(logp_all.exp() * logp_all).sum(-1)
            if keep:
                kept.append(logp_all)
        ctx.save_for_backward(hidden, weight, bias, targets, entropy)
        ctx.chunk, ctx.with_entropy, ctx.kept = chunk, with_entropy, kept if keep else None
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b and bias is not None else None
        for k, s in enumerate(range(0, hidden.shape[0], ctx.chunk)):
            h, y = hidden[s : s + ctx.chunk], targets[s : s + ctx.chunk]
            logp_all = ctx.kept[k] if ctx.kept is not None else _chunk_stats(h, weight, bias, y)[0]
            p = logp_all.exp()  # [c, V]
            g = grad_logp[s : s + ctx.chunk, None].float()  # [c, 1]
            dz = -p * g  # d logp / dz = onehot - p
            dz.scatter_add_(-1, y[:, None], g)
            if ctx.with_entropy and grad_entropy is not None:
                ge = grad_entropy[s : s + ctx.chunk, None].float()  # [c, 1]
                dz -= ge * p * (logp_all + entropy[s : s + ctx.chunk, None])
            dz = dz.to(hidden.dtype)
            if grad_h is not None:
                grad_h[s : s + ctx.chunk] = dz @ weight
            if grad_w is not None:
                grad_w += dz.float().T @ h.float()
            if grad_b is not None:
                grad_b += dz.float().sum(0)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        ctx.kept = None
        return grad_h, grad_w, grad_b, None, None, None, None


def head_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                  chunk: int = 256, with_entropy: bool = False, keep_bytes: int = KEEP_BYTES) -> tuple[Tensor, Tensor]:
    """Log-probs of `targets` under ``softmax(hidden @ weight.T + bias)``, and the entropy, chunk by chunk.

    Args:
        hidden: `[N, H]` hidden states of the positions that matter.
        weight: `[V, H]` output projection (the LM head; tied embeddings work: gradients reach the shared tensor).
        bias: `[V]` or None.
        targets: `[N]` token ids.
        chunk: positions per chunk (memory: about 3 x chunk x V float32 values at the peak).
        with_entropy: also return the entropy, differentiable (an entropy bonus can use it); otherwise zeros.
        keep_bytes: keep the chunks' log-softmaxes for the backward while they take at most this many bytes
            (faster: no second projection); above it, the backward recomputes them chunk by chunk.

    Returns:
        `(logp [N], entropy [N])`, float32.
    """
    if hidden.shape[0] == 0:
        zero = hidden.new_zeros(0, dtype=torch.float32) + 0 * weight.sum()  # keeps the graph for an empty batch
        return zero, zero.detach()
    backward_follows = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _ChunkedHead.apply(hidden, weight, bias, targets, chunk, with_entropy, keep_bytes if backward_follows else 0)


def _head_of(model: torch.nn.Module) -> torch.nn.Linear:
    for attr in _LOGIT_TRANSFORMS:
        if getattr(model.config, attr, None) not in (None, 0, 1, 1.0):
            raise ValueError(f"{type(model).__name__} transforms its logits ({attr}={getattr(model.config, attr)}); "
                             f"the chunked log-prob pass supports plain LM heads only")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__} has no plain linear LM head (got {type(head).__name__})")
    return head


def token_logprobs(model: torch.nn.Module, mb: MicroBatch, *, with_entropy: bool = False,
                   entropy_grad: bool = False, chunk: int = 0,
                   keep_bytes: int = KEEP_BYTES) -> tuple[Tensor, Tensor | None]:
    """Log pi(token_{t+1} | tokens_<=t) at every loss position of a micro-batch `[n, T]` (and the entropy `[n, T]`).

    The backbone runs over every position (attention needs the whole context), but the vocabulary projection runs
    only where `mb.loss_mask` is set, in chunks (see the module docstring). Positions without loss get 0. A micro-batch
    with a packed layout (`MicroBatch.packed`) runs the backbone padding-free on its one row
    (`agentrl.training.packing`) when the model's family packs exactly, else on the padded rows; either way the
    result is laid out `[n, T]`.

    Args:
        model: a transformers causal LM (``model.model`` the backbone, ``get_output_embeddings()`` the head).
        mb: the micro-batch.
        with_entropy: also compute the entropy at loss positions (else None is returned for it).
        entropy_grad: let gradients flow through the entropy (an entropy bonus); default detached.
        chunk: positions per vocabulary chunk (0: `chunk_positions` of the vocabulary size).
        keep_bytes: see `head_logprobs`.

    Everything computes in the dtype of the model's weights (bfloat16 under mixed precision, whose float32 masters
    live in `agentrl.training.precision`), the LM head included; the log-softmax, the entropy and the returned
    log-probs are float32.
    """
    head = _head_of(model)
    chunk = chunk or chunk_positions(head.weight.shape[0])
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    # Right padding never precedes a real token, so plain causal attention gives the real positions exactly what
    # the padding mask would, and lets SDPA take its fused path on CPU: with the mask it saved a [heads, T, T]
    # matrix per layer for backward (4 x 2k-token samples of SmolLM2: 15.7 GB peak and 85 s, against 13.3 GB, 71 s).
    packed = mb.packed is not None and use_packing(model)  # a family that cannot pack exactly runs padded
    hidden = (packed_hidden_states(backbone, mb.packed) if packed
              else backbone(input_ids=mb.input_ids).last_hidden_state)  # [1, L, H] packed, else [n, T+1, H]
    select = mb.loss_mask.bool()  # [n, T]: position t predicts token t + 1
    # Packed, padded position (i, t) sits at packed position index[i, t]. Loss positions stop one short of a
    # sample's end, so none predicts the first token of the next sample from the last token of its own.
    h = (hidden[0, mb.packed.index[:, :-1][select]] if packed else hidden[:, :-1][select]).to(head.weight.dtype)
    targets = mb.input_ids[:, 1:][select]  # [N_loss]
    logp_sel, ent_sel = head_logprobs(h, head.weight, head.bias, targets, chunk=chunk, with_entropy=with_entropy,
                                       keep_bytes=keep_bytes)
    logp = torch.zeros(select.shape, dtype=torch.float32, device=h.device).masked_scatter(select, logp_sel)  # [n, T]
    if not with_entropy:
        return logp, None
    ent_sel = ent_sel if entropy_grad else ent_sel.detach()
    entropy = torch.zeros(select.shape, dtype=torch.float32, device=h.device).masked_scatter(select, ent_sel)
    return logp, entropy


def full_logprobs(model: torch.nn.Module, mb: MicroBatch, *, with_entropy: bool = False):
    """The reference computation: full `[n, T, V]` float32 logits (tests and the memory benchmark's old path)."""
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()  # [n, T, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1) * mb.loss_mask  # [n, T]
    entropy = -(logp_all.exp() * logp_all).sum(-1) * mb.loss_mask if with_entropy else None
    return logp, entropy
