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

``address="local"`` also ignores ``RAY_ADDRESS``, which ``ray job submit`` sets for the job's driver (to the head's
``HOST:PORT``), so a submitted run would start a private Ray beside the cluster it was sent to. `choose_address`
decides once, in this order: an explicit address (``--ray-address``, ``ray_address`` in the config); else
``RAY_ADDRESS``; else a private local Ray.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.config import EngineConfig, TrainerConfig

__all__ = ["start_ray", "connect_ray", "check_cpu_workers", "ClusterError", "ClusterChoice", "choose_address",
           "find_auth_token", "shipped_code"]

log = logging.getLogger(__name__)

_shipped: tuple[str, ...] | None = None
"""The ``py_modules`` of the Ray job `start_ray` began (None: Ray was not started by `start_ray`)."""


class ClusterError(RuntimeError):
    """The Ray cluster cannot be joined (unreachable, refused the auth token) or cannot host what the run asks."""


@dataclass(frozen=True)
class ClusterChoice:
    """Which Ray a process uses, and why (what the run plan records and the log says).

    Attributes:
        address: the cluster to join (``HOST:PORT``, ``auto``, ``ray://HOST:PORT``), or None for a private local Ray.
        source: where it came from: ``flag`` (``--ray-address`` or the config), ``RAY_ADDRESS``, or ``local``.
        why: the choice in words.
        warning: set when a ``RAY_ADDRESS`` was passed over (a dashboard URL), with what to do instead.
    """

    address: str | None
    source: str
    why: str
    warning: str = ""

    def say(self) -> None:
        """Log the choice (info), and the warning when there is one."""
        log.info("Ray: %s", self.why)
        if self.warning:
            log.warning("%s", self.warning)


def choose_address(address: str | None, environ: Mapping[str, str] | None = None) -> ClusterChoice:
    """The Ray cluster to join: an explicit `address` wins, else ``RAY_ADDRESS``, else a private local Ray.

    ``ray job submit`` sets ``RAY_ADDRESS`` to the head's ``HOST:PORT`` for the job's driver, so a submitted
    ``agentrl run`` joins the cluster it was sent to. An ``http(s)://`` ``RAY_ADDRESS`` is the dashboard that the Jobs
    CLI talks to (Ray's docs tell users to export it for ``ray job submit``), not an address a driver can join: it
    is passed over (the choice's `warning` says so) and the run starts a local Ray, as before. Nothing is logged
    here: `ClusterChoice.say` does that where the choice is acted on.

    Args:
        address: ``--ray-address`` or ``ray_address`` from the config (None or empty: not given).
        environ: the environment to read (default: this process's).
    """
    if address and address != "local":
        return ClusterChoice(address, "flag", f"joins {address}: --ray-address (or ray_address in the config)")
    env = os.environ if environ is None else environ
    joined = env.get("RAY_ADDRESS", "").strip()
    if address == "local" or not joined or joined == "local":
        return ClusterChoice(None, "local", "a private local Ray: no --ray-address and no RAY_ADDRESS")
    if "://" in joined and not joined.startswith("ray://"):
        return ClusterChoice(None, "local", f"a private local Ray: RAY_ADDRESS={joined} is a dashboard URL", (
            f"RAY_ADDRESS={joined} is a dashboard URL (what `ray job submit` talks to), not a cluster a driver "
            f"joins: starting a private local Ray. To run on that cluster, submit the run with `ray job submit "
            f"--address {joined} -- agentrl run ...`, or pass --ray-address HOST:PORT"))
    return ClusterChoice(joined, "RAY_ADDRESS",
                         f"joins {joined}: RAY_ADDRESS is set (`ray job submit` sets it for the job's driver)")


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


def _check_reachable(address: str, timeout: float = 5.0, given_by: str = "--ray-address") -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"{given_by} {address!r} is not HOST:PORT, 'auto' or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ClusterError(f"no Ray cluster answers at {address} ({e.strerror or e}). Start one with "
                           f"`ray start --head --port {port}` on that machine, or fix {given_by}") from None


