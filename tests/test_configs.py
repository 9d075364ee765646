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
