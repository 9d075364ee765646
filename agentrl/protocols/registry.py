"""The shipped eval protocols by name: where they live, how a protocol file is read and checked, the listing.

The shipped protocols are the YAML files beside this module (`PROTOCOL_DIR`), one per name, the file named after the
protocol. Every setting must be written out: a missing key is refused rather than taken from a default, so a default
changing in the code cannot move a protocol silently (it would change the hash and fail the pin in
``tests/test_protocols.py``). What a protocol holds: `agentrl.protocols.protocol`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.protocols.protocol import (
    EvalProtocol,
    ProtocolContext,
    ProtocolEnv,
    ProtocolError,
    ProtocolIntervals,
    ProtocolSampling,
    ProtocolTasks,
)

__all__ = ["PROTOCOL_DIR", "INTERVAL_METHODS", "protocol_names", "load_protocol", "listing"]

PROTOCOL_DIR = Path(__file__).resolve().parent
"""Where the shipped protocols live: ``NAME.yaml``."""

INTERVAL_METHODS = {"success": ("wilson",), "means": ("student-t",), "pass_at_k": ("bootstrap-percentile",)}
"""The interval methods `agentrl.passk` implements, per kind of number (a protocol names one of each)."""


def protocol_names() -> list[str]:
    """The shipped protocols' names, sorted."""
    return sorted(p.stem for p in PROTOCOL_DIR.glob("*.yaml"))


