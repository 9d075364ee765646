"""Every config command's flags, generated from its config dataclasses: one source for the command line.

Each command that runs a config has one root dataclass (`COMMANDS`: ``run`` `RunConfig`, ``sft`` `SFTConfig`,
``eval`` `EvalConfig`, ``serve`` `ServeConfig`, ``env serve`` `ServeSettings`), built from the shared sections
(`EnvConfig`, `EngineConfig`, `RunnersConfig`, `ContextConfig`, `LogConfig`, ...). Every leaf field of the tree becomes
``--section.field-name`` (top-level fields: ``--field-name``), typed from its annotation, with the first sentence of
the field's docstring as its help; the command's alias table keeps the short flags. A field whose metadata says
``flag: False`` has none (`EvalConfig.protocol`, set by ``--protocol NAME``); ``envvar: NAME`` also reads it from the
environment (the servers' tokens).

To add a setting, add the field and its docstring to its dataclass: the flag, its type, its help line and its
section in ``agentrl X --help`` follow. A short alias for it is one more line in the command's alias table.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click

ALIASES: dict[str, str] = {
    # Everyday short flags.
    "--env": "env.id",
    "--model": "model",
    "--runners": "runners.count",
    "--steps": "steps",
    "--output": "output",
    "--engine": "engine.kind",
    "--engines": "engine.replicas",
    "--trainers": "trainer.workers",
    "--lr": "optim.lr",
    "--seed": "seed",
    "--loss": "loss.name",
    # The flags `agentrl run` typed by hand before they were generated: scripts and docs use them.
    "--group-size": "scheduler.group_size",
    "--prompts-per-step": "scheduler.prompts_per_step",
    "--ray-address": "ray_address",
    "--engine-dtype": "engine.dtype",
    "--sync-every": "scheduler.sync_every",
    "--async/--no-async": "scheduler.async_rollout",
    "--max-staleness": "scheduler.max_staleness",
    "--max-new-tokens": "sampling.max_new_tokens",
    "--max-turns": "env.max_turns",
    "--gpus-per-trainer": "trainer.gpus_per_worker",
    "--gpus-per-engine": "engine.gpus",
    "--colocate/--split": "engine.colocate",
    "--compute-dtype": "trainer.compute_dtype",
    "--log": "log.trackers",
    "--agent": "agent.function",
}
"""Short flag -> dotted config path; a boolean field's alias names both switches (``--on/--off``). The short flag is
a second name of the generated option. Building the options raises when a path is not a field of the config."""

SFT_ALIASES: dict[str, str] = {
    "--env": "env.id", "--model": "model", "--data": "data", "--demos": "demos", "--epochs": "epochs",
    "--batch-size": "batch_size", "--lr": "optim.lr", "--max-turns": "env.max_turns",
    "--eval-episodes": "eval_episodes", "--seed": "seed", "--output": "output",
    "--compute-dtype": "trainer.compute_dtype", "--trainers": "trainer.workers", "--log": "log.trackers",
}
"""`agentrl sft`'s short flags, as `ALIASES` for `agentrl run`."""

EVAL_ALIASES: dict[str, str] = {
    # The flags `agentrl eval` typed by hand before they were generated: the README, docs and tests use them.
    "--env": "env.id", "--max-turns": "env.max_turns", "--seed-offset": "env.seed_offset", "--k": "ks",
    "--engine": "engine.kind", "--engines": "engine.replicas", "--engine-dtype": "engine.dtype",
    "--runners": "runners.count", "--log": "log.trackers",
    **{f"--{key.replace('_', '-')}": f"sampling_overrides.{key}" for key in (
        "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")},
}
"""`agentrl eval`'s short flags, as `ALIASES` for `agentrl run`."""

EVAL_EVERYDAY: tuple[str, ...] = (
    "--env", "--env-arg", "--model", "--split", "--episodes", "--k", "--samples-per-task", "--output", "--max-turns",
    "--max-new-tokens", "--temperature", "--seed", "--engine", "--engines", "--runners", "--log", "--protocol",
    "--list-protocols", "--compare",
)
"""The flags `agentrl eval --help` lists first."""

