"""The README's examples run as written."""

import re

from conftest import ROOT

import agentrl


def test_readme_custom_env_example_works():
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    env = namespace["env"]
    obs, _ = env.reset(seed=5)
    obs, reward, terminated, truncated, info = env.step("not a number")
    assert reward == 0 and not terminated
    obs, reward, terminated, truncated, info = env.step(env.expert_action())
    assert reward == 1 and terminated and info["success"]
    assert "guess-number" in agentrl.registered()


def test_readme_opens_with_install_and_test_commands():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert "agentrl run --env math" in blocks[0]
    assert "python -m pytest" in blocks[1]
    assert blocks[1].strip() in (ROOT / ".ci" / "run").read_text()
