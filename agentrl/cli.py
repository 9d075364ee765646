"""The `agentrl` command: a thin dispatcher. Each command imports what it needs when it runs, so --help is instant."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

app = typer.Typer(help="Train LLM agents with RL on multi-turn text environments.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
envs_app = typer.Typer(help="Inspect registered environments.", no_args_is_help=True)
app.add_typer(envs_app, name="envs")


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@envs_app.command("list")
def envs_list() -> None:
    """List registered envs: id, one-line description, providing package."""
    import agentrl

    rows = []
    for env_id, spec in agentrl.registered().items():
        try:
            description = spec.description
        except Exception as e:  # a broken third-party env must not hide the others
            description = f"(cannot load: {e})"
        rows.append((env_id, description, spec.package))
    width = max(len(r[0]) for r in rows) if rows else 2
    pkg_width = max(len(r[2]) for r in rows) if rows else 7
    typer.echo(f"{'id':<{width}}  {'package':<{pkg_width}}  description")
    for env_id, description, package in rows:
        typer.echo(f"{env_id:<{width}}  {package:<{pkg_width}}  {description}")


def _parse_kwargs(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _fail(f"--env-arg expects KEY=VALUE, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


@app.command()
def play(
    env: str = typer.Option(..., "--env", help="Env id (see `agentrl envs list`)."),
    seed: int = typer.Option(0, help="Episode seed: the same seed replays the same task."),
    expert: bool = typer.Option(False, "--expert", help="Let the env's expert play and print the transcript."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="Env constructor argument KEY=VALUE (repeatable)."),
    max_steps: int = typer.Option(200, help="Stop after this many actions."),
) -> None:
    """Play one episode in the terminal (you type actions), or watch the expert play it."""
    import agentrl
    from agentrl.play import play_episode

    try:
        instance = agentrl.make(env, **_parse_kwargs(env_arg))
    except agentrl.UnknownEnvError as e:
        _fail(str(e))
    except TypeError as e:
        _fail(f"bad env argument for {env!r}: {e}")
    result = play_episode(instance, seed=seed, expert=expert, max_steps=max_steps)
    raise typer.Exit(0 if result.ended else 1)


@app.command()
def run(
    env: str | None = typer.Option(None, "--env", help="Env id [default: math]."),
    model: str | None = typer.Option(None, "--model", help="Built-in model, local HF folder or hub id."),
    steps: int | None = typer.Option(None, "--steps", help="Training steps."),
    group_size: int | None = typer.Option(None, "--group-size", help="Episodes per task (G)."),
    prompts_per_step: int | None = typer.Option(None, "--prompts-per-step", help="Tasks per step (B)."),
    runners: int | None = typer.Option(None, "--runners", help="Concurrent env runners (0 = in-process)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Per turn."),
    max_turns: int | None = typer.Option(None, "--max-turns", help="Model calls per episode."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate."),
    loss: str | None = typer.Option(None, "--loss", help="Policy loss name (minirl, grpo, dapo, ...)."),
    seed: int | None = typer.Option(None, "--seed", help="Run seed."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="Env constructor argument KEY=VALUE (repeatable)."),
    output: Path | None = typer.Option(None, "--output", help="Run folder [default: runs/latest]."),
    config: Path | None = typer.Option(None, "--config", help="YAML config (see configs/)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run saved in this folder."),
) -> None:
    """Train a model with RL on an env: rollouts, the loss, AdamW, metrics.jsonl, curves.png, checkpoints."""
    from agentrl.config import ConfigError, RunConfig, _build, apply_overrides, load_config
    from agentrl.models import UnknownModelError
    from agentrl.registry import UnknownEnvError
    from agentrl.train import TrainingError, train

    try:
        if resume is not None:
            saved = resume / "config.yaml"
            if not saved.exists():
                _fail(f"cannot resume {resume}: no config.yaml there (is it an agentrl run folder?)")
            import yaml

            cfg = _build(RunConfig, yaml.safe_load(saved.read_text()))
            output = resume
        else:
            cfg = load_config(config)
        overrides = {
            "env.id": env, "model": model, "steps": steps, "rollout.group_size": group_size,
            "rollout.prompts_per_step": prompts_per_step, "rollout.runners": runners,
            "rollout.max_new_tokens": max_new_tokens, "rollout.max_turns": max_turns, "optim.lr": lr,
            "loss.name": loss, "seed": seed, "output": str(output) if output else None,
        }
        if env_arg:
            overrides["env.kwargs"] = {**(cfg.env.kwargs if env is None else {}), **_parse_kwargs(env_arg)}
        elif env is not None and env != cfg.env.id:
            overrides["env.kwargs"] = {}  # the default kwargs belong to the default env
        cfg = apply_overrides(cfg, overrides)
        out = train(cfg, resume=resume is not None)
    except (ConfigError, UnknownModelError, UnknownEnvError, TrainingError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("interrupted; the last checkpoint and metrics so far are kept", code=130)
    typer.echo(f"run saved in {out} (metrics.jsonl, curves.png, checkpoint/)")


def main() -> None:
    """Entry point of the `agentrl` script."""
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
