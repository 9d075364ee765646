"""Joining a Ray cluster, or starting a private local one, without the traps Ray 2.60 sets.

Three traps, each met on this project's machines:

* A plain local run (no address) after any ``ray start --head`` on the machine: ``ray.init()`` reads the address
  file the head left in the Ray temp folder (``ray_current_cluster``), even after the head stopped, and then
  refuses our ``num_cpus`` ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
  We pass ``address="local"``, Ray's own word for "start a new instance, whatever the environment says".
* ``--ray-address HOST:PORT`` against a head with token auth (on by default since Ray 2.60): Ray enables token auth
  only for ``auto``, where it looks for a token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
  ``~/.ray/auth_token``) and switches the auth mode on when it finds one. For an explicit address it never does,
  and the connection fails after 20 s of "InvalidAuthToken" lines. We run the same token lookup for every address.
* An unreachable address or a missing token: we check the port answers first (seconds, not a 20 s retry loop) and
  turn Ray's ``ConnectionError`` into one message that names the address and the fix.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

__all__ = ["start_ray", "ClusterError", "find_auth_token", "shipped_code"]

log = logging.getLogger(__name__)

_shipped: tuple[str, ...] | None = None
"""The ``py_modules`` of the Ray job `start_ray` began (None: Ray was not started by `start_ray`)."""


class ClusterError(RuntimeError):
    """The Ray cluster cannot be joined (unreachable, refused the auth token) or cannot host what the run asks."""


def find_auth_token() -> str | None:
    """Where this machine keeps a Ray auth token (the places Ray itself reads), or None when it has none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    return path if os.path.isfile(path) else None


def _enable_token_auth_if_available() -> None:
    """Switch this process to token auth when a token exists, exactly as Ray does for ``address="auto"``."""
    if os.environ.get("RAY_AUTH_MODE") is not None or find_auth_token() is None:
        return
    try:  # Ray's own helper also refreshes its cached config; the env var alone is read only at import time
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token auth: nothing to enable
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--ray-address {address!r} is not HOST:PORT, 'auto' or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ClusterError(f"no Ray cluster answers at {address} ({e.strerror or e}). Start one with "
                           f"`ray start --head --port {port}` on that machine, or fix --ray-address") from None


def start_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to Ray: join `address`, or start a quiet private local instance.

    Returns True when this call connected this process to Ray (the caller shuts it down again).

    Args:
        address: ``HOST:PORT`` of a head, ``auto`` (the head on this machine), ``ray://HOST:PORT`` (Ray client), or
            None for a new local instance, whatever heads or address files the machine holds.
        num_cpus: logical CPUs of a new local instance (default: the machine's cores).

    Raises:
        ClusterError: the cluster is unreachable or refused this process (with the fix in the message).

    The local instance has no dashboard, no usage-stats prompt and does not stream worker logs: env failures reach
    the driver as `EnvFailure` records, not as log lines.
    """
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.WARNING, configure_logging=True)
    # glibc gives every stepping thread its own malloc arena; large numpy temporaries then stay as per-thread heap.
    # Two arenas keep envs with big transient arrays from multiplying their memory by the thread count.
    kwargs["runtime_env"] = {"env_vars": {"MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2")}}
    code = _env_code()
    if code:
        kwargs["runtime_env"]["py_modules"] = list(code)
    if not address:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, **kwargs)
        _set_shipped(code)
        return True
    if address != "auto" and "://" not in address:
        _check_reachable(address)
    _enable_token_auth_if_available()
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as e:
        token = find_auth_token()
        hint = (f"this machine's token ({token}) was sent and refused: copy the head's token (run "
                f"`ray get-auth-token` there) into RAY_AUTH_TOKEN") if token else (
                "if the cluster uses token auth (Ray's default since 2.60), this machine has no token: set "
                "RAY_AUTH_TOKEN to the output of `ray get-auth-token` on the head, or copy its ~/.ray/auth_token")
        raise ClusterError(f"could not join the Ray cluster at {address}: {str(e).splitlines()[0]}. {hint}") from None
    _set_shipped(code)
    return True


def _env_code() -> tuple[str, ...]:
    """The code of the ``file.py:Class`` / ``module:Class`` envs loaded so far, for the job's ``py_modules``.

    Ray's ``py_modules`` uploads each file or package folder once (content-addressed) and puts it on the `sys.path` of
    every worker on every node, so runners import the env under the same module name as the driver. It takes local
    paths only in the job's runtime_env, here at ``ray.init``, not per actor. ``working_dir`` would upload the whole
    current folder (run outputs and checkpoints included) and move the workers' cwd; a PYTHONPATH in ``env_vars``
    would only reach nodes that share the driver's filesystem.
    """
    from agentrl.registry import loaded_env_code

    return loaded_env_code()


def _set_shipped(code: tuple[str, ...]) -> None:
    global _shipped
    _shipped = code


def shipped_code() -> tuple[str, ...] | None:
    """The env code (``py_modules`` paths) the Ray job carries, or None when `start_ray` did not start it."""
    import ray

    return _shipped if ray.is_initialized() else None
