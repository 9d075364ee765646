"""Every config command's flags come from its config dataclasses: every field has one, aliases resolve, help in
sections, the same for ``run``, ``sft``, ``eval``, ``serve`` and ``env serve``.

The config tree is walked here independently of `agentrl.cli.flags`, so a field the generator misses fails a test.
Everything runs in-process and fails before a model loads, except the one `--help` subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import click
import pytest
import yaml
from conftest import ROOT
from typer.testing import CliRunner

from agentrl.cli.flags import (
    ALIASES,
    COMMANDS,
    EVERYDAY,
    ConfigCommand,
    config_command,
    config_options,
    first_sentence,
    root_of,
    run_command,
    sections,
)
from agentrl.cli.main import app
from agentrl.config import ConfigError, RunConfig


def help_max_lines() -> int:
    """About one line per setting: a line per field, four per section (title, blank, wrapped help), 25 for the usage
    and everyday block. Measured at 80 columns: 150 lines for 77 fields in 13 sections, 181 for 97 in 16."""
    return len(leaf_fields(RunConfig)) + 4 * len(list(sections(RunConfig))) + 25


# -- an independent walk of the config tree and a sample value per type -------------------------------------------


def leaf_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> annotation of every settable non-dataclass field under `cls`."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out |= leaf_fields(tp, f"{prefix}{f.name}.")
        elif f.init and f.metadata.get("flag", True):  # flag: False, a field set by a flag of its own (--protocol)
            out[prefix + f.name] = tp
    return out


def strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def sample(tp: Any) -> Any:
    """A value of type `tp` as it arrives from the command line (YAML lists for tuples), unlike any default."""
    tp = strip_optional(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    scalars = {bool: True, int: 7, float: 0.25, str: "abc"}
    if tp in scalars:
        return scalars[tp]
    if origin is Literal:
        return args[-1]
    if origin is tuple:
        return [sample(args[0])] * 2 if args[-1] is Ellipsis else [sample(a) for a in args]
    if origin in (list, set, frozenset):
        return [sample(args[0])]
    return {"key": 1}  # dict[...] and anything else YAML can carry


def argv_for(path: str, value: Any) -> list[str]:
    flag = "--" + path.replace("_", "-")
    if isinstance(value, bool):
        return [flag]
    if isinstance(value, (int, float, str)):
        return [flag, str(value)]
    return [flag, yaml.safe_dump(value, default_flow_style=True).strip()]


def parse(*argv: str) -> dict[str, Any]:
    """The overrides `agentrl run` would hand `apply_overrides` for `argv` (its own options left out)."""
    seen = {}
    command = run_command(lambda overrides: seen.update(overrides), [], help="")
    command.main(list(argv), standalone_mode=False)
    return seen


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"agentrl run {' '.join(args)} raised {result.exception!r}")
    return result.exit_code, result.stderr


# -- every field, every alias -------------------------------------------------------------------------------------


def test_every_config_field_has_one_generated_flag():
    options = config_options(RunConfig, ALIASES)
    assert sorted(opt.path for opt in options) == sorted(leaf_fields(RunConfig))
    for opt in options:
        assert opt.opts[0] == "--" + opt.path.replace("_", "-")
        assert opt.help, f"{opt.path} has no docstring: its flag would have no help"


@pytest.mark.parametrize("path, tp", sorted(leaf_fields(RunConfig).items()))
def test_each_flag_lands_in_its_dotted_key_with_its_type(path, tp):
    value = sample(tp)
    overrides = parse(*argv_for(path, value))
    assert overrides == {path: value} and type(overrides[path]) is type(value)
    node: Any = RunConfig()
    for part in path.split("."):  # the key names a real field: apply_overrides walks the same way
        node = getattr(node, part)
    if strip_optional(tp) is bool:
        off = path.rpartition(".")[0] + ".no-" + path.rpartition(".")[2] if "." in path else "no-" + path
        assert parse("--" + off.replace("_", "-")) == {path: False}


def test_flags_not_given_override_nothing():
    assert parse() == {}


@pytest.mark.parametrize("alias, path", sorted(ALIASES.items()))
def test_every_alias_resolves_to_a_field(alias, path):
    fields = leaf_fields(RunConfig)
    assert path in fields, f"{alias} points at {path!r}, not a RunConfig field"
    if "/" in alias:
        on, off = alias.split("/")
        assert parse(on) == {path: True} and parse(off) == {path: False}
    else:
        value = sample(fields[path])
        assert parse(*argv_for(path, value)[:0], alias, *argv_for(path, value)[1:]) == {path: value}


def test_an_alias_to_a_missing_field_raises():
    with pytest.raises(ValueError, match=r"--nope points at 'no.such'"):
        config_options(RunConfig, {"--nope": "no.such"})
    with pytest.raises(ValueError, match="names both switches"):
        config_options(RunConfig, {"--async": "scheduler.async_rollout"})
    with pytest.raises(ValueError, match="used twice"):
        config_options(RunConfig, {"--steps": "seed"})


def test_everyday_flags_exist_and_flags_are_unique():
    from agentrl.cli.train import _run_options

    command = run_command(lambda **_: None, _run_options(), help="")
    names = [name for p in command.params for name in (*p.opts, *p.secondary_opts)]
    assert len(names) == len(set(names))
    assert {flag.partition("/")[0] for flag in EVERYDAY} <= set(names)


def test_the_flags_the_old_run_command_took_still_parse():
    """As test_cli.py, test_headline_cli.py, test_bad_input.py and the README type them."""
    assert parse("--env", "math", "--model", "tiny-qwen3", "--steps", "2", "--output", "runs/x", "--group-size", "2",
                 "--prompts-per-step", "2", "--max-new-tokens", "8") == {
        "env.id": "math", "model": "tiny-qwen3", "steps": 2, "output": "runs/x", "scheduler.group_size": 2,
        "scheduler.prompts_per_step": 2, "sampling.max_new_tokens": 8}
    assert parse("--env", "webshop", "--runners", "8", "--engine", "vllm", "--engines", "2", "--engine-dtype",
                 "bfloat16", "--compute-dtype", "bfloat16", "--ray-address", "HOST:6379", "--trainers", "2",
                 "--gpus-per-trainer", "1", "--gpus-per-engine", "0.5", "--split", "--async", "--max-staleness", "2",
                 "--sync-every", "2", "--max-turns", "15", "--lr", "1e-6", "--loss", "grpo", "--seed", "3") == {
        "env.id": "webshop", "runners.count": 8, "engine.kind": "vllm", "engine.replicas": 2,
        "engine.dtype": "bfloat16", "trainer.compute_dtype": "bfloat16", "ray_address": "HOST:6379",
        "trainer.workers": 2, "trainer.gpus_per_worker": 1.0, "engine.gpus": 0.5, "engine.colocate": False,
        "scheduler.async_rollout": True, "scheduler.max_staleness": 2, "scheduler.sync_every": 2,
        "env.max_turns": 15, "optim.lr": 1e-6, "loss.name": "grpo", "seed": 3}


def test_the_renamed_advantage_flags_still_parse_until_they_are_removed():
    """``--advantage.name`` and the flat option flags of 0.1 keep working (hidden from the help) until 0.3."""
    from agentrl.config import RENAMED_KEYS, apply_overrides

    overrides = parse("--advantage.name", "passk", "--advantage.k", "2", "--advantage.no-normalize",
                      "--advantage.success-threshold", "1")
    assert overrides == {"advantage.name": "passk", "advantage.k": 2, "advantage.normalize": False,
                         "advantage.success_threshold": 1.0}
    cfg = apply_overrides(RunConfig(), overrides)
    assert cfg.advantage.estimator == "passk"
    assert cfg.advantage.options == {"k": 2, "normalize": False, "success_threshold": 1.0}
    command = ConfigCommand("run", RunConfig, ALIASES, (), [], callback=lambda overrides: overrides)
    text = command.get_help(click.Context(command))
    assert "--advantage.estimator" in text and all(f"--{old.replace('_', '-')} " not in text for old in RENAMED_KEYS)


def test_yaml_values_and_optional_scalars():
    assert parse("--optim.betas", "[0.9, 0.95]", "--env.kwargs", "{level: 2}") == {
        "optim.betas": [0.9, 0.95], "env.kwargs": {"level": 2}}
    assert parse("--ray-address", "1:30") == {"ray_address": "1:30"}  # a string, not YAML's sexagesimal 90


# -- errors: one line, exit 2 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (["--env.kwargs", "{level: 2"], "--env.kwargs"),
    (["--optim.betas", "[0.9, 0.95"], "--optim.betas"),
    (["--env.kwargs", "null"], "reads as null"),
    (["--steps", "many"], "'many' is not a valid integer"),
    (["--stepz", "3"], "No such option '--stepz'"),
])
def test_bad_flags_give_one_error_line(args, fragment):
    code, stderr = cli(*args)
    assert code == 2
    assert stderr.startswith("error:") and len(stderr.strip().splitlines()) == 1, stderr
    assert fragment in stderr


def test_a_config_error_from_a_flag_is_one_line(tmp_path):
    code, stderr = cli("--optim.betas", "[0.9, 1.5]", "--output", str(tmp_path / "run"))
    assert code == 2 and stderr.startswith("error: optim.betas must be two numbers in [0, 1)"), stderr
    assert len(stderr.strip().splitlines()) == 1


# -- what the body of `run` makes of the flags --------------------------------------------------------------------


@pytest.fixture
def overrides_seen(monkeypatch):
    """The overrides `run` hands apply_overrides; the run then stops with an error before anything loads."""
    import agentrl.config

    seen: dict[str, Any] = {}

    def capture(cfg, overrides):
        seen.update(overrides)
        raise ConfigError("captured")

    monkeypatch.setattr(agentrl.config, "apply_overrides", capture)
    return seen


@pytest.mark.parametrize("args, kwargs", [
    (["--env-arg", "level=2", "--env-arg", "mode=multi"], {"level": 2, "mode": "multi"}),
    (["--env", "webshop", "--env-arg", "a=[1, 2]"], {"a": [1, 2]}),
    (["--env", "gui"], {}),  # the default env's kwargs do not follow a new env id
    (["--env.kwargs", "{level: 3}", "--env-arg", "mode=multi"], {"level": 3, "mode": "multi"}),
    (["--env", "gui", "--env.kwargs", "{x: 1}"], {"x": 1}),
])
def test_env_arg_merges_into_env_kwargs(overrides_seen, args, kwargs):
    assert cli(*args)[0] == 2
    assert overrides_seen["env.kwargs"] == kwargs


def test_resume_sets_the_output_folder(overrides_seen, tmp_path):
    (tmp_path / "config.yaml").write_text("steps: 3\n")
    cli("--resume", str(tmp_path), "--steps", "5", "--output", "elsewhere")
    assert overrides_seen == {"steps": 5, "output": str(tmp_path)}


# -- help ---------------------------------------------------------------------------------------------------------


def test_run_help_reads_as_sections():
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "run", "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Usage:") and "Everyday:" in lines
    for section in sections(RunConfig)[1:]:
        assert any(line.startswith(f"{section.path}: ") for line in lines), section.path
    for opt in config_options(RunConfig, ALIASES):
        assert opt.names(only=opt.opts[0]).split()[0] in proc.stdout
    assert len(lines) <= help_max_lines(), f"{len(lines)} lines"
    assert max(len(line) for line in lines) <= 80


# -- any tree of dataclasses --------------------------------------------------------------------------------------


@dataclass
class Base:
    """A base section."""

    shared: int = 1
    """Inherited, documented in the base."""


@dataclass
class Deep(Base):
    """The innermost section.

    More text that is not the heading.
    """

    mode: Literal["on", "off"] = "on"
    """A choice: YAML must not turn it into a boolean. Second sentence."""
    limit: float | None = None
    """Optional scalar, e.g. `1.5` or unset."""


@dataclass
class Middle:
    """A section holding another."""

    deep: Deep = field(default_factory=Deep)
    sizes: tuple[int, ...] = ()
    undocumented: str = ""


@dataclass
class Root:
    """The root."""

    middle: Middle = field(default_factory=Middle)
    verbose: bool = False
    """A switch."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form."""


