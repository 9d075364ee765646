"""A run whose env fails every episode stops after `runners.max_failed_steps` steps with exit code 1, not "saved"."""

import subprocess
import sys
import textwrap

import pytest

from agentrl.config import ConfigError, RunnersConfig

BROKEN_ENV = textwrap.dedent('''
    import agentrl

    class Broken(agentrl.TextEnv):
        """An env whose every step fails, as a served env does once its server is gone."""

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return "Say something.", {}

        def step(self, action):
            raise ConnectionError("the env server at http://127.0.0.1:9 is gone")
''')


def test_a_run_whose_env_fails_every_episode_stops_with_exit_code_1(tmp_path):
    env_file = tmp_path / "broken.py"
    env_file.write_text(BROKEN_ENV)
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "run", "--env", f"{env_file}:Broken", "--model", "tiny-qwen3",
         "--engine", "hf", "--steps", "6", "--prompts-per-step", "1", "--group-size", "2", "--max-new-tokens", "4",
         "--runners.max-episode-retries", "0", "--runners.max-failed-steps", "2", "--output", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "every group failed in 2 steps in a row" in done.stderr and "is gone" in done.stderr
    assert "Traceback" not in done.stderr
    assert "step 0: no complete group" in done.stdout + done.stderr  # the first failed step is said and passed


def test_max_failed_steps_refuses_a_negative_count():
    with pytest.raises(ConfigError, match="runners.max_failed_steps"):
        RunnersConfig(max_failed_steps=-1)
