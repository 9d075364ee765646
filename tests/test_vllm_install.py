"""The README's vLLM install command is what CI runs (the vLLM tests must run for real there, not skip)."""

import re

from conftest import ROOT


def test_ci_installs_vllm_with_the_readme_command():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    command = next(b.strip() for b in blocks if "import vllm" in b)
    assert "pip uninstall -y torchvision torchaudio torchcodec" in command  # they break `import vllm`
    # The first command (install and run the main job) installs vLLM the same way.
    install = command.removesuffix('&& python -c "import vllm"').strip()
    assert install in blocks[0]
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci and ci.index(command) < ci.index("python -m pytest")
