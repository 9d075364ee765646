"""What every `agentrl` command shares: the exit codes, the one-line error, ``--env-arg KEY=VALUE`` parsing."""

from __future__ import annotations

import typer

__all__ = ["ENV_HELP", "USAGE_ERROR", "FAILURE", "fail", "error_code", "parse_env_args", "merge_env_args"]

ENV_HELP = ("Env id (see `agentrl envs list`), or package.module:Class (imported from --app-dir, default the "
            "current folder), or path/to/file.py:Class.")
"""The help of every ``--env`` option."""

# Exit codes, as shells and CI read them: 2 when the command line (or its config) is wrong and nothing was tried, as
# click's own usage errors; 1 when the work itself failed (training, the cluster, a server); 128 + N for signal N
# (130 Ctrl-C, 143 SIGTERM).
USAGE_ERROR, FAILURE = 2, 1


def fail(message: str, code: int = USAGE_ERROR) -> None:
    """Say ``error: message`` on stderr, one red line, and exit with `code` (never returns)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def error_code(error: BaseException) -> int:
    """1 for a package the install left out (the command line was right, the install was not), else 2."""
    from agentrl.envs.registry import EnvExtraError
    from agentrl.extras import MissingExtraError

    return FAILURE if isinstance(error, (EnvExtraError, MissingExtraError)) else USAGE_ERROR


def parse_env_args(pairs: list[str]) -> dict:
    """``--env-arg KEY=VALUE`` pairs as constructor arguments, each VALUE read as YAML; a bad pair exits with 2."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--env-arg expects KEY=VALUE, got {pair!r}")
        try:  # VALUE is YAML so numbers, booleans and lists arrive typed: level=2, task_types=[a, b]
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            fail(f"--env-arg {pair!r}: the value is not valid YAML ({str(e).splitlines()[0]}); quote it or fix it")
    return out


def merge_env_args(overrides: dict, path: str, env_arg: tuple[str, ...] | list[str], base: object) -> None:
    """Merge ``--env-arg KEY=VALUE`` pairs into the kwargs at `path` of `overrides`.

    They start from `base` when the flags do not set the kwargs; kwargs that are not a mapping (``--env.kwargs
    "[1]"``) exit with 2, naming them.
    """
    if not env_arg:
        return
    kwargs = overrides.get(path, base)
    if not isinstance(kwargs, dict):
        fail(f"{path}: expected a mapping for --env-arg to merge into, got {kwargs!r}")
    overrides[path] = {**kwargs, **parse_env_args(list(env_arg))}