def test_any_tree_of_dataclasses():
    aliases = {"--quiet/--loud": "verbose", "--mode": "middle.deep.mode"}
    options = {opt.path: opt for opt in config_options(Root, aliases)}
    assert sorted(options) == sorted(leaf_fields(Root)) == [
        "extra", "middle.deep.limit", "middle.deep.mode", "middle.deep.shared", "middle.sizes", "middle.undocumented",
        "verbose"]
    assert options["middle.deep.mode"].help == "A choice: YAML must not turn it into a boolean."
    assert options["middle.deep.shared"].help == "Inherited, documented in the base."
    assert options["middle.deep.limit"].help == "Optional scalar, e.g. `1.5` or unset."
    assert options["middle.undocumented"].help == ""
    assert [s.path for s in sections(Root)] == ["", "middle", "middle.deep"]
    assert sections(Root)[2].doc == "The innermost section."

    command = ConfigCommand("x", Root, {"--quiet/--loud": "verbose"}, (), [], callback=lambda overrides: overrides)
    assert command.main(["--middle.deep.mode", "off", "--middle.deep.limit", "2", "--middle.sizes", "[1, 2]",
                         "--loud", "--extra", "{a: {b: 1}}"], standalone_mode=False) == {
        "middle.deep.mode": "off", "middle.deep.limit": 2.0, "middle.sizes": [1, 2], "verbose": False,
        "extra": {"a": {"b": 1}}}
    with pytest.raises(click.BadParameter):
        command.main(["--middle.deep.mode", "maybe"], standalone_mode=False)
    text = command.get_help(click.Context(command))
    assert "middle.deep: The innermost section." in text and "--middle.deep.mode [on|off]" in text
    assert "--[no-]verbose" in text and "(--quiet/--loud)" in text


