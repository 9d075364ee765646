"""One rollout protocol: both drivers are `RolloutDriver`s, member by member, and the train loop uses nothing else."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import agentrl
from agentrl.rollout.agents import AgentRollout
from agentrl.rollout.driver import RolloutDriver
from agentrl.rollout.scheduler import RolloutScheduler

ROOT = Path(agentrl.__file__).resolve().parent
DRIVERS = [RolloutScheduler, AgentRollout]


def _members() -> dict[str, object]:
    """The protocol's own members, by name (methods and properties; typing's bookkeeping left out)."""
    return {name: value for name, value in vars(RolloutDriver).items() if not name.startswith("_")}


def _shape(member: object) -> tuple[str, inspect.Signature]:
    """What a member is and its signature (annotations are strings under ``from __future__ import annotations``)."""
    if isinstance(member, property):
        return "property", inspect.signature(member.fget)
    return "method", inspect.signature(member)


def test_the_protocol_names_what_the_loop_needs():
    assert sorted(_members()) == ["close", "rollout", "stale_groups_evicted", "updated"]


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda d: d.__name__)
def test_each_driver_has_every_member_with_the_protocol_signature(driver):
    """A drifted driver fails here: a member renamed, turned from property to method, or given other parameters."""
    for name, member in _members().items():
        assert name in dir(driver), f"{driver.__name__} lacks {name}"
        assert _shape(inspect.getattr_static(driver, name)) == _shape(member), f"{driver.__name__}.{name} drifted"


def test_the_train_loop_uses_only_the_protocol():
    """`recipes/train.py` reaches the driver as ``run.scheduler``; every attribute it reads there is a member."""
    used = set()
    for node in ast.walk(ast.parse((ROOT / "recipes" / "train.py").read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "scheduler"
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "run"):
            used.add(node.attr)
    assert used and used <= set(_members()), used - set(_members())


def test_the_scheduler_is_a_driver_at_run_time(qwen3_tokenizer):
    from test_pool_async import _scheduler

    sched, _ = _scheduler(qwen3_tokenizer)
    try:
        assert isinstance(sched, RolloutDriver)
        assert len(sched.rollout(0).trajectories) == 4
        sched.updated(0)
        assert sched.stale_groups_evicted == sched.buffer.evicted == 0
    finally:
        sched.close()
