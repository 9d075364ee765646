"""Off-policy updates: split one rollout batch into `n_minibatches` mini-batches, one optimizer step each.

With n_minibatches = N > 1 the later mini-batches are trained on data sampled by an older policy (pi_old is the
rollout policy, pi_theta has moved): the paper's off-policy setting, where clipping and Routing Replay are required.
Groups stay whole so that every mini-batch sees complete groups (the group baseline was computed over them).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["minibatch_indices"]


def minibatch_indices(
    group_ids: Tensor, n_minibatches: int, *, generator: torch.Generator | None = None
) -> list[Tensor]:
    """Split response indices into `n_minibatches` shuffled mini-batches of whole groups.

    Args:
        group_ids: `[N]` integer group id per response.
        n_minibatches: number of optimizer steps per rollout batch (the paper's N = gbs / mbs).
        generator: random generator for the shuffle (None: no shuffle, groups in order of first appearance).

    Returns:
        `n_minibatches` index tensors whose union is `arange(N)`.

    Raises:
        ValueError: if there are fewer groups than mini-batches.
    """
    if n_minibatches < 1:
        raise ValueError(f"n_minibatches must be >= 1, got {n_minibatches}")
    unique, first = [], set()
    for g in group_ids.tolist():
        if g not in first:
            first.add(g)
            unique.append(g)
    if len(unique) < n_minibatches:
        raise ValueError(f"{len(unique)} groups cannot fill {n_minibatches} mini-batches; lower n_minibatches")
    order = torch.randperm(len(unique), generator=generator).tolist() if generator is not None else range(len(unique))
    groups = [unique[i] for i in order]
    chunks = [groups[i::n_minibatches] for i in range(n_minibatches)]
    return [torch.cat([(group_ids == g).nonzero(as_tuple=True)[0] for g in chunk]) for chunk in chunks]