def test_first_sentence():
    assert first_sentence("Cap on calls. Envs end\n    first.") == "Cap on calls."
    assert first_sentence("Options, e.g. ``{boost: 2.0}`` (low). More.") == "Options, e.g. `{boost: 2.0}` (low)."
    assert first_sentence("") == ""


# -- every config command: eval, serve, env serve as run and sft -----------------------------------------------------


def parse_for(name: str, *argv: str) -> dict[str, Any]:
    """The overrides command `name` (`COMMANDS`) hands its body for `argv` (its own options left out)."""
    seen: dict[str, Any] = {}
    command = config_command(name, lambda overrides, **_: seen.update(overrides), [], help="")
    command.main(list(argv), standalone_mode=False)
    return seen


COMMAND_FIELDS = [(name, path, tp) for name in COMMANDS for path, tp in sorted(leaf_fields(root_of(name)).items())]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_one_documented_flag_per_config_field(name):
    root = root_of(name)
    options = config_options(root, COMMANDS[name].aliases)
    assert sorted(opt.path for opt in options) == sorted(leaf_fields(root))
    for opt in options:
        assert opt.opts[0] == "--" + opt.path.replace("_", "-")
        assert opt.help, f"agentrl {name}: {opt.path} has no docstring, so its flag would have no help"