def load_protocol(name_or_path: str | Path) -> EvalProtocol:
    """A shipped protocol by name, or a protocol file (``path/to/NAME.yaml``).

    Raises:
        ProtocolError: unknown name (the message lists the available ones), unreadable file, missing or unknown
            keys, bad values.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if not (text.endswith((".yaml", ".yml")) or path.is_file()):
        path = PROTOCOL_DIR / f"{text}.yaml"
        if not path.is_file():
            raise ProtocolError(f"unknown protocol {text!r}; available: {', '.join(protocol_names())} "
                                f"(or a path/to/protocol.yaml)")
    if not path.is_file():
        raise ProtocolError(f"protocol file {path} not found")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ProtocolError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    protocol = _parse(data, str(path))
    if path.parent == PROTOCOL_DIR and protocol.name != path.stem:
        raise ProtocolError(f"{path}: name {protocol.name!r} differs from the file name; a shipped protocol's file "
                            f"is NAME.yaml")
    return protocol


def listing() -> str:
    """`agentrl eval --list-protocols`: one line per shipped protocol (name, hash prefix, what it fixes)."""
    protocols = [load_protocol(name) for name in protocol_names()]
    width = max((len(p.name) for p in protocols), default=4)
    lines = [f"{'name':<{width}}  {'hash':<12}  settings"]
    lines += [f"{p.name:<{width}}  {p.hash[:12]}  {p.summary()}" for p in protocols]
    lines.append(f"run one: agentrl eval --protocol NAME --model MODEL (files: {PROTOCOL_DIR}/NAME.yaml)")
    return "\n".join(lines)


def _section(data: Any, where: str, keys: Sequence[str]) -> dict[str, Any]:
    """`data` as a mapping with exactly `keys` (every one required: a protocol writes every setting out)."""
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{where}: expected a mapping with keys {', '.join(keys)}, got {data!r}")
    missing = [k for k in keys if k not in data]
    unknown = [k for k in data if k not in keys]
    if missing or unknown:
        raise ProtocolError(f"{where}: " + "; ".join(
            ([f"missing {', '.join(missing)} (a protocol writes every setting out)"] if missing else [])
            + ([f"unknown {', '.join(map(str, unknown))}; expected {', '.join(keys)}"] if unknown else [])))
    return dict(data)


def _int(where: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ProtocolError(f"{where}: expected an integer >= {low}, got {value!r}")
    return value


def _float(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _parse(data: Any, where: str) -> EvalProtocol:
    top = _section(data, where, ("name", "description", "provenance", "env", "tasks", "context", "sampling",
                                 "intervals"))
    if not isinstance(top["name"], str) or not top["name"]:
        raise ProtocolError(f"{where}: name must be a non-empty string")
    env = _section(top["env"], f"{where}: env", ("id", "kwargs", "split", "max_turns"))
    if not isinstance(env["kwargs"], Mapping) or "split" in env["kwargs"]:
        raise ProtocolError(f"{where}: env.kwargs must be a mapping without split (env.split names it)")
    tasks = _section(top["tasks"], f"{where}: tasks", ("seed_offset", "count", "samples_per_task", "ks",
                                                        "fingerprint"))
    ks = tasks["ks"]
    if not isinstance(ks, list) or not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ProtocolError(f"{where}: tasks.ks must be a list of positive integers, got {ks!r}")
    if max(ks) > tasks["samples_per_task"]:
        raise ProtocolError(f"{where}: pass@{max(ks)} needs samples_per_task >= {max(ks)}")
    context = _section(top["context"], f"{where}: context", ("max_context_tokens", "max_new_tokens",
                                                             "recap_actions", "history"))
    if context["history"] not in ("template", "as_sampled"):
        raise ProtocolError(f"{where}: context.history must be template or as_sampled, got {context['history']!r}")
    sampling = _section(top["sampling"], f"{where}: sampling", ("temperature", "top_p", "top_k", "min_p",
                                                                "repetition_penalty", "presence_penalty",
                                                                "frequency_penalty", "seed", "thinking"))
    if sampling["thinking"] not in (True, False, None):
        raise ProtocolError(f"{where}: sampling.thinking must be true, false or null, got {sampling['thinking']!r}")
    intervals = _section(top["intervals"], f"{where}: intervals", ("success", "means", "pass_at_k", "confidence"))
    for kind, methods in INTERVAL_METHODS.items():
        if intervals[kind] not in methods:
            raise ProtocolError(f"{where}: intervals.{kind} must be {' or '.join(methods)} (what agentrl.passk "
                                f"implements), got {intervals[kind]!r}")
    confidence = _float(f"{where}: intervals.confidence", intervals["confidence"])
    if not 0 < confidence < 1:
        raise ProtocolError(f"{where}: intervals.confidence must be in (0, 1), got {confidence}")
    provenance = top["provenance"]
    if not isinstance(provenance, Mapping) or not provenance:
        raise ProtocolError(f"{where}: provenance must say where the settings come from (a mapping)")
    return EvalProtocol(
        name=top["name"], description=str(top["description"]).strip(), provenance=dict(provenance),
        env=ProtocolEnv(id=str(env["id"]), kwargs=dict(env["kwargs"]),
                        split=None if env["split"] is None else str(env["split"]),
                        max_turns=_int(f"{where}: env.max_turns", env["max_turns"], 1)),
        tasks=ProtocolTasks(seed_offset=_int(f"{where}: tasks.seed_offset", tasks["seed_offset"]),
                            count=_int(f"{where}: tasks.count", tasks["count"], 1),
                            samples_per_task=_int(f"{where}: tasks.samples_per_task", tasks["samples_per_task"], 1),
                            ks=tuple(ks), fingerprint=str(tasks["fingerprint"] or "")),
        context=ProtocolContext(max_context_tokens=_int(f"{where}: context.max_context_tokens",
                                                        context["max_context_tokens"], 1),
                                max_new_tokens=_int(f"{where}: context.max_new_tokens", context["max_new_tokens"], 1),
                                recap_actions=_int(f"{where}: context.recap_actions", context["recap_actions"]),
                                history=context["history"]),
        sampling=ProtocolSampling(
            **{k: _float(f"{where}: sampling.{k}", sampling[k]) for k in ("temperature", "top_p", "min_p",
                                                                         "repetition_penalty", "presence_penalty",
                                                                         "frequency_penalty")},
            top_k=_int(f"{where}: sampling.top_k", sampling["top_k"]), seed=_int(f"{where}: sampling.seed",
                                                                                 sampling["seed"]),
            thinking=sampling["thinking"]),
        intervals=ProtocolIntervals(success=intervals["success"], means=intervals["means"],
                                    pass_at_k=intervals["pass_at_k"], confidence=confidence),
        path=where,
    )
