"""The multi-turn headline command with a 151k-vocabulary model completes a training step, as a user types it."""

import json
import subprocess
import sys

import pytest
import yaml


@pytest.mark.slow  # 32 WebShop episodes of up to 15 turns through 8 Ray runners: minutes on 2 shared cores
def test_webshop_tiny_qwen3_eight_runners_one_step(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "run", "--env", "webshop", "--model", "tiny-qwen3",
                           "--runners", "8", "--steps", "1", "--output", str(out)],
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1
    # Qwen3 with WebShop's default: tool observations keep the prefix, so each episode trains as one sample.
    assert yaml.safe_load((out / "config.yaml").read_text())["context"]["observation_role"] == "tool"
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        assert not any(turn["new_segment"] for turn in json.loads(line)["turns"])
