"""`HFEngine`: batched sampling with a Hugging Face transformers causal LM (CPU by default).

We run our own decode loop instead of `model.generate` because the trainer needs, for every sampled token, the
log-probability under the exact distribution it was drawn from (after temperature / top-k / top-p / min-p), per-sample
finish reasons with stop strings, and a hook point for MoE routing capture.

Two ways through a batch, chosen once per engine:

* Prefix reuse (the default for full-attention models): multi-turn prompts are token-in/token-out, so turn k+1's
  prompt extends turn k's prompt and reply. The engine keeps each sequence's keys and values after a call
  (`agentrl.engine.kv_cache.PrefixStore`, LRU within `prefix_cache_bytes`), and the next prompt that extends one
  prefills only its new tokens, in groups of similar length; then the batch decodes together (`BatchKV`). A prompt
  that extends nothing (a new episode, a history rewrite, an evicted prefix) is prefilled in full. The stored state
  is dropped whenever the weights change (`clear_cache`, and a check of the parameters' version counters and of
  `policy_version` at every call), so reuse never mixes old and new weights.
* Plain (`prefix_cache_bytes=0`, or a model with sliding-window / linear-attention layers): one prefill forward
  over the left-padded prompts, then one forward per new token with a transformers `DynamicCache`.

Both sample in the same row order from the same generator, so with the same seed they give the same tokens (up to
floating-point ties: the reused keys and values come from differently shaped matrix products).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import torch

from agentrl.engine.base import Generation, NamedTensors, SamplingParams
from agentrl.engine.kv_cache import BatchKV, PrefixEntry, PrefixStore, supports_batch_kv

__all__ = ["HFEngine", "process_logits", "apply_penalties", "sample_tokens", "DEFAULT_PREFIX_CACHE_BYTES"]

DEFAULT_PREFIX_CACHE_BYTES = 2 * 2**30
"""Keys and values the engine keeps between calls by default: 2 GiB holds ~45k tokens of SmolLM2-135M in float32
(32 episodes of 1.4k tokens), ~9k of Qwen3-0.6B. Past it, the least recently used sequences are prefilled again."""

# Rows whose new tokens are prefilled together: a group grows while its padded size stays within this factor of
# its real tokens (rows are sorted by new-token count, so padding is bounded by the group, not by the batch).
_GROUP_PADDING = 1.25


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


def sample_tokens(logp: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of log-probabilities `[B, V]`, drawn by inverse CDF; returns `[B]` ids.

    `torch.multinomial` costs ~35 ms per step for 8 rows of a 151k vocabulary on a CPU core, more than a small
    model's forward; a float64 cumulative sum and a binary search cost a tenth of that and draw from the same
    distribution. ``u`` is uniform on [0, total) and the search takes the first index whose cumulative mass exceeds
    it, so a token of probability zero (removed by top-k / top-p) can never be drawn.
    """
    cdf = logp.detach().to("cpu", torch.float64).exp().cumsum(-1)  # [B, V]
    u = torch.rand((cdf.shape[0], 1), generator=generator, dtype=torch.float64) * cdf[:, -1:]  # [B, 1]
    idx = torch.searchsorted(cdf, u, side="right").clamp(max=cdf.shape[-1] - 1)
    return idx.squeeze(-1).to(logp.device)


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
        prefix_cache_bytes: memory for the keys and values kept between calls (prefix reuse, see the module
            docstring); 0 turns reuse off and every prompt is prefilled in full.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, batch_size: int = 16, dtype: torch.dtype | None = None,
                 capture_routes: bool = False, share_module: bool = False,
                 prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES):
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
            from agentrl.training.routing_replay import RoutingReplay

            self._router = RoutingReplay(self.model)  # raises a clear error for a dense model
        self.policy_version = 0
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else {gen_eos}
        self.eos_ids = {e for e in eos if e is not None}
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.prefix_cache = PrefixStore(prefix_cache_bytes)
        self.reuse_prefixes = prefix_cache_bytes > 0 and supports_batch_kv(self.model.config)
        self._cache_weights: tuple | None = None
        self.prefill_tokens = 0
        """Tokens run through the model at prefill (new tokens only where a prefix was reused), for benchmarks."""
        self.reused_tokens = 0
        """Prompt tokens whose keys and values came from the prefix cache."""
        self._reported = (0, 0)  # (prompt, reused) tokens at the previous `metrics` call

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
        self.clear_cache()  # kept keys and values belong to the old weights

    def metrics(self) -> dict[str, float]:
        """Prefix reuse since the previous call, under the keys every engine reports (see `VLLMEngine.metrics`)."""
        prompt, cached = self.prefill_tokens + self.reused_tokens, self.reused_tokens
        new_prompt, new_cached = prompt - self._reported[0], cached - self._reported[1]
        self._reported = (prompt, cached)
        if not new_prompt:
            return {}
        return {"prefix_cache_hit_rate": new_cached / new_prompt, "prefix_cached_tokens": float(new_cached),
                "prefix_prompt_tokens": float(new_prompt)}

    def clear_cache(self) -> None:
        """Drop every kept prefix (call it whenever the weights change; `generate` also checks on its own)."""
        self.prefix_cache.clear()
        self._cache_weights = None

    def _check_cache_weights(self) -> None:
        """Clear the prefix cache when the weights changed since it was filled.

        In-place updates (optimizer steps, `load_state_dict`) bump each parameter's version counter, so this catches
        an engine that samples from the training module itself, where no weight sync ever runs.
        """
        weights = (self.policy_version, tuple(p._version for p in self.model.parameters()))
        if weights != self._cache_weights:
            self.prefix_cache.clear()
            self._cache_weights = weights

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt; see `Generation` for what comes back."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        generator = torch.Generator().manual_seed(params.seed if params.seed is not None else torch.seed() % 2**63)
        # Similar lengths share a batch so padding stays small.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        if self.reuse_prefixes:
            self._check_cache_weights()
        try:
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch_prompts = [list(prompts[i]) for i in idx]
                if self.reuse_prefixes:
                    gens = self._generate_reusing(batch_prompts, params, generator)
                else:
                    gens = self._generate_padded(batch_prompts, params, generator)
                for i, gen in zip(idx, gens):
                    results[i] = gen
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    # ---- forwards ----------------------------------------------------------------------------------------------

    def _forward(self, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One model call: the last position's logits `[N, V]` and, when capturing, the routes `[N, S, L, K]`."""
        if self._router is None:
            return self.model(**inputs, use_cache=True, logits_to_keep=1).logits[:, -1, :], None
        with self._router.record() as recording:
            logits = self.model(**inputs, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        return logits, recording.routes

    def _generate_padded(self, prompts: list[list[int]], params: SamplingParams, generator) -> list[Generation]:
        """The plain path: one forward over the left-padded prompts, then a `DynamicCache` decode."""
        from transformers.cache_utils import DynamicCache

        device = next(self.model.parameters()).device
        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every row's next token lands in the last column
            input_ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[row, width - len(p) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        # Only the last position's logits are needed: a full [B, width, V] tensor would dominate time and memory.
        first_logits, prompt_routes = self._forward(input_ids=input_ids, attention_mask=attention,
                                                    position_ids=positions, past_key_values=cache)
        self.prefill_tokens += sum(len(p) for p in prompts)
        state = {"attention": attention, "position": positions[:, -1:]}
        step_routes: list[torch.Tensor] = []

        def step(feed: torch.Tensor) -> torch.Tensor:
            state["attention"] = torch.cat([state["attention"], torch.ones_like(state["attention"][:, :1])], dim=1)
            state["position"] = state["position"] + 1
            logits, routes = self._forward(input_ids=feed[:, None], attention_mask=state["attention"],
                                           position_ids=state["position"], past_key_values=cache)
            if routes is not None:
                step_routes.append(routes[:, 0])  # [B, L, K]
            return logits

        gens = self._sample(first_logits, step, prompts, params, generator)
        if prompt_routes is None:
            return gens
        return [dataclasses.replace(g, routed_experts=_join_routes(
            [prompt_routes[row, width - len(p) :]] + [r[row : row + 1] for r in step_routes[: len(g.token_ids) - 1]]
        ).numpy()) for row, (p, g) in enumerate(zip(prompts, gens))]

    def _generate_reusing(self, prompts: list[list[int]], params: SamplingParams, generator) -> list[Generation]:
        """Prefix reuse: prefill only what no kept prefix covers, in groups of similar length; decode together."""
        config = self.model.config
        first = next(self.model.parameters())
        batch = len(prompts)
        # 1. Each row's reused prefix: the longest kept sequence the prompt extends, leaving >= 1 token to feed.
        matches = [self.prefix_cache.match(p) for p in prompts]
        reused = [min(len(m.ids), len(p) - 1) if m else 0 for m, p in zip(matches, prompts)]
        for m in {id(m): m for m in matches if m is not None}.values():
            self.prefix_cache.pop(m)  # superseded by the longer sequence this call will keep
        new = [len(p) - c for p, c in zip(prompts, reused)]
        self.prefill_tokens += sum(new)
        self.reused_tokens += sum(reused)

        # 2. Buffer rows sorted by new tokens; contiguous runs of them form the prefill groups.
        buf_rows = sorted(range(batch), key=lambda j: new[j])  # buffer row -> prompt index
        row_of = [0] * batch  # prompt index -> buffer row
        for r, j in enumerate(buf_rows):
            row_of[j] = r
        groups = _similar_length_groups([new[j] for j in buf_rows])
        group_width = [0] * batch  # per buffer row: m_g, the new-token width of its group
        for start, end in groups:
            for r in range(start, end):
                group_width[r] = new[buf_rows[end - 1]]
        decode_start = max(reused[j] + group_width[r] for r, j in enumerate(buf_rows))  # P
        columns = decode_start + params.max_new_tokens - 1

        kv = BatchKV(config.num_hidden_layers)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv.allocate(batch, columns, heads, head_dim, first.dtype, first.device)
        mask = torch.zeros((batch, columns), dtype=torch.long, device=first.device)
        placements = []
        for r, j in enumerate(buf_rows):
            past_start = decode_start - group_width[r] - reused[j]
            mask[r, past_start : past_start + reused[j]] = 1
            mask[r, decode_start - new[j] : decode_start] = 1
            if reused[j]:
                placements.append((r, past_start, matches[j], reused[j]))
        kv.place(placements)

        # 3. Prefill the new tokens, group by group (right-aligned at column P; the gaps are masked).
        first_logits = torch.empty((batch, config.vocab_size), dtype=torch.float32, device=first.device)
        new_routes: list[torch.Tensor | None] = [None] * batch
        for start, end in groups:
            width = group_width[start]
            ids = torch.full((end - start, width), self.pad_id, dtype=torch.long)
            positions = torch.zeros((end - start, width), dtype=torch.long)
            for k, j in enumerate(buf_rows[start:end]):
                ids[k, width - new[j] :] = torch.tensor(prompts[j][reused[j] :], dtype=torch.long)
                positions[k, width - new[j] :] = torch.arange(reused[j], len(prompts[j]))
            kv.set_window(start, end, decode_start - width, decode_start)
            logits, routes = self._forward(input_ids=ids.to(first.device), position_ids=positions.to(first.device),
                                           attention_mask=mask[start:end, :decode_start], past_key_values=kv)
            first_logits[start:end] = logits.float()
            if routes is not None:
                for k, j in enumerate(buf_rows[start:end]):
                    new_routes[j] = routes[k, width - new[j] :]

        # 4. Decode every row together, one column per step; sampling sees the rows in prompt order.
        to_prompt_order = torch.tensor(row_of, device=first.device)
        to_buffer_order = torch.tensor(buf_rows, device=first.device)
        lengths = torch.tensor([len(prompts[j]) for j in buf_rows], device=first.device)[:, None]  # [B, 1]
        step_routes: list[torch.Tensor] = []
        state = {"column": decode_start}

        def step(feed: torch.Tensor) -> torch.Tensor:
            column = state["column"]
            mask[:, column] = 1
            kv.set_window(0, batch, column, column + 1)
            logits, routes = self._forward(input_ids=feed[to_buffer_order][:, None], past_key_values=kv,
                                           position_ids=lengths + (column - decode_start),
                                           attention_mask=mask[:, : column + 1])
            if routes is not None:
                # The router's recording lives where it was recorded (the CPU): index it there.
                step_routes.append(routes[to_prompt_order.to(routes.device), 0])  # [B, L, K], prompt order
            state["column"] = column + 1
            return logits[to_prompt_order]

        gens = self._sample(first_logits[to_prompt_order], step, prompts, params, generator)

        # 5. Keep each row's sequence: prompt + generated ids but the last, which was never fed back.
        fed = [len(g.token_ids) - 1 for g in gens]
        spans = []
        for r, j in enumerate(buf_rows):
            past_start = decode_start - group_width[r] - reused[j]
            spans.append([(past_start, past_start + reused[j]), (decode_start - new[j], decode_start + fed[j])])
        kept = kv.take_rows(spans)
        out = []
        for j, (p, g) in enumerate(zip(prompts, gens)):
            routes = None
            if self._router is not None:
                cached = matches[j].routes[: reused[j]] if reused[j] else None
                routes = _join_routes([cached, new_routes[j]] + [r[j : j + 1] for r in step_routes[: fed[j]]])
                g = dataclasses.replace(g, routed_experts=routes.numpy())
            keys, values = kept[row_of[j]]
            self.prefix_cache.add(PrefixEntry(tuple(p) + g.token_ids[:-1], keys, values, routes))
            out.append(g)
        return out

    # ---- sampling ----------------------------------------------------------------------------------------------

    def _sample(self, first_logits: torch.Tensor, step, prompts: list[list[int]], params: SamplingParams,
                generator) -> list[Generation]:
        """The decode loop shared by both paths.

        Args:
            first_logits: `[B, V]` next-token logits after the prompts, in prompt order.
            step: feeds `[B]` tokens (prompt order) and returns the next `[B, V]` logits, in prompt order.
            prompts: the batch's prompts (for the penalties' token statistics).
            params: sampling settings.
            generator: the random stream (one draw per step for the whole batch, rows in prompt order).
        """
        device = first_logits.device
        batch = len(prompts)
        next_logits = first_logits
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish: list[str | None] = [None] * batch
        seen = counts = None
        if params.has_penalties:  # token statistics for the penalties, only paid for when one is on
            vocab = next_logits.shape[-1]
            seen = torch.zeros((batch, vocab), dtype=torch.bool, device=device)  # [B, V]
            for row, p in enumerate(prompts):  # prompt tokens only (never the padding)
                seen[row, torch.tensor(list(p), dtype=torch.long, device=device)] = True
            counts = torch.zeros((batch, vocab), dtype=torch.float32, device=device)  # [B, V]
        for i in range(params.max_new_tokens):
            logp = process_logits(next_logits, params, seen, counts)  # [B, V]
            if params.temperature == 0:
                nxt = logp.argmax(-1)
            else:
                nxt = sample_tokens(logp, generator)
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
            if all(f is not None for f in finish) or i == params.max_new_tokens - 1:
                break
            feed = torch.tensor([tok[-1] if f is None else self.pad_id for tok, f in zip(tokens, finish)],
                                device=device)
            next_logits = step(feed)
        return [Generation(tuple(t), tuple(lp), f or "length") for t, lp, f in zip(tokens, logprobs, finish)]


def _similar_length_groups(lengths: list[int]) -> list[tuple[int, int]]:
    """Split ascending `lengths` into runs [start, end) whose padded size stays within `_GROUP_PADDING` of real."""
    groups: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (i + 1 - start) * n > _GROUP_PADDING * (total + n):
            groups.append((start, i))
            start, total = i, 0
        total += n
    groups.append((start, len(lengths)))
    return groups


def _join_routes(pieces: list[torch.Tensor | None]) -> torch.Tensor:
    """Concatenate per-position route pieces `[n_i, L, K]` (None pieces skipped) into one `[sum n_i, L, K]`."""
    return torch.cat([p for p in pieces if p is not None], dim=0)
