"""ALFWorld env: rules, text, expert, generator, splits, files, and the env contract."""

import dataclasses
import random
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.envs.alfworld import SPLITS, TASK_TYPES, AlfworldEnv, generate_game, load_game, save_game
from agentrl.envs.alfworld.catalogue import load_catalogue
from agentrl.envs.alfworld.engine import GRAMMARS, admissible_commands, apply, goal_reached
from agentrl.envs.alfworld.expert import run_expert
from agentrl.envs.alfworld.generator import is_held_out
from agentrl.envs.alfworld.world import GameFormatError

EXAMPLE = Path(__file__).resolve().parents[1] / "envs" / "alfworld" / "example_game.json"

# The real-engine transcript from shared/docs/envs.md (ALFWorld section), on the same scene, hand-written in
# example_game.json. One line differs on purpose: TextWorld 1.7.0 answers "Nothing happens." to examining an object
# that is not in hand (checked by tests/test_alfworld_textworld.py), so "examine apple 1" is played while holding it.
DOC_TRANSCRIPT = [
    ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed."),
    ("take mug 1 from cabinet 1", "Nothing happens."),
    ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In it, you see a mug 1."),
    ("take mug 1 from cabinet 1", "You pick up the mug 1 from the cabinet 1."),
    ("inventory", "You are carrying: a mug 1."),
    ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."),
    ("clean mug 1 with sinkbasin 1", "You clean the mug 1 using the sinkbasin 1."),
    ("look", "You are facing the sinkbasin 1. Next to it, you see nothing."),
    ("examine apple 1", "Nothing happens."),
    ("examine mug 1", "This is a clean mug 1."),
    ("move mug 1 to coffeemachine 1", "Nothing happens."),
    ("go to coffeemachine 1", "You arrive at coffeemachine 1. On the coffeemachine 1, you see nothing."),
    ("move mug 1 to coffeemachine 1", "You move the mug 1 to the coffeemachine 1."),
]
DOC_INTRO = (
    "-= Welcome to TextWorld, ALFRED! =-\n\n"
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a coffeemachine 1, "
    "a countertop 1, a fridge 1, and a sinkbasin 1.\n\nYour task is to: put a clean mug in coffeemachine."
)


def test_doc_transcript_word_for_word():
    env = AlfworldEnv(game_file=EXAMPLE)
    obs, info = env.reset(seed=0)
    assert obs == DOC_INTRO
    assert info["task_type"] == "pick_clean_then_place_in_recep"
    for i, (command, expected) in enumerate(DOC_TRANSCRIPT):
        obs, reward, terminated, truncated, info = env.step(command)
        assert obs == expected, command
        last = i == len(DOC_TRANSCRIPT) - 1
        assert (reward, terminated, truncated) == ((1.0, True, False) if last else (0.0, False, False))
    assert info["success"] is True


def test_legacy_grammar_words():
    env = AlfworldEnv(game_file=EXAMPLE, grammar="legacy")
    env.reset(seed=0)
    assert env.step("go to cabinet 1")[0] == "You arrive at loc 4. The cabinet 1 is closed."
    env.step("open cabinet 1")
    env.step("take mug 1 from cabinet 1")
    env.step("go to coffeemachine 1")
    assert env.step("help")[0] == "Nothing happens."
    assert env.step("move mug 1 to coffeemachine 1")[0] == "Nothing happens."
    assert "put mug 1 in/on coffeemachine 1" in env._admissible
    assert env.step("put mug 1 in/on coffeemachine 1")[0] == "You put the mug 1 in/on the coffeemachine 1."
    assert "help" not in env.system_prompt and "in/on" in env.system_prompt


def test_help_only_in_04_and_examine_states():
    env = AlfworldEnv(game_file=EXAMPLE)
    env.reset(seed=0)
    assert env.step("help")[0].startswith("Available commands:\n  look:")
    for command in ("go to fridge 1", "open fridge 1", "take apple 1 from fridge 1"):
        env.step(command)
    assert env.step("examine apple 1")[0] == "This is a cold apple 1."
    env.step("go to countertop 1")
    env.step("move apple 1 to countertop 1")
    env.step("take knife 1 from countertop 1")
    assert env.step("slice apple 1 with knife 1")[0] == "You sliced the apple 1 with the knife 1."
    env.step("move knife 1 to countertop 1")
    env.step("take apple 1 from countertop 1")
    assert env.step("examine apple 1")[0] == "This is a cool sliced apple 1."


def _random_walk(game, grammar, rng, steps):
    state = game.initial
    for _ in range(steps):
        state, _ = apply(game, state, rng.choice(admissible_commands(game, state, grammar)), grammar)
        yield state


@pytest.mark.parametrize("grammar", ["0.4", "legacy"])
def test_inadmissible_is_nothing_happens_and_admissible_always_acts(grammar):
    g = GRAMMARS[grammar]
    rng = random.Random(0)
    for seed in range(20):
        game = generate_game(seed)
        for state in _random_walk(game, g, rng, 15):
            adm = admissible_commands(game, state, g)
            assert adm == sorted(set(adm))
            for junk in ("", "take", "go to the moon", "open " + adm[0], "GO TO " + adm[0][6:]):
                if junk not in adm:
                    assert apply(game, state, junk, g) == (state, "Nothing happens.")
            for command in adm:
                _, feedback = apply(game, state, command, g)
                assert feedback != "Nothing happens.", command


