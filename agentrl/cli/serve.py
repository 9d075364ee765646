"""`agentrl serve`: a model behind an OpenAI-compatible API, every sampled call recorded (`agentrl.recipes.serve`).

Every field of `agentrl.recipes.serve.ServeConfig` is a flag (`agentrl.cli.flags`, `SERVE_ALIASES` for the short
ones); the token is also read from ``AGENTRL_SERVE_TOKEN``.
"""

from __future__ import annotations

import typer

from agentrl.cli.common import fail

__all__ = ["serve_"]


def serve_(ctx: typer.Context) -> None:
    """Serve a model behind an OpenAI-compatible /v1/chat/completions and /v1/completions, recording every call."""
    from agentrl.cli.flags import config_command, invoke

    invoke(config_command("serve", _serve, [], help=serve_.__doc__), ctx.args, ctx.command_path)


def _serve(overrides: dict) -> None:
    """`agentrl serve`'s body: `overrides` are the config flags given (dotted path -> value)."""
    from agentrl.config import ConfigError, build_config
    from agentrl.models import UnknownModelError, check_model_name
    from agentrl.recipes.serve import ServeConfig, ServeError, serve

    if "model" not in overrides:
        fail("agentrl serve needs --model")
    try:
        check_model_name(overrides["model"])
        cfg = build_config(ServeConfig, overrides)
        serve(cfg, say=typer.echo)
    except (ServeError, ConfigError, UnknownModelError) as e:
        fail(str(e))
