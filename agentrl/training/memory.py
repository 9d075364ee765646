"""How much memory a training step will take, known before the first step, so a config that cannot fit fails at once.

Peak resident memory of one update, for a decoder-only transformer trained with AdamW:

    weights      P x bytes(dtype)
    gradients    P x bytes(dtype)
    AdamW        2 x P x 4            (two float32 moments)
    engine copy  P x bytes(dtype)     (when the inference engine holds weights of its own)
    engine       KV cache + weights + ~1.5 GB runtime  (an in-process vLLM engine: resident through the step;
                                          `agentrl.engine.plan.EnginePlan.resident_bytes`)
    activations  tokens x layers x a  (a: values saved for backward per token and layer, see `_per_token_layer`)
                 with gradient checkpointing: tokens x layers x hidden + tokens x a (one layer recomputed)
    logits       min(tokens x V x 4, KEEP_BYTES) + 4 x chunk x V x 4   (`agentrl.training.logprobs`: the kept
                 log-softmaxes, and the chunked head's backward peak)
    runtime      about 0.6 GB         (Python, torch, transformers, tokenizer)

`tokens` is the largest micro-batch in padded tokens: the token budget, or the longest sample the env allows
(``max_context_tokens + max_new_tokens``) when one sample is longer than the budget. The per-token activation count
is written out for Llama / Qwen / Mistral-style blocks and scaled by `ACTIVATION_MARGIN`, fitted on SmolLM2-135M
(float32, 8,000 padded tokens: the count alone was 26% under the measured peak; bench/micro/train_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.training.logprobs import CHUNK_BYTES, KEEP_BYTES

__all__ = ["MemoryEstimate", "MemoryPlan", "estimate_train_memory", "plan_training_memory", "RUNTIME_BYTES"]

RUNTIME_BYTES = int(0.6 * 2**30)
"""Interpreter, torch, transformers and a tokenizer, resident before any tensor (measured: 0.5-0.7 GB)."""

GiB = 2**30

ACTIVATION_MARGIN = 1.3
"""Resident activations over the counted values: SmolLM2-135M, 8,000 padded tokens (4 samples), float32, one
forward and backward of the backbone peaked at 10.8 GiB of activations against 8.6 GiB counted (allocator slack,
saved tensors the count leaves out)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each part of a training step's peak, and what it was computed for."""

    weights: int
    gradients: int
    optimizer: int
    engine_copy: int
    activations: int
    logits: int
    runtime: int
    tokens: int
    gradient_checkpointing: bool
    engine: int = 0

    @property
    def total(self) -> int:
        """The estimated peak resident memory in bytes."""
        return (self.weights + self.gradients + self.optimizer + self.engine_copy + self.engine + self.activations
                + self.logits + self.runtime)

    def table(self) -> str:
        """One line per part, in GiB."""
        parts = ["weights", "gradients", "optimizer", "engine_copy", "engine", "activations", "logits", "runtime"]
        rows = [f"  {p:<12} {getattr(self, p) / GiB:6.2f} GiB" for p in parts]
        return "\n".join(rows + [f"  {'total':<12} {self.total / GiB:6.2f} GiB"])


def _per_token_layer(config) -> int:
    """Values one transformer block saves for backward, per token (float count)."""
    h = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    q = heads * head_dim
    # The two norms' inputs, q / k / v (projected, normed, rotated), the attention output; the MLP's gate, up,
    # activation and product. Fitted on SmolLM2-135M: 9.4k values per token and layer measured, 9.6k estimated.
    attention = 2 * h + 3 * q + 3 * kv
    experts = getattr(config, "num_experts", 0) or getattr(config, "n_routed_experts", 0) or 0
    if experts:
        inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        top_k = getattr(config, "num_experts_per_tok", 1)
        mlp = 4 * inter * top_k + experts + h * top_k
    else:
        mlp = 4 * config.intermediate_size
    return attention + mlp


