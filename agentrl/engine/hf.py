"""`HFEngine`: batched sampling with a Hugging Face transformers causal LM (CPU by default).

We run our own decode loop instead of `model.generate` because the trainer needs, for every sampled token, the
log-probability under the exact distribution it was drawn from (after temperature / top-k / top-p / min-p), per-sample
finish reasons with stop strings, and a hook point for MoE routing capture. The loop is the textbook one: one prefill
forward over left-padded prompts, then one forward per new token with the KV cache.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import torch

from agentrl.engine.base import Generation, NamedTensors, SamplingParams

__all__ = ["HFEngine", "process_logits", "apply_penalties"]


def apply_penalties(logits: torch.Tensor, params: SamplingParams, context_seen: torch.Tensor,
                    output_counts: torch.Tensor) -> torch.Tensor:
    """Repetition, presence and frequency penalties on raw logits `[B, V]` (vLLM semantics).

    Args:
        logits: raw next-token logits `[B, V]` (float).
        params: the penalties to apply.
        context_seen: `[B, V]` bool, tokens present in the prompt or the output so far (repetition penalty).
        output_counts: `[B, V]` float, occurrences of each token in the output so far (presence / frequency).
    """
    if params.repetition_penalty != 1.0:
        penalised = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = torch.where(context_seen, penalised, logits)
    if params.frequency_penalty != 0.0:
        logits = logits - params.frequency_penalty * output_counts
    if params.presence_penalty != 0.0:
        logits = logits - params.presence_penalty * (output_counts > 0).float()
    return logits


def process_logits(logits: torch.Tensor, params: SamplingParams, context_seen: torch.Tensor | None = None,
                   output_counts: torch.Tensor | None = None) -> torch.Tensor:
    """Turn raw next-token logits `[B, V]` into the log-probabilities actually sampled from `[B, V]`.

    Removed tokens get -inf. Order: penalties (when `params` has any, given `context_seen` and `output_counts`, see
    `apply_penalties`), temperature, top-k, top-p, min-p (the transformers / vLLM order). Because penalties are
    applied here, the returned log-probabilities stay those of the distribution the token was really drawn from.
    """
    logits = logits.float()
    if params.has_penalties:
        if context_seen is None or output_counts is None:
            raise ValueError("sampling penalties need the context_seen and output_counts token statistics")
        logits = apply_penalties(logits, params, context_seen, output_counts)
    if params.temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        drop_sorted = mass_before > params.top_p  # the top token always has mass_before 0: never dropped
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if params.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(-1, keepdim=True).values, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


class HFEngine:
    """Inference engine over a transformers causal LM; it samples from weights of its own.

    Args:
        model: the policy. The engine keeps its own copy (in `dtype`, when given), refreshed by `update_weights`.
        tokenizer: its tokenizer (for the pad / end-of-sequence ids and for stop strings).
        batch_size: prompts per forward pass; larger batches amortise the per-step overhead.
        dtype: optional precision of the engine's copy (e.g. bfloat16 rollouts against float32 training, to study
            the train-inference mismatch).
        capture_routes: for MoE models, record the experts chosen at every position (R3 Routing Replay).
        share_module: sample from `model` itself instead of a copy. Only correct when the rollout always uses the
            trainer's current weights (lockstep, ``sync_every=1``, one process), where it saves the copy's memory
            and makes `update_weights` free.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, batch_size: int = 16, dtype: torch.dtype | None = None,
                 capture_routes: bool = False, share_module: bool = False):
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.share_module = share_module
        if share_module:
            if dtype is not None and dtype != next(model.parameters()).dtype:
                raise ValueError("share_module=True samples from the trainer's own module: it cannot have another "
                                 "dtype (pass share_module=False for an engine copy in that dtype)")
            self.model = model
        else:
            self.model = copy.deepcopy(model) if dtype is None else copy.deepcopy(model).to(dtype)
        self.capture_routes = capture_routes
        self._router = None
        if capture_routes:
            from agentrl.routing_replay import RoutingReplay

            self._router = RoutingReplay(self.model)  # raises a clear error for a dense model
        self.policy_version = 0
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else {gen_eos}
        self.eos_ids = {e for e in eos if e is not None}
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)

    @torch.no_grad()
    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Copy the named tensors into the engine's weights (cast to its dtype) and tag them `version`.

        A tensor that already is the engine's own (a shared module handed its own parameters) is not copied.

        Raises:
            KeyError: a name that is not one of the model's weights (nothing is half-loaded: names are checked first).
        """
        own = self.model.state_dict(keep_vars=True)
        pairs = list(named_tensors)
        unknown = [name for name, _ in pairs if name not in own]
        if unknown:
            raise KeyError(f"update_weights: {unknown[0]!r} is not a weight of the engine's model "
                           f"({len(unknown)} unknown names)")
        for name, tensor in pairs:
            target = own[name]
            if target.data_ptr() != tensor.data_ptr():
                target.data.copy_(tensor)
        self.policy_version = int(version)

    def metrics(self) -> dict[str, float]:
        """The HF engine keeps no counters."""
        return {}

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt; see `Generation` for what comes back."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        generator = torch.Generator().manual_seed(params.seed if params.seed is not None else torch.seed() % 2**63)
        # Similar lengths share a batch so left padding stays small.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch_prompts = [prompts[i] for i in idx]
                if self._router is None:
                    gens = self._generate_batch(batch_prompts, params, generator)
                else:
                    gens = self._generate_batch_with_routes(batch_prompts, params, generator)
                for i, gen in zip(idx, gens):
                    results[i] = gen
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    def _generate_batch_with_routes(self, prompts: list[Sequence[int]], params: SamplingParams,
                                    generator) -> list[Generation]:
        """`_generate_batch`, recording the experts every MoE layer chose at every position (for R3)."""
        with self._router.record_generation() as recording:
            gens = self._generate_batch(prompts, params, generator)
        width = max(len(p) for p in prompts)
        prompt_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            prompt_mask[row, width - len(p) :] = 1
        routes = recording.per_sample(prompt_mask, [len(g.token_ids) for g in gens])  # [P_i + G_i - 1, L, K] each
        return [dataclasses.replace(g, routed_experts=r.numpy()) for g, r in zip(gens, routes)]

    def _generate_batch(self, prompts: list[Sequence[int]], params: SamplingParams, generator) -> list[Generation]:
        device = next(self.model.parameters()).device
        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every row's next token lands in the last column
            input_ids[row, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            attention[row, width - len(p) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        # Only the last position's logits are needed: a full [B, width, V] tensor would dominate time and memory.
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        cache, next_logits = out.past_key_values, out.logits[:, -1, :]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish: list[str | None] = [None] * batch
        last_pos = positions[:, -1:]
        seen = counts = None
        if params.has_penalties:  # token statistics for the penalties, only paid for when one is on
            vocab = next_logits.shape[-1]
            seen = torch.zeros((batch, vocab), dtype=torch.bool, device=device)  # [B, V]
            for row, p in enumerate(prompts):  # prompt tokens only (never the padding)
                seen[row, torch.tensor(list(p), dtype=torch.long, device=device)] = True
            counts = torch.zeros((batch, vocab), dtype=torch.float32, device=device)  # [B, V]
        for _ in range(params.max_new_tokens):
            logp = process_logits(next_logits, params, seen, counts)  # [B, V]
            if params.temperature == 0:
                nxt = logp.argmax(-1)
            else:
                nxt = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(-1).to(device)
            chosen = logp.gather(-1, nxt[:, None]).squeeze(-1).tolist()
            if counts is not None:
                live = torch.tensor([f is None for f in finish], device=device)  # [B]
                counts[live, nxt[live]] += 1
                seen[live, nxt[live]] = True
            for row, (tok, lp) in enumerate(zip(nxt.tolist(), chosen)):
                if finish[row] is not None:
                    continue
                tokens[row].append(tok)
                logprobs[row].append(lp)
                if tok in self.eos_ids:
                    finish[row] = "stop"
                elif params.stop:
                    text = self.tokenizer.decode(tokens[row][-64:])
                    if any(s in text for s in params.stop):
                        finish[row] = "stop"
            if all(f is not None for f in finish):
                break
            feed = [tok[-1] if f is None else self.pad_id for tok, f in zip(tokens, finish)]
            feed = torch.tensor(feed, device=device)
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], dim=1)
            last_pos = last_pos + 1
            out = self.model(input_ids=feed[:, None], attention_mask=attention, position_ids=last_pos,
                             past_key_values=cache, use_cache=True)
            cache, next_logits = out.past_key_values, out.logits[:, -1, :]
        return [
            Generation(tuple(t), tuple(lp), f or "length") for t, lp, f in zip(tokens, logprobs, finish)
        ]
