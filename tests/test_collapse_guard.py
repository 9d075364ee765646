"""The collapse guard's opt-in signals (gradient norm, length-cut share, success drop), their config, and the replay of
a guard over a finished run's metrics. The entropy and KL checks are tested in test_objective_diagnostics.py."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

from agentrl.config import ConfigError, GuardConfig, RunConfig, apply_overrides
from agentrl.objective import CollapseGuard, GuardVerdict
from agentrl.training.guard_replay import GuardReplay, replay_guard
from agentrl.training.metrics import rollout_metrics
from agentrl.training.step import MISMATCH_KL

HEALTHY = {"entropy": 1.0, "kl_k3": 0.001, "grad_norm": 20.0, "length_cut_frac": 0.1, "success_rate": 0.5}


def verdicts(guard: CollapseGuard, rows: list[dict]) -> list[GuardVerdict]:
    return [guard.update(row) for row in rows]


# -- each new signal trips after `patience` bad readings, not before ------------------------------------------------


@pytest.mark.parametrize("threshold, key, bad, said", [
    ({"grad_norm_max": 100.0}, "grad_norm", 674.0, "grad_norm 674 > 100"),
    ({"grad_norm_max": 100.0}, "grad_norm", float("nan"), "grad_norm nan > 100"),
    ({"length_cut_max": 0.9}, "length_cut_frac", 1.0, "length_cut_frac 1 > 0.9"),
])
def test_a_threshold_signal_trips_after_patience_and_not_before(threshold, key, bad, said):
    guard = CollapseGuard(patience=3, action="rollback", **threshold)
    assert guard.update(HEALTHY) == GuardVerdict(True, "", "none", 0, 0)
    first, second, third = verdicts(guard, [HEALTHY | {key: bad}] * 3)
    assert first.ok and second.ok and (first.bad_streak, second.bad_streak) == (1, 2)
    assert second.reason == f"step 2: {said} (2/3 consecutive bad readings)"
    assert not third.ok and third.action == "rollback" and third.last_good_step == 0
    assert third.reason == f"collapse guard tripped at step 3: {said} for 3 consecutive readings; roll back to step 0"


def test_a_threshold_signal_streak_breaks_on_a_good_reading_and_the_edge_is_fine():
    guard = CollapseGuard(patience=2, grad_norm_max=100.0, length_cut_max=0.9)
    rows = [HEALTHY | {"grad_norm": 500.0}, HEALTHY | {"grad_norm": 100.0, "length_cut_frac": 0.9},  # at the limit
            HEALTHY | {"grad_norm": 500.0}, HEALTHY | {"length_cut_frac": 0.95}, HEALTHY | {"grad_norm": 500.0}]
    assert [v.ok for v in verdicts(guard, rows)] == [True] * 5  # never two bad readings of one signal in a row
    assert guard.readings == {"entropy": False, "kl": False, "grad_norm": True, "length_cut": False}
    assert not guard.update(HEALTHY | {"grad_norm": 500.0}).ok


def test_success_drop_trips_after_patience_once_the_moving_mean_falls_below_its_best():
    guard = CollapseGuard(patience=2, success_drop=0.5)
    rates = [0.4, 0.6, 0.5, 0.3, 0.1, 0.1, 0.1]  # 3-step means from step 2: 0.5, 0.467, 0.3, 0.167, 0.1
    got = [guard.update(HEALTHY | {"success_rate": r}) for r in rates]
    assert [v.bad_streak for v in got] == [0, 0, 0, 0, 0, 1, 2]  # 0.3 is not below 0.25; 0.167 is
    assert guard.success_best == pytest.approx(0.5) and got[5].ok and not got[6].ok
    assert "success_rate 3-step mean 0.1 < 0.25 (0.5 x best 0.5) for 2 consecutive readings" in got[6].reason


def test_success_drop_waits_for_a_full_window_and_a_best_above_zero():
    guard = CollapseGuard(patience=1, success_drop=0.5)
    assert [guard.update(HEALTHY | {"success_rate": 0.0}).ok for _ in range(6)] == [True] * 6  # best 0: no drop
    filling = CollapseGuard(success_drop=0.5)
    filling.update(HEALTHY)
    assert "success" not in filling.readings  # one rate of three: not measured yet


def test_reset_empties_the_success_window_and_keeps_its_best():
    guard = CollapseGuard(patience=1, success_drop=0.5, action="rollback")
    for rate in (0.6, 0.6, 0.6, 0.0, 0.0):
        verdict = guard.update(HEALTHY | {"success_rate": rate})
    assert not verdict.ok
    guard.reset()
    assert guard.update(HEALTHY | {"success_rate": 0.1}).ok and "success" not in guard.readings
    guard.update(HEALTHY | {"success_rate": 0.1})
    assert not guard.update(HEALTHY | {"success_rate": 0.1}).ok  # measured against the best before the rollback


def test_each_signal_keeps_its_own_streak():
    guard = CollapseGuard(patience=2, grad_norm_max=100.0, length_cut_max=0.9)
    assert guard.update(HEALTHY | {"grad_norm": 500.0}).bad_streak == 1
    both = guard.update(HEALTHY | {"length_cut_frac": 1.0})  # the norm recovers as the cut share goes bad
    assert both.ok and both.bad_streak == 1
    tripped = guard.update(HEALTHY | {"length_cut_frac": 1.0, "grad_norm": 500.0})
    assert not tripped.ok and tripped.reason == ("collapse guard tripped at step 2: grad_norm 500 > 100 and "
                                                 "length_cut_frac 1 > 0.9 for 2 consecutive readings")


def test_a_missing_metric_raises_in_training_and_is_unmeasured_in_a_replay():
    with pytest.raises(KeyError, match="'grad_norm'"):
        CollapseGuard(grad_norm_max=100.0).update({"entropy": 1.0, "kl_k3": 0.0})
    lenient = CollapseGuard(grad_norm_max=100.0, success_drop=0.5, missing_ok=True)
    assert lenient.update({"kl_k3": 0.0, "entropy": None}).ok and lenient.readings == {"kl": False}


# -- defaults off: today's verdicts ---------------------------------------------------------------------------------


def test_the_default_config_builds_todays_guard():
    guard = CollapseGuard.from_config(GuardConfig(), kl_key=MISMATCH_KL)
    assert (guard.entropy_min, guard.k3_max, guard.patience, guard.action, guard.kl_key) == (
        0.05, 0.01, 3, "stop", MISMATCH_KL)
    assert (guard.grad_norm_max, guard.length_cut_max, guard.success_drop) == (None, None, None)
    assert guard.signals == ("entropy", "kl")
    on = CollapseGuard.from_config(GuardConfig(grad_norm_max=100, length_cut_max=0.9, success_drop=0.5), "kl_k3")
    assert (on.grad_norm_max, on.length_cut_max, on.success_drop) == (100, 0.9, 0.5)
    assert on.signals == ("entropy", "kl", "grad_norm", "length_cut", "success")


def test_with_the_new_signals_off_the_existing_rows_get_the_same_verdicts():
    """The rows of test_objective_diagnostics.py's guard tests, with the new metrics at their worst: same verdicts."""
    worst = {"grad_norm": float("nan"), "length_cut_frac": 1.0}
    low, fine = {"entropy": 0.1, "kl_k3": 0.001}, {"entropy": 0.9, "kl_k3": 0.002}
    rows = [fine, low, low, fine, low, low, low]
    for row_set in (rows, [r | worst | {"success_rate": s} for r, s in zip(rows, (0.9, 0.9, 0.9, 0, 0, 0, 0))]):
        guard = CollapseGuard.from_config(GuardConfig(entropy_min=0.25, patience=3, action="rollback"), "kl_k3")
        got = verdicts(guard, row_set)
        assert [(v.ok, v.bad_streak, v.last_good_step) for v in got] == [
            (True, 0, 0), (True, 1, 0), (True, 2, 0), (True, 0, 3), (True, 1, 3), (True, 2, 3), (False, 3, 3)]
        assert got[-1].reason == ("collapse guard tripped at step 6: entropy 0.1 < 0.25 for 3 consecutive readings; "
                                  "roll back to step 3")
    kl_rows = [{"entropy": 1.0, MISMATCH_KL: v} for v in (0.05, None, 0.02, 0.001, float("nan"))]
    guard = CollapseGuard.from_config(GuardConfig(patience=2), MISMATCH_KL)
    assert [(v.ok, v.bad_streak) for v in verdicts(guard, kl_rows)] == [
        (True, 1), (True, 0), (False, 2), (True, 0), (True, 1)]