def estimate_train_memory(config, n_params: int, *, dtype_bytes: int, tokens: int, gradient_checkpointing: bool,
                          engine_copy: bool, engine_bytes: int = 0, trainable_params: int | None = None
                          ) -> MemoryEstimate:
    """Estimate the peak memory of one training step (see the module docstring for the formula).

    Args:
        config: the model's transformers config (hidden size, layers, heads, vocabulary, MoE sizes).
        n_params: parameter count.
        dtype_bytes: bytes per parameter and activation value (4 for float32, 2 for bfloat16).
        tokens: padded tokens of the largest micro-batch.
        gradient_checkpointing: whether blocks recompute their activations in the backward.
        engine_copy: whether the inference engine keeps weights of its own in this process.
        engine_bytes: what an in-process engine holds through the step beside that (vLLM: KV cache, weights,
            runtime).
        trainable_params: LoRA: the adapters' parameter count (they add to the weights; the gradients and AdamW
            hold them alone); None: every parameter trains.
    """
    layers = config.num_hidden_layers
    per_layer = _per_token_layer(config) * dtype_bytes
    if gradient_checkpointing:
        activations = tokens * (layers * config.hidden_size * dtype_bytes + per_layer)
    else:
        activations = tokens * layers * per_layer
    activations = int(activations * ACTIVATION_MARGIN)
    vocab = config.vocab_size
    chunk = max(16, CHUNK_BYTES // (4 * vocab))
    logits = min(tokens * vocab * 4, KEEP_BYTES) + 4 * min(chunk, tokens) * vocab * 4
    trained = n_params if trainable_params is None else trainable_params
    weights = (n_params + (trainable_params or 0)) * dtype_bytes
    return MemoryEstimate(weights=weights, gradients=trained * dtype_bytes, optimizer=2 * trained * 4,
                          engine_copy=weights if engine_copy else 0, activations=activations, logits=logits,
                          runtime=RUNTIME_BYTES, tokens=tokens, gradient_checkpointing=gradient_checkpointing,
                          engine=engine_bytes)


@dataclass(frozen=True)
class MemoryPlan:
    """What the trainer will do about memory: whether blocks recompute activations, and the estimate behind it."""

    gradient_checkpointing: bool
    estimate: MemoryEstimate
    limit: int


def plan_training_memory(model, *, dtype_bytes: int, token_budget: int, longest_sample: int, checkpointing: str,
                         engine_copy: bool, limit_bytes: int = 0, shards: int = 1,
                         engine_bytes: int = 0, trainable_params: int | None = None) -> MemoryPlan:
    """Decide gradient checkpointing and check that the step fits, before the first rollout.

    Args:
        model: the policy (its config and parameter count).
        dtype_bytes: bytes per parameter and activation value.
        token_budget: `trainer.micro_batch_tokens`.
        longest_sample: the longest sample the env and config allow (``max_context_tokens + max_new_tokens``).
        checkpointing: ``on``, ``off`` or ``auto`` (on only when needed to fit).
        engine_copy: whether the inference engine holds its own weights in this process.
        limit_bytes: the memory the step may use (0 = what the machine has available now).
        shards: FSDP trainer workers the weights, gradients and AdamW state are split over (activations are not);
            the estimate and the limit are then per worker.
        engine_bytes: memory an in-process engine holds through the step (vLLM: KV cache, weights, runtime).
        trainable_params: LoRA: the adapters' parameter count (all workers); None: every parameter trains.

    Raises:
        ConfigError: the step cannot fit even with the cheapest settings this function controls; the message gives
            the estimate and names the settings to change.
    """
    import psutil

    from agentrl.config import ConfigError

    limit = limit_bytes or psutil.virtual_memory().available
    n_params = -(-sum(p.numel() for p in model.parameters()) // shards)  # this worker's shard, rounded up
    tokens = max(token_budget, longest_sample)
    trainable = None if trainable_params is None else -(-trainable_params // shards)

    def estimate(ckpt: bool) -> MemoryEstimate:
        return estimate_train_memory(model.config, n_params, dtype_bytes=dtype_bytes, tokens=tokens,
                                     gradient_checkpointing=ckpt, engine_copy=engine_copy, engine_bytes=engine_bytes,
                                     trainable_params=trainable)

    plain, recompute = estimate(False), estimate(True)
    if checkpointing == "on" or (checkpointing == "auto" and plain.total > limit):
        chosen = recompute
    else:
        chosen = plain
    if chosen.total > limit:
        fixes = []
        if not chosen.gradient_checkpointing:
            fixes.append(f"trainer.gradient_checkpointing: on (estimate {recompute.total / GiB:.1f} GiB)")
        if token_budget > longest_sample:
            fixes.append(f"a smaller trainer.micro_batch_tokens (now {token_budget})")
        fixes.append(f"a smaller context.max_context_tokens (the longest sample is {longest_sample} tokens)")
        if engine_bytes:
            fixes.append("engine.dtype: bfloat16 or a smaller engine.kv_cache_gib (the engine holds "
                         f"{engine_bytes / GiB:.1f} GiB), or the engine as a Ray actor on another machine")
        fixes.append("trainer.dtype: bfloat16, or a machine with more memory (trainer.memory_limit_gb sets the limit)")
        raise ConfigError(
            f"the training step needs about {chosen.total / GiB:.1f} GiB but {limit / GiB:.1f} GiB is available:\n"
            f"{chosen.table()}\nTo fit, set " + "; or ".join(fixes))
    return MemoryPlan(chosen.gradient_checkpointing, chosen, limit)
