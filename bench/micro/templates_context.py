"""Per-turn context cost at turn 50 vs turn 1 when the prefix holds: ours (render only the new messages) against a
baseline that re-renders and re-tokenizes the whole history every turn. Target: ours <= 1.5.

Run: python bench/micro/templates_context.py [--turns 50] [--repeats 20]. Writes docs/results/templates_context.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from agentrl.chat.context import ChatContext
from agentrl.models import load_qwen3_tokenizer

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, time_calls, write_json  # noqa: E402


class FullRerender(ChatContext):
    """The baseline: every turn renders the whole history and tokenizes all of it."""

    def next_prompt(self, generated_ids, observation, role=None):
        self.messages += [self.parse_reply(generated_ids).message, {"role": "user", "content": observation}]
        text = self._render(self.messages)
        self._pieces, self._ids = [text], self._encode(text)
        return list(self._ids), False


def turn_costs(cls, tok, family: str, turns: int, reply: list[int], observation: str, **options) -> list[float]:
    """Seconds spent in `next_prompt` at each turn of one episode."""
    ctx = cls(tok, "You are an agent in a text world. Reply with one action.", family=family, **options)
    ctx.first_prompt("You are in a kitchen. Your task is to put a clean mug in the coffee machine.")
    return time_calls(ctx.next_prompt, [(reply, observation)] * turns)


def main() -> None:
    """Measure and print the ratios; save them under docs/results/."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    tok = load_qwen3_tokenizer()
    reply = tok("go to countertop 1<|im_end|>", add_special_tokens=False)["input_ids"]
    observation = "You arrive at countertop 1. On the countertop 1, you see a mug 2, a knife 1 and a loaf of bread 3."
    results = {}
    cases = [("ours", ChatContext, "chatml", {}), ("baseline", FullRerender, "chatml", {}),
             ("ours-qwen3-tool", ChatContext, "qwen3", {"observation_role": "tool"})]
    for name, cls, family, options in cases:
        runs = [turn_costs(cls, tok, family, args.turns, reply, observation, **options)
                for _ in tqdm(range(args.repeats), desc=name)]
        # Median over repeats per turn index; turn 1 vs turn N (the last).
        first = sorted(r[0] for r in runs)[len(runs) // 2]
        last = sorted(r[-1] for r in runs)[len(runs) // 2]
        results[name] = {"turn1_us": first * 1e6, f"turn{args.turns}_us": last * 1e6, "ratio": last / first}
    for name, r in results.items():
        print(f"{name:16s} turn 1 {r['turn1_us']:8.1f} us   turn {args.turns} {r[f'turn{args.turns}_us']:8.1f} us"
              f"   ratio {r['ratio']:.2f}")
    print(f"baseline / ours at turn {args.turns}: "
          f"{results['baseline'][f'turn{args.turns}_us'] / results['ours'][f'turn{args.turns}_us']:.1f}x")
    write_json(RESULTS / "templates_context.json", results)


if __name__ == "__main__":
    main()
