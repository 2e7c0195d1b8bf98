"""``PatientLocalScheduler``: AReaL's ``LocalScheduler`` made safe for shared, loaded machines.

Three changes, nothing else of AReaL's scheduler is altered:

- a forked worker (the eval rollout, colocated with the rollout) gets ``FORK_READY_TIMEOUT_S``
  to import torch and AReaL and answer, not AReaL's 60 s;
- worker ports are not drawn from the run's seed. AReaL picks them with the global ``random``,
  which ``PPOTrainer`` seeds with ``config.seed`` just before: two runs of one seed started
  together on one machine chose the same ports, and a port stays unbound until its worker has
  imported torch and AReaL, so the second run's check found it free. Ports come from the OS's
  entropy here (a private ``SystemRandom``); the process-wide ``random`` is not touched;
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
from areal.infra.scheduler.exceptions import PortAllocationError
from areal.utils.network import is_port_free

FORK_READY_TIMEOUT_S = 600.0
"""Seconds a forked worker gets to answer its readiness check (AReaL's default is 60 s; a
loaded laptop or CI machine needs longer)."""

ALLOC_PORTS_ROUTE = "/alloc_ports"
PORT_RANGE = (10000, 32767)
"""AReaL's ``find_free_ports`` range: below the OS's ephemeral ports (32768–60999 on Linux)."""
PORT_ATTEMPTS_PER_PORT = 10


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._port_picker = random.SystemRandom()
        super().__init__(*args, **kwargs)

    @staticmethod
    async def _wait_for_fork_ready(
        session: Any,
        host: str,
        port: int,
        timeout: float = FORK_READY_TIMEOUT_S,  # noqa: ASYNC109
    ) -> bool:
        ready: bool = await LocalScheduler._wait_for_fork_ready(
            session, host, port, timeout=max(timeout, FORK_READY_TIMEOUT_S)
        )
        return ready

    def _allocate_ports(self, count: int) -> list[int]:
        """``count`` free ports of AReaL's range, drawn from the OS's entropy (a private
        ``SystemRandom``: the process-wide ``random`` is neither read nor reseeded, so no other
        thread's draws or seeding are disturbed), never one this scheduler already gave out."""
        low, high = PORT_RANGE
        ports: list[int] = []
        tried: set[int] = set()
        for _ in range(count * PORT_ATTEMPTS_PER_PORT):
            if len(ports) == count:
                break
            port = self._port_picker.randint(low, high)
            if port in tried or port in self._allocated_ports:
                continue
            tried.add(port)
            if is_port_free(port):
                ports.append(port)
        if len(ports) < count:
            raise PortAllocationError(
                f"found {len(ports)} of {count} free ports in {low}-{high} after {len(tried)} tries"
            )
        self._allocated_ports.update(ports)
        return sorted(ports)

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
