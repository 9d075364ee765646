"""ALFWorld: text household tasks on a faithful reimplementation of ALFWorld's TextWorld engine.

`AlfworldEnv` is the env (registered as ``alfworld``). The pieces, one concept per module:
`world` (frozen game/state records and their JSON files), `engine` (rules and text of both grammars),
`catalogue` (world facts), `generator` (seeded scenes and splits), `expert` (the hand-coded expert) and
`textworld_engine` (the original engine on `.tw-pddl` files, an optional extra).
"""

from agentrl.envs.alfworld.env import AlfworldEnv
from agentrl.envs.alfworld.generator import SPLITS, generate_game
from agentrl.envs.alfworld.world import TASK_TYPES, Game, load_game, save_game

__all__ = ["AlfworldEnv", "Game", "SPLITS", "TASK_TYPES", "generate_game", "load_game", "save_game"]
