"""A checkpoint that cannot be written (a full disk) stops the run with one clear message and keeps the last one."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import pytest

from agentrl.training.checkpoint import CHECKPOINT, TrainerState, save_checkpoint
from agentrl.training.step import TrainingError


class _Tokenizer:
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


class _Backend:
    """Writes a weights file, or fails the way a full disk does (after a partial write)."""

    def __init__(self, full: bool):
        self.full = full

    def save(self, folder):
        (folder / "model.safetensors").write_bytes(b"weights")
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")


def _policy():
    return SimpleNamespace(tokenizer=_Tokenizer(), generation_config={}, family="chatml", name="tiny")


def _state(step: int) -> TrainerState:
    return TrainerState(step=step)


def test_a_full_disk_names_the_problem_and_keeps_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, _Backend(full=False), _policy(), _state(4))
    with pytest.raises(TrainingError, match=r"No space left on device \(\d+\.\d GiB free there\); the previous "
                                            r"checkpoint is intact\. Free disk space") as info:
        save_checkpoint(tmp_path, _Backend(full=True), _policy(), _state(9))
    assert "agentrl run --resume" in str(info.value)
    assert not (tmp_path / (CHECKPOINT + ".tmp")).exists()  # no partial folder left behind
    assert '"step": 4' in (tmp_path / CHECKPOINT / "trainer_state.json").read_text()


def test_a_first_checkpoint_that_fails_says_there_is_none(tmp_path):
    with pytest.raises(TrainingError, match="no earlier checkpoint exists"):
        save_checkpoint(tmp_path, _Backend(full=True), _policy(), _state(0))
