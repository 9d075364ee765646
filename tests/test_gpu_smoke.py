"""bench/micro/gpu_smoke.py runs anywhere: without a GPU it reports the CUDA checks skipped and runs the same paths on
CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

SCRIPT = ROOT / "bench" / "micro" / "gpu_smoke.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run bench/micro/gpu_smoke.py itself")
def test_cpu_mode_runs_every_check_and_skips_the_cuda_ones_with_the_reason(tmp_path):
    out = tmp_path / "smoke.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    by = {(r["check"], r["device"]): r for r in report["results"]}
    checks = ["hf_engine", "single_trainer", "bf16", "memory_plan", "fsdp_one_rank", "routing_replay", "packing",
              "trainer_rate"]
    assert set(by) == {(c, d) for c in checks for d in ("cuda", "cpu")}
    for check in checks:
        assert by[check, "cuda"]["status"] == "skipped" and "CPU build" in by[check, "cuda"]["reason"]
        assert by[check, "cpu"]["status"] == "ran", by[check, "cpu"]
    assert report["summary"] == {"ran": 8, "skipped": 8, "failed": 0}
    # The CPU paths measured what the CUDA ones will: the one-rank FSDP group (gloo here) gives the one-process
    # update, and replaying the engine's experts gives the engine's log-probs.
    fsdp = by["fsdp_one_rank", "cpu"]["facts"]
    assert fsdp["process_group"] == "gloo" and fsdp["weight_max_diff_vs_single"] < 1e-5
    assert by["routing_replay", "cpu"]["facts"]["max_logp_gap_replay"] < 1e-3
    assert by["hf_engine", "cpu"]["facts"]["turn2_reused_tokens"] > 0
    assert "refused_at_1_mib" in by["memory_plan", "cpu"]["facts"]
    packing = by["packing", "cpu"]["facts"]
    assert packing["tokens_packed"] < packing["tokens_padded"] and packing["logp_max_diff"] < 1e-5
    rate = by["trainer_rate", "cpu"]["facts"]
    assert {"float32", "bfloat16"} <= rate.keys() and 0 < rate["float32"]["update"]["mfu"] < 1
    for line in ("check ", "fsdp_one_rank    cpu    ran", "hf_engine        cuda   skipped"):
        assert line in done.stdout, done.stdout


def test_a_failing_check_is_reported_and_sets_the_exit_status(monkeypatch, capsys, tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_smoke
    finally:
        sys.path.remove(str(SCRIPT.parent))

    def broken(device):
        raise RuntimeError("the router output changed shape\nsecond line")

    monkeypatch.setitem(gpu_smoke.CHECK_FUNCTIONS, "routing_replay", broken)
    assert gpu_smoke.main(["--device", "cpu", "--checks", "routing_replay", "--out", str(tmp_path / "r.json")]) == 1
    result = json.loads((tmp_path / "r.json").read_text())["results"][-1]
    assert (result["device"], result["status"]) == ("cpu", "failed")
    assert result["reason"] == "RuntimeError: the router output changed shape"
    assert "routing_replay   cpu    failed" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_cuda_without_a_gpu_is_one_line():
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gpu_smoke: --device cuda, but torch {torch.__version__} is a CPU build (torch.version.cuda is None)"]


def test_after_installing_the_script_runs_itself_again_once(monkeypatch):
    """The editable install's import hook loads only in a new interpreter (a fresh GPU machine failed without)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_smoke
    finally:
        sys.path.remove(str(SCRIPT.parent))

    class Exec(Exception):
        pass

    def execv(path, args):
        raise Exec(args)

    monkeypatch.delenv(gpu_smoke.REEXEC_VAR, raising=False)
    monkeypatch.setattr(gpu_smoke.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(gpu_smoke.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    monkeypatch.setattr(gpu_smoke.os, "execv", execv)
    monkeypatch.setattr(gpu_smoke.sys, "argv", ["gpu_smoke.py", "--device", "cuda"])
    with pytest.raises(Exec) as raised:
        gpu_smoke.install_project(force=False)
    assert raised.value.args[0] == [sys.executable, "gpu_smoke.py", "--device", "cuda"]
    assert gpu_smoke.os.environ[gpu_smoke.REEXEC_VAR] == "pip install --no-deps -e . --no-build-isolation"
    # The second run installs (the hook may still be missing) and goes on: it never runs itself a third time.
    assert gpu_smoke.install_project(force=False) == "pip install --no-deps -e . --no-build-isolation"
