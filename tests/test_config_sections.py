"""Config sections of issue 18: env defaults live with the env, advantage options from YAML, no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentrl
from agentrl.config import ConfigError, load_config
from agentrl.objective.advantages import GiGPOOptions, LowSuccessWeightOptions


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
    cfg = load_config(_yaml(tmp_path, "advantage: {estimator: low_success_weight, options: {boost: 2}}\n"))
    assert cfg.advantage.options == {"boost": 2}
    assert cfg.advantage.typed_options() == LowSuccessWeightOptions(boost=2.0, success_threshold=1.0)
    gigpo = load_config(_yaml(tmp_path, "advantage: {estimator: gigpo, options: {gamma: 0.9, step_weight: 0.5}}"))
    assert gigpo.advantage.estimator == "gigpo" and gigpo.advantage.typed_options() == GiGPOOptions(0.9, 0.5)
    with pytest.raises(ConfigError) as err:
        load_config(_yaml(tmp_path, "advantage: {estimator: low_success_weight, options: {bost: 2.0}}\n"))
    assert str(err.value).endswith("advantage.options: unknown option(s) 'bost' for advantage estimator "
                                   "'low_success_weight'; valid options: boost, success_threshold")
    with pytest.raises(ConfigError, match="advantage.options: unknown option.*'gamma'.*low_success_weight"):
        load_config(_yaml(tmp_path, "advantage: {estimator: low_success_weight, options: {gamma: 0.5}}\n"))
    with pytest.raises(ConfigError, match="advantage.options: option 'k' of advantage estimator 'passk' must be int"):
        load_config(_yaml(tmp_path, "advantage: {estimator: passk, options: {k: eight}}\n"))
    with pytest.raises(ConfigError, match="scheduler.group_size must be >= 8 with advantage.estimator passk"):
        load_config(_yaml(tmp_path, "scheduler: {group_size: 4}\nadvantage: {estimator: passk, options: {k: 8}}\n"))
    with pytest.raises(ConfigError, match="loss.kl_reward_estimator must be one of k1, k2, k3"):
        load_config(_yaml(tmp_path, "loss: {kl_reward_coef: 0.1, kl_reward_estimator: k9}\n"))
    # Episode-level penalties never reach a step-level estimator (it reads each turn's env reward): refused.
    with pytest.raises(ConfigError, match="loss.kl_reward_coef must be 0 with advantage.estimator gigpo"):
        load_config(_yaml(tmp_path, "loss: {kl_reward_coef: 0.1}\nadvantage: {estimator: gigpo}\n"))
    with pytest.raises(ConfigError, match="loss.overlong.mode must be none or filter with advantage.estimator gigpo"):
        load_config(_yaml(tmp_path, "loss: {overlong: {mode: penalize}}\nadvantage: {estimator: gigpo}\n"))
    assert load_config(_yaml(tmp_path, "loss: {overlong: {mode: filter}}\nadvantage: {estimator: gigpo}\n"))
    assert load_config(_yaml(tmp_path, "loss: {kl_reward_coef: 0.1}\nadvantage: {estimator: grpo}\n"))


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


def test_the_flat_advantage_keys_of_0_1_still_read_with_a_warning(tmp_path, caplog):
    """The keys renamed in 0.2 (issue 40) keep working until 0.3, in a YAML file and as flags, one warning each."""
    from agentrl.config import RENAMED_KEYS, RunConfig, apply_overrides

    assert {old: r.removed_in for old, r in RENAMED_KEYS.items()} == {
        f"advantage.{key}": "0.3" for key in ("name", "boost", "success_threshold", "k", "normalize", "gamma",
                                               "step_weight", "normalize_std", "eps")}
    old = load_config(_yaml(tmp_path, "advantage: {name: gigpo, gamma: 0.9, step_weight: 0.5}\n"))
    new = load_config(_yaml(tmp_path, "advantage: {estimator: gigpo, options: {gamma: 0.9, step_weight: 0.5}}\n"))
    assert old == new
    warned = [r.getMessage() for r in caplog.records if r.name == "agentrl.config"]
    assert ("advantage.gamma is now advantage.options.gamma (advantage.gamma is read until 0.3, which removes it)"
            in warned)
    assert len(warned) == 3
    flags = apply_overrides(RunConfig(), {"advantage.name": "passk", "advantage.k": 2, "advantage.normalize": False})
    assert flags.advantage.estimator == "passk" and flags.advantage.options == {"k": 2, "normalize": False}
    with pytest.raises(ConfigError, match="advantage.name and advantage.estimator are one setting, set twice"):
        load_config(_yaml(tmp_path, "advantage: {name: gigpo, estimator: grpo}\n"))
    with pytest.raises(ConfigError, match="advantage.options: unknown option.*'gamma'.*low_success_weight"):
        load_config(_yaml(tmp_path, "advantage: {name: low_success_weight, gamma: 0.5}\n"))
