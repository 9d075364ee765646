"""Play one episode in the terminal: a person types actions, or the env's expert plays and the transcript prints."""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.envs.core import TextEnv

__all__ = ["PlayResult", "play_episode"]


@dataclass(frozen=True)
class PlayResult:
    """How a played episode ended."""

    total_reward: float
    success: bool
    steps: int
    ended: bool


def play_episode(env: TextEnv, seed: int = 0, expert: bool = False, max_steps: int = 200,
                 input_fn=input, print_fn=print) -> PlayResult:
    """Play one episode; with `expert`, the env's `expert_action()` chooses every action.

    The last line printed reports the reward and success, e.g. ``reward=1.0 success=True steps=3``.
    """
    obs, info = env.reset(seed=seed)
    print_fn(f"=== {type(env).__name__} seed={seed} ===")
    if env.system_prompt and not expert:
        print_fn(f"[how to play] {env.system_prompt}")
    print_fn(obs)
    total, steps, success, ended = 0.0, 0, False, False
    while steps < max_steps:
        if "admissible_actions" in info and not expert:
            print_fn(f"[admissible] {', '.join(info['admissible_actions'][:30])}")
        if expert:
            action = env.expert_action()
            print_fn(f"> {action}")
        else:
            try:
                action = _read_action(input_fn)
            except EOFError:  # stdin closed (Ctrl-D, or a pipe ran dry): stop cleanly and say so
                print_fn("\n[end of input: the episode was not finished]")
                break
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        total += reward
        print_fn(obs)
        print_fn(f"[reward {reward:g}]")
        if terminated or truncated:
            success, ended = bool(info.get("success", False)), True
            break
    env.close()
    print_fn(f"reward={total:g} success={success} steps={steps}")
    return PlayResult(total, success, steps, ended)


def _read_action(input_fn) -> str:
    """One action; a ``` block opened on a line (or asked for by ``write_file PATH``) is read up to its closing fence.

    So code and files can be typed at `agentrl play --env code` as the code env's text form takes them.
    """
    lines = [input_fn("> ")]
    while "\n".join(lines).count("```") % 2 == 1 or (lines[0].strip().startswith("write_file")
                                                      and "```" not in "\n".join(lines)):
        lines.append(input_fn(". "))
    return "\n".join(lines)
