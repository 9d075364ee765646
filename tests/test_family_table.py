"""The family table `templates/families.yaml`: it ships as package data, every name in it resolves (template files,
parsers, rewrite rules, anchors, writers), it round-trips to the loaded families, and a broken entry fails with one
message naming the family and the field."""

from __future__ import annotations

import copy
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from agentrl.chat import families as fam
from agentrl.chat.families import ALIASES, FAMILIES, FamilyTableError, family_entry, parse_family_table
from agentrl.chat.parsers import PARSERS

TABLE_TEXT = files("agentrl.templates").joinpath("families.yaml").read_text(encoding="utf-8")
TABLE = yaml.safe_load(TABLE_TEXT)


def _dump(table) -> str:
    return yaml.safe_dump(table, allow_unicode=True, sort_keys=False)


def test_table_is_package_data_of_agentrl_templates():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "*.yaml" in pyproject["tool"]["setuptools"]["package-data"]["agentrl.templates"]
    assert [e["name"] for e in TABLE["families"]] == list(FAMILIES)
    assert TABLE["aliases"] == ALIASES


def test_every_name_in_the_table_resolves():
    templates = files("agentrl.templates")
    for entry in TABLE["families"]:
        assert templates.joinpath(entry["template_file"]).read_text(), entry["name"]
        assert entry["parser"] in PARSERS
        assert entry["rewrites"] in fam._REWRITES
        assert entry.get("anchor") is None or entry["anchor"] in fam._ANCHORS
        assert entry.get("writer") is None or entry["writer"] in fam._WRITERS
    # Every official file has a family, and every rule function in code is picked by some family (none is dead).
    shipped = {p.name for p in templates.iterdir() if p.name.endswith(".jinja")}
    assert shipped == {f.template_file for f in FAMILIES.values()}
    assert {id(f.rewrites_history) for f in FAMILIES.values()} == {id(r) for r in fam._REWRITES.values()}
    assert {id(f.anchor) for f in FAMILIES.values() if f.anchor} == {id(a) for a in fam._ANCHORS.values()}
    assert {id(f.writer) for f in FAMILIES.values() if f.writer} == {id(w) for w in fam._WRITERS.values()}
    assert all(ALIASES[a] in FAMILIES and a not in FAMILIES for a in ALIASES)


def test_table_round_trips():
    for entry in TABLE["families"]:
        full = family_entry(FAMILIES[entry["name"]])
        assert {k: full[k] for k in entry} == entry  # what the file says is what was loaded
    dumped = _dump({"families": [family_entry(f) for f in FAMILIES.values()], "aliases": ALIASES})
    assert parse_family_table(dumped) == (FAMILIES, ALIASES)
    assert parse_family_table(_dump(TABLE)) == (FAMILIES, ALIASES)


def _broken(family: str, /, **change):
    table = copy.deepcopy(TABLE)
    entry = next(e for e in table["families"] if e["name"] == family)
    for key, value in change.items():
        if value is None:
            del entry[key]
        else:
            entry[key] = value
    return _dump(table)


@pytest.mark.parametrize(("text", "message"), [
    (_broken("qwen3", rewrites="qwen4"), "family 'qwen3': unknown rewrites key 'qwen4' (known: never, qwen3"),
    (_broken("glm-4.6", anchor="last"), "family 'glm-4.6': unknown anchor key 'last'"),
    (_broken("gpt-oss", writer="harmonica"), "family 'gpt-oss': unknown writer key 'harmonica'"),
    (_broken("chatml", parser="chatml"), "family 'chatml': unknown parser key 'chatml'"),
    (_broken("deepseek-r1", parser=None), "family 'deepseek-r1': missing field 'parser'"),
    (_broken("qwen3", prefill=["<think>\n"]), "family 'qwen3': unknown field 'prefill'"),
    (_broken("qwen3", reasons="yes"), "family 'qwen3': field 'reasons' must be true or false, not 'yes'"),
    (_broken("llama-3.1", max_tool_calls=True), "family 'llama-3.1': field 'max_tool_calls' must be a count"),
    (_broken("smollm3", end_of_turn=[]), "family 'smollm3': field 'end_of_turn' must name at least one marker"),
    (_broken("qwen3", template_file="qwen4.jinja"), "family 'qwen3': template_file 'qwen4.jinja' is not in"),
    (_broken("qwen3", name="chatml"), "family 'chatml' is listed twice"),
    (_dump({**TABLE, "aliases": {"kimi": "kimi-k3"}}), "alias 'kimi' must be a new name for a listed family"),
    (_dump({"families": TABLE["families"]}), "exactly 'families' and 'aliases'"),
    ("families: [", "not valid YAML"),
])
def test_broken_entry_gives_one_clear_error(text, message):
    with pytest.raises(FamilyTableError, match="^families.yaml: ") as raised:
        parse_family_table(text)
    assert message in str(raised.value)
