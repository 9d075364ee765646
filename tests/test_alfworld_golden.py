# ruff: noqa: E501  (golden transcripts are kept as whole lines, exactly as the env prints them)
"""Golden transcripts: the expert on generate_game(0) of each task type, in both grammars, word for word.

Regenerate only on purpose (a deliberate change to the generator or the text), and check the diff reads right.
"""

import pytest

from agentrl.envs.alfworld import AlfworldEnv, generate_game

GOLDEN = {
    "pick_and_place_simple/0.4": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a garbagecan 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, and a toiletpaperhanger 1.\n\nYour task is to: put a cloth in garbagecan.",
        "> go to countertop 1\nYou arrive at countertop 1. On the countertop 1, you see a cloth 2, a cloth 1, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 1 from countertop 1\nYou pick up the cloth 1 from the countertop 1.",
        "> go to garbagecan 1\nYou arrive at garbagecan 1. On the garbagecan 1, you see nothing.",
        "> move cloth 1 to garbagecan 1\nYou move the cloth 1 to the garbagecan 1.",
    ],
    "pick_and_place_simple/legacy": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a garbagecan 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, and a toiletpaperhanger 1.\n\nYour task is to: put a cloth in garbagecan.",
        "> go to countertop 1\nYou arrive at loc 1. On the countertop 1, you see a cloth 2, a cloth 1, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 1 from countertop 1\nYou pick up the cloth 1 from the countertop 1.",
        "> go to garbagecan 1\nYou arrive at loc 9. On the garbagecan 1, you see nothing.",
        "> put cloth 1 in/on garbagecan 1\nYou put the cloth 1 in/on the garbagecan 1.",
    ],
    "look_at_obj_in_light/0.4": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bed 1, a desk 1, a drawer 3, a drawer 2, a drawer 1, a garbagecan 1, a sidetable 2, and a sidetable 1.\n\nYour task is to: examine the bowl with the desklamp.",
        "> go to desk 1\nYou arrive at desk 1. On the desk 1, you see a alarmclock 1, a basketball 1, a bowl 1, a cd 1, a cellphone 1, a creditcard 1, a laptop 2, a laptop 1, and a mug 1.",
        "> take bowl 1 from desk 1\nYou pick up the bowl 1 from the desk 1.",
        "> go to sidetable 2\nYou arrive at sidetable 2. On the sidetable 2, you see a cd 2, and a desklamp 1.",
        "> use desklamp 1\nYou turn on the desklamp 1.",
    ],
    "look_at_obj_in_light/legacy": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bed 1, a desk 1, a drawer 3, a drawer 2, a drawer 1, a garbagecan 1, a sidetable 2, and a sidetable 1.\n\nYour task is to: examine the bowl with the desklamp.",
        "> go to desk 1\nYou arrive at loc 3. On the desk 1, you see a alarmclock 1, a basketball 1, a bowl 1, a cd 1, a cellphone 1, a creditcard 1, a laptop 2, a laptop 1, and a mug 1.",
        "> take bowl 1 from desk 1\nYou pick up the bowl 1 from the desk 1.",
        "> go to sidetable 2\nYou arrive at loc 5. On the sidetable 2, you see a cd 2, and a desklamp 1.",
        "> use desklamp 1\nYou turn on the desklamp 1.",
    ],
    "pick_clean_then_place_in_recep/0.4": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a garbagecan 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, and a toiletpaperhanger 1.\n\nYour task is to: put a clean cloth in drawer.",
        "> go to countertop 1\nYou arrive at countertop 1. On the countertop 1, you see a cloth 2, a cloth 1, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 1 from countertop 1\nYou pick up the cloth 1 from the countertop 1.",
        "> go to sinkbasin 1\nYou arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.",
        "> clean cloth 1 with sinkbasin 1\nYou clean the cloth 1 using the sinkbasin 1.",
        "> go to drawer 1\nYou arrive at drawer 1. The drawer 1 is closed.",
        "> open drawer 1\nYou open the drawer 1. The drawer 1 is open. In it, you see nothing.",
        "> move cloth 1 to drawer 1\nYou move the cloth 1 to the drawer 1.",
    ],
    "pick_clean_then_place_in_recep/legacy": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a garbagecan 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, and a toiletpaperhanger 1.\n\nYour task is to: put a clean cloth in drawer.",
        "> go to countertop 1\nYou arrive at loc 1. On the countertop 1, you see a cloth 2, a cloth 1, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 1 from countertop 1\nYou pick up the cloth 1 from the countertop 1.",
        "> go to sinkbasin 1\nYou arrive at loc 10. On the sinkbasin 1, you see nothing.",
        "> clean cloth 1 with sinkbasin 1\nYou clean the cloth 1 using the sinkbasin 1.",
        "> go to drawer 1\nYou arrive at loc 6. The drawer 1 is closed.",
        "> open drawer 1\nYou open the drawer 1. The drawer 1 is open. In it, you see nothing.",
        "> put cloth 1 in/on drawer 1\nYou put the cloth 1 in/on the drawer 1.",
    ],
    "pick_heat_then_place_in_recep/0.4": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a cabinet 8, a cabinet 7, a cabinet 6, a cabinet 5, a cabinet 4, a cabinet 3, a cabinet 2, a cabinet 1, a coffeemachine 1, a countertop 2, a countertop 1, a drawer 4, a drawer 3, a drawer 2, a drawer 1, a fridge 1, a garbagecan 1, a microwave 1, a sinkbasin 1, a stoveburner 2, and a stoveburner 1.\n\nYour task is to: put a hot mug in countertop.",
        "> go to cabinet 8\nYou arrive at cabinet 8. The cabinet 8 is closed.",
        "> open cabinet 8\nYou open the cabinet 8. The cabinet 8 is open. In it, you see nothing.",
        "> go to cabinet 7\nYou arrive at cabinet 7. The cabinet 7 is closed.",
        "> open cabinet 7\nYou open the cabinet 7. The cabinet 7 is open. In it, you see a kettle 1, and a soapbottle 1.",
        "> go to cabinet 6\nYou arrive at cabinet 6. The cabinet 6 is closed.",
        "> open cabinet 6\nYou open the cabinet 6. The cabinet 6 is open. In it, you see nothing.",
        "> go to cabinet 5\nYou arrive at cabinet 5. The cabinet 5 is closed.",
        "> open cabinet 5\nYou open the cabinet 5. The cabinet 5 is open. In it, you see a bowl 3, a mug 2, a peppershaker 1, and a plate 1.",
        "> take mug 2 from cabinet 5\nYou pick up the mug 2 from the cabinet 5.",
        "> go to microwave 1\nYou arrive at microwave 1. The microwave 1 is closed.",
        "> heat mug 2 with microwave 1\nYou heat the mug 2 using the microwave 1.",
        "> go to countertop 1\nYou arrive at countertop 1. On the countertop 1, you see a butterknife 2, a glassbottle 1, a knife 2, and a ladle 1.",
        "> move mug 2 to countertop 1\nYou move the mug 2 to the countertop 1.",
    ],
    "pick_heat_then_place_in_recep/legacy": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a cabinet 8, a cabinet 7, a cabinet 6, a cabinet 5, a cabinet 4, a cabinet 3, a cabinet 2, a cabinet 1, a coffeemachine 1, a countertop 2, a countertop 1, a drawer 4, a drawer 3, a drawer 2, a drawer 1, a fridge 1, a garbagecan 1, a microwave 1, a sinkbasin 1, a stoveburner 2, and a stoveburner 1.\n\nYour task is to: put a hot mug in countertop.",
        "> go to cabinet 8\nYou arrive at loc 7. The cabinet 8 is closed.",
        "> open cabinet 8\nYou open the cabinet 8. The cabinet 8 is open. In it, you see nothing.",
        "> go to cabinet 7\nYou arrive at loc 2. The cabinet 7 is closed.",
        "> open cabinet 7\nYou open the cabinet 7. The cabinet 7 is open. In it, you see a kettle 1, and a soapbottle 1.",
        "> go to cabinet 6\nYou arrive at loc 3. The cabinet 6 is closed.",
        "> open cabinet 6\nYou open the cabinet 6. The cabinet 6 is open. In it, you see nothing.",
        "> go to cabinet 5\nYou arrive at loc 12. The cabinet 5 is closed.",
        "> open cabinet 5\nYou open the cabinet 5. The cabinet 5 is open. In it, you see a bowl 3, a mug 2, a peppershaker 1, and a plate 1.",
        "> take mug 2 from cabinet 5\nYou pick up the mug 2 from the cabinet 5.",
        "> go to microwave 1\nYou arrive at loc 20. The microwave 1 is closed.",
        "> heat mug 2 with microwave 1\nYou heat the mug 2 using the microwave 1.",
        "> go to countertop 1\nYou arrive at loc 1. On the countertop 1, you see a butterknife 2, a glassbottle 1, a knife 2, and a ladle 1.",
        "> put mug 2 in/on countertop 1\nYou put the mug 2 in/on the countertop 1.",
    ],
    "pick_cool_then_place_in_recep/0.4": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a cabinet 8, a cabinet 7, a cabinet 6, a cabinet 5, a cabinet 4, a cabinet 3, a cabinet 2, a cabinet 1, a coffeemachine 1, a countertop 2, a countertop 1, a drawer 4, a drawer 3, a drawer 2, a drawer 1, a fridge 1, a garbagecan 1, a microwave 1, a sinkbasin 1, a stoveburner 2, and a stoveburner 1.\n\nYour task is to: put a cool mug in coffeemachine.",
        "> go to cabinet 8\nYou arrive at cabinet 8. The cabinet 8 is closed.",
        "> open cabinet 8\nYou open the cabinet 8. The cabinet 8 is open. In it, you see nothing.",
        "> go to cabinet 7\nYou arrive at cabinet 7. The cabinet 7 is closed.",
        "> open cabinet 7\nYou open the cabinet 7. The cabinet 7 is open. In it, you see a kettle 1, and a soapbottle 1.",
        "> go to cabinet 6\nYou arrive at cabinet 6. The cabinet 6 is closed.",
        "> open cabinet 6\nYou open the cabinet 6. The cabinet 6 is open. In it, you see nothing.",
        "> go to cabinet 5\nYou arrive at cabinet 5. The cabinet 5 is closed.",
        "> open cabinet 5\nYou open the cabinet 5. The cabinet 5 is open. In it, you see a bowl 3, a mug 2, a peppershaker 1, and a plate 1.",
        "> take mug 2 from cabinet 5\nYou pick up the mug 2 from the cabinet 5.",
        "> go to fridge 1\nYou arrive at fridge 1. The fridge 1 is closed.",
        "> cool mug 2 with fridge 1\nYou cool the mug 2 using the fridge 1.",
        "> go to coffeemachine 1\nYou arrive at coffeemachine 1. On the coffeemachine 1, you see nothing.",
        "> move mug 2 to coffeemachine 1\nYou move the mug 2 to the coffeemachine 1.",
    ],
    "pick_cool_then_place_in_recep/legacy": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a cabinet 8, a cabinet 7, a cabinet 6, a cabinet 5, a cabinet 4, a cabinet 3, a cabinet 2, a cabinet 1, a coffeemachine 1, a countertop 2, a countertop 1, a drawer 4, a drawer 3, a drawer 2, a drawer 1, a fridge 1, a garbagecan 1, a microwave 1, a sinkbasin 1, a stoveburner 2, and a stoveburner 1.\n\nYour task is to: put a cool mug in coffeemachine.",
        "> go to cabinet 8\nYou arrive at loc 7. The cabinet 8 is closed.",
        "> open cabinet 8\nYou open the cabinet 8. The cabinet 8 is open. In it, you see nothing.",
        "> go to cabinet 7\nYou arrive at loc 2. The cabinet 7 is closed.",
        "> open cabinet 7\nYou open the cabinet 7. The cabinet 7 is open. In it, you see a kettle 1, and a soapbottle 1.",
        "> go to cabinet 6\nYou arrive at loc 3. The cabinet 6 is closed.",
        "> open cabinet 6\nYou open the cabinet 6. The cabinet 6 is open. In it, you see nothing.",
        "> go to cabinet 5\nYou arrive at loc 12. The cabinet 5 is closed.",
        "> open cabinet 5\nYou open the cabinet 5. The cabinet 5 is open. In it, you see a bowl 3, a mug 2, a peppershaker 1, and a plate 1.",
        "> take mug 2 from cabinet 5\nYou pick up the mug 2 from the cabinet 5.",
        "> go to fridge 1\nYou arrive at loc 13. The fridge 1 is closed.",
        "> cool mug 2 with fridge 1\nYou cool the mug 2 using the fridge 1.",
        "> go to coffeemachine 1\nYou arrive at loc 18. On the coffeemachine 1, you see nothing.",
        "> put mug 2 in/on coffeemachine 1\nYou put the mug 2 in/on the coffeemachine 1.",
    ],
    "pick_two_obj_and_place/0.4": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a garbagecan 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, and a toiletpaperhanger 1.\n\nYour task is to: put two cloth in sinkbasin.",
        "> go to countertop 1\nYou arrive at countertop 1. On the countertop 1, you see a cloth 2, a cloth 1, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 1 from countertop 1\nYou pick up the cloth 1 from the countertop 1.",
        "> go to sinkbasin 1\nYou arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.",
        "> move cloth 1 to sinkbasin 1\nYou move the cloth 1 to the sinkbasin 1.",
        "> go to countertop 1\nYou arrive at countertop 1. On the countertop 1, you see a cloth 2, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 2 from countertop 1\nYou pick up the cloth 2 from the countertop 1.",
        "> go to sinkbasin 1\nYou arrive at sinkbasin 1. On the sinkbasin 1, you see a cloth 1.",
        "> move cloth 2 to sinkbasin 1\nYou move the cloth 2 to the sinkbasin 1.",
    ],
    "pick_two_obj_and_place/legacy": [
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a bathtubbasin 1, a cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a garbagecan 1, a sinkbasin 2, a sinkbasin 1, a toilet 1, and a toiletpaperhanger 1.\n\nYour task is to: put two cloth in sinkbasin.",
        "> go to countertop 1\nYou arrive at loc 1. On the countertop 1, you see a cloth 2, a cloth 1, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 1 from countertop 1\nYou pick up the cloth 1 from the countertop 1.",
        "> go to sinkbasin 1\nYou arrive at loc 10. On the sinkbasin 1, you see nothing.",
        "> put cloth 1 in/on sinkbasin 1\nYou put the cloth 1 in/on the sinkbasin 1.",
        "> go to countertop 1\nYou arrive at loc 1. On the countertop 1, you see a cloth 2, a handtowel 3, a handtowel 2, a handtowel 1, a tissuebox 2, and a towel 1.",
        "> take cloth 2 from countertop 1\nYou pick up the cloth 2 from the countertop 1.",
        "> go to sinkbasin 1\nYou arrive at loc 10. On the sinkbasin 1, you see a cloth 1.",
        "> put cloth 2 in/on sinkbasin 1\nYou put the cloth 2 in/on the sinkbasin 1.",
    ],
}


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_transcript(key):
    task_type, grammar = key.split("/")
    env = AlfworldEnv(grammar=grammar)
    obs, info = env.reset(options={"game": generate_game(0, task_types=[task_type])})
    lines = [obs]
    terminated = truncated = False
    while not (terminated or truncated):
        action = env.expert_action()
        obs, reward, terminated, truncated, info = env.step(action)
        lines.append(f"> {action}\n{obs}")
    assert lines == GOLDEN[key]
    assert info["task_type"] == task_type and info["success"]