@pytest.mark.parametrize("name, path, tp", [case for case in COMMAND_FIELDS if case[0] != "run"],
                         ids=[f"{n}:{p}" for n, p, _ in COMMAND_FIELDS if n != "run"])
def test_each_commands_flag_lands_in_its_dotted_key_with_its_type(name, path, tp):
    value = sample(tp)
    overrides = parse_for(name, *argv_for(path, value))
    assert overrides == {path: value} and type(overrides[path]) is type(value)
    if strip_optional(tp) is bool:
        off = path.rpartition(".")[0] + ".no-" + path.rpartition(".")[2] if "." in path else "no-" + path
        assert parse_for(name, "--" + off.replace("_", "-")) == {path: False}


@pytest.mark.parametrize("name, alias, path", [(n, a, p) for n in COMMANDS for a, p in COMMANDS[n].aliases.items()])
def test_every_commands_aliases_resolve_to_its_fields(name, alias, path):
    fields = leaf_fields(root_of(name))
    assert path in fields, f"agentrl {name}: {alias} points at {path!r}, not a field of its config"
    if "/" in alias:
        on, off = alias.split("/")
        assert parse_for(name, on) == {path: True} and parse_for(name, off) == {path: False}
    else:
        value = sample(fields[path])
        assert parse_for(name, alias, *argv_for(path, value)[1:]) == {path: value}


def test_the_eval_flags_the_docs_use_parse_to_their_fields():
    assert parse_for("eval", "--env", "math", "--model", "m", "--k", "1,4,8", "--max-turns", "15", "--seed-offset",
                     "5", "--temperature", "0.4", "--top-k", "20", "--no-thinking", "--log", "wandb,mlflow") == {
        "env.id": "math", "model": "m", "ks": [1, 4, 8], "env.max_turns": 15, "env.seed_offset": 5,
        "sampling_overrides.temperature": 0.4, "sampling_overrides.top_k": 20, "thinking": False,
        "log.trackers": ["wandb,mlflow"]}
    with pytest.raises(click.BadParameter, match="comma-separated integers"):
        parse_for("eval", "--k", "1,x")


