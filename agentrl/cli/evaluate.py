"""`agentrl eval`: a model's success, reward and pass@k at its official sampling settings, or under a named protocol.

Every field of `agentrl.recipes.evaluate.EvalConfig` is a flag (`agentrl.cli.flags`, `EVAL_ALIASES` for the short
ones); the command's own options are ``--env-arg``, ``--compare``, ``--protocol`` and ``--list-protocols``.
``--protocol NAME`` takes every setting from the protocol (`agentrl.protocols`); a flag that changes one of them
becomes an override and the result is labelled "NAME + overrides". ``--reward.*`` flags score with a judge as
``agentrl run`` does; given for an evaluation of ``RUN/checkpoint`` whose run had a judge, they change that run's
judge key by key (`eval_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from agentrl.cli.common import FAILURE, error_code, fail, merge_env_args

__all__ = ["eval_", "eval_config"]


def eval_(ctx: typer.Context) -> None:
    """Evaluate a model at its official sampling settings: success, reward, pass@k with intervals, report.html."""
    from agentrl.cli.flags import config_command, invoke

    invoke(config_command("eval", _eval, _eval_options(), help=eval_.__doc__), ctx.args, ctx.command_path)


def _eval_options() -> list:
    """`agentrl eval`'s own options; every other flag is a field of `EvalConfig`."""
    import click

    path = click.Path(path_type=Path)
    return [
        click.Option(["--env-arg"], multiple=True, metavar="KEY=VALUE",
                     help="Env constructor argument (repeatable), merged into env.kwargs."),
        click.Option(["--compare"], type=(path, path), default=None, metavar="A B",
                     help="Compare two eval folders: A B."),
        click.Option(["--protocol"], metavar="NAME", help="Named eval protocol (see --list-protocols): fixes env, "
                     "split, task panel, steps, context, sampling, samples and intervals."),
        click.Option(["--list-protocols"], is_flag=True, help="List the named eval protocols and exit."),
    ]


def _eval(overrides: dict, env_arg: tuple[str, ...], compare: tuple[Path, Path] | None, protocol: str | None,
          list_protocols: bool) -> None:
    """`agentrl eval`'s body: `overrides` are the config flags given (dotted path -> value)."""
    from agentrl.cluster import ClusterError
    from agentrl.config import ConfigError
    from agentrl.envs.registry import UnknownEnvError
    from agentrl.models import UnknownModelError
    from agentrl.protocols.protocol import ProtocolError
    from agentrl.protocols.registry import listing
    from agentrl.recipes.evaluate import EvalError, evaluate, load_results
    from agentrl.recipes.report import print_comparison, print_results

    try:
        if compare is not None:
            a, b = (load_results(folder) for folder in compare)
            print_comparison(a, b, label_a=str(compare[0]), label_b=str(compare[1]))
            return
        if list_protocols:
            typer.echo(listing())
            return
        merge_env_args(overrides, "env.kwargs", env_arg, {})
        if protocol is not None:
            cfg = _protocol_config(protocol, overrides)
        elif "env.id" not in overrides and "env.url" not in overrides or "model" not in overrides:
            fail("agentrl eval needs --env and --model (or --compare DIR_A DIR_B)")
        else:
            cfg = eval_config(overrides)
        results = evaluate(cfg)
    except (EvalError, ConfigError, UnknownModelError, UnknownEnvError, ProtocolError) as e:
        fail(str(e), error_code(e))
    except ClusterError as e:
        fail(str(e), FAILURE)
    except KeyboardInterrupt:
        fail("interrupted; nothing was written", code=130)
    print_results(results)
    output = Path(cfg.output)
    typer.echo(f"results in {output / 'results.json'}, report in {output / 'report.html'}")


def eval_config(overrides: dict[str, Any]):
    """The `EvalConfig` of the flags given (dotted path -> value): its defaults, with the flags set.

    Raises:
        ConfigError: a value the config refuses (the message names the key).
    """
    from agentrl.config import build_config
    from agentrl.recipes.eval_config import EvalConfig

    if "ks" in overrides:  # the k of pass@k, each once, smallest first, however they were typed
        overrides = {**overrides, "ks": sorted(set(overrides["ks"]))}
    return build_config(EvalConfig, _reward_over_run(overrides))


