import pytest

import agentrl
from agentrl.envs.core import TextEnv


class Counter(TextEnv):
    """Count to a target: say the next number."""

    system_prompt = "Say the next number."

    def __init__(self, target: int = 3):
        self.target = target

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return "0", {}

    def step(self, action):
        ok = action.strip() == str(self.n + 1)
        self.n += ok
        done = self.n == self.target
        return str(self.n), float(done), done, False, {"success": done} if done else {}

    def expert_action(self):
        return str(self.n + 1)


def test_register_and_make_with_defaults_and_overrides():
    agentrl.register("counter-test", entry_point=Counter, target=2)
    env = agentrl.make("counter-test")
    assert env.target == 2
    assert agentrl.make("counter-test", target=5).target == 5
    assert "counter-test" in agentrl.registered()
    assert agentrl.spec("counter-test").description == "Count to a target: say the next number."


def test_register_by_string_is_lazy_and_validated():
    agentrl.register("counter-string", entry_point="tests.test_registry:Counter")
    assert agentrl.registered()["counter-string"].entry_point == "tests.test_registry:Counter"
    agentrl.register("broken", entry_point="no_such_module_xyz:Env")
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        agentrl.make("broken")
    agentrl.register("no-colon", entry_point="some.module")
    with pytest.raises(ValueError, match="pkg.module:Class"):
        agentrl.make("no-colon")


def test_unknown_id_lists_known_and_closest():
    with pytest.raises(agentrl.UnknownEnvError) as err:
        agentrl.make("mathh")
    msg = str(err.value)
    assert "Did you mean 'math'" in msg and "alfworld" in msg and "webshop" in msg


def test_builtins_come_from_entry_points():
    specs = agentrl.registered()
    for env_id in ("math", "alfworld", "webshop", "gui"):
        assert specs[env_id].package == "agentrl-platform"  # the distribution (PyPI name), not the import name
        assert specs[env_id].entry_point.startswith(f"agentrl.envs.{env_id}:")


def test_builtins_do_not_install_a_bare_envs_module(tmp_path):
    import subprocess
    import sys

    code = "import importlib.util, agentrl.envs.math; print(importlib.util.find_spec('envs') is None)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