def test_each_default_is_stated_once_in_the_config():
    """eval plays 20 model calls per episode from seed 1,000,000 (RL: 50 from 0), set in `EvalEnvConfig` alone."""
    from agentrl.cli.evaluate import eval_config
    from agentrl.recipes.evaluate import EVAL_SEED_OFFSET, EvalConfig, eval_env

    cfg = eval_config({"model": "m", "env.id": "gui"})
    assert (cfg.env.max_turns, cfg.env.seed_offset) == (20, EVAL_SEED_OFFSET) == (EvalConfig("m").env.max_turns,
                                                                                  eval_env("gui").seed_offset)
    for name in COMMANDS:  # no generated flag carries a default of its own: a flag not given sets nothing
        assert all(opt.default is None for opt in config_options(root_of(name), COMMANDS[name].aliases))
    words = " ".join(CliRunner().invoke(app, ["eval", "--help"]).stdout.split())  # the help shows the config's
    assert "--max-turns INT Model calls per episode" in words and "WebShop 15, GUI 25). [default: 20]" in words


@pytest.mark.parametrize("name, module", [("serve", "agentrl.serve.server"), ("env serve", "agentrl.envs.remote")])
def test_the_servers_tokens_are_read_from_their_environment_variables(monkeypatch, name, module):
    import importlib

    monkeypatch.setenv(importlib.import_module(module).TOKEN_ENV_VAR, "t0ken")
    assert parse_for(name) == {"token": "t0ken"}
    assert parse_for(name, "--token", "given") == {"token": "given"}


# -- the same config values reach the recipes as before the flags were generated --------------------------------


def _plain(cfg: Any) -> dict[str, Any]:
    """A config as JSON data, the sampling overrides as the settings given, a protocol as its name and overrides."""
    data = json.loads(json.dumps(dataclasses.asdict(cfg), default=repr))
    if "sampling_overrides" in data:
        data["sampling_overrides"] = {k: v for k, v in data["sampling_overrides"].items() if v is not None}
    if data.get("protocol"):
        data["protocol"] = {"name": cfg.protocol.protocol.name, "overrides": data["protocol"]["overrides"]}
    return data


RECORDED = json.loads((ROOT / "tests" / "data" / "cli_configs.json").read_text())
"""Command lines of the README, docs and tests, and the config each one built with the hand-typed typer options of
0.2 (captured before the flags were generated from the configs)."""


@pytest.mark.parametrize("name, case", [(name, case) for name, cases in RECORDED.items() for case in cases],
                         ids=[f"{name}:{' '.join(c['argv'])[:60]}" for name, cases in RECORDED.items() for c in cases])
def test_the_same_command_line_builds_the_same_config_as_before(monkeypatch, name, case):
    import agentrl.envs.server
    import agentrl.recipes.evaluate
    import agentrl.recipes.report
    import agentrl.recipes.serve

    got: list[Any] = []
    for module, attr in ((agentrl.recipes.evaluate, "evaluate"), (agentrl.recipes.serve, "serve"),
                         (agentrl.envs.server, "serve")):
        monkeypatch.setattr(module, attr, lambda cfg, *_, **__: got.append(cfg))
    monkeypatch.setattr(agentrl.recipes.report, "print_results", lambda *_: None)
    result = CliRunner().invoke(app, [*name.split(), *case["argv"]], env=case.get("env", {}))
    assert result.exit_code == 0 and len(got) == 1, (result.output, result.exception)
    assert _plain(got[0]) == case["config"]


# -- one help style for every command -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_config_commands_help_reads_as_sections(name):
    result = CliRunner().invoke(app, [*name.split(), "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Usage:") and "Everyday:" in lines and "General:" in lines
    for section in sections(root_of(name))[1:]:
        assert any(line.startswith(f"{section.path}: ") for line in lines), (name, section.path)
    for opt in config_options(root_of(name), COMMANDS[name].aliases):
        assert opt.names(only=opt.opts[0]).split()[0] in result.stdout, (name, opt.path)
    for flag in COMMANDS[name].everyday:
        assert any(line.lstrip().startswith(flag.partition("/")[0]) for line in lines), (name, flag)
    assert "\u256d" not in result.stdout  # no rich box


@pytest.mark.parametrize("argv", [["--help"], ["doctor", "--help"], ["play", "--help"], ["envs", "list", "--help"],
                                  ["webshop", "serve", "--help"], ["inspect", "--help"]])
def test_the_other_commands_help_is_clicks_too(argv):
    result = CliRunner().invoke(app, argv, terminal_width=100)
    assert result.exit_code == 0 and result.stdout.startswith("Usage:"), result.output
    assert "\u256d" not in result.stdout and "Options:" in result.stdout  # click's sections, no rich boxes
