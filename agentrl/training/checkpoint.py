"""Checkpoints: what `out/checkpoint/` holds, written atomically, read back for an exact resume.

Layout (one folder, replaced atomically: written as ``checkpoint.tmp`` then renamed)::

    checkpoint/
      model.safetensors, config.json        the full weights in Hugging Face format: `from_pretrained` loads them
      tokenizer files, generation_config.json, agentrl_model.json (chat family, base model)
      trainer_state.json                    step, backend, world size, data-order and torch RNG states, curriculum
      optimizer.pt                          single-process backend: the AdamW state
      shards/                               FSDP backend: model + AdamW state, one file per rank
                                            (torch.distributed.checkpoint; loads at any worker count)

Exact resume: the weights, the optimizer state, the step, the mini-batch shuffle generator, the torch RNG and the
curriculum's state all come back, and every rollout seed is a function of the step and that state, so step s+1 after a
resume is the step s+1 the run would have taken. On a cluster the run folder must be on storage every trainer node
sees (each rank writes its own shard).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT", "TrainerState", "save_checkpoint", "read_trainer_state", "checkpoint_folder",
           "save_safetensors"]

CHECKPOINT = "checkpoint"
"""The checkpoint folder's name inside a run folder."""
STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class TrainerState:
    """Where the run stands, beside the weights.

    Attributes:
        step: the last step whose update the checkpoint holds.
        backend: ``single`` or ``fsdp`` (which optimizer-state layout the folder holds).
        world_size: trainer workers that wrote it.
        shuffle_rng: the mini-batch shuffle generator's state (`torch.Generator.get_state`) as a list of bytes.
        torch_rng: the driver's global torch RNG state, likewise.
        curriculum: the task-sampling curriculum's state that step ``step + 1`` starts from
            (`agentrl.curriculum.Curriculum.state_dict`, JSON values); None without one (agent rollouts, and
            checkpoints from before curricula).
    """

    step: int
    backend: str = "single"
    world_size: int = 1
    shuffle_rng: tuple[int, ...] = ()
    torch_rng: tuple[int, ...] = ()
    curriculum: Mapping[str, Any] | None = None

    @staticmethod
    def capture(step: int, backend: str, world_size: int, shuffle: torch.Generator,
                curriculum: Mapping[str, Any] | None = None) -> TrainerState:
        """The state after `step`, with the current RNG states (and the curriculum's, when the run has one)."""
        return TrainerState(step, backend, world_size, tuple(shuffle.get_state().tolist()),
                            tuple(torch.get_rng_state().tolist()), curriculum)

    def restore_rng(self, shuffle: torch.Generator) -> None:
        """Put the saved RNG states back (checkpoints from before they were saved keep the current ones)."""
        if self.shuffle_rng:
            shuffle.set_state(torch.tensor(self.shuffle_rng, dtype=torch.uint8))
        if self.torch_rng:
            torch.set_rng_state(torch.tensor(self.torch_rng, dtype=torch.uint8))


def checkpoint_folder(out: Path) -> Path:
    """The checkpoint folder of run folder `out`."""
    return out / CHECKPOINT


def read_trainer_state(folder: Path) -> TrainerState:
    """The `TrainerState` saved in checkpoint `folder`.

    Raises:
        FileNotFoundError: no trainer_state.json there.
    """
    data = json.loads((folder / STATE_FILE).read_text())
    return TrainerState(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def save_checkpoint(out: Path, backend, policy, state: TrainerState) -> Path:
    """Write the backend's weights and optimizer state, the tokenizer and `state` to `out/checkpoint`, atomically.

    Args:
        out: the run folder.
        backend: the `TrainingBackend` (writes the model and its optimizer state).
        policy: the driver's `LoadedModel` (tokenizer, generation config, chat family, base model name).
        state: the trainer state to save beside them.

    Returns:
        The checkpoint folder.

    Raises:
        TrainingError: the checkpoint could not be written (a full disk, say): the message names the free space, and
            the partial folder is removed so the previous checkpoint stays the one a resume reads.
    """
    final = checkpoint_folder(out)
    tmp = out / (CHECKPOINT + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a crash mid-save leaves a partial tmp: never mix it with new files
    try:
        tmp.mkdir(parents=True)
        backend.save(tmp)
        policy.tokenizer.save_pretrained(tmp)
        (tmp / "generation_config.json").write_text(json.dumps(policy.generation_config, indent=1))
        (tmp / "agentrl_model.json").write_text(json.dumps({"family": policy.family, "base_model": policy.name}))
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state)))
    except Exception as e:  # a full disk surfaces from safetensors, torch.save or a worker, each in its own type
        from agentrl.training.step import TrainingError

        shutil.rmtree(tmp, ignore_errors=True)
        free_gib = shutil.disk_usage(out).free / 2**30
        kept = "the previous checkpoint is intact" if final.exists() else "no earlier checkpoint exists"
        raise TrainingError(f"could not write the checkpoint to {tmp}: {e} ({free_gib:.1f} GiB free there); {kept}. "
                            "Free disk space (a checkpoint holds the weights and the optimizer state), then resume "
                            f"with `agentrl run --resume {out}` or start again") from e
    if final.exists():
        old = out / (CHECKPOINT + ".old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    return final


def save_safetensors(state: dict[str, torch.Tensor], folder: Path) -> None:
    """Write a full state dict as an HF `model.safetensors` (tied tensors once, contiguous)."""
    from safetensors.torch import save_file

    seen: dict[int, str] = {}
    tensors = {}
    for name, tensor in state.items():
        key = tensor.untyped_storage().data_ptr()
        if key in seen and tensor.data_ptr() == state[seen[key]].data_ptr():
            continue  # a tied weight (lm_head = embed_tokens): HF restores the tie from the config
        seen[key] = name
        tensors[name] = tensor.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
