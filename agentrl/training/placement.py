"""Where trainer workers and inference engines run: one Ray placement group, checked before anything starts.

Layouts:

* split (default): trainers and engines get devices of their own. Bundles: N x ``{CPU: 1, GPU: gpus_per_trainer}``
  for the trainers, then E x ``{CPU: 1, GPU: gpus_per_engine}`` for the engines. Training and generation can overlap
  (async rollouts).
* colocated (``--colocate``): every engine shares a trainer's GPU; the engine sleeps (frees its KV cache) while the
  trainers train, the trainers' weights stay resident. Bundles: N x ``{CPU: 1, GPU: 1}``; trainer r and engine r
  each take half of bundle r's GPU, so Ray places them on the same device. Needs one GPU per trainer and per engine,
  and no more engines than trainers.
* CPU (``gpus_per_trainer = 0``): each trainer worker reserves one logical CPU; engines stay in the driver.

Nodes (``trainer.ray_resource``, ``engine.ray_resource``): a role may be pinned to the nodes that offer a Ray custom
resource (``ray start --resources '{"NAME": 1}'``); each of its workers asks `RESOURCE_SHARE` of it, so one unit hosts
up to 100 of them. Env runners are spread over every node (Ray's SPREAD strategy) and follow no resource.

The plan is checked against the cluster's resources first, so "more workers than devices" (or a resource no node
offers) is one message naming the numbers, not a placement group that waits forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.cluster import ClusterError

if TYPE_CHECKING:
    from agentrl.config import EngineConfig, TrainerConfig

__all__ = ["PlacementPlan", "Placement", "RESOURCE_SHARE", "check_node_resources", "reserve_placement"]

PLACEMENT_TIMEOUT_S = 120.0
"""How long to wait for Ray to reserve the bundles before giving up with a message."""
RESOURCE_SHARE = 0.01
"""How much of its role's custom resource each trainer worker or engine asks for."""


def check_node_resources(wanted: dict[str, str], resources: dict[str, float]) -> None:
    """Raise `ClusterError` when a custom resource a role asks for is offered by no node of the cluster.

    Args:
        wanted: resource name -> the setting that names it (``trainer.ray_resource``); empty names are skipped.
        resources: the cluster's resources (``ray.cluster_resources()``).
    """
    for name, setting in wanted.items():
        flag = "--" + setting.replace("_", "-")
        if name and resources.get(name, 0.0) < RESOURCE_SHARE:
            raise ClusterError(f"no node of the Ray cluster offers the resource {name!r} that {flag} asks for: start "
                               f"one with `ray start --address ... --resources '{{\"{name}\": 1}}'`, or pass "
                               f"{flag} '' to place them anywhere")


@dataclass(frozen=True)
class PlacementPlan:
    """What to place.

    Attributes:
        trainers: trainer workers (FSDP ranks).
        gpus_per_trainer: GPUs each trainer owns (0 = train on CPU).
        engines: inference engines placed through Ray (0 = the engine runs in the driver).
        gpus_per_engine: GPUs each engine owns (its tensor-parallel size).
        colocate: engines share the trainers' GPUs instead of owning their own.
        trainer_resource: the Ray custom resource every trainer bundle asks `RESOURCE_SHARE` of (empty: none).
        engine_resource: likewise for every engine bundle.
    """

    trainers: int
    gpus_per_trainer: float = 0.0
    engines: int = 0
    gpus_per_engine: float = 0.0
    colocate: bool = False
    trainer_resource: str = ""
    engine_resource: str = ""

    def __post_init__(self) -> None:
        if self.colocate and (self.gpus_per_trainer != 1 or self.engines > self.trainers
                              or (self.engines and self.gpus_per_engine != 1)):
            raise ClusterError("--colocate shares one GPU between trainer r and engine r: it needs "
                               "--gpus-per-trainer 1, --gpus-per-engine 1 and no more engines than trainers "
                               f"(got {self.gpus_per_trainer}, {self.gpus_per_engine}, {self.engines} engines for "
                               f"{self.trainers} trainers)")

    def describe(self) -> str:
        """The reservation in words, for the run plan."""
        parts = [f"{self.trainers} trainer worker(s) x {self.gpus_per_trainer:g} GPU"] if self.trainers else []
        if self.engines:
            parts.append(f"{self.engines} engine(s) " + ("sharing the trainers' GPUs" if self.colocate
                                                         else f"x {self.gpus_per_engine:g} GPU"))
        return ", ".join(parts)

    @property
    def gpus(self) -> float:
        """GPUs the plan needs in all."""
        if self.colocate:
            return float(self.trainers)
        return self.trainers * self.gpus_per_trainer + self.engines * self.gpus_per_engine

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles: trainers first, then (split layout) engines."""
        pin = {self.trainer_resource: RESOURCE_SHARE} if self.trainer_resource else {}
        if self.colocate:
            return [{"CPU": 1.0, "GPU": 1.0} | pin for _ in range(self.trainers)]
        trainer = {"CPU": 1.0} | ({"GPU": self.gpus_per_trainer} if self.gpus_per_trainer else {}) | pin
        engine = ({"CPU": 1.0} | ({"GPU": self.gpus_per_engine} if self.gpus_per_engine else {})
                  | ({self.engine_resource: RESOURCE_SHARE} if self.engine_resource else {}))
        return [dict(trainer) for _ in range(self.trainers)] + [dict(engine) for _ in range(self.engines)]

    def check_fits(self, resources: dict[str, float]) -> None:
        """Raise `ClusterError` when the cluster's `resources` (``ray.cluster_resources()``) cannot hold the plan."""
        check_node_resources({self.trainer_resource: "trainer.ray_resource"} if self.trainers else {}, resources)
        check_node_resources({self.engine_resource: "engine.ray_resource"} if self.engines else {}, resources)
        gpus, cpus = resources.get("GPU", 0.0), resources.get("CPU", 0.0)
        if self.gpus > gpus:
            raise ClusterError(
                f"more workers than devices: {self.trainers} trainer(s) x {self.gpus_per_trainer} GPU"
                + (f" + {self.engines} engine(s) x {self.gpus_per_engine} GPU" if self.engines else "")
                + f" need {self.gpus:g} GPUs, and the Ray cluster has {gpus:g}. Lower --trainers / --engines or "
                  "the GPUs per worker, or join a bigger cluster with --ray-address")
        need_cpus = len(self.bundles())
        if need_cpus > cpus:
            raise ClusterError(
                f"more workers than devices: {need_cpus} worker(s) need a CPU each and the Ray cluster has {cpus:g}. "
                "Lower --trainers, or join a bigger cluster with --ray-address")


