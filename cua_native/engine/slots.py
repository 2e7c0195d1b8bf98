"""Continuous-batching decoder: rows in ``KVArena`` slots, one graph-replayed step for all.

Rows are prefilled (in groups, left-padded, through the model's own forward as before) and
their keys/values copied into their slots; every decode step then feeds one token per row
through ``TextStack`` (a CUDA graph per batch bucket on CUDA, eager elsewhere). Rows join
(``fill``) and leave (``retain``) between steps; leaving rows are replaced by the last rows
(one slot copy each), and ``retain`` returns the new order so the caller can follow it.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from cua_native.engine.batch import BatchDecoder, RowInput
from cua_native.engine.kv_arena import KVArena, batch_bucket
from cua_native.engine.text_step import DecodeGraphs, StepInputs, TextStack, pick_attention
from cua_native.engine.vision_cache import VisionCache


class SlotDecoder:
    """Holds the arena, each row's length and next rotary position (worker thread only)."""

    def __init__(
        self,
        model: PreTrainedModel,
        device: torch.device,
        pad_id: int,
        block: int,
        cuda_graphs: bool,
        attention: str = "auto",
        compiled: bool = False,
        vision_cache: VisionCache | None = None,
        kv_budget_bytes: int | None = None,
        stacked: bool = False,
    ) -> None:
        self._device = device
        dtype = model.get_output_embeddings().weight.dtype
        self.attention = pick_attention(attention, device, dtype)
        graphs = cuda_graphs and device.type == "cuda"
        # compiled elementwise kernels only inside graphs: eager, their guards would cost
        # more host time per step than the launches they save
        self._stack = TextStack(
            model, self.attention, compiled=compiled and graphs, stacked=stacked
        )
        self._prefiller = BatchDecoder(model, device, pad_id, vision_cache)
        self._arena = KVArena(
            self._stack.layers,
            self._stack.kv_heads,
            self._stack.head_dim,
            dtype,
            device,
            block,
            tokens_first=self.attention == "flash",
        )
        self._graphs = DecodeGraphs(self._stack.forward) if graphs else None
        if self._stack.ops.compiled:
            with torch.inference_mode():  # the mode the steps run in (a compile guard)
                self._stack.warm_up(device)
        self._lengths: list[int] = []
        self._next_pos: list[int] = []
        if kv_budget_bytes is None and device.type == "cuda":
            kv_budget_bytes = int(0.75 * torch.cuda.mem_get_info(device)[0])
        self.kv_budget_bytes = kv_budget_bytes
        """Most bytes the arena may take (``None``: no limit); see ``fits``."""

    @property
    def size(self) -> int:
        return len(self._lengths)

    @property
    def graph_captures(self) -> int:
        return 0 if self._graphs is None else self._graphs.captures

    def fits(self, rows: int, horizon: int) -> bool:
        """Whether an arena for ``rows`` rows of up to ``horizon`` positions (never less than
        it holds now) stays within the budget. Up to 8 rows the arena may add 1/8 headroom
        past the horizon (``KVArena.fit``), so that is counted too."""
        if self.kv_budget_bytes is None:
            return True
        length = horizon + (horizon // 8 if rows <= 8 else 0)
        needed = self._arena.bytes_for(rows, length, grown=any(self._lengths))
        return needed <= self.kv_budget_bytes

    def _pad_to(self, total: int) -> None:
        self._lengths += [0] * (total - len(self._lengths))
        self._next_pos += [0] * (total - len(self._next_pos))

    def fill(
        self, rows: list[RowInput], slots: list[int], total: int, need: int, horizon: int
    ) -> torch.Tensor:
        """Prefill ``rows`` into ``slots`` of a batch of ``total`` rows (rows not yet filled
        count as empty); returns their next-token logits. ``need``: the most positions any
        of the ``total`` rows holds after its next token; ``horizon``: the most any can
        ever hold (prompt + max_new_tokens), which bounds the arena's headroom."""
        logits = self._prefiller.prefill(rows)
        cache, next_pos = self._prefiller.cache, self._prefiller.next_positions
        idle = not any(self._lengths)
        self._pad_to(max(total, max(slots) + 1))
        need = max([need, *(len(r.ids) + 1 for r in rows), *(n + 1 for n in self._lengths)])
        if idle:
            self._arena.fit(self.size, need, horizon)
        else:
            self._arena.ensure(self.size, need, horizon)
        filled: list[tuple[torch.Tensor, torch.Tensor]] = []
        for cached in cache.layers:
            if cached.keys is None or cached.values is None:
                raise RuntimeError("prefill left a cache layer without keys or values")
            filled.append((cached.keys, cached.values))
        width = filled[0][0].shape[2]
        for i, (row, slot) in enumerate(zip(rows, slots, strict=True)):
            n = len(row.ids)
            for layer, (layer_keys, layer_values) in enumerate(filled):
                keys = layer_keys[i, :, width - n :]
                values = layer_values[i, :, width - n :]
                self._arena.write(slot, layer, keys, values)
            self._lengths[slot] = n
            self._next_pos[slot] = int(next_pos[i])
        self._prefiller.reset()
        return logits

    def step(self, tokens: list[int] | torch.Tensor, horizon: int | None = None) -> torch.Tensor:
        """Feed one token per row; next-token logits ``[rows, vocab]``.

        ``tokens``: host ints, or a ``[rows]`` long tensor already on the device (the
        previous step's sampled tokens, fed without the host reading them)."""
        n = self.size
        if len(tokens) != n or n == 0 or not all(self._lengths):
            raise ValueError(f"step needs {n} tokens, got {len(tokens)}")
        self._arena.ensure(n, max(self._lengths) + 1, horizon)
        batch = batch_bucket(n)
        pad = batch - n
        on_device = isinstance(tokens, torch.Tensor)
        host = torch.tensor(
            ([] if on_device else [list(tokens) + [0] * pad])
            + [self._next_pos + [0] * pad, self._lengths + [0] * pad],
            dtype=torch.long,
        )
        packed = host.pin_memory() if self._device.type == "cuda" else host
        moved = packed.to(self._device, non_blocking=True)
        if isinstance(tokens, torch.Tensor):
            tokens_t = torch.nn.functional.pad(tokens, (0, pad))
            positions_t, write_t = moved
        else:
            tokens_t, positions_t, write_t = moved
        inputs = StepInputs(tokens=tokens_t, positions=positions_t, write=write_t)
        if self._graphs is not None:
            logits = self._graphs.run(self._arena, batch, inputs)
        else:
            logits = self._stack.forward(self._arena, batch, inputs)
        self._lengths = [x + 1 for x in self._lengths]
        self._next_pos = [x + 1 for x in self._next_pos]
        return logits[:n]

    def weights_changed(self) -> None:
        """The model's weights were updated in place: refresh what the step keeps of them."""
        self._stack.weights_changed()

    def retain(self, keep: list[int], total: int) -> list[int]:
        """Keep rows ``keep`` (increasing indices) of a batch of ``total``; returns
        ``order``: the row now at position ``j`` was at ``order[j]``. Leavers' slots take
        the last rows (one slot copy each)."""
        self._pad_to(total)
        kept = set(keep)
        new_size = len(keep)
        holes = [i for i in range(new_size) if i not in kept]
        movers = [i for i in range(new_size, self.size) if i in kept]
        order = list(range(new_size))
        for hole, mover in zip(holes, movers, strict=True):
            if self._lengths[mover]:
                self._arena.move(mover, hole, self._lengths[mover])
            self._lengths[hole] = self._lengths[mover]
            self._next_pos[hole] = self._next_pos[mover]
            order[hole] = mover
        del self._lengths[new_size:], self._next_pos[new_size:]
        return order

    def reset(self) -> None:
        """Forget all rows (the arena's storage is kept for the next batch)."""
        self._lengths, self._next_pos = [], []
        self._prefiller.reset()