def _reward_over_run(overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with the training run's judge under the ``--reward.*`` flags given, when asked and it had one.

    Only with ``--reward-from-run``: a run folder is not trusted by default (`EvalConfig.reward_from_run`).
    Without a ``--reward.*`` flag, the evaluation takes the run's judge whole (`agentrl.recipes.evaluate`); with
    some (a budget, another endpoint), what a user means is the run's judge with those keys changed, as
    ``--env-arg`` changes the run's env arguments key by key. An empty ``--reward.judge.endpoint ""`` asks for no
    judge: the env's rule reward alone, whatever the run used.

    Raises:
        EvalError: the run's config.yaml cannot be read.
    """
    if not any(path.startswith("reward.") for path in overrides):
        return overrides
    if overrides.get("reward.judge.endpoint") == "":
        return {**overrides, "reward_from_run": False}
    if overrides.get("reward_from_run") is not True or "model" not in overrides:
        return overrides
    from agentrl.config import config_to_dict
    from agentrl.recipes.evaluate import run_reward

    saved = run_reward(overrides["model"])
    return overrides if saved is None else {**_dotted(config_to_dict(saved), "reward"), **overrides}


def _dotted(tree: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A nested mapping as dotted keys under `prefix` (``{"judge": {"model": "m"}}`` -> ``reward.judge.model``)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _dotted(value, f"{prefix}.{key}")
        else:
            out[f"{prefix}.{key}"] = value
    return out


# `agentrl eval` flags that change a protocol's settings: dotted config path -> (the override it makes, its old option
# name: the overrides are made in that name's order, as before the flags were generated), see `agentrl.protocols`.
_PROTOCOL_FLAGS: dict[str, tuple[str, str]] = {
    "split": ("split", "split"), "episodes": ("episodes", "episodes"), "ks": ("ks", "k"),
    "samples_per_task": ("samples_per_task", "samples_per_task"), "env.kwargs": ("env_kwargs", "env_arg"),
    "env.max_turns": ("max_turns", "max_turns"), "max_new_tokens": ("max_new_tokens", "max_new_tokens"),
    "seed": ("seed", "seed"), "env.seed_offset": ("seed_offset", "seed_offset"), "thinking": ("thinking", "thinking"),
    **{f"sampling_overrides.{key}": ("sampling", key) for key in (
        "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")},
}

# Where a protocol's evaluation runs and what it also reports: the caller's, on top of the protocol.
_WHERE_IT_RUNS = ("model", "output", "engine.", "runners.", "ray_address", "log.", "transcripts")


def _protocol_config(name: str, overrides: dict[str, Any]):
    """`agentrl eval --protocol NAME`: the protocol's `EvalConfig`.

    Flags that change its settings become overrides (the result is then labelled "NAME + overrides"); where it runs
    (model, engine, runners, cluster, output) and where it also reports (trackers, transcripts) are the caller's.
    Any other flag (``--env``, ``--confidence``, ...) is the protocol's to fix, and refused.
    """
    import dataclasses

    from agentrl.protocols.protocol import ProtocolRun
    from agentrl.protocols.registry import load_protocol
    from agentrl.recipes.evaluate import EvalError, from_protocol

    run = ProtocolRun(load_protocol(name))
    if "env.id" in overrides or "env.url" in overrides:
        raise EvalError(f"--env conflicts with --protocol {name}, which evaluates {run.protocol.env.id!r}; drop --env")
    if "model" not in overrides:
        raise EvalError(f"agentrl eval --protocol {name} needs --model")
    fixed = sorted(path for path in overrides if path not in _PROTOCOL_FLAGS and not path.startswith(_WHERE_IT_RUNS))
    if fixed:
        raise EvalError(f"--protocol {name} fixes {', '.join(fixed)}; drop the flag (or evaluate without a protocol)")
    ks = overrides.get("ks")
    changes: dict[str, Any] = {}
    for path in sorted(set(overrides) & set(_PROTOCOL_FLAGS), key=lambda path: _PROTOCOL_FLAGS[path][1]):
        key, setting = _PROTOCOL_FLAGS[path]
        value = tuple(sorted(set(ks))) if path == "ks" else overrides[path]
        if key == "sampling":
            changes.setdefault("sampling", {})[setting] = value
        else:
            changes[key] = value
    where = eval_config({path: v for path, v in overrides.items() if path.startswith(_WHERE_IT_RUNS)})
    cfg = from_protocol(ProtocolRun(run.protocol, changes), where.model, output=where.output, engine=where.engine,
                        runners=where.runners, ray_address=where.ray_address)
    return dataclasses.replace(cfg, log=where.log, transcripts=where.transcripts)
