"""Per-episode chat context: each turn's prompt ids, built token-in/token-out.

Turn k's prompt is what the model family's chat template renders for the history so far, which is exactly what the
model would see at inference. Where that rendering extends the previous turn's full sequence (prompt + the ids the
engine generated), the context simply grows: the generated ids are kept verbatim and only the new text (end of the
assistant turn, the observation, the next generation prompt) is tokenized. Where the template rewrote history (Qwen3
drops earlier turns' ``<think>`` spans, for example), the prefix no longer holds and the turn starts a new segment
from the full re-rendered history; training samples split there.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ChatContext", "strip_thinking"]


def strip_thinking(text: str) -> str:
    """The answer part of a thinking model's reply: everything after the last ``</think>``."""
    return text.rsplit("</think>", 1)[-1].strip() if "</think>" in text else text.strip()


class ChatContext:
    """The growing conversation of one episode, rendered with the tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        system_prompt: the env's instructions; omitted when empty.
        chat_kwargs: extra template variables (e.g. ``{"enable_thinking": False}`` for Qwen3).
    """

    def __init__(self, tokenizer, system_prompt: str = "", chat_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.chat_kwargs = dict(chat_kwargs or {})
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self._text = ""  # the text of the last prompt
        self._ids: list[int] = []  # and its ids

    def _render(self) -> str:
        return self.tokenizer.apply_chat_template(
            self.messages, tokenize=False, add_generation_prompt=True, **self.chat_kwargs
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def first_prompt(self, observation: str) -> list[int]:
        """Prompt ids for the first turn."""
        self.messages.append({"role": "user", "content": observation})
        self._text = self._render()
        self._ids = self._encode(self._text)
        return list(self._ids)

    def next_prompt(self, generated_ids: list[int] | tuple[int, ...], observation: str) -> tuple[list[int], bool]:
        """Record the model's reply and the env's observation; return (next prompt ids, starts a new segment)."""
        reply_text = self.tokenizer.decode(list(generated_ids), skip_special_tokens=False)
        content = self.tokenizer.decode(list(generated_ids), skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": content})
        self.messages.append({"role": "user", "content": observation})
        text = self._render()
        seen = self._text + reply_text
        if text.startswith(seen):
            ids = self._ids + list(generated_ids) + self._encode(text[len(seen) :])
            new_segment = False
        else:
            ids = self._encode(text)
            new_segment = True
        self._text, self._ids = text, ids
        return list(ids), new_segment

    @staticmethod
    def action_text(tokenizer, generated_ids) -> str:
        """The text an env receives for `generated_ids`: special tokens and thinking removed."""
        return strip_thinking(tokenizer.decode(list(generated_ids), skip_special_tokens=True))