# -- config and flags -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, message", [
    ("grad_norm_max", -1.0, "guard.grad_norm_max must be >= 0 (0 = off), got -1.0"),
    ("grad_norm_max", float("nan"), "guard.grad_norm_max must be >= 0 (0 = off), got nan"),
    ("length_cut_max", 1.0, "guard.length_cut_max must be in [0, 1) (a share of episodes; 0 = off), got 1.0"),
    ("length_cut_max", -0.1, "guard.length_cut_max must be in [0, 1) (a share of episodes; 0 = off), got -0.1"),
    ("success_drop", 1.0, "guard.success_drop must be in [0, 1) (a fraction of the best success; 0 = off), got 1.0"),
    ("success_drop", -0.5, "guard.success_drop must be in [0, 1) (a fraction of the best success; 0 = off), got -0.5"),
])
def test_the_config_refuses_out_of_range_thresholds(field, value, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        GuardConfig(**{field: value})


def test_the_thresholds_are_flags_and_off_by_default():
    from agentrl.cli.flags import run_command

    assert (GuardConfig().grad_norm_max, GuardConfig().length_cut_max, GuardConfig().success_drop) == (0, 0, 0)
    overrides: dict = {}
    run_command(lambda **given: overrides.update(given["overrides"]), [], help="").main(
        ["--guard.grad-norm-max", "100", "--guard.length-cut-max", "0.9", "--guard.success-drop", "0.5"],
        standalone_mode=False)
    assert overrides == {"guard.grad_norm_max": 100.0, "guard.length_cut_max": 0.9, "guard.success_drop": 0.5}
    cfg = apply_overrides(RunConfig(), overrides).guard
    assert (cfg.grad_norm_max, cfg.length_cut_max, cfg.success_drop) == (100.0, 0.9, 0.5)
    with pytest.raises(ConfigError, match="guard.success_drop must be in"):
        apply_overrides(RunConfig(), {"guard.success_drop": 2.0})


# -- the length-cut share in the step's metrics ---------------------------------------------------------------------


def test_rollout_metrics_count_the_episodes_with_a_reply_cut_at_the_token_limit():
    def episode(*finish: str, truncated: bool = False):
        turns = [SimpleNamespace(generated_ids=(1, 2), new_segment=False, roundtrip_drift="", finish_reason=f)
                 for f in finish]
        return SimpleNamespace(turns=turns, success=False, truncated=truncated)

    trajectories = [episode("stop", "length", "stop"), episode("length", "length"), episode("stop", truncated=True),
                    episode("stop")]
    metrics = rollout_metrics(trajectories, torch.zeros(4))
    assert metrics["length_cut_frac"] == 0.5  # one episode counts once, however many replies were cut
    assert metrics["truncated_frac"] == 0.25  # a budget that ended the episode is another thing


# -- replaying a guard over a finished run ---------------------------------------------------------------------------


def pilot_rows() -> list[dict]:
    """The shape of the off-policy pilot (lr 2e-4, sync_every 8, 4 mini-batches, no IS): from its record, the grad
    norms of steps 0-3, success 0.16 at step 0 and 0.00 at step 8, staleness KL 0.6 -> 7.7, entropy within 0.24-2.7 and
    a fresh mismatch KL of 0.001 at step 8; the values in between are made up to that shape. Fresh samples (the
    mismatch KL) only at steps 0 and 8; no length-cut share (the metric is newer than the run)."""
    grad = [62, 674, 48, 2910, 1850, 3620, 940, 5100, 2270, 4480]
    success = [0.16, 0.22, 0.19, 0.12, 0.06, 0.03, 0.03, 0.0, 0.0, 0.0]
    entropy = [0.9, 0.6, 1.1, 1.8, 2.3, 2.7, 2.1, 1.4, 0.24, 0.5]
    kl = [0.6, 1.1, 0.9, 2.4, 3.1, 4.0, 5.2, 6.3, 7.7, 7.1]
    return [{"step": s, "grad_norm": float(grad[s]), "success_rate": success[s], "entropy": entropy[s],
             "kl_k3": kl[s], MISMATCH_KL: {0: 0.0012, 8: 0.001}.get(s), "response_tokens_mean": 40.0 + 3 * s}
            for s in range(10)]


def test_the_shipped_guard_misses_the_pilot_and_a_gradient_norm_limit_catches_it():
    shipped = replay_guard(pilot_rows(), GuardConfig())
    assert shipped.tripped_step is None and shipped.reason == "" and shipped.steps == tuple(range(10))
    assert set(shipped.bad) == {"entropy", "kl"} and not any(shipped.bad["entropy"])
    assert shipped.bad["kl"] == (False, None, None, None, None, None, None, None, False, None)

    replay = replay_guard(pilot_rows(), GuardConfig(grad_norm_max=100))
    assert isinstance(replay, GuardReplay) and replay.tripped_step == 5  # 2910, 1850, 3620: steps 3-5 (674 alone)
    assert replay.bad["grad_norm"] == (False, True, False, True, True, True, True, True, True, True)
    assert replay.reason == "collapse guard tripped at step 5: grad_norm 3620 > 100 for 3 consecutive readings"


def test_the_other_signals_on_the_pilot():
    drop = replay_guard(pilot_rows(), GuardConfig(success_drop=0.5))
    assert drop.bad["success"][:2] == (None, None) and drop.tripped_step == 7  # means 0.07, 0.04, 0.02 < 0.095
    assert drop.bad["success"][2:] == (False, False, False, True, True, True, True, True)
    cut = replay_guard(pilot_rows(), GuardConfig(length_cut_max=0.9))
    assert cut.tripped_step is None and cut.bad["length_cut"] == (None,) * 10  # not in these rows: not measured
    cuts = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0]
    rows = [r | {"length_cut_frac": c} for r, c in zip(pilot_rows(), cuts)]
    assert replay_guard(rows, GuardConfig(length_cut_max=0.9, patience=2)).tripped_step == 6  # 1.0 from step 5


