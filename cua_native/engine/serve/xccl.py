"""The inference side of AReaL's NCCL ("xccl") weight updates, with ``torch.distributed``.

The trainer (rank 0) creates a process group with the servers (ranks ``rank_offset`` …) through
a TCP rendezvous, then broadcasts each parameter in the order of the names it announced over
HTTP. This side joins with AReaL's own ``init_custom_process_group`` (the function the trainer
and AReaL's vLLM worker extension use), receives into empty tensors of the announced dtype and
shape, and hands them to the engine. ``nccl`` needs CUDA tensors, so a CPU server answers it
with an error; ``gloo`` (what AReaL uses on CPU) works anywhere. Blocking: run on a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

JOIN_TIMEOUT = timedelta(minutes=10)


class WeightGroups:
    """Process groups this server joined, by name."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._groups: dict[str, tuple[dist.ProcessGroup, str]] = {}

    def tensor_device(self, backend: str) -> torch.device:
        """Where received tensors live: the model's GPU for NCCL, CPU for gloo."""
        if backend == "nccl":
            if self._device.type != "cuda":
                raise ValueError(
                    "backend 'nccl' needs CUDA: this server runs on "
                    f"{self._device.type} (start it with --device cuda, or use "
                    "weight_update_mode: disk)"
                )
            if self._device.index is None:  # NCCL and set_device need the device's index
                return torch.device("cuda", torch.cuda.current_device())
            return self._device
        if backend == "gloo":
            return torch.device("cpu")
        raise ValueError(f"backend {backend!r} is not supported (nccl or gloo)")

    def join(
        self,
        *,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        group_name: str,
    ) -> None:
        from areal.engine.core.distributed import init_custom_process_group

        device = self.tensor_device(backend)  # refuse an impossible backend before the rendezvous
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL binds this thread's communicator to it
        with self._lock:
            if group_name in self._groups:
                raise ValueError(f"weight update group {group_name!r} already exists")
        if not 0 < rank < world_size:
            raise ValueError(f"rank_offset {rank} must be in [1, world_size={world_size})")
        group = init_custom_process_group(
            backend=backend,
            init_method=f"tcp://{master_address}:{master_port}",
            world_size=world_size,
            rank=rank,
            group_name=group_name,
            timeout=JOIN_TIMEOUT,
        )
        with self._lock:
            self._groups[group_name] = (group, backend)

    def receive(
        self,
        group_name: str,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
    ) -> list[tuple[str, torch.Tensor]]:
        """Receive one broadcast from rank 0 per name, in order."""
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError("names, dtypes and shapes must have the same length")
        with self._lock:
            entry = self._groups.get(group_name)
        if entry is None:
            raise ValueError(
                f"weight update group {group_name!r} was never initialised "
                "(call /init_weights_update_group first)"
            )
        group, backend = entry
        device = self.tensor_device(backend)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        specs: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            torch_dtype = getattr(torch, str(dtype).removeprefix("torch."), None)
            if not isinstance(torch_dtype, torch.dtype):
                raise ValueError(f"unknown dtype {dtype!r} for {name!r}")
            specs.append((name, torch_dtype, tuple(int(s) for s in shape)))
        out: list[tuple[str, torch.Tensor]] = []
        for name, torch_dtype, shape in specs:  # all checked first: never stop mid-broadcast
            tensor = torch.empty(shape, dtype=torch_dtype, device=device)
            dist.broadcast(tensor, src=0, group=group)
            out.append((name, tensor))
        if device.type == "cuda":
            # NCCL fills the tensors on its own stream; the engine reads them on another thread
            torch.cuda.synchronize(device)
        return out
