"""FSDP2 training backend: N Ray worker actors, each holding a shard of the model and of AdamW (``--trainers N``).

Each worker loads the model, wraps every decoder layer and then the root with `torch.distributed.fsdp.fully_shard`,
and joins one process group (gloo on CPU, NCCL on GPU). The driver keeps no weights: it sends each worker its share
of the micro-batches (data parallel; micro-batch i goes to rank i mod N) and gets numbers back.

Why the gradient equals the single-process one: every micro-batch's loss already divides by the whole mini-batch's
sequence / token counts (the `Objective`), so the single-process gradient is the SUM of the micro-batch gradients.
FSDP's reduce-scatter averages over ranks, so each rank multiplies its loss by the world size before the backward
(a divide factor of 1 would say the same, but gloo has no pre-multiplied sum). A rank with fewer
micro-batches than its peers runs zero-weighted forward + backward passes, because every FSDP forward and backward
is a collective that all ranks must join.

Placement: the workers live in one Ray placement group of N bundles of ``{CPU: 1, GPU: gpus_per_trainer}``
(`agentrl.training.placement`), so on GPUs each worker owns its devices; on CPU each worker reserves one logical
CPU. Mixed precision (`MixedPrecisionPolicy`: parameters in bf16 for compute, gradients reduced in fp32) and
gradient checkpointing are options.

A worker that dies (killed, OOM) fails its next call; the driver then raises `TrainerFailure` naming the worker,
kills the others (which may be blocked in a collective with the dead one), and the run ends with the last saved
checkpoint intact. Nothing waits on a dead worker: calls are collected with `ray.wait` and the first failure wins.

Departures from verl / SkyRL FSDP workers, on purpose: no CPU offload, no Ulysses sequence parallelism (packed
micro-batches travel to the workers with their layout: `agentrl.training.packing`), weights reach the engines through
the driver (`named_weights`) rather than a direct NCCL broadcast; every rank loads the full weights before sharding
(fine up to a few billion parameters; larger models want a meta-device init and a sharded load).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from agentrl.training.allocator import pin_mmap_threshold
from agentrl.training.backend import (
    LossResult,
    Objective,
    Scored,
    ScoreRequest,
    TrainerFailure,
    UpdateRequest,
)
from agentrl.training.checkpoint import save_safetensors

__all__ = ["WorkerSpec", "TrainerWorker", "FSDPBackend", "SHARDS_DIR"]

SHARDS_DIR = "shards"
"""The sharded (torch.distributed.checkpoint) model + optimizer state inside a checkpoint folder."""
UNSTEPPED_MARKER = "optimizer_unstepped"
"""A file in `SHARDS_DIR` saying the optimizer state there was saved before any update (a fill, not a state)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class WorkerSpec:
    """What every trainer worker builds (picklable: it travels to the actors).

    Attributes:
        model: a built-in name, or a local HF folder (a checkpoint when resuming).
        dtype: the dtype the weights are loaded and stored in.
        lr: AdamW learning rate.
        betas: AdamW betas.
        weight_decay: AdamW decoupled weight decay.
        param_dtype: FSDP compute dtype of the parameters (None = `dtype`).
        reduce_dtype: FSDP gradient reduce-scatter dtype (None = the parameters' dtype).
        gradient_checkpointing: recompute activations in the backward.
        use_gpu: train on the worker's GPU with NCCL (else CPU with gloo).
        seed: torch seed of every worker (random-init built-ins are then identical on every rank).
        collective_timeout_s: how long a collective may wait for a peer before the worker gives up.
        lora: LoRA settings (`agentrl.config.LoraConfig`): adapters are injected before sharding and only they train;
            None trains every weight.
        mmap_threshold_kb: pin the C library's mmap threshold in each worker (`agentrl.training.allocator`; 0 =
            leave it).
    """

    model: str
    dtype: str = "float32"
    lr: float = 2e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    gradient_checkpointing: bool = False
    use_gpu: bool = False
    seed: int = 0
    collective_timeout_s: float = 600.0
    lora: Any = None
    mmap_threshold_kb: int = 0


