"""`agentrl run` and `agentrl sft`: the training commands, one flag per config field (`agentrl.cli.flags`).

Typer hands every argument through to a click command generated from the config dataclasses
(`agentrl.cli.flags.config_command`); the command's own options (``--config``, ``--resume``, ``--env-arg``,
``--overwrite``) are the ``_*_options`` here, and its body applies the flags to the config, checks the env and model
names before the trainer's imports, and maps each failure to its exit code.
"""

from __future__ import annotations

from pathlib import Path

import typer

from agentrl.cli.common import FAILURE, error_code, fail, merge_env_args

__all__ = ["run", "sft"]


def run(ctx: typer.Context) -> None:
    """Train a model with RL on an env: rollouts, the loss, AdamW, metrics.jsonl, curves.png, checkpoints."""
    from agentrl.cli.flags import config_command, invoke

    invoke(config_command("run", _run, _run_options(), help=run.__doc__), ctx.args, ctx.command_path)


def _run_options() -> list:
    """`agentrl run`'s own options; every other flag is a config field."""
    import click

    path = click.Path(path_type=Path)
    return [
        click.Option(["--config"], type=path, help="YAML config (see configs/); flags override it."),
        click.Option(["--resume"], type=path, help="Continue the run saved in this folder."),
        click.Option(["--env-arg"], multiple=True, metavar="KEY=VALUE",
                     help="Env constructor argument (repeatable), merged into env.kwargs."),
        click.Option(["--overwrite"], is_flag=True, help="Replace a run already saved in --output."),
    ]


def _run(overrides: dict, config: Path | None, resume: Path | None, env_arg: tuple[str, ...], overwrite: bool) -> None:
    """`agentrl run`'s body: `overrides` are the config flags given (dotted path -> value)."""
    from agentrl.config import ConfigError, load_config, read_run_config
    from agentrl.envs.registry import UnknownEnvError
    from agentrl.extras import MissingExtraError
    from agentrl.models import UnknownModelError

    try:
        if resume is not None:
            saved = resume / "config.yaml"
            if not saved.is_file():
                fail(f"cannot resume {resume}: no config.yaml there (is it an agentrl run folder?)")
            cfg, moved = read_run_config(saved)
            if moved:
                typer.echo(f"{saved} uses the earlier config layout; read with {len(moved)} keys moved "
                           f"({moved[0]}, ...)", err=True)
            overrides["output"] = str(resume)
        else:
            cfg = load_config(config)
        cfg = _configured(cfg, overrides, env_arg)
        if cfg.agent.function:  # a wrong --agent is answered before the trainer's imports (seconds)
            from agentrl.rollout.agent_loader import load_agent

            load_agent(cfg.agent.function)
    except (ConfigError, UnknownModelError, UnknownEnvError) as e:
        fail(str(e), error_code(e))
    import dataclasses

    from agentrl.recipes.stops import exit_code
    from agentrl.recipes.train import TrainingError, default_run_dir, plot_curves, train

    if not cfg.output:  # named here, so an interrupted run can still say where it is
        cfg = dataclasses.replace(cfg, output=str(default_run_dir(cfg)))
    code = 0
    try:
        out = train(cfg, resume=resume is not None, overwrite=overwrite)
    except (ConfigError, UnknownModelError, UnknownEnvError, MissingExtraError) as e:
        fail(str(e), error_code(e))
    except TrainingError as e:  # the run started and failed (or refused a setting only the loaded model shows)
        fail(str(e), FAILURE)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (`RunStopped`)
        code = exit_code(e)
    if code:  # said outside the except: the stopped frames (and their progress bars) are gone, so this is the end
        _stopped(Path(cfg.output), cfg.steps, code, plot_curves)
    typer.echo(f"run saved in {out} (metrics.jsonl, curves.png, checkpoint/)")


