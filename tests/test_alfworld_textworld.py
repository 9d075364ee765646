"""Our ALFWorld engine against the original (TextWorld 1.7.0 + alfworld 0.4.2) on the same games.

Skipped unless the real-engine extra is installed: pip install "textworld[pddl]==1.7.0" "alfworld==0.4.2".
Each game is exported to a .tw-pddl document (`to_tw_pddl`) and played in both engines with the same commands
(the expert's, random admissible ones and junk); intro, every feedback, the admissible list and `won` must match.
"""

import random
from pathlib import Path

import pytest

from agentrl.envs.alfworld import TASK_TYPES, AlfworldEnv, generate_game, load_game
from agentrl.envs.alfworld.catalogue import load_catalogue
from agentrl.envs.alfworld.engine import GRAMMARS, admissible_commands, apply, goal_reached, intro
from agentrl.envs.alfworld.expert import expert_action, observe
from agentrl.envs.alfworld.textworld_engine import TextWorldGame, textworld_available, to_tw_pddl

pytestmark = pytest.mark.skipif(not textworld_available(), reason="needs textworld[pddl]==1.7.0 and alfworld==0.4.2")

EXAMPLE = Path(__file__).resolve().parents[1] / "envs" / "alfworld" / "example_game.json"


def _play_both(game, grammar, seed, max_steps=40):
    g, cat, rng = GRAMMARS[grammar], load_catalogue(), random.Random(seed)
    real = TextWorldGame(to_tw_pddl(game, grammar))
    obs_real, adm_real, won_real = real.reset()
    state, seen = game.initial, observe(game, game.initial, {})
    assert intro(game, state) == obs_real
    for step in range(max_steps):
        adm = admissible_commands(game, state, g)
        assert adm == adm_real, step
        if step % 3 == 2:
            command = rng.choice(adm + ["examine apple 1", "go to nowhere", "move it"])
        else:
            command = expert_action(game, state, seen, cat, g)
        state, obs = apply(game, state, command, g)
        seen = observe(game, state, seen)
        obs_real, adm_real, won_real = real.step(command)
        assert obs == obs_real, command
        assert goal_reached(game, state) == won_real
        if won_real:
            return
    pytest.fail("the expert did not finish in either engine")


@pytest.mark.parametrize("grammar", ["0.4", "legacy"])
def test_hand_written_game_matches_textworld(grammar):
    _play_both(load_game(EXAMPLE), grammar, seed=0)


@pytest.mark.parametrize("task_type", ["pick_two_obj_and_place", "look_at_obj_in_light"])
def test_generated_games_match_textworld(task_type):
    _play_both(generate_game(1, task_types=[task_type]), "0.4", seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("grammar", ["0.4", "legacy"])
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_every_task_type_matches_textworld(task_type, grammar):
    for seed in range(3):
        _play_both(generate_game(seed, task_types=[task_type]), grammar, seed=seed)


def test_env_plays_tw_pddl_files_with_planner_expert(tmp_path):
    import json

    path = tmp_path / "pick_and_place_simple-Mug-None-CoffeeMachine-1" / "trial_1" / "game.tw-pddl"
    path.parent.mkdir(parents=True)
    data = to_tw_pddl(load_game(EXAMPLE))
    data.pop("agentrl_task_type")
    path.write_text(json.dumps(data))
    env = AlfworldEnv(game_file=path)
    obs, info = env.reset(seed=0)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert info["task_type"] == "pick_and_place_simple"  # read from the ALFWorld-style folder name
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated:
            break
    assert terminated and reward == 1.0 and info["success"]
