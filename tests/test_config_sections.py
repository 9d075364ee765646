"""Config sections of issue 18: env defaults live with the env, advantage options from YAML, no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentrl
from agentrl.config import ConfigError, load_config


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_env_defaults_belong_to_the_env(tmp_path):
    # `env: {id: alfworld}` must not inherit math's {"level": 1}: AlfworldEnv has no `level` argument.
    cfg = load_config(_yaml(tmp_path, "env: {id: alfworld}\n"))
    assert cfg.env.kwargs == {}
    agentrl.make(cfg.env.id, **cfg.env.kwargs).close()
    math_cfg = load_config(_yaml(tmp_path, "env: {id: math}\n"))
    env = agentrl.make(math_cfg.env.id, **math_cfg.env.kwargs)
    assert env.level == 1  # math's own default
    env.close()


def test_advantage_options_come_from_the_config(tmp_path):
    cfg = load_config(_yaml(tmp_path, "advantage: {name: low_success_weight, boost: 2.0}\n"))
    assert cfg.advantage.options() == {"boost": 2.0}
    gigpo = load_config(_yaml(tmp_path, "advantage: {name: gigpo, gamma: 0.9, step_weight: 0.5}"))
    assert gigpo.advantage.name == "gigpo" and gigpo.advantage.options() == {"gamma": 0.9, "step_weight": 0.5}
    with pytest.raises(ConfigError, match="unknown config key advantage.'bost'.*Did you mean 'boost'"):
        load_config(_yaml(tmp_path, "advantage: {name: low_success_weight, bost: 2.0}\n"))
    with pytest.raises(ConfigError, match="advantage: unknown option.*'gamma'.*low_success_weight"):
        load_config(_yaml(tmp_path, "advantage: {name: low_success_weight, gamma: 0.5}\n"))
    with pytest.raises(ConfigError, match="scheduler.group_size must be >= 8 with advantage.name passk"):
        load_config(_yaml(tmp_path, "scheduler: {group_size: 4}\nadvantage: {name: passk, k: 8}\n"))
    with pytest.raises(ConfigError, match="loss.kl_reward_estimator must be one of k1, k2, k3"):
        load_config(_yaml(tmp_path, "loss: {kl_reward_coef: 0.1, kl_reward_estimator: k9}\n"))


def test_new_loss_options_validate_at_config_time(tmp_path):
    cfg = load_config(_yaml(tmp_path, "loss: {name: grpo, options: {dual_clip: 3.0, kl_coef: 0.001, "
                                      "kl_estimator: k3, entropy_coef: 0.001, rejection: geometric}}\n"))
    assert cfg.loss.options["dual_clip"] == 3.0
    with pytest.raises(ConfigError, match="dual_clip must be > 1"):
        load_config(_yaml(tmp_path, "loss: {name: grpo, options: {dual_clip: 0.9}}\n"))
    with pytest.raises(ConfigError, match="unknown option.*'dual_clip'.*'cispo'"):
        load_config(_yaml(tmp_path, "loss: {name: cispo, options: {dual_clip: 3.0}}\n"))


def test_no_two_agentrl_modules_import_each_other():
    # evaluate used to import report and report evaluate (inside functions): a cycle that breaks on refactors.
    root = Path(agentrl.__file__).parent
    deps: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        name = ".".join(("agentrl", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentrl"):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("agentrl")}
        deps[name] = found
    cycles = sorted((a, b) for a, found in deps.items() for b in found if a < b and a in deps.get(b, set()))
    assert cycles == []


def test_colocated_engines_with_async_rollouts_are_refused_with_the_fix():
    from agentrl.config import ConfigError, EngineConfig, RunConfig, SchedulerConfig, TrainerConfig

    with pytest.raises(ConfigError, match="scheduler.async_rollout.*colocate.*drop --async"):
        RunConfig(scheduler=SchedulerConfig(async_rollout=True), engine=EngineConfig(colocate=True),
                  trainer=TrainerConfig(workers=1, gpus_per_worker=1))