def _stopped(out: Path, steps: int, code: int, plot_curves) -> None:
    """A run stopped by a signal: plot what it has, then one line on where it stands and how to go on."""
    import signal

    from agentrl.recipes.train import stop_message

    if (out / "metrics.jsonl").exists():
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    name = "Ctrl-C" if code == 128 + signal.SIGINT else signal.Signals(code - 128).name
    # Not "error:": the user asked for this stop
    typer.secho(stop_message(out, steps, name), fg=typer.colors.YELLOW, err=True)
    raise typer.Exit(code)


def sft(ctx: typer.Context) -> None:
    """Supervised warm start on expert (or given) episodes, with RL's templates and loss masks; checkpoint + eval."""
    from agentrl.cli.flags import config_command, invoke

    invoke(config_command("sft", _sft, _sft_options(), help=sft.__doc__), ctx.args, ctx.command_path)


def _sft_options() -> list:
    """`agentrl sft`'s own options; every other flag is a field of `SFTConfig`."""
    import click

    return [
        click.Option(["--config"], type=click.Path(path_type=Path),
                     help="YAML SFT config (see configs/*-sft.yaml); flags override it."),
        click.Option(["--env-arg"], multiple=True, metavar="KEY=VALUE",
                     help="Env constructor argument (repeatable), merged into env.kwargs."),
        click.Option(["--overwrite"], is_flag=True, help="Replace a run already saved in --output."),
    ]


def _sft(overrides: dict, config: Path | None, env_arg: tuple[str, ...], overwrite: bool) -> None:
    """`agentrl sft`'s body: `overrides` are the config flags given (dotted path -> value)."""
    from agentrl.cluster import ClusterError
    from agentrl.config import ConfigError
    from agentrl.envs.registry import UnknownEnvError
    from agentrl.models import UnknownModelError
    from agentrl.recipes.sft import SFTError, load_sft_config, run_sft
    from agentrl.training.backend import TrainerFailure

    try:
        cfg = _configured(load_sft_config(config), overrides, env_arg)
        out = run_sft(cfg, overwrite=overwrite)
    except (ConfigError, SFTError, UnknownModelError, UnknownEnvError) as e:
        fail(str(e), error_code(e))
    except (ClusterError, TrainerFailure) as e:
        fail(str(e), FAILURE)
    except KeyboardInterrupt:
        fail("interrupted; nothing was checkpointed", code=130)
    summary = (out / "summary.json").read_text()
    typer.echo(summary)
    typer.echo(f"SFT run saved in {out} (metrics.jsonl, curves.png, checkpoint/, eval/); continue with RL: "
               f"agentrl run --env {cfg.env.id} --model {out / 'checkpoint'}")


def _configured(cfg, overrides: dict, env_arg: tuple[str, ...]):
    """`cfg` (a `RunConfig` or `SFTConfig`) with the command line's flags and --env-arg applied, env and model checked.

    Typos in the env or model name must not wait for the trainer's imports (seconds).
    """
    from agentrl.config import apply_overrides
    from agentrl.envs.registry import spec
    from agentrl.models import check_model_name

    _merge_env_args(overrides, cfg, env_arg)
    cfg = apply_overrides(cfg, overrides)
    spec(cfg.env.id)
    check_model_name(cfg.model)
    return cfg


def _merge_env_args(overrides: dict, cfg, env_arg: tuple[str, ...]) -> None:
    """--env-arg KEY=VALUE merges into env.kwargs; a new --env starts from no kwargs (the old ones were its env's)."""
    env = overrides.get("env.id")
    if env_arg:
        merge_env_args(overrides, "env.kwargs", env_arg, cfg.env.kwargs if env is None else {})
    elif env is not None and env != cfg.env.id and "env.kwargs" not in overrides:
        overrides["env.kwargs"] = {}  # the default kwargs belong to the default env
    if env is not None and env != cfg.env.url and "env.url" not in overrides:
        overrides["env.url"] = ""  # --env names another env than the config's served one
