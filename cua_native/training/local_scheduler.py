"""``PatientLocalScheduler``: AReaL's ``LocalScheduler`` made safe for shared, loaded machines.

Three changes, nothing else of AReaL's scheduler is altered:

- a forked worker (the eval rollout, colocated with the rollout) gets ``FORK_READY_TIMEOUT_S``
  to import torch and AReaL and answer, not AReaL's 60 s;
- worker ports are not drawn from the run's seed. AReaL picks them with the global ``random``,
  which ``PPOTrainer`` seeds with ``config.seed`` just before: two runs of one seed started
  together on one machine chose the same ports, and a port stays unbound until its worker has
  imported torch and AReaL, so the second run's check found it free. Ports come from fresh
  entropy here and the run's random stream is left as it was;
- a forked worker's port is picked here too. AReaL asks the parent worker's guard
  (``/alloc_ports``), which draws it from *that* process's ``random``, seeded by ``/configure``
  with ``config.seed``: every run of one seed forked its eval rollout on the same port (16224
  for seed 1), and the second run's readiness check could reach the first run's worker. All
  workers of a local scheduler share one node, so the scheduler may pick the port itself
  (AReaL does this for every non-forked worker).
"""

from __future__ import annotations

import random
from types import TracebackType
from typing import Any

from areal.infra import LocalScheduler

FORK_READY_TIMEOUT_S = 600.0
"""Seconds a forked worker gets to answer its readiness check (AReaL's default is 60 s; a
loaded laptop or CI machine needs longer)."""

ALLOC_PORTS_ROUTE = "/alloc_ports"


class _Allocation:
    """An answer to a guard's ``/alloc_ports``, in the shape AReaL's scheduler reads it."""

    status = 200

    def __init__(self, host: str, ports: list[int]) -> None:
        self._body = {"status": "success", "ports": ports, "host": host}

    async def json(self) -> dict[str, Any]:
        return self._body

    async def text(self) -> str:
        return str(self._body)

    async def __aenter__(self) -> _Allocation:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class _LocalPortSession:
    """The scheduler's HTTP session, except that ``/alloc_ports`` is answered by the scheduler's
    own port picker instead of the parent worker's seeded one."""

    def __init__(self, inner: Any, host: str, scheduler: PatientLocalScheduler) -> None:
        self._inner = inner
        self._host = host
        self._scheduler = scheduler

    def post(self, url: str, **kwargs: Any) -> Any:
        if url.endswith(ALLOC_PORTS_ROUTE):
            count = int(kwargs.get("json", {}).get("count", 1))
            return _Allocation(self._host, self._scheduler._allocate_ports(count))
        return self._inner.post(url, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class PatientLocalScheduler(LocalScheduler):
    """AReaL's local scheduler with patient forks and ports that do not follow the run's seed
    (see the module docstring)."""

    @staticmethod
    async def _wait_for_fork_ready(
        session: Any, host: str, port: int, timeout: float = FORK_READY_TIMEOUT_S  # noqa: ASYNC109
    ) -> bool:
        ready: bool = await LocalScheduler._wait_for_fork_ready(
            session, host, port, timeout=max(timeout, FORK_READY_TIMEOUT_S)
        )
        return ready

    def _allocate_ports(self, count: int) -> list[int]:
        state = random.getstate()
        random.seed()  # from os.urandom
        try:
            ports: list[int] = super()._allocate_ports(count)
            return ports
        finally:
            random.setstate(state)

    async def _fork_single_worker(
        self,
        session: Any,
        role: str,
        idx: int,
        target_wi: Any,
        target_role: str,
        command: str | None = None,
    ) -> Any:
        local = _LocalPortSession(session, target_wi.worker.ip, self)
        return await super()._fork_single_worker(local, role, idx, target_wi, target_role, command)


def patient_local_scheduler(config: Any) -> PatientLocalScheduler:
    """The scheduler ``CUAPPOTrainer`` runs a local (single-node) job on."""
    return PatientLocalScheduler(exp_config=config, startup_timeout=FORK_READY_TIMEOUT_S)
