"""The env commands: `agentrl envs list`, `agentrl play`, `agentrl env serve` and `agentrl webshop serve`."""

from __future__ import annotations

import math

import typer

from agentrl.cli.common import ENV_HELP, FAILURE, USAGE_ERROR, error_code, fail, merge_env_args, parse_env_args

__all__ = ["envs_list", "play", "env_serve", "webshop_serve"]


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


def play(
    env: str = typer.Option(..., "--env", help=ENV_HELP),
    seed: int = typer.Option(0, help="Episode seed: the same seed replays the same task."),
    expert: bool = typer.Option(False, "--expert", help="Let the env's expert play and print the transcript."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="Env constructor argument KEY=VALUE (repeatable)."),
    max_steps: int = typer.Option(200, help="Stop after this many actions."),
) -> None:
    """Play one episode in the terminal (you type actions), or watch the expert play it."""
    import agentrl
    from agentrl.recipes.play import play_episode

    if seed < 0:
        fail(f"--seed must be >= 0 (env seeds cannot be negative), got {seed}")
    if max_steps < 1:
        fail(f"--max-steps must be >= 1, got {max_steps}")
    try:
        instance = agentrl.make(env, **parse_env_args(env_arg))
    except agentrl.UnknownEnvError as e:
        fail(str(e), error_code(e))
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        fail(f"bad env argument for {env!r}: {e}")
    result = play_episode(instance, seed=seed, expert=expert, max_steps=max_steps)
    raise typer.Exit(0 if result.ended else 1)


def env_serve(ctx: typer.Context) -> None:
    """Serve an env over HTTP (agentrl's --env http://HOST:PORT/NAME) and WebSocket (OpenEnv clients)."""
    from agentrl.cli.flags import config_command, invoke
    from agentrl.extras import install_hint

    note = ("Every setting is a flag: --section.field-name (YAML for lists and mappings); the token is also read "
            "from AGENTRL_ENV_TOKEN.")
    try:
        command = config_command("env serve", _env_serve, _env_serve_options(), help=env_serve.__doc__, note=note)
    except ImportError as e:  # FastAPI and uvicorn are in the base install: only a broken install lacks them
        fail(f"agentrl env serve needs FastAPI and uvicorn: {install_hint('serve')} ({e})", FAILURE)
    invoke(command, ctx.args, ctx.command_path)


def _env_serve_options() -> list:
    """`agentrl env serve`'s own options: each sets more than one field of `ServeSettings`."""
    import click

    return [
        click.Option(["--env-arg"], multiple=True, metavar="KEY=VALUE",
                     help="Env constructor argument (repeatable), merged into kwargs."),
        click.Option(["--max-body-mib"], type=float, metavar="FLOAT",
                     help="Largest request body and WebSocket message, in MiB (sets limits.max_body_bytes and "
                          "limits.ws_max_size)."),
        click.Option(["--read-timeout"], type=float, metavar="FLOAT",
                     help="Seconds a client may take to send a request's headers, and its body (sets "
                          "limits.header_timeout and limits.body_timeout)."),
    ]


def _env_serve(overrides: dict, env_arg: tuple[str, ...], max_body_mib: float | None,
               read_timeout: float | None) -> None:
    """`agentrl env serve`'s body: `overrides` are the settings' flags given (dotted path -> value)."""
    import agentrl
    from agentrl.config import ConfigError, build_config
    from agentrl.envs.server import ServeError, ServeSettings, serve
    from agentrl.extras import MissingExtraError

    if "env_id" not in overrides:
        fail("agentrl env serve needs --env")
    for flag, value in (("--max-body-mib", max_body_mib), ("--read-timeout", read_timeout)):
        if value is not None and not (math.isfinite(value) and value > 0):
            fail(f"{flag} must be a finite number > 0, got {value}")
    merge_env_args(overrides, "kwargs", env_arg, {})
    if max_body_mib is not None:  # the one flag sets both bounds, unless a finer flag sets one itself
        for path in ("limits.max_body_bytes", "limits.ws_max_size"):
            overrides.setdefault(path, int(max_body_mib * 2**20))
    if read_timeout is not None:
        for path in ("limits.header_timeout", "limits.body_timeout"):
            overrides.setdefault(path, read_timeout)
    env = overrides["env_id"]
    try:
        settings = build_config(ServeSettings, overrides)
        serve(settings, announce=lambda line: typer.echo(line, err=True))
    except (ServeError, ConfigError) as e:
        fail(str(e))
    except (agentrl.UnknownEnvError, MissingExtraError) as e:
        fail(str(e), error_code(e))
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        fail(f"cannot serve {env!r}: {e}", FAILURE if isinstance(e, OSError) else USAGE_ERROR)
    except KeyboardInterrupt:
        pass


def webshop_serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (keep it on loopback unless you mean it)."),
    port: int = typer.Option(3000, help="Port (0 picks a free one)."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="WebShop constructor argument KEY=VALUE (repeatable)."),
) -> None:
    """Serve the WebShop pages as HTML for a person to shop in a browser (same pages, actions and score)."""
    from agentrl.envs.webshop.server import serve

    if not 0 <= port <= 65535:
        fail(f"--port must be in 0..65535 (0 picks a free one), got {port}")
    try:
        serve(host=host, port=port, **parse_env_args(env_arg))
    except (TypeError, ValueError, OSError) as e:
        fail(f"cannot serve WebShop: {e}", FAILURE if isinstance(e, OSError) else USAGE_ERROR)