class Placement:
    """The reserved placement group of a `PlacementPlan` (Ray must be running).

    Raises:
        ClusterError: the cluster cannot hold the plan, or Ray could not reserve it in time.
    """

    def __init__(self, plan: PlacementPlan):
        import ray
        from ray.util.placement_group import placement_group

        self.plan = plan
        plan.check_fits(ray.cluster_resources())
        self.group = placement_group(plan.bundles(), strategy="PACK")
        ready, _ = ray.wait([self.group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            ray.util.remove_placement_group(self.group)
            raise ClusterError(f"Ray could not reserve {plan.bundles()} within {PLACEMENT_TIMEOUT_S:.0f}s: other jobs "
                               f"hold the resources (see `ray status`)")

    def _options(self, bundle: int, num_cpus: float, num_gpus: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return dict(num_cpus=num_cpus, num_gpus=num_gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.group, placement_group_bundle_index=bundle))

    def trainer_options(self, rank: int) -> dict[str, Any]:
        """`ray.remote(...).options(**...)` for trainer worker `rank`."""
        gpus = 0.5 if self.plan.colocate else self.plan.gpus_per_trainer
        return self._options(rank, 0.5 if self.plan.colocate else 1.0, gpus)

    def engine_options(self, index: int) -> dict[str, Any]:
        """`ray.remote(...).options(**...)` for inference engine `index` (its bundle, or its trainer's one)."""
        if self.plan.colocate:
            return self._options(index, 0.5, 0.5)
        return self._options(self.plan.trainers + index, 1.0, self.plan.gpus_per_engine)

    def close(self) -> None:
        """Release the reserved resources."""
        import ray

        if ray.is_initialized():
            ray.util.remove_placement_group(self.group)


def reserve_placement(trainer: TrainerConfig, engine: EngineConfig | None = None) -> Placement | None:
    """Reserve the trainer workers' and GPU engines' devices (None for neither); refuses what the cluster cannot hold.

    Engines enter the placement group when they own GPUs (``engine.gpus``) or share the trainers' ones
    (``engine.colocate``); CPU engines are not scheduled by CPU count, so env runners still fit beside them (an
    ``engine.ray_resource`` they ask for is checked here all the same).
    """
    engines = engine.replicas if engine is not None and (engine.gpus > 0 or engine.colocate) else 0
    if engine is not None and engine.ray_resource and not engines:
        import ray

        check_node_resources({engine.ray_resource: "engine.ray_resource"}, ray.cluster_resources())
    if trainer.workers == 0 and engines == 0:
        return None
    return Placement(PlacementPlan(trainer.workers, trainer.gpus_per_worker, engines,
                                   engine.gpus if engine is not None else 0.0,
                                   engine.colocate if engine is not None else False,
                                   trainer_resource=trainer.ray_resource,
                                   engine_resource=engine.ray_resource if engine is not None else ""))
