"""`BatchedRequests`: the request interface (`submit` / `poll`) over an engine that only samples whole batches.

Every `poll` samples everything submitted since the previous one in as few `generate` calls as there are distinct
sampling settings (a per-turn token budget makes requests differ), so a driver that submits each waiting episode's
turn and then polls gets the lockstep behaviour of one batch per round. Requests that differ only in their seed share
a batch: the batch is seeded with its first request's seed (the HF engine draws a whole batch from one generator).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from agentrl.engine.base import EngineRequest, EngineResult, InferenceEngine, NamedTensors

__all__ = ["BatchedRequests"]


class BatchedRequests:
    """A `RequestEngine` over an `InferenceEngine`: each `poll` generates every pending request.

    Args:
        engine: samples batches (`generate`) and owns its weights (`update_weights`).
    """

    def __init__(self, engine: InferenceEngine):
        self.engine = engine
        self._pending: list[EngineRequest] = []
        # The async rollout producer polls while the trainer thread updates the weights: never both at once.
        self._lock = threading.Lock()

    @property
    def policy_version(self) -> int:
        """The wrapped engine's version (setting it tags the wrapped engine's weights, as engine actors do)."""
        return int(self.engine.policy_version)

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.engine.policy_version = int(version)

    def submit(self, request: EngineRequest) -> None:
        """Queue `request` for the next `poll`."""
        self._pending.append(request)

    def poll(self, timeout: float | None = None) -> list[EngineResult]:
        """Generate every pending request now (`timeout` is moot: the work happens inside this call)."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        by_settings: dict[Any, list[EngineRequest]] = {}
        for req in pending:
            by_settings.setdefault(dataclasses.replace(req.params, seed=None), []).append(req)
        out: list[EngineResult] = []
        with self._lock:
            version = self.policy_version
            for members in by_settings.values():
                gens = self.engine.generate([r.prompt for r in members], members[0].params)
                out += [EngineResult(r.id, g, version) for r, g in zip(members, gens)]
        return out

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """The wrapped engine's `update_weights`, never during a `poll`."""
        with self._lock:
            self.engine.update_weights(named_tensors, version)

    def metrics(self) -> dict[str, float]:
        """The wrapped engine's metrics."""
        return self.engine.metrics()

    def clear_cache(self) -> None:
        """Drop the prefixes the wrapped engine keeps between calls (HFEngine), never during a `poll`."""
        with self._lock:
            self.engine.clear_cache()

    def sleep(self) -> None:
        """Drop what the wrapped engine keeps between calls (its prefixes are already dropped after each rollout)."""
        self.clear_cache()

    def wake_up(self) -> None:
        """Nothing to restore: the wrapped engine's weights never left."""

    def close(self) -> None:
        """Nothing to release: the wrapped engine lives in this process."""