def test_a_replay_leaves_out_the_rows_without_an_update_as_the_loop_does():
    rows = pilot_rows()
    skipped = {"step": 2, "success_rate": 0.0, "update_skipped": 1.0, "grad_norm": 9999.0}
    replay = replay_guard([*rows[:2], skipped, *rows[3:]], GuardConfig(grad_norm_max=100))
    # Without step 2's healthy norm (48), 674 at step 1 starts the streak that 2910 and 1850 extend.
    assert replay.steps == (0, 1, *range(3, 10)) and replay.tripped_step == 4
    nan = replay_guard([{"step": 0, "grad_norm": math.nan}], GuardConfig(grad_norm_max=1, patience=1))
    assert nan.tripped_step == 0 and nan.bad == {"entropy": (None,), "kl": (None,), "grad_norm": (True,)}


def test_a_run_stops_on_a_new_signal_and_its_replay_trips_at_the_same_step(tmp_path):
    import json

    from test_train import tiny_config  # registers its env, parity-test

    from agentrl.recipes.train import train
    from agentrl.training.step import TrainingError

    cfg = tiny_config(tmp_path, **{"guard.enabled": True, "guard.grad_norm_max": 1e-9, "guard.patience": 2,
                                   "steps": 4})
    with pytest.raises(TrainingError, match=r"collapse guard stopped the run at step (\d+): .*grad_norm") as stopped:
        train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= row["length_cut_frac"] <= 1 for row in rows)  # every step logs the length-cut share
    replay = replay_guard(rows, cfg.guard)
    assert replay.tripped_step == int(re.search(r"at step (\d+)", str(stopped.value)).group(1))
    assert replay.reason in str(stopped.value)
