"""The Docker images build from the project's own files (checked without a Docker daemon, which CI machines lack)."""

from __future__ import annotations

import fnmatch
import re

import yaml
from conftest import ROOT

DOCKER = ROOT / "docker"


def _instructions(dockerfile) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _ignored(path: str) -> bool:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    parts = path.split("/")
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(parts[0], p) or
               any(fnmatch.fnmatch(part, p.removeprefix("**/")) for part in parts) for p in patterns)


def test_every_copied_file_is_in_the_repository_and_the_build_context():
    dockerfiles = sorted(DOCKER.glob("Dockerfile*"))
    assert {d.name for d in dockerfiles} >= {"Dockerfile.cpu", "Dockerfile.gpu"}
    for dockerfile in dockerfiles:
        copies = [args.split()[:-1] for op, args in _instructions(dockerfile) if op == "COPY"]
        assert copies, dockerfile.name
        for sources in copies:
            for src in sources:
                assert (ROOT / src).exists(), f"{dockerfile.name} copies {src}, which the repository lacks"
                assert not _ignored(src), f"{dockerfile.name} copies {src}, which .dockerignore excludes"


def test_pins_match_pyproject_and_the_cpu_image_default_config_loads():
    from agentrl.config import load_config

    pyproject = (ROOT / "pyproject.toml").read_text()
    torch_pin = re.search(r'"torch==([^"]+)"', pyproject).group(1)
    cpu = (DOCKER / "Dockerfile.cpu").read_text()
    assert f"torch=={torch_pin}" in cpu and "download.pytorch.org/whl/cpu" in cpu
    assert '"vllm==0.32.0"' in pyproject and '".[gpu]"' in (DOCKER / "Dockerfile.gpu").read_text()
    cmd = [args for op, args in _instructions(DOCKER / "Dockerfile.cpu") if op == "CMD"][-1]
    config = re.search(r'"(configs/[^"]+)"', cmd).group(1)
    load_config(ROOT / config)


def test_compose_builds_the_two_images_from_the_repository():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    for service in ("cpu", "gpu"):
        build = compose["services"][service]["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve().exists()
        assert (DOCKER / build["context"]).resolve() == ROOT.resolve()
