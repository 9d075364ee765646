"""agentrl: train LLM agents with reinforcement learning on multi-turn text environments.

The public surface is small: the env contract (`TextEnv`, with `ClientSetting` for what a served env's clients
may set) and the registry (`register`, `make`, `registered`).
Everything else lives in submodules named after what they do: `agentrl.engine` (inference), `agentrl.rollout.loop`
(the agent loop), `agentrl.records` (Turn / Trajectory / Sample), `agentrl.objective` (losses), `agentrl.recipes.train`
(the training loop).
"""

from agentrl.envs.core import ClientSetting, SharedResource, TextEnv, TextSpace
from agentrl.envs.registry import EnvSpec, UnknownEnvError, make, register, registered, spec

__version__ = "0.1.0"

__all__ = [
    "ClientSetting",
    "EnvSpec",
    "SharedResource",
    "TextEnv",
    "TextSpace",
    "UnknownEnvError",
    "make",
    "register",
    "registered",
    "spec",
    "__version__",
]
