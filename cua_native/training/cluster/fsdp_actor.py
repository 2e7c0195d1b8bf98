"""AReaL's FSDP PPO actor with one correction: packing only where attention separates sequences.

AReaL packs several sequences into one micro-batch and relies on flash attention's varlen path
(``cu_seqlens``) to keep them apart. With ``sdpa`` or ``eager`` (CPU, or a GPU without
flash-attn) the packed rows attend across the boundary and every row after the first gets wrong
log-probs (up to 0.13 nats off on the tiny model). ``CUAFSDPPPOActor`` therefore asks AReaL's
own splitter for as many micro-batches as there are sequences when ``actor.attn_impl`` is not
a varlen implementation (``checks.packs_sequences``), and gives the model no packing
arguments (``cu_seqlens``, ``cu_seq_lens_q``/``_k``, ``max_length_q``/``_k``): with one
sequence per micro-batch causal attention needs none, and newer transformers (5.17) hand them
on to Qwen3-VL's vision attention, which then splits the image patches by the TEXT lengths.
With flash attention it changes nothing.
It runs in AReaL's actor worker: ``CUAPPOTrainer`` names it as the actor's engine class.
"""

from __future__ import annotations

from typing import Any

from areal.api.cli_args import MicroBatchSpec
from areal.engine import FSDPPPOActor

from cua_native.training.cluster.checks import packs_sequences

PACKING_KWARGS = (
    "cu_seqlens",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
    "max_seqlen",
)


class CUAFSDPPPOActor(FSDPPPOActor):
    """``FSDPPPOActor`` that never packs two sequences together under non-varlen attention."""

    def _prepare_mb_inputs(self, mb_item: Any) -> tuple[dict[str, Any], Any]:
        inputs, ctx = super()._prepare_mb_inputs(mb_item)
        if not packs_sequences(self.config.attn_impl):
            inputs = {k: v for k, v in inputs.items() if k not in PACKING_KWARGS}
        return inputs, ctx

    def _prepare_mb_list(self, input_: dict[str, Any]) -> Any:
        if packs_sequences(self.config.attn_impl):
            return super()._prepare_mb_list(input_)
        rows = int(input_["attention_mask"].shape[0])
        spec = self.config.mb_spec
        self.config.mb_spec = MicroBatchSpec.new(spec, n_mbs=rows, n_mbs_divisor=1)
        try:
            return super()._prepare_mb_list(input_)
        finally:
            self.config.mb_spec = spec