def _to_device(value: Any, device: torch.device) -> Any:
    """A frozen dataclass (or tensor) with every tensor moved to `device` (a no-op on the CPU)."""
    if device.type == "cpu":
        return value
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: _to_device(getattr(value, f.name), device)
                                             for f in dataclasses.fields(value)})
    return value


def _to_cpu(value: Any) -> Any:
    """A result with every tensor back on the CPU (results travel to the driver)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _to_cpu(getattr(value, f.name))
                                             for f in dataclasses.fields(value)})
    return value


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one (HF models name their class in `_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules); cannot shard it")
    return layers


def _route_logprobs_through_fsdp(model: torch.nn.Module) -> None:
    """Make `token_logprobs` a method FSDP hooks like `forward`.

    `token_logprobs` runs the backbone and reads the LM head's weight itself, never calling the root module's
    `forward`, which is where FSDP gathers the root's own parameters (embeddings, final norm, LM head) and sets up
    their gradient reduction. As a registered forward method it gets the same pre- and post-forward hooks.
    """
    from torch.distributed.fsdp import register_fsdp_forward_method

    from agentrl.training.logprobs import token_logprobs

    def agentrl_token_logprobs(self, mb, **kwargs):
        return token_logprobs(self, mb, **kwargs)

    model.agentrl_token_logprobs = types.MethodType(agentrl_token_logprobs, model)
    register_fsdp_forward_method(model, "agentrl_token_logprobs")


def _fsdp_logprobs(model: torch.nn.Module, mb, **kwargs):
    return model.agentrl_token_logprobs(mb, **kwargs)


class TrainerWorker:
    """One FSDP rank (a Ray actor). The driver calls every method on all ranks at once.

    Args:
        rank: this worker's rank.
        world_size: number of workers.
        spec: what to build.
    """

    def __init__(self, rank: int, world_size: int, spec: WorkerSpec):
        self.rank, self.world_size, self.spec = rank, world_size, spec
        self.model = None

    def pid(self) -> int:
        """The worker's process id (tests kill it)."""
        return os.getpid()

    def node(self) -> str:
        """The id of the Ray node this worker lives on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port, for rank 0 to host the process group."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, host: str, port: int) -> dict[str, Any]:
        """Join the process group, load and shard the model, build AdamW; returns facts the driver needs."""
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from agentrl.models import load_model
        from agentrl.training.single import MicroBatchPasses, build_optimizer, moe_router

        spec = self.spec
        pin_mmap_threshold(spec.mmap_threshold_kb * 1024)
        self.device = torch.device("cuda", 0) if spec.use_gpu else torch.device("cpu")  # Ray sets the visible GPU
        if spec.use_gpu:
            torch.cuda.set_device(self.device)
            if spec.param_dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
                raise RuntimeError(f"{torch.cuda.get_device_name()} has no native bfloat16: train with "
                                   f"--compute-dtype float32")
        dist.init_process_group("nccl" if spec.use_gpu else "gloo", init_method=f"tcp://{host}:{port}",
                                rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=spec.collective_timeout_s))
        torch.manual_seed(spec.seed)
        policy = load_model(spec.model, dtype=_DTYPES[spec.dtype])
        model = policy.model.to(self.device)
        # vLLM and other loaders pick the model class from config.json's `architectures`: name the HF class before
        # fully_shard swaps in its FSDP subclass.
        model.config.architectures = [type(model).__name__]
        if spec.lora is not None:  # before sharding: FSDP2 shards the adapters with their blocks, frozen base alike
            from agentrl.training.lora import add_lora

            add_lora(model, spec.lora)
        if spec.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        mp = MixedPrecisionPolicy(param_dtype=_DTYPES[spec.param_dtype] if spec.param_dtype else None,
                                  reduce_dtype=_DTYPES[spec.reduce_dtype] if spec.reduce_dtype else None)
        for layer in _decoder_layers(model):
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        model.train()
        self.model = model
        _route_logprobs_through_fsdp(model)
        self.router = moe_router(model)
        self.passes = MicroBatchPasses(model, self.router, logprobs=_fsdp_logprobs)
        self.optimizer = build_optimizer(model.parameters(), spec.lr, spec.betas, spec.weight_decay)
        return {"is_moe": self.router is not None,
                "parameters": sum(p.numel() for p in model.parameters())}  # this rank's shard

    def score(self, requests: Sequence[ScoreRequest], idle: Sequence[ScoreRequest]) -> list[Scored]:
        """The pi_old pass of this rank's micro-batches, then discarded passes over `idle` to match its peers."""
        out = [_to_cpu(self.passes.score(_to_device(r, self.device))) for r in requests]
        for r in idle:
            self.passes.score(_to_device(r, self.device))
        return out

    def accumulate(self, requests: Sequence[UpdateRequest], idle: Sequence[UpdateRequest],
                   objective: Objective) -> list[LossResult]:
        """Forward + backward of this rank's micro-batches, then zero-weighted ones to match its peers."""
        # FSDP averages gradients over ranks; the loss is multiplied by the world size so the result is their sum.
        out = [_to_cpu(self.passes.accumulate(_to_device(r, self.device), objective, scale=self.world_size))
               for r in requests]
        for r in idle:
            self.passes.idle_backward(_to_device(r, self.device))
        return out

    def step(self, grad_clip: float, lr: float | None = None) -> float:
        """Clip (global norm over all shards), AdamW step (at `lr` when given), zero the gradients.

        Returns the norm before clipping.
        """
        from agentrl.training.single import set_lr

        set_lr(self.optimizer, lr)
        norm = float("nan")
        if grad_clip > 0:
            total = torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
            norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        """All-gather the full weights (a collective); rank 0 returns them on the CPU, the others None."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        if self.spec.lora is not None:
            from agentrl.training.lora import merged_state, scalings

            return merged_state(state, scalings(self.model))
        return state

    def adapter_weights(self) -> dict[str, torch.Tensor] | None:
        """All-gather the adapter tensors alone (a collective); rank 0 returns them on the CPU, the others None."""
        from agentrl.training.lora import is_adapter_name

        out = {}
        for name, param in self.model.named_parameters():  # the same order on every rank: one gather each
            if is_adapter_name(name):
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                out[name] = full.detach().cpu()
        return out if self.rank == 0 else None

    def save(self, folder: str) -> None:
        """Sharded model + optimizer state into `folder/shards`; rank 0 also writes the HF-format model."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        unstepped = not self.optimizer.state
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(Path(folder) / SHARDS_DIR))
        if unstepped:  # get_state_dict fills an empty optimizer with a step of lr 0 (AdamW's count 1, zero moments):
            self.optimizer.state.clear()  # emptied again, the first real update is the one-process backend's
        marker = Path(folder) / SHARDS_DIR / UNSTEPPED_MARKER
        if self.rank == 0 and unstepped:  # and a resume from this checkpoint empties it too (`load`)
            marker.write_text("The optimizer had not stepped when this was saved: its state here is a fill.\n")
        elif self.rank == 0:  # a stepped save into a folder that held an unstepped one: its state is real now
            marker.unlink(missing_ok=True)
        lora = self.spec.lora
        full = self.full_weights() if lora is None or lora.save_merged else None
        adapter = self.adapter_weights() if lora is not None else None
        if self.rank == 0:
            if lora is not None:
                from agentrl.training.lora import save_adapter

                save_adapter(Path(folder), adapter, lora, self.spec.model)
            if full is not None:
                self.model.config.save_pretrained(folder)
                save_safetensors(full, Path(folder))

    def load(self, folder: str, weights_only: bool) -> None:
        """Restore the sharded state `save` wrote (any world size: DCP reshards on load)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        unstepped = not self.optimizer.state
        model_state, optim_state = get_state_dict(self.model, self.optimizer)  # fills an unstepped optimizer (`save`)
        state = {"model": model_state} if weights_only else {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(Path(folder) / SHARDS_DIR))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state.get("optim", {}))
        saved_unstepped = (Path(folder) / SHARDS_DIR / UNSTEPPED_MARKER).exists()
        if (weights_only and unstepped) or (not weights_only and saved_unstepped):
            self.optimizer.state.clear()  # no update yet (here, or before the save): the next one is the first

    def memory(self, probe: UpdateRequest | None = None) -> dict[str, float]:
        """Bytes this rank holds: parameter shards, optimizer state, the process RSS and peak RSS.

        With `probe`, also the gradient shards and the activations its forward keeps for the backward (every saved
        tensor that is not a weight, counted once per storage); the probe's gradient is thrown away. A collective:
        call it on every rank.
        """
        import resource

        import psutil

        def nbytes(t: torch.Tensor) -> int:
            t = t.to_local() if hasattr(t, "to_local") else t
            return t.numel() * t.element_size()

        activations = grads = 0
        if probe is not None:
            saved: dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                if not isinstance(t, torch.nn.Parameter):  # weights saved for backward are not activations
                    saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                self.passes.idle_backward(_to_device(probe, self.device))
            grads = sum(nbytes(p.grad) for p in self.model.parameters() if p.grad is not None)
            self.optimizer.zero_grad(set_to_none=True)
            activations = sum(saved.values())
        return {"params": sum(nbytes(p) for p in self.model.parameters()), "grads": grads,
                "optimizer": sum(nbytes(v) for s in self.optimizer.state.values() for v in s.values()
                                 if isinstance(v, torch.Tensor)),
                "activations": activations, "rss": psutil.Process().memory_info().rss,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def shutdown(self) -> None:
        """Leave the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class FSDPBackend:
    """The driver's handle on N FSDP trainer workers; implements `TrainingBackend`.

    Args:
        spec: what every worker builds.
        world_size: number of workers.
        placement: where they go (`agentrl.training.placement.Placement`).
    """

    name = "fsdp"
    trains_in_place = False

    def __init__(self, spec: WorkerSpec, world_size: int, placement):
        import ray

        self.world_size = world_size
        self.lora = spec.lora
        self._closed = False
        remote = ray.remote(TrainerWorker)
        self.workers = [remote.options(**placement.trainer_options(rank)).remote(rank, world_size, spec)
                        for rank in range(world_size)]
        host, port = self._call_one(0, "rendezvous")
        facts = self._call("setup", [(host, port)] * world_size)
        self.is_moe = bool(facts[0]["is_moe"])

    # -- calls -------------------------------------------------------------------------------------------------

    def _collect(self, refs: list, what: str) -> list:
        """Results of one call per worker, failing fast on the first dead or failing worker."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        index = {ref: rank for rank, ref in enumerate(refs)}
        pending, results = list(refs), {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=5.0)
            for ref in ready:
                rank = index[ref]
                try:
                    results[rank] = ray.get(ref)
                except RayActorError as e:
                    self.close()
                    raise TrainerFailure(f"trainer worker {rank} died during {what} "
                                         f"({str(e).splitlines()[0][:200]})", died=True) from None
                except RayTaskError as e:
                    # A survivor's collective breaks when its peer dies (gloo: "Connection closed by peer"), often
                    # before Ray reports the death: name the dead peer when there is one, so the run may restart.
                    dead = self._dead_peer(pending, index)
                    self.close()
                    if dead is not None:
                        raise TrainerFailure(f"trainer worker {dead[0]} died during {what} ({dead[1]})",
                                             died=True) from None
                    cause = e.cause if getattr(e, "cause", None) is not None else e
                    raise TrainerFailure(f"trainer worker {rank} failed during {what}: "
                                         f"{type(cause).__name__}: {str(cause).splitlines()[0][:300]}") from None
        return [results[r] for r in range(len(refs))]

    @staticmethod
    def _dead_peer(pending: list, index: dict, wait_s: float = 10.0) -> tuple[int, str] | None:
        """The rank and error of a call in `pending` whose worker died, waiting up to `wait_s` for Ray to say so."""
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + wait_s
        pending = list(pending)
        while pending and time.monotonic() < deadline:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                try:
                    ray.get(ref)
                except RayActorError as e:
                    return index[ref], str(e).splitlines()[0][:200]
                except Exception:  # another broken collective: not the cause
                    continue
        return None

    def _call(self, method: str, args_per_rank: Sequence[tuple]) -> list:
        if self._closed:
            raise TrainerFailure("the trainer workers were shut down after an earlier failure")
        refs = [getattr(w, method).remote(*args) for w, args in zip(self.workers, args_per_rank)]
        return self._collect(refs, method)

    def _call_one(self, rank: int, method: str, *args):
        return self._collect([getattr(self.workers[rank], method).remote(*args)], method)[0]

    def _shares(self, items: Sequence) -> list[list[int]]:
        """Indices of `items` per rank: round robin, so every rank gets a similar count."""
        return [list(range(rank, len(items), self.world_size)) for rank in range(self.world_size)]

    # -- TrainingBackend ---------------------------------------------------------------------------------------

    def score(self, requests: Sequence[ScoreRequest]) -> list[Scored]:
        """See `TrainingBackend.score`."""
        shares = self._shares(requests)
        most = max(len(s) for s in shares)
        # Every FSDP forward is a collective: a rank with fewer micro-batches repeats one, and drops its result.
        per_rank = self._call("score", [([requests[i] for i in s], [requests[0]] * (most - len(s))) for s in shares])
        out: list[Scored | None] = [None] * len(requests)
        for share, results in zip(shares, per_rank):
            for i, result in zip(share, results):
                out[i] = result
        return out

    def accumulate(self, requests: Sequence[UpdateRequest], objective: Objective) -> list[LossResult]:
        """See `TrainingBackend.accumulate`."""
        shares = self._shares(requests)
        most = max(len(s) for s in shares)
        args = [([requests[i] for i in s], [requests[0]] * (most - len(s)), objective) for s in shares]
        per_rank = self._call("accumulate", args)
        out: list[LossResult | None] = [None] * len(requests)
        for share, results in zip(shares, per_rank):
            for i, result in zip(share, results):
                out[i] = result
        return out

    def step(self, grad_clip: float, lr: float | None = None) -> float:
        """See `TrainingBackend.step` (every rank computes the same global norm)."""
        return self._call("step", [(grad_clip, lr)] * self.world_size)[0]

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """See `TrainingBackend.named_weights` (gathered on rank 0, sent through the Ray object store)."""
        yield from self._call("full_weights", [()] * self.world_size)[0].items()

    def adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """See `TrainingBackend.adapter_weights` (gathered on rank 0, sent through the Ray object store)."""
        yield from self._call("adapter_weights", [()] * self.world_size)[0].items()

    def save(self, folder: Path) -> None:
        """See `TrainingBackend.save`: `folder/shards` (every rank) and the HF-format model (rank 0)."""
        self._call("save", [(str(folder),)] * self.world_size)

    def load(self, folder: Path, *, weights_only: bool = False) -> None:
        """See `TrainingBackend.load`."""
        if not (folder / SHARDS_DIR).is_dir():
            raise FileNotFoundError(f"{folder} holds no {SHARDS_DIR}/ (it was not written with --trainers N >= 1)")
        self._call("load", [(str(folder), weights_only)] * self.world_size)

    def nodes(self) -> list[str]:
        """The Ray node id of each worker, by rank."""
        return self._call("node", [()] * self.world_size)

    def memory(self, probe: UpdateRequest | None = None) -> list[dict[str, float]]:
        """Per rank: see `TrainerWorker.memory` (`probe` measures the activations of one micro-batch)."""
        return self._call("memory", [(probe,)] * self.world_size)

    def close(self) -> None:
        """Kill the workers (a peer of a dead worker may be blocked in a collective: never wait for it)."""
        import ray

        if self._closed:
            return
        self._closed = True
        if not ray.is_initialized():
            return
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # already dead
                pass
