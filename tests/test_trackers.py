"""Experiment trackers (`--log`): each one, offline, in a real `agentrl run`, read back with the tracker's own reader.

A tracker whose package is not installed is skipped here (its reader is missing too); the README's test install
(requirements/dev.txt) installs all four. A missing or misconfigured tracker must cost one line and leave the run going.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from agentrl.config import ConfigError, LogConfig, RunConfig, apply_overrides
from agentrl.trackers.base import Table
from agentrl.trackers.registry import tracker_names
from agentrl.trackers.runlog import RunLog
from agentrl.trackers.tables import eval_summary, trajectory_table

RUN_ARGS = ("--env", "math", "--model", "tiny-qwen3", "--group-size", "2", "--prompts-per-step", "2",
            "--max-new-tokens", "8", "--engine", "hf")


def agentrl(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def rows_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- the setting -------------------------------------------------------------------------------------------------


def test_log_flag_takes_repeats_and_commas():
    from agentrl.cli.flags import ALIASES, run_command

    command = run_command(lambda **kw: kw, [], help="")
    ctx = command.make_context("run", ["--log", "wandb,mlflow", "--log", "tensorboard", "--log.project", "p"])
    overrides = command.invoke(ctx)["overrides"]
    assert overrides == {"log.trackers": ["wandb,mlflow", "tensorboard"], "log.project": "p"}
    cfg = apply_overrides(RunConfig(), overrides)
    assert cfg.log.trackers == ("wandb", "mlflow", "tensorboard") and cfg.log.project == "p"
    # Not given: nothing is overridden (an empty tuple would wipe a config file's trackers).
    assert command.invoke(command.make_context("run", []))["overrides"] == {}
    assert ALIASES["--log"] == "log.trackers"


def test_unknown_tracker_is_one_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError) as e:
        LogConfig(trackers=("wandb", "tensorbord"))
    assert "tensorbord" in str(e.value) and "tensorboard" in str(e.value) and "trackio" in str(e.value)
    assert tracker_names(["a,b", " c ", "a"]) == ("a", "b", "c")


class _Recorder:
    """A tracker that keeps what it is given, and raises where told (to test `RunLog`'s isolation)."""

    run_id, location = "", "memory"

    def __init__(self, fail_on: str = ""):
        self.calls, self.fail_on = [], fail_on

    def __getattr__(self, method):
        def call(*args):
            if method == self.fail_on:
                raise RuntimeError("disk full\nsecond line")
            self.calls.append((method, args))
        return call


def test_a_failing_tracker_is_said_once_and_dropped_while_the_files_go_on(tmp_path):
    said = []
    good, bad = _Recorder(), _Recorder(fail_on="log_metrics")
    log = RunLog(tmp_path, {"good": good, "bad": bad}, say=said.append)
    log.metrics({"step": 0, "reward_mean": 0.5, "entropy": float("nan"), "flag": True})
    log.metrics({"step": 1, "reward_mean": 0.7})
    log.close()
    assert [r["step"] for r in rows_of(tmp_path)] == [0, 1]
    assert said == ["--log bad: log_metrics failed (RuntimeError: disk full); it stops logging, metrics.jsonl goes on"]
    metrics = [args for method, args in good.calls if method == "log_metrics"]
    assert metrics == [(0, {"reward_mean": 0.5}), (1, {"reward_mean": 0.7})]  # NaN, booleans and step left out
    assert good.calls[-1][0] == "close"


def test_trajectory_table_spans_groups_and_eval_summary_flattens_intervals():
    from agentrl.records import Trajectory, Turn

    def episode(group, i):
        turn = Turn((1,), (2, 3), (-0.1, -0.2), f"answer {i}", "wrong", 0.0)
        return Trajectory("math", group, group, (turn,), "What is 1+1?", 0.0, False, True, False, 3, train_step=3)

    table = trajectory_table([episode(g, i) for g in (0, 1) for i in range(3)], 3)
    assert [(r[1], r[0]) for r in table.rows] == [(0, 3), (1, 3), (0, 3)]  # one group after another, at step 3
    assert table.rows[0][-1] == "What is 1+1?\n> answer 0\nwrong" and table.rows[0][7] == 2
    interval = {"estimate": 0.5, "low": 0.2, "high": 0.8, "n": 4}
    results = {"overall": {"success_rate": interval, "pass_at_k": {"1": interval}, "reward_std": 0.1, "episodes": 4},
               "by_task_type": {"a": {"success_rate": interval}, "b": {"success_rate": interval}}}
    summary = eval_summary(results)
    assert summary["eval/success_rate"] == 0.5 and summary["eval/success_rate_high"] == 0.8
    assert summary["eval/pass_at_1"] == 0.5 and summary["eval/reward_std"] == 0.1 and summary["eval/b/success_rate"]


def test_tensorboard_markdown_table_keeps_one_line_per_row():
    pytest.importorskip("tensorboard")
    from agentrl.trackers.tensorboard import markdown_table

    text = markdown_table(Table(("a", "b"), ((1, "x|y\nz"),)))
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y<br>z |"]


# -- each tracker in a real run, read back with its own reader ---------------------------------------------------


ALL = ("wandb", "mlflow", "tensorboard", "trackio")


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A 2-step run logging to every tracker (one given twice, comma-separated and repeated)."""
    run = tmp_path_factory.mktemp("trackers") / "run"
    out = agentrl("run", *RUN_ARGS, "--steps", "2", "--output", str(run), "--log", "wandb,mlflow", "--log",
                  "tensorboard", "--log", "trackio", "--log.table-episodes", "3",
                  env={"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": "", "TRACKIO_DIR": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in rows_of(run)] == [0, 1] and (run / "curves.png").exists()
    return run, out.stderr


def _check_rows(logged: dict[int, dict], run: Path, keys=("reward_mean", "entropy", "kl_k3", "step_seconds")):
    """The tracker's values equal metrics.jsonl's, step by step."""
    rows = rows_of(run)
    assert sorted(logged) == [r["step"] for r in rows]
    for row in rows:
        for key in keys:
            assert logged[row["step"]][key] == pytest.approx(row[key], rel=1e-6), key


def _wandb_records(path: Path):
    """The records of a W&B transaction log (.wandb): LevelDB's log format (32 KiB blocks of checksummed chunks)
    after a 7-byte header, each record a `wandb_internal_pb2.Record`. wandb has no public reader of it any more."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = pb.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""
        elif kind == 0:
            break


def test_wandb_offline_run_holds_config_metrics_and_tables(tracked_run):
    pytest.importorskip("wandb")
    run, stderr = tracked_run
    assert "--log wandb: offline run in" in stderr
    (log_file,) = run.glob("wandb/offline-run-*/run-*.wandb")
    history, config = {}, {}
    for record in _wandb_records(log_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":  # a nested value (a table's reference) comes one leaf per item
            row = history.setdefault(record.history.step.num, {})
            for item in record.history.item:
                *parents, leaf = [item.key] if item.key else item.nested_key
                node = row
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = json.loads(item.value_json)
        elif kind == "config":
            config |= {item.key: json.loads(item.value_json) for item in record.config.update}
    _check_rows({step: row for step, row in history.items()}, run)
    assert history[0]["trajectories"]["_type"] == "table-file" and history[1]["trajectories"]["nrows"] == 3
    assert config["model"] == "tiny-qwen3" and config["log"]["trackers"] == list(ALL)
    table = json.loads(next(log_file.parent.glob("files/media/table/trajectories_1_*.table.json")).read_text())
    assert table["columns"][:3] == ["step", "group", "seed"] and {r[0] for r in table["data"]} == {1}


def _mlflow_client(run: Path, monkeypatch):
    """MLflow's client on the run's file store (which MLflow 3 opens only when asked to)."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return MlflowClient(tracking_uri=(run / "mlruns").as_uri())


def test_mlflow_file_store_holds_params_metrics_and_tables(tracked_run, monkeypatch):
    pytest.importorskip("mlflow")

    run, stderr = tracked_run
    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]
    assert f"--log mlflow: run {run_id} in file://" in stderr
    client = _mlflow_client(run, monkeypatch)
    logged: dict[int, dict] = {}
    for key in ("reward_mean", "entropy", "kl_k3", "step_seconds"):
        for m in client.get_metric_history(run_id, key):
            logged.setdefault(m.step, {})[key] = m.value
    _check_rows(logged, run)
    info = client.get_run(run_id)
    assert info.data.params["model"] == "tiny-qwen3" and info.data.params["scheduler.group_size"] == "2"
    assert info.info.status == "FINISHED" and info.info.run_name == "run"
    table = json.loads(Path(client.download_artifacts(run_id, "trajectories/step_000001.json", str(run))).read_text())
    assert table["columns"][-1] == "transcript" and len(table["data"]) == 3


def test_tensorboard_event_files_hold_scalars_and_text(tracked_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = tracked_run
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    logged: dict[int, dict] = {}
    for key in ("reward_mean", "entropy", "kl_k3", "step_seconds"):
        for e in events.Scalars(key):
            logged.setdefault(e.step, {})[key] = e.value
    _check_rows(logged, run)
    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}
    assert "tiny-qwen3" in texts["config/text_summary"][0].tensor_proto.string_val[0].decode()
    table = texts["trajectories/text_summary"][-1]
    assert table.step == 1 and table.tensor_proto.string_val[0].decode().count("\n| 1 |") == 3


def test_trackio_store_holds_config_metrics_and_tables(tracked_run):
    pytest.importorskip("trackio")
    run, stderr = tracked_run
    assert f"--log trackio: project 'agentrl' in {run.resolve() / 'trackio'}" in stderr
    # Trackio reads TRACKIO_DIR when first imported: its reader runs in a process of its own.
    script = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
              "print(json.dumps([S.get_logs('agentrl', 'run'), S.get_run_config('agentrl', 'run')], default=str))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRACKIO_DIR": str(run / "trackio")})
    assert out.returncode == 0, out.stderr[-2000:]
    logs, config = json.loads(out.stdout.splitlines()[-1])
    logged: dict[int, dict] = {}
    for entry in logs:
        logged.setdefault(entry["step"], {}).update(entry)
    _check_rows(logged, run)
    assert logged[1]["trajectories"]["_type"] == "trackio.table" and len(logged[1]["trajectories"]["_value"]) == 3
    assert config["model"] == "tiny-qwen3"


def test_missing_or_misconfigured_tracker_is_one_line_and_the_run_finishes(tmp_path):
    # wandb made unimportable (as if not installed); MLflow pointed at a scheme it has no store for.
    shadow = tmp_path / "shadow" / "wandb"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'wandb'\", name='wandb')\n")
    run = tmp_path / "run"
    out = agentrl("run", *RUN_ARGS, "--steps", "1", "--output", str(run), "--log", "wandb,mlflow",
                  env={"PYTHONPATH": str(shadow.parent), "MLFLOW_TRACKING_URI": "nosuchscheme://nowhere"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in rows_of(run)] == [0] and (run / "curves.png").exists()
    lines = [line for line in out.stderr.splitlines() if line.startswith("--log")]
    assert lines[0] == ("--log wandb: cannot import wandb (pip install 'agentrl-platform[wandb]'); this run logs to "
                        "metrics.jsonl without it")
    if "mlflow" in sys.modules or _installed("mlflow"):
        assert lines[1].startswith("--log mlflow: could not start (") and "nosuchscheme" in lines[1]
    assert len(lines) == 2 and "Traceback" not in out.stderr


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- sft and eval ------------------------------------------------------------------------------------------------


def _tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


@pytest.mark.slow
def test_sft_logs_its_loss_and_the_checkpoints_eval(tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "sft"
    out = agentrl("sft", "--env", "math", "--model", "tiny-qwen3", "--demos", "4", "--epochs", "1", "--batch-size",
                  "2", "--eval-episodes", "2", "--output", str(run), "--log", "tensorboard",
                  "--sampling.max-new-tokens", "8")
    assert out.returncode == 0, out.stderr[-3000:]
    scalars = _tensorboard_scalars(run / "tensorboard")
    rows = rows_of(run)
    assert scalars["loss"] == pytest.approx({r["step"]: r["loss"] for r in rows})
    summary = json.loads((run / "summary.json").read_text())
    assert scalars["eval/success_rate"] == {len(rows): summary["eval"]["success_rate"]["estimate"]}


@pytest.mark.slow
def test_eval_logs_its_results(tmp_path):
    pytest.importorskip("tensorboard")
    folder = tmp_path / "eval"
    out = agentrl("eval", "--env", "math", "--model", "tiny-qwen3", "--episodes", "2", "--max-new-tokens", "8",
                  "--engine", "hf", "--output", str(folder), "--log", "tensorboard")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((folder / "results.json").read_text())
    scalars = _tensorboard_scalars(folder / "tensorboard")
    assert scalars["eval/success_rate"] == {0: results["overall"]["success_rate"]["estimate"]}
    assert scalars["eval/tokens_mean"] == {0: pytest.approx(results["overall"]["tokens_mean"]["estimate"])}


@pytest.mark.slow
def test_resume_continues_the_same_tracker_runs(tracked_run, monkeypatch):
    pytest.importorskip("mlflow")

    run, _ = tracked_run
    ids = json.loads((run / "trackers.json").read_text())
    out = agentrl("run", "--resume", str(run), "--steps", "3", env={"MLFLOW_TRACKING_URI": "", "TRACKIO_DIR": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((run / "trackers.json").read_text()) == ids
    client = _mlflow_client(run, monkeypatch)
    assert [m.step for m in client.get_metric_history(ids["mlflow"], "reward_mean")] == [0, 1, 2]
    if _installed("tensorboard"):  # a second event file beside the first, read as one run
        assert sorted(_tensorboard_scalars(run / "tensorboard")["reward_mean"]) == [0, 1, 2]
    if _installed("wandb"):  # W&B's offline mode writes the resumed part to a folder of its own, same run id
        assert {p.name.rpartition("-")[2] for p in run.glob("wandb/offline-run-*")} == {ids["wandb"]}
