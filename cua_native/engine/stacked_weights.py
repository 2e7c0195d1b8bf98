"""The decode step's input projections stacked: one matrix product where the model has several.

At batch 1 a decode step's matrix products read every weight once, and cuBLAS reads small
matrices far below the memory's speed (on an H200: a 4 MB key projection at 8 % of the copy
bandwidth, a 25 MB MLP projection at 61 %, a 50 MB stacked one at 75 %;
``bench/gpu/gemv_shapes.py``). Stacking each layer's query/key/value weights into one matrix
and its MLP's gate/up weights into another turns five products into two.

Contract: ``StackedLinear`` holds a copy of its sources' weights (and biases) stacked by
rows; ``__call__`` returns what each source would return, as views of one product's
output. The copy is refreshed by ``refresh`` (in place, so CUDA graphs that captured it stay
valid): the engine calls it after every weight update (``SlotDecoder.weights_changed``); the
model's weights change only through the engine's update calls. Each output element is the
same dot product as the source's own, computed by another kernel: equal up to the order of
the summation (float32: within 1e-5 of the model's forward, ``tests/engine``).
"""

from __future__ import annotations

import torch


class StackedLinear:
    """Several ``nn.Linear`` with the same input applied as one product."""

    def __init__(self, sources: list[torch.nn.Linear]) -> None:
        if len(sources) < 2:
            raise ValueError("stacking needs at least two projections")
        first = sources[0].weight
        if any(
            s.weight.shape[1] != first.shape[1]
            or s.weight.dtype != first.dtype
            or s.weight.device != first.device
            for s in sources
        ):
            raise ValueError("stacked projections need one input size, dtype and device")
        has_bias = [s.bias is not None for s in sources]
        if any(has_bias) and not all(has_bias):
            raise ValueError("stacked projections need a bias on all or none")
        self._sources = sources
        self.sizes = [int(s.weight.shape[0]) for s in sources]
        with torch.no_grad():
            self.weight = torch.cat([s.weight.detach() for s in sources])
            self.bias = (
                torch.cat([s.bias.detach() for s in sources if s.bias is not None])
                if all(has_bias)
                else None
            )

    @staticmethod
    def of(*sources: torch.nn.Module) -> StackedLinear | None:
        """A stack of ``sources`` if they can be stacked (plain ``nn.Linear`` layers of one
        input size), else ``None``."""
        if not all(type(s) is torch.nn.Linear for s in sources):
            return None
        linears = [s for s in sources if isinstance(s, torch.nn.Linear)]
        try:
            return StackedLinear(linears)
        except ValueError:
            return None

    def refresh(self) -> None:
        """Copy the sources' current weights (and biases) into the stack, in place."""
        with torch.no_grad():
            start = 0
            for source, size in zip(self._sources, self.sizes, strict=True):
                self.weight[start : start + size].copy_(source.weight)
                if self.bias is not None and source.bias is not None:
                    self.bias[start : start + size].copy_(source.bias)
                start += size

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each source's output, as views of one ``[..., sum(sizes)]`` product."""
        out = torch.nn.functional.linear(x, self.weight, self.bias)
        return tuple(out.split(self.sizes, dim=-1))