def test_expert_solves_200_seeds_per_split_within_budget():
    cat = load_catalogue()
    for split in SPLITS:
        env = AlfworldEnv(split=split)
        for seed in range(200 if split == "train" else 50):
            env.reset(seed=seed)
            for _ in range(env.max_steps):
                obs, reward, terminated, truncated, info = env.step(env.expert_action())
                if terminated or truncated:
                    break
            assert info["success"], (split, seed, env.game.goal.text)
    # and in the legacy grammar
    for seed in range(50):
        assert run_expert(generate_game(seed), cat, GRAMMARS["legacy"], 50) is not None


def test_expert_recovers_after_random_detour():
    rng = random.Random(1)
    for seed in range(40):
        env = AlfworldEnv()
        _, info = env.reset(seed=seed)
        terminated = False
        for _ in range(8):  # wander: move things, open and close, pick up junk
            obs, reward, terminated, truncated, info = env.step(rng.choice(info["admissible_actions"]))
            if terminated:
                break
        steps = 0
        while not terminated and steps < 60:
            obs, reward, terminated, truncated, info = env.step(env.expert_action())
            steps += 1
        assert terminated, (seed, env.game.goal.text)


def test_every_task_type_generated_with_its_templates():
    cat = load_catalogue()
    for task_type in TASK_TYPES:
        texts = set()
        for seed in range(30):
            game = generate_game(seed, task_types=[task_type])
            assert game.goal.task_type == task_type
            assert not goal_reached(game, game.initial)
            texts.add(game.goal.text.split(game.goal.obj)[0])
        templates = {t.split("{obj}")[0] for t in cat.templates[task_type]}
        assert texts == templates


def test_generator_is_deterministic_and_splits_differ():
    assert generate_game(7) == generate_game(7)
    assert generate_game(7) != generate_game(8)
    assert generate_game(7, "train") != generate_game(7, "valid_seen")


def test_unseen_split_holds_out_combinations():
    def combo(game):
        return game.goal.task_type, game.goal.obj, game.goal.recep or game.goal.toggle

    train = {combo(generate_game(s, "train")) for s in range(300)}
    unseen = {combo(generate_game(s, "valid_unseen")) for s in range(100)}
    assert all(not is_held_out(*c) for c in train)
    assert all(is_held_out(*c) for c in unseen)
    assert not train & unseen


def test_save_load_replays_exactly(tmp_path):
    env = AlfworldEnv(grammar="legacy")
    env.reset(seed=5)
    path = env.save_game(tmp_path / "game.json")
    assert load_game(path) == env.game
    replay = AlfworldEnv(grammar="legacy", game_file=path)
    a, b = [env.reset(seed=5)[0]], [replay.reset(seed=123)[0]]
    rng = random.Random(3)
    info = env.reset(seed=5)[1]
    for _ in range(30):
        command = rng.choice(info["admissible_actions"] + ["junk"])
        step_a, step_b = env.step(command), replay.step(command)
        a.append(step_a[0])
        b.append(step_b[0])
        info = step_a[4]
        assert step_a[1:4] == step_b[1:4]
    assert a[1:] == b[1:]


def test_bad_inputs_have_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown split"):
        AlfworldEnv(split="test")
    with pytest.raises(ValueError, match="unknown grammar"):
        AlfworldEnv(grammar="0.3")
    with pytest.raises(ValueError, match="task_types"):
        AlfworldEnv(task_types=["pick_and_place"])
    with pytest.raises(ValueError, match="max_steps"):
        AlfworldEnv(max_steps=0)
    with pytest.raises(FileNotFoundError):
        AlfworldEnv(game_file=tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(GameFormatError, match="bad.json"):
        load_game(bad)
    game = generate_game(0)
    broken = dataclasses.replace(game.initial, contents={**game.initial.contents, "cabinet 99": ()})
    with pytest.raises(GameFormatError, match="every receptacle"):
        dataclasses.replace(game, initial=broken)
    save_game(game, tmp_path / "ok.json")


def test_contract_check_env_truncation_and_junk():
    env = AlfworldEnv(max_steps=5)
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    for _ in range(5):
        obs, reward, terminated, truncated, info = env.step("dance")
        assert obs == "Nothing happens." and reward == 0.0 and not terminated
    assert truncated and info["success"] is False
    env = AlfworldEnv()
    env.reset(seed=1)
    for _ in range(200):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert isinstance(obs, str)
        if terminated or truncated:
            env.reset()


def test_task_type_filter_and_info():
    env = AlfworldEnv(task_types=["look_at_obj_in_light"])
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        assert info["task_type"] == "look_at_obj_in_light"
        assert info["admissible_actions"] == sorted(info["admissible_actions"])
        assert obs.endswith(f"Your task is to: {info['goal']}.")
