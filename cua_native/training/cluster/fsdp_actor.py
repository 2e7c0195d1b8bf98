"""AReaL's FSDP PPO actor, packing rows without flash-attn and encoding each screenshot once.

AReaL packs several sequences into one micro-batch and relies on flash attention's varlen path
(``cu_seqlens``) to keep them apart. With plain ``sdpa`` (a GPU without flash-attn, or CPU) the
packed rows would attend across the boundary (up to 0.13 nats off on the tiny model).
``CUAFSDPPPOActor`` therefore:

- under ``sdpa`` switches the model to ``training.packing.PACKED_SDPA``, which reads the same
  ``cu_seq_lens_q`` AReaL passes for flash attention and runs PyTorch's SDPA causally on each
  packed sequence alone; AReaL's own splitter then packs rows by tokens (``mb_spec``) as it
  does under flash attention. The sequence starts move to the host once per micro-batch, so
  the per-layer split costs no device synchronisation;
- under any other non-varlen implementation (``eager``) asks AReaL's splitter for one sequence
  per micro-batch and gives the model no packing keywords (``checks.packs_sequences``);
- on a vision model wraps ``get_image_features`` (``training.packing.share_screenshots``) so
  that the screenshots a micro-batch's rows repeat (per-turn rows carry the episode's history
  screenshots; a GRPO group starts from one screen) go through the vision tower once, and the
  tower never sees the text's packing keywords (transformers 5.17 hands them on, and its
  attention then split the patches by the TEXT lengths). The same holds for the no-grad
  recompute of log-probs, which runs the same forward.

Log-probs and gradients equal one-row-at-a-time in fp32 within 1e-5
(``tests/training/test_packing.py``). With AReaL's default ``mb_spec`` (no token cap) a
minibatch is one micro-batch, so every shared screenshot is encoded once per minibatch; with
``max_tokens_per_mb`` set, AReaL's balancer may put an episode's rows in different
micro-batches, and each of those encodes its own copy.

Rows whose screenshots arrive compact (``rollout.pixel_palette``: uint8 indices into a
palette, what the cluster workflow sends across AReaL's process boundary) get their
``pixel_values`` back, bit for bit, before anything else reads the batch.

The class attributes ``pack_rows`` and ``vision_once`` exist for comparisons
(``bench/gpu/train_step_pack.py``); the trainer uses the class as it is. It runs in AReaL's
actor worker: ``CUAPPOTrainer`` names it as the actor's engine class.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
from areal.api.cli_args import MicroBatchSpec
from areal.engine import FSDPPPOActor
from areal.utils.data import DEFAULT_MAX_TOKENS_PER_MB, MicroBatchList

from cua_native.rollout.pixel_palette import expand
from cua_native.training.cluster.checks import packs_sequences
from cua_native.training.packing import (
    PACKING_KWARGS,
    allocate_groups,
    row_groups,
    share_screenshots,
    use_packed_attention,
)

HOST_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k")
"""Packing keywords ``PACKED_SDPA`` reads on the host (one copy per micro-batch)."""


class CUAFSDPPPOActor(FSDPPPOActor):
    """``FSDPPPOActor`` that packs rows under ``sdpa`` too and encodes each screenshot once."""

    pack_rows: ClassVar[bool] = True
    """Pack several rows per micro-batch under ``sdpa`` (``PACKED_SDPA``)."""
    vision_once: ClassVar[bool] = True
    """Encode each distinct image of a micro-batch once."""

    def _packed_sdpa(self) -> bool:
        return self.pack_rows and self.config.attn_impl == "sdpa"

    def _packs(self) -> bool:
        return packs_sequences(self.config.attn_impl) or self._packed_sdpa()

    def _create_device_model(self) -> None:
        super()._create_device_model()
        if self.is_vision_model:
            share_screenshots(self.model, dedupe=self.vision_once)
        if self._packed_sdpa():
            use_packed_attention(self.model)

    def _prepare_mb_inputs(self, mb_item: Any) -> tuple[dict[str, Any], Any]:
        inputs, ctx = super()._prepare_mb_inputs(mb_item)
        if self._packed_sdpa():
            inputs = dict(inputs)
            for key in HOST_KWARGS:
                if key in inputs:
                    inputs[key] = inputs[key].cpu()
        elif not packs_sequences(self.config.attn_impl):
            inputs = {k: v for k, v in inputs.items() if k not in PACKING_KWARGS}
        return inputs, ctx

    def _prepare_mb_list(self, input_: dict[str, Any]) -> Any:
        if input_.get("multi_modal_input"):  # screenshots sent compact (``pixel_palette``)
            input_ = input_ | {
                "multi_modal_input": [expand(e) for e in input_["multi_modal_input"]]
            }
        rows = int(input_["attention_mask"].shape[0])
        if not self._packs():
            return self._areal_mb_list(
                input_, MicroBatchSpec.new(self.config.mb_spec, n_mbs=rows, n_mbs_divisor=1)
            )
        if not (self.vision_once and self.is_vision_model and input_.get("multi_modal_input")):
            return super()._prepare_mb_list(input_)
        return self._grouped_mb_list(input_)

    def _areal_mb_list(self, input_: dict[str, Any], spec: MicroBatchSpec) -> Any:
        """AReaL's ``_prepare_mb_list`` under ``spec`` instead of the configured one."""
        configured = self.config.mb_spec
        self.config.mb_spec = spec
        try:
            return super()._prepare_mb_list(input_)
        finally:
            self.config.mb_spec = configured

    def _grouped_mb_list(self, input_: dict[str, Any]) -> Any:
        """Micro-batches that keep rows sharing a screenshot together (``allocate_groups``
        under the configured ``max_tokens_per_mb`` and ``n_mbs``, the count agreed across data
        parallel ranks as AReaL's splitter agrees it and rounded up to ``n_mbs_divisor``), each built by AReaL's own
        ``_prepare_mb_list`` (packing, padding, 3-D positions) and merged into one list."""
        spec = self.config.mb_spec
        lengths = [int(n) for n in input_["attention_mask"].sum(-1).tolist()]
        groups = row_groups(input_["multi_modal_input"])
        cap = spec.max_tokens_per_mb or DEFAULT_MAX_TOKENS_PER_MB
        divisor = max(1, spec.n_mbs_divisor or 1)
        count = len(allocate_groups(lengths, groups, cap, max(1, spec.n_mbs or 1)))
        if dist.is_initialized() and dist.get_world_size(self.data_parallel_group) > 1:
            counts: list[Any] = [None] * dist.get_world_size(self.data_parallel_group)
            dist.all_gather_object(counts, count, group=self.data_parallel_group)
            count = max(counts)
        bins = allocate_groups(lengths, groups, cap, -(-count // divisor) * divisor)
        whole = MicroBatchSpec.new(
            spec,
            n_mbs=1,
            n_mbs_divisor=1,
            granularity=1,
            max_tokens_per_mb=DEFAULT_MAX_TOKENS_PER_MB,
        )
        parts = [(b, self._areal_mb_list(_select_rows(input_, b), whole)) for b in bins]
        forward = [b[i] for b, part in parts for i in part.forward_indices]
        backward = [0] * len(forward)
        for position, row in enumerate(forward):
            backward[row] = position
        data = {k: v for k, v in input_.items() if k != "multi_modal_input"}
        return MicroBatchList(
            data=data,
            mb_spec=spec,
            mbs=[mb for _, part in parts for mb in part.mbs],
            group_lens=[n for _, part in parts for n in part.group_lens],
            forward_indices=forward,
            backward_indices=backward,
            padded_mbs=[mb for _, part in parts for mb in part.padded_mbs],
            padding_lengths=[n for _, part in parts for n in part.padding_lengths],
            padded_to_lengths=[n for _, part in parts for n in part.padded_to_lengths],
        )


def _select_rows(batch: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    """The padded batch's ``rows`` (tensors with a row dimension, per-row lists)."""
    size = int(batch["attention_mask"].shape[0])
    index = torch.tensor(rows, dtype=torch.long)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == size:
            out[key] = value[index.to(value.device)]
        elif isinstance(value, list) and len(value) == size:
            out[key] = [value[r] for r in rows]
        else:
            out[key] = value
    return out