SERVE_ALIASES: dict[str, str] = {
    # The flags `agentrl serve` typed by hand before they were generated.
    "--engine": "engine.kind", "--engines": "engine.replicas", "--engine-dtype": "engine.dtype",
    "--family": "context.chat_family", "--thinking/--no-thinking": "context.enable_thinking",
    "--max-context-tokens": "context.max_context_tokens", "--allowed-host": "allowed_hosts",
}
"""`agentrl serve`'s short flags."""

SERVE_EVERYDAY: tuple[str, ...] = (
    "--model", "--host", "--port", "--token", "--engine", "--engines", "--max-tokens", "--max-context-tokens",
    "--record", "--allowed-host",
)
"""The flags `agentrl serve --help` lists first."""

ENV_SERVE_ALIASES: dict[str, str] = {
    # The flags `agentrl env serve` typed by hand before they were generated.
    "--env": "env_id", "--allowed-host": "allowed_hosts",
}
"""`agentrl env serve`'s short flags (``--env-arg``, ``--max-body-mib`` and ``--read-timeout`` are the command's own:
each sets more than one field)."""

ENV_SERVE_EVERYDAY: tuple[str, ...] = (
    "--env", "--env-arg", "--host", "--port", "--token", "--max-sessions", "--threads", "--allowed-host",
    "--max-body-mib", "--read-timeout",
)
"""The flags `agentrl env serve --help` lists first."""

SFT_EVERYDAY: tuple[str, ...] = (
    "--config", "--output", "--env", "--env-arg", "--model", "--data", "--demos", "--epochs", "--batch-size", "--lr",
    "--eval-episodes", "--trainers", "--log", "--overwrite",
)
"""The flags `agentrl sft --help` lists first."""

EVERYDAY: tuple[str, ...] = (
    "--config", "--resume", "--output", "--env", "--env-arg", "--model", "--steps", "--loss", "--lr", "--seed",
    "--runners", "--engine", "--engines", "--trainers", "--log", "--overwrite",
)
"""The flags `agentrl run --help` lists first, in this order; every config flag then follows in its section."""

_SCALARS: dict[Any, tuple[click.ParamType, str]] = {int: (click.INT, "INT"), float: (click.FLOAT, "FLOAT"),
                                                    str: (click.STRING, "TEXT")}


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One settable config field."""

    path: str
    """Dotted path from the root config (``scheduler.group_size``)."""
    type: Any
    """The field's resolved annotation."""
    doc: str
    """The field's attribute docstring (empty when the source cannot be read)."""
    envvar: str | None = None
    """An environment variable the flag is also read from (the field's ``envvar`` metadata)."""
    default: Any = None
    """The field's default in the dataclass, as the help shows it (None: required, or nothing worth showing)."""


@dataclasses.dataclass(frozen=True)
class Section:
    """One config dataclass of the tree and its own (non-dataclass) fields."""

    path: str
    """Dotted path of the section (empty for the root)."""
    doc: str
    """First sentence of the dataclass's docstring."""
    leaves: tuple[Leaf, ...]


# -- the config tree ---------------------------------------------------------------------------------------------


@functools.cache
def sections(root_cls: type) -> tuple[Section, ...]:
    """The config tree under `root_cls`, depth first: the root's own fields, then one section per nested dataclass."""
    out: list[Section] = []
    _walk(root_cls, "", out)
    return tuple(out)


def _walk(cls: type, path: str, out: list[Section]) -> None:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    leaves, children = [], []
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("flag") is False:  # rebuilt through __init__; or set by a flag of its own
            continue
        child_path = f"{path}.{f.name}" if path else f.name
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            children.append((tp, child_path))
        else:
            leaves.append(Leaf(child_path, tp, docs.get(f.name, ""), f.metadata.get("envvar"), _default(f)))
    out.append(Section(path, first_sentence(_class_doc(cls).split("\n\n")[0]), tuple(leaves)))
    for child, child_path in children:
        _walk(child, child_path, out)


