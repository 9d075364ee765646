"""The `agentrl` command: a thin dispatcher. Each command imports what it needs when it runs, so --help is instant.

The commands live in modules named after them (`agentrl.cli.train` for ``run`` and ``sft``, `agentrl.cli.evaluate`,
`agentrl.cli.envs`, `agentrl.cli.serve`, `agentrl.cli.runs`, `agentrl.cli.check_template`, `agentrl.cli.doctor`);
this module is the table that names them, and `main` is the ``agentrl`` script (``python -m agentrl.cli`` too).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from agentrl.cli import check_template, doctor, envs, evaluate, runs, serve, train
from agentrl.cli.common import fail
from agentrl.cli.flags import PASS_THROUGH

__all__ = ["app", "main"]

# One help style: click's, for every command. Typer is the registry of commands only; its boxed (rich) help is off, so
# `agentrl X --help` reads as the generated config commands' help does (`agentrl.cli.flags.ConfigCommand`).
_PLAIN = {"rich_markup_mode": None, "context_settings": {"max_content_width": 120}}
app = typer.Typer(help="Train LLM agents with RL on multi-turn text environments.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False, **_PLAIN)
envs_app = typer.Typer(help="Inspect registered environments.", no_args_is_help=True, **_PLAIN)
app.add_typer(envs_app, name="envs")
env_app = typer.Typer(help="Serve an environment to other processes and machines.", no_args_is_help=True, **_PLAIN)
app.add_typer(env_app, name="env")
webshop_app = typer.Typer(help="WebShop tools.", no_args_is_help=True, **_PLAIN)
app.add_typer(webshop_app, name="webshop")


def _version(value: bool) -> None:
    if value:
        from agentrl import __version__

        typer.echo(f"agentrl {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print agentrl's version and exit."),
    log_level: str = typer.Option("warning", "--log-level", envvar="AGENTRL_LOG_LEVEL", show_envvar=True,
                                  metavar="LEVEL", help="debug, info, warning, error or critical: agentrl's log lines "
                                                        "at this level and above go to stderr (debug also lets Ray's "
                                                        "and vLLM's start-up lines through)."),
    app_dir: Path = typer.Option(Path("."), "--app-dir", metavar="FOLDER",
                                 help="Put FOLDER first on the import path before resolving package.module:attr "
                                      "names (--env pkg.mod:Class, --agent pkg.mod:function), as uvicorn does: a "
                                      "console script does not import from the current folder by itself."),
) -> None:
    """Train LLM agents with RL on multi-turn text environments."""
    from agentrl.envs.registry import use_app_dir
    from agentrl.logs import configure_logging

    try:
        configure_logging(log_level)
        use_app_dir(app_dir)
    except ValueError as e:
        fail(str(e))


# The command table: each command is a function of the module named after it.
app.callback()(_root)
app.command("doctor")(doctor.doctor_)
envs_app.command("list")(envs.envs_list)
app.command()(envs.play)
# The config commands: typer hands every argument to a click command built from the command's config dataclasses
# (`agentrl.cli.flags.COMMANDS`): one flag per config field, generated, with --help in sections. Typer itself cannot
# take a generated set of options.
app.command(add_help_option=False, context_settings=PASS_THROUGH)(train.run)
app.command(add_help_option=False, context_settings=PASS_THROUGH)(train.sft)
app.command("eval", add_help_option=False, context_settings=PASS_THROUGH)(evaluate.eval_)
app.command("inspect")(runs.inspect_)
app.command("view")(runs.view_)
app.command("check-template")(check_template.check_template)
app.command("serve", add_help_option=False, context_settings=PASS_THROUGH)(serve.serve_)
webshop_app.command("serve")(envs.webshop_serve)
env_app.command("serve", add_help_option=False, context_settings=PASS_THROUGH)(envs.env_serve)


def main() -> None:
    """Entry point of the `agentrl` script."""
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
