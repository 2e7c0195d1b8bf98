"""Seeded inference faults for an in-process engine: stalls and restarts, as a remote inference
server shows them (the chaos bench, ``bench/experiments/chaos.py``).

``FaultyEngine`` wraps any engine with AReaL's ``agenerate``: a stalled call answers
``stall_s`` late (time lost, the answer intact); a restarted call fails with
``InferenceRestarted`` before anything is generated (what a client sees when the server it
talks to restarts mid-request: the episode is rejected as an infrastructure failure and never
trained on). Every other attribute is the wrapped engine's. Decisions come from one
``random.Random`` seeded with ``seed``: the n-th call always gets the same fate.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class InferenceRestarted(ConnectionResetError):
    """The inference server restarted while the request was in flight."""


class EngineFaults(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = 0
    stall_share: float = Field(0.0, ge=0.0, le=1.0)
    stall_s: float = Field(0.0, ge=0.0)
    restart_share: float = Field(0.0, ge=0.0, le=1.0)


@dataclass(slots=True)
class EngineFaultCounts:
    """Monotonic counters of what was injected (readers take differences)."""

    calls: int = 0
    stalls: int = 0
    restarts: int = 0
    stalled_s: float = 0.0


@dataclass(slots=True)
class FaultyEngine:
    engine: Any
    faults: EngineFaults
    counts: EngineFaultCounts = field(default_factory=EngineFaultCounts)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.faults.seed}:engine")

    async def agenerate(self, request: Any) -> Any:
        self.counts.calls += 1
        stall, restart = self._rng.random(), self._rng.random()
        if restart < self.faults.restart_share:
            self.counts.restarts += 1
            raise InferenceRestarted("injected fault: the inference server restarted")
        if stall < self.faults.stall_share and self.faults.stall_s > 0:
            self.counts.stalls += 1
            self.counts.stalled_s += self.faults.stall_s
            await asyncio.sleep(self.faults.stall_s)
        return await self.engine.agenerate(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