def start_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to Ray: join `address`, or start a quiet private local instance.

    Returns True when this call connected this process to Ray (the caller shuts it down again).

    Args:
        address: ``HOST:PORT`` of a head, ``auto`` (the head on this machine), ``ray://HOST:PORT`` (Ray client), or
            None: the cluster ``RAY_ADDRESS`` names (as ``ray job submit`` sets it), else a new local instance,
            whatever heads or address files the machine holds (see `choose_address`).
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
    from agentrl.logs import third_party_level

    # Ray's start-up lines (INFO) stay out of the run's output unless --log-level debug.
    kwargs: dict[str, Any] = dict(log_to_driver=False, logging_level=third_party_level(), configure_logging=True)
    # glibc gives every stepping thread its own malloc arena; large numpy temporaries then stay as per-thread heap.
    # Two arenas keep envs with big transient arrays from multiplying their memory by the thread count.
    kwargs["runtime_env"] = {"env_vars": {"MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2")}}
    code = _env_code()
    if code:
        kwargs["runtime_env"]["py_modules"] = list(code)
    kwargs["runtime_env"] = _beside_job_env(kwargs["runtime_env"])
    code = tuple(kwargs["runtime_env"].get("py_modules", ()))  # what is shipped after all
    choice = choose_address(address)
    if address:  # chosen by the caller (a recipe that resolved RAY_ADDRESS already says so)
        log.info("Ray: joining %s", address)
    else:
        choice.say()
    address = choice.address
    if not address:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, **kwargs)
        _set_shipped(code)
        return True
    if address != "auto" and "://" not in address:
        _check_reachable(address, given_by="--ray-address" if choice.source == "flag" else "RAY_ADDRESS")
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


def check_cpu_workers(trainer: TrainerConfig, address: str | None = None) -> None:
    """Refuse more CPU trainer workers than this machine has cores on a local Ray (a core per worker).

    Raises:
        ConfigError: naming the count that fits.
    """
    from agentrl.config import ConfigError

    cores = os.cpu_count() or 1
    if address is None and trainer.gpus_per_worker == 0 and trainer.workers > cores:
        raise ConfigError(f"more workers than devices: --trainers {trainer.workers} on CPU needs a core per worker "
                          f"and this machine has {cores}. Use --trainers {cores} or fewer, or --ray-address a bigger "
                          f"cluster")


def connect_ray(trainer: TrainerConfig, engine: EngineConfig | None = None, *, runners: int = 0,
                address: str | None = None) -> bool:
    """Join the cluster (or start a local Ray) when a command uses one, before any model loads.

    A command uses Ray for trainer workers, env runners, GPU or colocated engines, or engines pinned to a Ray
    resource. A local Ray gives each CPU trainer worker a logical CPU of its own beside the cores the env runners
    use, as the driver's training shared the cores with them before.

    Returns:
        True when this call connected (the caller shuts Ray down again), False when Ray is not needed or was
        connected already.

    Raises:
        ConfigError: more CPU trainer workers than cores on a local Ray.
        ClusterError: the cluster is unreachable or refused this process.
    """
    uses_engines = engine is not None and (engine.gpus > 0 or engine.colocate or bool(engine.ray_resource))
    if trainer.workers == 0 and runners == 0 and not uses_engines:
        return False
    check_cpu_workers(trainer, address)
    cores = os.cpu_count() or 1
    return start_ray(address, num_cpus=cores + (trainer.workers if trainer.gpus_per_worker == 0 else 0))


def _beside_job_env(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """`runtime_env` less what the submitted job's own runtime env sets: ``ray.init`` refuses any overlap.

    A driver started by ``ray job submit --runtime-env-json ...`` finds its job's runtime env in
    ``RAY_JOB_CONFIG_JSON_ENV_VAR``, and Ray will not merge an init runtime env that sets the same field or the same
    env var ("Failed to merge the Job's runtime env"). The job's settings are the user's: they win.
    """
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    try:
        job = (json.loads(raw).get("runtime_env") or {}) if raw else {}
    except (ValueError, AttributeError):  # not ours to judge: Ray reads it again and says what is wrong
        return runtime_env
    if not job:
        return runtime_env
    fitted = {k: v for k, v in runtime_env.items() if k == "env_vars" or k not in job}
    fitted["env_vars"] = {k: v for k, v in runtime_env.get("env_vars", {}).items()
                          if k not in (job.get("env_vars") or {})}
    if "py_modules" in runtime_env and "py_modules" in job:
        log.warning("the submitted job sets its own py_modules, so the env code %s is not shipped to the workers: "
                    "add it to the job's py_modules", runtime_env["py_modules"])
    return fitted


def _env_code() -> tuple[str, ...]:
    """The code of the ``file.py:Class`` / ``module:Class`` envs loaded so far, for the job's ``py_modules``.

    Ray's ``py_modules`` uploads each file or package folder once (content-addressed) and puts it on the `sys.path` of
    every worker on every node, so runners import the env under the same module name as the driver. It takes local
    paths only in the job's runtime_env, here at ``ray.init``, not per actor. ``working_dir`` would upload the whole
    current folder (run outputs and checkpoints included) and move the workers' cwd; a PYTHONPATH in ``env_vars``
    would only reach nodes that share the driver's filesystem.
    """
    from agentrl.envs.registry import loaded_env_code

    return loaded_env_code()


def _set_shipped(code: tuple[str, ...]) -> None:
    global _shipped
    _shipped = code


def shipped_code() -> tuple[str, ...] | None:
    """The env code (``py_modules`` paths) the Ray job carries, or None when `start_ray` did not start it."""
    import ray

    return _shipped if ray.is_initialized() else None
