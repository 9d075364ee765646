"""Every shipped config loads and round-trips through the config.yaml a run saves; earlier layouts fail in one line."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT

from agentrl.config import MOVED_KEYS, ConfigError, RunConfig, config_to_dict, load_config
from agentrl.recipes.sft import SFTConfig, load_sft_config

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def _loader(path):
    return load_sft_config if path.stem.endswith("-sft") else load_config


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_loads_and_round_trips_through_config_yaml(tmp_path, path):
    cfg = _loader(path)(path)
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))  # as a run folder saves it
    assert _loader(path)(saved) == cfg


def test_the_shipped_configs_are_all_here():
    assert len(CONFIGS) >= 13 and any(p.stem.endswith("-sft") for p in CONFIGS)


@pytest.mark.parametrize("old, new", sorted(MOVED_KEYS.items()))
def test_every_moved_key_names_its_new_place_in_one_line(tmp_path, old, new):
    section, _, leaf = old.rpartition(".")
    values = {section: {leaf: 1}} if section else {leaf: 1}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message == f"{path}: {old} is now {new}" and "\n" not in message


@pytest.mark.parametrize("old, new", sorted(SFTConfig.MOVED.items()))
def test_every_moved_sft_key_names_its_new_place(tmp_path, old, new):
    section, _, leaf = old.rpartition(".")
    path = tmp_path / "old-sft.yaml"
    path.write_text(yaml.safe_dump({section: {leaf: 1}} if section else {leaf: 1}))
    with pytest.raises(ConfigError, match=f"^{path}: {old} is now {new}$"):
        load_sft_config(path)


def test_a_section_that_is_gone_is_named(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("rollout: {}\n")
    with pytest.raises(ConfigError, match="the rollout section is gone: its keys moved to sampling, engine"):
        load_config(path)


def test_new_moved_keys_point_at_real_fields():
    """A moved key's new place exists, so the message never sends a user to a key that fails too."""
    cfg = config_to_dict(RunConfig())
    for new in MOVED_KEYS.values():
        node = cfg
        for part in new.split(" ")[0].split("."):
            assert part in node, new
            node = node[part]


OLD_RUN_CONFIG = """\
model: smollm2-135m
env: {id: math, kwargs: {level: 1}, seed_offset: 0}
rollout: {prompts_per_step: 4, group_size: 8, max_turns: 50, max_new_tokens: 64, max_context_tokens: 4096,
  temperature: 1.0, engine: hf, engines: 1, engine_dtype: '', runners: 0, ray_address: null}
context: {observation_role: user}
loss: {name: minirl, advantage: gigpo, advantage_options: {gamma: 0.9}, micro_batch_size: 8, n_minibatches: 1}
trainer: {workers: 0, colocate: false}
steps: 20
dtype: float32
"""


def test_a_run_saved_in_the_earlier_layout_still_reads(tmp_path):
    """Resume and eval read a run folder's config.yaml: one saved before the sections were sorted still works."""
    from agentrl.config import read_run_config

    path = tmp_path / "config.yaml"
    path.write_text(OLD_RUN_CONFIG)
    with pytest.raises(ConfigError, match="is now"):  # as a config a user writes, it is refused ...
        load_config(path)
    cfg, moved = read_run_config(path)  # ... as a saved run, its keys move
    assert (cfg.scheduler.group_size, cfg.engine.kind, cfg.trainer.micro_batch_size) == (8, "hf", 8)
    assert cfg.advantage.estimator == "gigpo" and cfg.advantage.options == {"gamma": 0.9}
    assert cfg.trainer.dtype == "float32"
    assert "rollout.engine -> engine.kind" in moved and "loss.advantage_options -> advantage.options" in moved
    assert read_run_config(path)[0] == cfg


def test_an_overlong_band_longer_than_the_budget_fails_at_set_up():
    import torch

    from agentrl.config import AdvantageConfig, LossConfig, OptimConfig, OverlongConfig, TrainerConfig
    from agentrl.training.routing_replay import DenseRouting
    from agentrl.training.step import TrainingStep

    loss = LossConfig(overlong=OverlongConfig(mode="penalize"))  # cache_length 4096 by default
    with pytest.raises(ConfigError, match="loss.overlong.*per-turn token budget is 64.*cache_length"):
        TrainingStep(backend=None, routing=DenseRouting(), loss=loss, advantage=AdvantageConfig(),
                     optim=OptimConfig(), trainer=TrainerConfig(), per_turn_budget=64, pad_id=0,
                     shuffle=torch.Generator(), out=None)