def _default(f: dataclasses.Field) -> Any:
    """The default of field `f` (its factory's value), for the help; None where there is none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def default_label(value: Any) -> str:
    """How the help shows a default: ``on`` / ``off`` for a switch, names comma-separated; "" for none or empty."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or (isinstance(value, (str, tuple, list, dict)) and not value):
        return ""
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass's fields: the string literal right after each annotated field.

    Fields inherited from dataclass bases take their base's docstring unless the subclass documents them again. A
    class that documents its fields in an ``Attributes:`` section of its docstring (Google style, as
    `agentrl.http_guard.HttpLimits`) gives each field its entry there, unless the field has a docstring of its own.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        node = _class_node(klass)
        if node is None:
            continue
        docs.update(_attributes_section(ast.get_docstring(node) or ""))
        for stmt, after in zip(node.body, node.body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and _is_string(after):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _attributes_section(doc: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Attributes:`` section, each entry's indented lines joined."""
    entries: dict[str, list[str]] = {}
    lines = iter(doc.splitlines())
    for line in lines:
        if line.strip() == "Attributes:":
            break
    else:
        return {}
    current: list[str] | None = None
    for line in lines:
        if not line.strip():
            continue
        if not line.startswith(" "):  # the section ends at the next unindented line
            break
        match = re.match(r"^ {4}(\w+)(?: \([^)]*\))?: (.*)$", line)
        if match:
            current = entries.setdefault(match.group(1), [match.group(2)])
        elif current is not None:
            current.append(line.strip())
    return {name: " ".join(text) for name, text in entries.items()}


def _is_string(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _class_doc(cls: type) -> str:
    # From the source, not __doc__: dataclasses invent "Name(field: type, ...)" for a class without a docstring.
    node = _class_node(cls)
    return (ast.get_docstring(node) or "") if node is not None else ""


def _class_node(cls: type) -> ast.ClassDef | None:
    try:
        filename = inspect.getsourcefile(cls)
    except TypeError:  # builtins such as object
        return None
    return _class_nodes(filename).get(cls.__qualname__) if filename else None


@functools.cache
def _class_nodes(filename: str) -> dict[str, ast.ClassDef]:
    """Every class of a source file by qualified name; each file is parsed once (a few ms for agentrl/config.py)."""
    try:
        tree = ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError):
        return {}
    found: dict[str, ast.ClassDef] = {}
    _collect_classes(tree.body, "", found)
    return found


def _collect_classes(body: Iterable[ast.stmt], prefix: str, found: dict[str, ast.ClassDef]) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef):
            found[prefix + node.name] = node
            _collect_classes(node.body, f"{prefix}{node.name}.", found)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # a class defined in a function
            _collect_classes(node.body, f"{prefix}{node.name}.<locals>.", found)


def first_sentence(text: str) -> str:
    """The first sentence of a docstring on one line, with RST ``literals`` as `literals`."""
    flat = " ".join(text.replace("``", "`").split())
    end = re.search(r"(?<=[.!?])\s(?=[A-Z])", flat)  # "e.g. `x`" or "(0 = off)." inside a sentence do not end it
    return flat[: end.start()] if end else flat


# -- options -----------------------------------------------------------------------------------------------------


class YamlValue(click.ParamType):
    """A value typed as YAML (lists, mappings, unions): ``--optim.betas "[0.9, 0.95]"``, ``--env.kwargs "{level: 2}"``.

    A parse error is one line naming the flag (PyYAML's own text spans several).
    """

    name = "yaml"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The parsed value."""
        if not isinstance(value, str):
            return value
        import yaml  # here: building the command and --help need no YAML

        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as e:
            self.fail(f"not valid YAML ({_yaml_problem(e)}); quote it or fix it", param, ctx)
        if parsed is None:  # apply_overrides skips None: the flag would silently do nothing
            self.fail(f"{value!r} reads as null; give a value such as [1, 2] or {{key: value}}", param, ctx)
        return parsed


class Ints(YamlValue):
    """A list of integers: ``1,4,8`` as given, or a YAML list ``[1, 4, 8]``."""

    name = "ints"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The integers, as a list in the order given."""
        if isinstance(value, str) and not value.lstrip().startswith("["):
            value = [part.strip() for part in value.split(",") if part.strip()]
        elif isinstance(value, str):
            value = super().convert(value, param, ctx)
        if not isinstance(value, (list, tuple)):
            self.fail(f"expects comma-separated integers like 1,4,8, got {value!r}", param, ctx)
        try:
            return [_int(v) for v in value]
        except ValueError:
            self.fail(f"expects comma-separated integers like 1,4,8, got {','.join(map(str, value))!r}", param, ctx)


def _int(value: Any) -> int:
    if isinstance(value, bool) or isinstance(value, float):
        raise ValueError(value)
    return int(value)


class Names(YamlValue):
    """One occurrence of a repeatable names flag: ``wandb`` or ``wandb,mlflow`` as given, or a YAML list ``[a, b]``.

    Commas are split by the config (`agentrl.config.LogConfig`), which sees the same strings from a YAML file.
    """

    name = "names"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The names of this occurrence, as a list."""
        if isinstance(value, str) and value.lstrip().startswith("["):
            value = super().convert(value, param, ctx)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                self.fail(f"expected a list of names, got {value!r}", param, ctx)
            return value
        return list(value) if isinstance(value, (list, tuple)) else [str(value)]


def _yaml_problem(error: Exception) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem} at column {mark.column + 1}" if mark is not None else problem


class ConfigOption(click.Option):
    """A click option that sets one config field: `path`, dotted."""

    def __init__(self, leaf: Leaf, section: str, aliases: list[str], hidden: bool = False):
        """Build the option for `leaf`.

        Args:
            leaf: the field.
            section: the path of the section it is listed under in the help.
            aliases: extra names (``--short``; for a boolean, ``--on/--off``).
            hidden: left out of the help (a renamed key's flag, `renamed_options`).
        """
        self.path, self.section = leaf.path, section
        self.default_label = default_label(leaf.default)
        tp = _strip_optional(leaf.type)
        _check_alias_form(leaf.path, tp, aliases)
        name, flag = "cfg__" + leaf.path.replace(".", "__"), "--" + leaf.path.replace("_", "-")
        text = first_sentence(leaf.doc)
        if leaf.envvar and leaf.envvar not in text:
            text = f"{text} (env var {leaf.envvar})".lstrip()
        common = {"default": None, "help": text, "envvar": leaf.envvar, "show_envvar": False}
        if tp is bool:
            super().__init__([name, f"{flag}/{_off_switch(flag)}", *aliases], is_flag=True, **common)
            self.type_label = ""
        elif tp == tuple[str, ...]:  # names: repeat the flag or separate them by commas (the config splits them)
            self.type_label = "NAME[,NAME]"
            super().__init__([name, flag, *aliases], multiple=True, type=Names(), metavar=self.type_label, **common)
        else:
            click_type, self.type_label = _click_type(tp)
            super().__init__([name, flag, *aliases], type=click_type, metavar=self.type_label, **common)
        self.hidden = hidden

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        """The value; a repeatable flag's occurrences as one list, None when not given (so it overrides nothing)."""
        value = super().process_value(ctx, value)
        if not self.multiple:
            return value
        return [name for names in value for name in names] or None

    def row(self) -> tuple[str, str]:
        """The option's line in its section: the config flag, then the help led by its short aliases."""
        (flag, _), *aliases = self._pairs()
        lead = f"({', '.join(_switch(on, off) for on, off in aliases)}) " if aliases else ""
        return self.names(only=flag), lead + (self.help or "")

    def _pairs(self) -> list[tuple[str, str | None]]:
        return list(zip(self.opts, self.secondary_opts)) if self.is_flag else [(name, None) for name in self.opts]

    def names(self, only: str | None = None) -> str:
        """The flag names for the help, booleans as ``--[no-]x`` (or ``--on/--off``); `only`: just that alias."""
        pairs = self._pairs()
        if only is not None:
            pairs = [(on, off) for on, off in pairs if only in (on, f"{on}/{off}")]
        shown = ", ".join(_switch(on, off) for on, off in pairs)
        return f"{shown} {self.type_label}" if self.type_label else shown


def _check_alias_form(path: str, tp: Any, aliases: list[str]) -> None:
    for alias in aliases:
        if (tp is bool) != ("/" in alias):
            raise ValueError(f"alias {alias} -> {path}: a boolean field's alias names both switches (--on/--off), "
                             f"any other field's alias one flag")


def _off_switch(flag: str) -> str:
    """``--a.b-c`` -> ``--a.no-b-c``; ``--b-c`` -> ``--no-b-c``."""
    head, dot, last = flag.rpartition(".")
    return f"{head}.no-{last}" if dot else f"--no-{flag[2:]}"


def _switch(on: str, off: str | None) -> str:
    if off is None:
        return on
    if off == _off_switch(on):
        head, dot, last = on.rpartition(".")
        return f"{head}.[no-]{last}" if dot else f"--[no-]{on[2:]}"
    return f"{on}/{off}"


def _strip_optional(tp: Any) -> Any:
    """``X | None`` -> X, since a flag cannot set None anyway (`apply_overrides` skips None).

    A typed value also avoids YAML surprises: ``--ray-address 1:30`` would read as the integer 90.
    """
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return tp


def _click_type(tp: Any) -> tuple[click.ParamType, str]:
    """The click type and metavar of a (non-boolean) field's type; anything but a scalar or a choice is YAML."""
    if tp in _SCALARS:
        return _SCALARS[tp]
    if tp == tuple[int, ...]:
        return Ints(), "INT[,INT]"
    choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()
    if choices and all(isinstance(c, str) for c in choices):  # YAML would turn Literal["on", "off"] into booleans
        return click.Choice(choices), "[" + "|".join(choices) + "]"
    return YamlValue(), "YAML"


def config_options(root_cls: type, aliases: Mapping[str, str] | None = None) -> list[ConfigOption]:
    """One click option per leaf field of the config tree under `root_cls`, each with ``default=None``.

    Args:
        root_cls: the root config dataclass (`agentrl.config.RunConfig`).
        aliases: short flag -> dotted path (`ALIASES`); a short flag equal to the generated one is left as it is.

    Raises:
        ValueError: an alias whose path is not a leaf field, or two options with the same flag.
    """
    tree = sections(root_cls)
    leaves = {leaf.path for section in tree for leaf in section.leaves}
    extra: dict[str, list[str]] = {}
    for alias, path in (aliases or {}).items():
        if path not in leaves:
            raise ValueError(f"alias {alias} points at {path!r}, which is not a field of {root_cls.__name__}")
        if alias.partition("/")[0] != "--" + path.replace("_", "-"):
            extra.setdefault(path, []).append(alias)
    options = [ConfigOption(leaf, section.path, extra.get(leaf.path, []))
               for section in tree for leaf in section.leaves]
    _check_unique(options)
    return options


def renamed_options(root_cls: type) -> list[ConfigOption]:
    """A hidden flag per key the config still reads by its old name (``RENAMED``: `agentrl.config.RENAMED_KEYS`).

    ``--advantage.gamma 0.9`` keeps working until the release that removes the key: the flag hands its old dotted
    path to `agentrl.config.apply_overrides`, which sets the new place (``advantage.options.gamma``) with a warning.
    """
    renamed = getattr(root_cls, "RENAMED", {})
    return [ConfigOption(Leaf(old, r.type, f"Old name of {r.new} (read until {r.removed_in})."), "", [], hidden=True)
            for old, r in renamed.items()]


def _check_unique(params: Iterable[click.Parameter]) -> None:
    seen: dict[str, str | None] = {}
    for param in params:
        for name in (*param.opts, *param.secondary_opts):
            if name in seen:
                raise ValueError(f"flag {name} is used twice: by {seen[name]} and {param.name}")
            seen[name] = param.name


def overrides_of(options: Iterable[ConfigOption], values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted path -> value of each option given on the command line (`values`: click's parameter name -> value)."""
    return {opt.path: values[opt.name] for opt in options if values.get(opt.name) is not None}


# -- the command -------------------------------------------------------------------------------------------------


class ConfigCommand(click.Command):
    """A click command that takes one flag per config field besides its own options, with its help in sections.

    The callback gets its own options as usual, and the config flags given as ``overrides`` (dotted path -> value,
    for `agentrl.config.apply_overrides`).
    """

    def __init__(self, name: str, root: type, aliases: Mapping[str, str], everyday: Iterable[str],
                 params: list[click.Parameter], required: Iterable[str] = (), **kwargs: Any):
        """Build the command.

        Args:
            name: the command name.
            root: the root config dataclass.
            aliases: short flag -> dotted path (`ALIASES`).
            everyday: the flags listed first in the help, in order (`EVERYDAY`).
            params: the command's own options.
            required: dotted paths the command needs given (its body says so when one is missing); the help marks
                them ``[required]`` instead of showing a default.
            **kwargs: `click.Command`'s (callback, help, ...).
        """
        self.root, self.everyday = root, tuple(everyday)
        self.config_params = config_options(root, aliases) + renamed_options(root)
        for opt in self.config_params:
            if opt.path in required:
                opt.default_label = "required"
        _check_unique([*params, *self.config_params])
        super().__init__(name, params=[*params, *self.config_params], **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        """Hand the callback the config flags as one ``overrides`` mapping rather than one argument each."""
        values = {opt.name: ctx.params.pop(opt.name, None) for opt in self.config_params}
        ctx.params["overrides"] = overrides_of(self.config_params, values)
        return super().invoke(ctx)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The everyday flags in full, then one block per config section (its name and docstring), a line a flag."""
        params = self.get_params(ctx)
        named = {name: p for p in params for name in (*p.opts, *p.secondary_opts)}
        everyday = {flag: named[flag.partition("/")[0]] for flag in self.everyday}  # "--on/--off" by its first
        rest = [p for p in params if not isinstance(p, ConfigOption) and p not in everyday.values()]
        rows = [_record(ctx, param, flag) for flag, param in everyday.items()]
        formatter.write_paragraph()
        formatter.write_text("Everyday:")
        with formatter.indentation():
            formatter.write_dl(rows + [p.get_help_record(ctx) for p in rest])
        for section in sections(self.root):
            rows = [opt.row() for opt in self.config_params if opt.section == section.path and not opt.hidden]
            if rows:
                formatter.write_paragraph()
                formatter.write_text(f"{section.path}: {section.doc}" if section.path else "General:")
                with formatter.indentation():
                    _write_lines(formatter, rows)


def _record(ctx: click.Context, param: click.Parameter, flag: str) -> tuple[str, str]:
    """An everyday flag's line: its help in full, with the config's default as click shows defaults."""
    if isinstance(param, ConfigOption):
        label = param.default_label
        default = f"  [{label if label == 'required' else 'default: ' + label}]" if label else ""
        return param.names(only=flag), (param.help or "") + default
    return param.get_help_record(ctx)


def _write_lines(formatter: click.HelpFormatter, rows: list[tuple[str, str]]) -> None:
    """One line a flag: the help is cut at a word to the terminal's width, so a section reads at a glance."""
    name_width = max(len(name) for name, _ in rows)
    for name, text in rows:
        room = formatter.width - formatter.current_indent - name_width - 2
        formatter.write(f"{'':>{formatter.current_indent}}{name:<{name_width}}  {_cut(text, room)}".rstrip() + "\n")


def _cut(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    cut = text[: max(room - 3, 0)].rsplit(" ", 1)[0]
    return cut.rstrip(",;:(") + "..."  # ASCII: a terminal without UTF-8 must still print the help


@dataclasses.dataclass(frozen=True)
class CommandFlags:
    """One config command's flags: its root config, its short flags and the flags its help lists first."""

    root: str
    """The root config dataclass, ``package.module:Class`` (imported when the command is built, not for ``agentrl``)."""
    aliases: Mapping[str, str]
    """Short flag -> dotted path (`ALIASES`)."""
    everyday: tuple[str, ...]
    """The flags its ``--help`` lists first, in order (`EVERYDAY`); the command's own options among them."""
    required: tuple[str, ...] = ()
    """Dotted paths it needs on its command line (its body refuses to start without them)."""


COMMANDS: dict[str, CommandFlags] = {
    "run": CommandFlags("agentrl.config:RunConfig", ALIASES, EVERYDAY),
    "sft": CommandFlags("agentrl.recipes.sft:SFTConfig", SFT_ALIASES, SFT_EVERYDAY),
    "eval": CommandFlags("agentrl.recipes.eval_config:EvalConfig", EVAL_ALIASES, EVAL_EVERYDAY, ("env.id", "model")),
    "serve": CommandFlags("agentrl.recipes.serve:ServeConfig", SERVE_ALIASES, SERVE_EVERYDAY, ("model",)),
    "env serve": CommandFlags("agentrl.envs.server:ServeSettings", ENV_SERVE_ALIASES, ENV_SERVE_EVERYDAY,
                              ("env_id",)),
}
"""Every command whose flags are generated: its name (as typed after ``agentrl``) -> its root and tables."""


def root_of(name: str) -> type:
    """The root config dataclass of command `name` (`COMMANDS`)."""
    import importlib

    module, _, attr = COMMANDS[name].root.partition(":")
    return getattr(importlib.import_module(module), attr)


FLAG_NOTE = "Every config field is a flag: --section.field-name (YAML for lists and mappings)."
"""The line every config command's help ends with (after its own description)."""


def config_command(name: str, callback: Any, params: list[click.Parameter], help: str, *,
                   note: str = FLAG_NOTE) -> ConfigCommand:
    """Command `name` of `COMMANDS`: its own options (`params`), then one flag per field of its root config.

    The callback gets its own options by name and the config flags given as ``overrides`` (dotted path -> value).
    The help is `help` (the command's description; empty for none) followed by `note`.
    """
    flags = COMMANDS[name]
    text = f"{help}\n\n{note}" if help else ""
    return ConfigCommand(name.rpartition(" ")[2], root_of(name), flags.aliases, flags.everyday, params,
                         required=flags.required, callback=callback, help=text,
                         context_settings={"max_content_width": 120})


def run_command(callback: Any, params: list[click.Parameter], help: str) -> ConfigCommand:
    """`agentrl run`: its own options (`params`), one flag per `RunConfig` field, and `ALIASES`."""
    return config_command("run", callback, params, help)


def sft_command(callback: Any, params: list[click.Parameter], help: str) -> ConfigCommand:
    """`agentrl sft`: its own options (`params`), one flag per `SFTConfig` field, and `SFT_ALIASES`."""
    return config_command("sft", callback, params, help)


def invoke(command: click.Command, args: list[str], prog_name: str) -> Any:
    """Run a generated command on the arguments typer passed through; a usage error ends in one line (exit 2).

    Typer is only the registry of commands: it hands every argument of a config command on unparsed (its
    ``context_settings``: `PASS_THROUGH`), since it cannot take a generated set of options.
    """
    from agentrl.cli.common import fail

    try:
        return command.main(args, prog_name=prog_name, standalone_mode=False)
    except click.UsageError as e:  # a bad flag or value: one line, as every other error here
        fail(e.format_message())
    except click.Abort:
        fail("interrupted", code=130)


PASS_THROUGH: dict[str, Any] = {"ignore_unknown_options": True, "allow_extra_args": True,
                                "allow_interspersed_args": False}
"""The typer ``context_settings`` of a config command (registered with ``add_help_option=False``): every argument,
``--help`` too, goes to `invoke`."""
