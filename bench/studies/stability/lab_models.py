"""Tiny Qwen3-MoE policies, their mismatched inference copies, sampling and toy rewards for the mismatch lab.

The training engine pi is a float32 model. The inference engine mu is a copy that computes slightly differently:
- `quantized_copy`: weights rounded to a lower-precision format (FP8 e4m3 / e5m2 with a per-output-row scale, as
  FP8 inference kernels do, or a plain bf16 / fp16 cast), computed in float32. This is the paper's setting in
  miniature (FP8 rollout, higher-precision training); the router is quantized too, so some tokens change experts.
- `perturbed_router_copy`: float32 weights with Gaussian noise on the router only (part (b), Routing Replay).

Departures from a real stack, on purpose: mu is re-created from pi before every rollout (perfect weight sync), and
sequences are tiny, so sampling re-runs the full forward per token instead of keeping a KV cache.
"""

from __future__ import annotations

import copy

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

PROMPT_LEN = 4
WEIGHT_FORMATS: dict[str, torch.dtype | None] = {
    "fp32": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def tiny_moe(seed: int, vocab: int = 64, embed_std: float | None = None, head_std: float | None = None
             ) -> Qwen3MoeForCausalLM:  # fmt: skip
    """A 2-layer, 8-expert, top-2 Qwen3-MoE with a random init.

    Args:
        seed: torch seed for the init.
        vocab: vocabulary size.
        embed_std: std of the token embeddings (None: the HF default, 0.02).
        head_std: std of the LM head (None: the HF default, 0.02, which gives near-uniform next-token
            distributions; ~0.3 gives peaked ones, closer to a pretrained LM).

    Returns:
        The model in float32.
    """
    config = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=64, decoder_sparse_step=1, mlp_only_layers=[],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(std=1.0)  # transformers 5.x inits the router to zeros: every top-k would be a tie
            elif ".mlp.experts." in name:
                p.normal_(std=0.2)
            elif name == "lm_head.weight" and head_std is not None:
                p.normal_(std=head_std)
            elif name == "model.embed_tokens.weight" and embed_std is not None:
                p.normal_(std=embed_std)
    return model


def quantize_weight(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round a weight to `fmt` and back to its dtype (fake quantization).

    FP8 formats scale each output row so its largest magnitude maps to the format's max (per-channel FP8, as
    inference kernels do; without a scale small weights would underflow). bf16 / fp16 are a plain cast.

    Args:
        weight: a float tensor, `[..., in_features]`.
        fmt: a key of `WEIGHT_FORMATS`.

    Returns:
        The rounded tensor, same shape and dtype.
    """
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
    dtype = WEIGHT_FORMATS[fmt]
    if dtype is None:
        return weight.clone()
    if not fmt.startswith("fp8"):
        return weight.to(dtype).to(weight.dtype)
    scale = weight.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / torch.finfo(dtype).max  # [..., 1]
    return (weight / scale).to(dtype).to(weight.dtype) * scale


def quantized_copy(model: torch.nn.Module, fmt: str) -> torch.nn.Module:
    """The inference engine: a copy of `model` whose matrices (router, experts, attention, embeddings, LM head) are
    rounded to `fmt`; norms stay in float32, as in FP8 serving.
    """
    mu = copy.deepcopy(model).eval()
    with torch.no_grad():
        for p in mu.parameters():
            if p.dim() >= 2:
                p.copy_(quantize_weight(p, fmt))
    return mu


def perturbed_router_copy(model: torch.nn.Module, std: float, gen: torch.Generator) -> torch.nn.Module:
    """The inference engine for part (b): float32, Gaussian noise of `std` on every router weight."""
    mu = copy.deepcopy(model).eval()
    with torch.no_grad():
        for name, p in mu.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(torch.randn(p.shape, generator=gen) * std)
    return mu


@torch.no_grad()
def sample(mu: torch.nn.Module, prompts: torch.Tensor, response_len: int, gen: torch.Generator) -> torch.Tensor:
    """Sample `response_len` tokens from mu at temperature 1; returns prompt + response `[B, P + R]`."""
    seq = prompts
    for _ in range(response_len):
        logits = mu(seq).logits[:, -1].float()  # [B, V]
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)  # [B, 1]
        seq = torch.cat([seq, nxt], dim=1)
    return seq  # [B, P + R]


def response_logp(model: torch.nn.Module, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the response tokens `[B, R]` and their logits `[B, R, V]` (float32)."""
    logits = model(seq).logits[:, PROMPT_LEN - 1 : -1].float()  # [B, R, V]
    logp = torch.log_softmax(logits, -1).gather(-1, seq[:, PROMPT_LEN:, None]).squeeze(-1)  # [B, R]
    return logp, logits


def prompt_class_reward(seq: torch.Tensor) -> torch.Tensor:
    """Part (b)'s reward: the fraction of response tokens t with t % 4 == prompt[0] % 4 (chance 0.25), `[B]`."""
    target = seq[:, :1] % 4  # [B, 1]
    return (seq[:, PROMPT_LEN:] % 4 == target).float().mean(dim=1)  # [B]


def chain_reward(seq: torch.Tensor) -> torch.Tensor:
    """Part (a)'s reward: the fraction of response tokens y_t with y_t % 4 == (y_{t-1} + 1) % 4, where y_0 is the
    last prompt token (chance 0.25). Each token's credit depends on the token sampled before it, `[B]`.
    """
    prev, cur = seq[:, PROMPT_LEN - 1 : -1], seq[:, PROMPT_LEN:]  # [B, R] each
    return (cur % 4 == (prev + 1) % 4).float().mean(dim=1)  # [B]


def make_batch(n_prompts: int, group: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts, each repeated `group` times: `(prompts [n*G, P], group_ids [n*G])`."""
    prompts = torch.randint(0, vocab, (n_prompts, PROMPT_LEN), generator=gen)
    return prompts.repeat_interleave(group, 0), torch.arange(n_prompts).repeat_interleave(group)


# The corrections part (a) compares, as `policy_loss` options on top of MiniRL (one-sided clip 0.2 / 0.27, token sum
# per response). "seq_is" (untruncated sequence-level IS) is the unbiased reference of the exact-gradient check only.
CORRECTIONS_COMPARED: dict[str, dict[str, object]] = {
    "none": {"correction": "none"},
    "tis": {"correction": "tis", "is_cap": 5.0},
    "icepop": {"correction": "icepop", "icepop_low": 0.5, "icepop_high": 5.0},
    "seq_mis": {"correction": "mis", "mis_level": "sequence", "mis_low": 0.5, "mis_high": 2.0},
}
SEQUENCE_IS: dict[str, object] = {"correction": "tis", "is_level": "sequence", "is_cap": 1e30}
