"""A KV cache of fixed-shape slots that grows in buckets (worker thread only).

Each layer holds one key and one value tensor ``[slots, kv_heads, capacity, head_dim]``
(``tokens_first``: ``[slots, capacity, kv_heads, head_dim]``, the packed layout of
flash attention's variable-length kernel); the row decoded in batch position ``i`` lives in
slot ``i``. A decode step writes one position
per row in place (no concatenation), and its attention reads ``capacity`` positions masked
to each row's length. Shapes change only when the arena grows: the slot count in batch
buckets, the capacity in multiples of ``block`` tokens with some headroom, so a run of
decode steps sees one shape (what CUDA graphs need). It is never sized to the model's
maximum context, only to the rows it holds. ``generation`` changes whenever the storage is
replaced; anything holding pointers into it (a captured graph) must be dropped then.
"""

from __future__ import annotations

import torch

BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 20, 24, 28, 32)


def batch_bucket(n: int) -> int:
    """The smallest bucket holding ``n`` rows (multiples of 8 past the table)."""
    for size in BATCH_BUCKETS:
        if n <= size:
            return size
    return -(-n // 8) * 8


class KVArena:
    """Per-layer key/value slots; see the module docstring."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        block: int,
        tokens_first: bool = False,
    ) -> None:
        if block < 1:
            raise ValueError("block must be >= 1")
        self._shape = (layers, kv_heads, head_dim)
        self._dtype = dtype
        self._device = device
        self._block = block
        self.tokens_first = tokens_first
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.capacity = 0
        self.generation = 0

    def _span(self, slot: int | slice, n: int) -> tuple[int | slice, ...]:
        """Index of the first ``n`` positions of ``slot``."""
        if self.tokens_first:
            return (slot, slice(0, n))
        return (slot, slice(None), slice(0, n))

    def _target_capacity(self, length: int, horizon: int | None) -> int:
        """``length`` plus 1/8 headroom, but no more than ``horizon`` (the longest any row
        can become), in whole blocks."""
        target = length + length // 8
        if horizon is not None:
            target = max(length, min(target, horizon))
        return -(-target // self._block) * self._block

    def bytes_for(self, rows: int, length: int, grown: bool = True) -> int:
        """Bytes of an arena for ``rows`` rows of ``length`` positions: grown from the
        present one (``ensure``), or sized afresh (``fit``, with no row held)."""
        layers, heads, dim = self._shape
        slots = batch_bucket(rows)
        capacity = -(-length // self._block) * self._block
        if grown:
            slots, capacity = max(self.slots, slots), max(self.capacity, capacity)
        itemsize = torch.empty((), dtype=self._dtype).element_size()
        return 2 * layers * slots * capacity * heads * dim * itemsize

    def ensure(self, rows: int, length: int, horizon: int | None = None) -> bool:
        """Make room for ``rows`` slots of ``length`` positions; True when storage moved.

        Grows layer by layer (old and new tensors of one layer coexist, not of all layers),
        keeping every slot's contents.
        """
        if rows <= self.slots and length <= self.capacity:
            return False
        slots = max(self.slots, batch_bucket(rows))
        capacity = max(self.capacity, self._target_capacity(length, horizon))
        self._reallocate(slots, capacity, keep=True)
        return True

    def fit(self, rows: int, length: int, horizon: int | None = None) -> None:
        """With no row held: size the arena for ``rows`` x ``length`` (shrinking a much
        larger one, so an idle engine does not keep the largest batch's memory)."""
        slots = batch_bucket(rows)
        # the headroom is kept even past ``horizon`` when the arena is small: the next
        # batch's prompts are usually a little longer, and a new storage costs new graphs
        capacity = self._target_capacity(length, horizon if rows > 8 else None)
        fits = self.slots >= slots and self.capacity >= length
        if fits and self.slots * self.capacity <= 2 * slots * capacity:
            return
        self._reallocate(slots, capacity, keep=False)

    def _reallocate(self, slots: int, capacity: int, keep: bool) -> None:
        layers, heads, dim = self._shape
        old_slots, old_cap = self.slots, self.capacity
        for store in (self.keys, self.values):
            for layer in range(layers):
                shape = (
                    (slots, capacity, heads, dim)
                    if self.tokens_first
                    else (slots, heads, capacity, dim)
                )
                fresh = torch.zeros(shape, dtype=self._dtype, device=self._device)
                if keep and layer < len(store):
                    span = self._span(slice(0, min(slots, old_slots)), min(capacity, old_cap))
                    fresh[span] = store[layer][span]
                if layer < len(store):
                    store[layer] = fresh
                else:
                    store.append(fresh)
        self.slots, self.capacity = slots, capacity
        self.generation += 1

    def write(self, slot: int, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store a row's first ``n`` positions from ``[kv_heads, n, head_dim]`` tensors."""
        span = self._span(slot, keys.shape[1])
        if self.tokens_first:
            keys, values = keys.transpose(0, 1), values.transpose(0, 1)
        self.keys[layer][span] = keys
        self.values[layer][span] = values

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions into slot ``dst``."""
        for store in (self.keys, self.values):
            for tensor in store:
                tensor[self._span(dst, length)] = tensor[self._span(src, length)]

    def release(self) -> None:
        """Free all storage."""
        self.keys, self.values = [], []
        self.slots = self.capacity = 0
        self.generation += 1
