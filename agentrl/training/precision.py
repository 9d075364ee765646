"""Training precision: bfloat16 compute with float32 master weights, chosen once from what the hardware does natively.

A policy-gradient update is small: at a learning rate of 2e-5, AdamW moves a weight of 0.05 by about 1e-6, far
below bfloat16's spacing there (2**-13 ~ 1.2e-4), so bfloat16 weights would round most updates away. Mixed precision
keeps what accumulates in float32 and computes in bfloat16:

    master weights w (fp32) --cast once per optimizer step--> compute weights w16 (bf16)
    forward + backward on w16 (every matmul, attention, the LM head) -> g16 (bf16, per micro-batch)
    g (fp32) += g16, as soon as each g16 is produced              (micro-batches accumulate in fp32)
    AdamW(w, g) in fp32, state in fp32; then w16 <- w

The compute weights are the model's own parameters, so anything that runs the module (the HF engine sampling in the
driver, Routing Replay's hooks, LoRA layers, gradient checkpointing) runs in bfloat16 with no casts per op; the
masters live beside them and are what the optimizer steps, what checkpoints save and what the weight sync ships.
This is where autocast lost most of bfloat16's speed on a CPU (`docs/results.md`, the speed issue): it casts every
weight on every use, keeps the LM head and its gradient in float32, and accumulates float32 gradients per op.

`resolve_compute_dtype` picks the compute precision for ``trainer.compute_dtype: auto``: bfloat16 where the chip
multiplies bfloat16 natively (x86 CPUs with AVX512-BF16 or AMX, CUDA GPUs that report bf16 support), float32 elsewhere
(emulated bfloat16 is slower than float32). ``float32`` turns all of this off: the model trains exactly as before.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["ComputePrecision", "MasterWeights", "resolve_compute_dtype", "native_bf16", "dtype_bytes"]


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a floating dtype named as in the config (``float32``, ``bfloat16``)."""
    return torch.finfo(getattr(torch, dtype)).bits // 8

@dataclass(frozen=True)
class ComputePrecision:
    """The resolved compute precision of a run's trainer.

    Attributes:
        dtype: ``float32`` or ``bfloat16``: what the forward and backward compute in.
        why: the reason, for the run plan (the detected capability, or "set").
    """

    dtype: str
    why: str

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of `dtype`."""
        return getattr(torch, self.dtype)


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16(*, on_gpu: bool = False, cpu_flags: set[str] | None = None) -> tuple[bool, str]:
    """Whether the trainer's device multiplies bfloat16 natively, and what was found (for the run plan).

    Args:
        on_gpu: the trainer runs on CUDA GPUs (FSDP workers with ``--gpus-per-trainer``): bf16 there is native on
            every GPU since Ampere; the workers check `torch.cuda.is_bf16_supported` when they start.
        cpu_flags: the CPU's feature flags (default: read from /proc/cpuinfo; tests pass their own).
    """
    if on_gpu:
        return True, "CUDA GPU"
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    found = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if found:
        return True, f"CPU has {' and '.join(f.upper() for f in found)}"
    if platform.machine().lower() in ("aarch64", "arm64") and "bf16" in flags:
        return True, "ARM CPU has BF16"
    return False, "no native bfloat16 on this CPU (no AVX512_BF16 or AMX): emulated bf16 is slower than float32"


def resolve_compute_dtype(setting: str, master_dtype: str, *, on_gpu: bool = False,
                          cpu_flags: set[str] | None = None) -> ComputePrecision:
    """What ``trainer.compute_dtype`` means on this machine.

    Args:
        setting: ``auto``, ``float32`` or ``bfloat16`` (empty: float32, what an empty value meant before ``auto``).
        master_dtype: ``trainer.dtype``, the precision of the weights, gradients and AdamW state. A bfloat16 or
            float16 model computes in its own dtype: there is nothing to mix.
        on_gpu: see `native_bf16`.
        cpu_flags: see `native_bf16`.
    """
    if master_dtype != "float32":
        return ComputePrecision(master_dtype, f"trainer.dtype is {master_dtype}: weights compute in their own dtype")
    if setting in ("", "float32"):
        return ComputePrecision("float32", "set" if setting else "set (empty means float32)")
    if setting == "bfloat16":
        return ComputePrecision("bfloat16", "set; float32 master weights")
    native, found = native_bf16(on_gpu=on_gpu, cpu_flags=cpu_flags)
    if native:
        return ComputePrecision("bfloat16", f"auto: {found}; float32 master weights")
    return ComputePrecision("float32", f"auto: {found}")


class MasterWeights:
    """Float32 master copies of a module's parameters, which themselves become the compute-dtype copies.

    Built once, after anything that adds parameters (LoRA) and before the optimizer: the optimizer steps
    `parameters()`, the masters. Each compute parameter's gradient is added into its master's float32 ``.grad`` the
    moment autograd has accumulated it (a post-accumulate-grad hook), then dropped, so micro-batches accumulate in
    float32 and no bfloat16 gradient outlives its backward. After every optimizer step, `publish` copies the masters
    into the compute weights (one cast per step, not one per use).

    Frozen parameters (a LoRA base) keep float32 masters too: the merged weights a checkpoint or the weight sync
    ships are then exactly what float32 training would have shipped.

    Args:
        model: the module; its floating parameters are converted to `compute_dtype` in place (tied parameters stay
            tied: each distinct parameter has one master).
        compute_dtype: the dtype the module computes in (bfloat16).
    """

    def __init__(self, model: torch.nn.Module, compute_dtype: torch.dtype):
        self.model = model
        self.compute_dtype = compute_dtype
        self._pairs: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._master_of: dict[int, torch.Tensor] = {}
        for p in model.parameters():  # distinct parameters only: a tied embedding appears once
            if not p.is_floating_point():
                continue
            master = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)  # same dtype as before
            with torch.no_grad():
                p.data = p.data.to(compute_dtype)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._move_grad_to(master))
            self._pairs.append((p, master))
            self._master_of[id(p)] = master

    @staticmethod
    def _move_grad_to(master: torch.Tensor):
        def hook(p: torch.Tensor) -> None:
            if master.grad is None:
                master.grad = p.grad.to(master.dtype)
            else:
                master.grad.add_(p.grad)
            p.grad = None
        return hook

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The trainable masters (what the optimizer steps and gradient clipping measures)."""
        return (m for _, m in self._pairs if m.requires_grad)

    @torch.no_grad()
    def publish(self) -> None:
        """Copy every master into its compute weight (after each optimizer step or load)."""
        for p, master in self._pairs:
            p.copy_(master)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with each parameter replaced by its master (buffers as they are)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        state = self.model.state_dict()
        for name, tensor in params.items():
            master = self._master_of.get(id(tensor))
            if master is not None and name in state:
                state[name] = master.detach()
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True):
        """Load float32 values into the masters (by the module's parameter names), then `publish`.

        Returns the module's `load_state_dict` result (missing and unexpected keys), checked by the caller.
        """
        result = self.model.load_state_dict(state, strict=strict)  # validates names and shapes; casts into w16
        params = dict(self.model.named_parameters(remove_duplicate=False))
        for name, value in state.items():
            p = params.get(name)
            if p is not None and id(p) in self._master_of:
                self._master_of[id(p)].copy_(value)
        self.publish()
        return result
