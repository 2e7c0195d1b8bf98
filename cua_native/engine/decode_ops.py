"""The decode step's elementwise work as pure tensor functions, fused by ``torch.compile``.

Between a layer's matrix products a decode step has only small elementwise work: RMSNorm,
the query/key norms and rotary embedding, residual adds and the MLP's ``silu(gate) * up``.
Run op by op that is ~25 kernels per layer, each a few microseconds of launch and tail for
a few kilobytes of data. ``DecodeOps`` groups it into three functions per layer
(``add_norm``, ``qk_rope``, ``silu_mul``) plus ``norm`` for the first layer; on CUDA each is
compiled (inductor, static weights passed as arguments, so one compiled function serves
every layer and, after one recompile with a dynamic batch dimension, every batch bucket),
so each becomes one generated kernel that the decode step's CUDA graph then replays. The
matrix products and the attention stay the model's modules and PyTorch's kernels.

Each function is the model's own arithmetic (transformers' Qwen3 ``RMSNorm``: float32
statistics, ``weight * x.to(dtype)``; the model module's ``apply_rotary_pos_emb``; the MLP's
activation). Compiled, inductor may keep float32 intermediates that eager rounds to the
weights' dtype; ``emulate_precision_casts`` keeps eager's roundings, so bf16 results match
the eager step's, and fp32 results match to float32 rounding (the exactness tests hold).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Rope = Callable[..., tuple[torch.Tensor, torch.Tensor]]

COMPILE_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {
    "emulate_precision_casts": True
}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm: statistics in float32, the weight applied after the cast back.

    Traced for compiling: the module's own arithmetic (inductor fuses it). Eager: PyTorch's
    one-kernel ``rms_norm`` (the same function in float32; on CPU one call, not five).
    """
    dtype = x.dtype
    h = x.to(torch.float32)
    if not torch.compiler.is_compiling():
        return weight * torch.nn.functional.rms_norm(h, (h.shape[-1],), eps=eps).to(dtype)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_norm(
    hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next norm: ``(hidden + delta, rms_norm(hidden + delta))``."""
    hidden = hidden + delta
    return hidden, rms_norm(hidden, weight, eps)


def qk_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope: Rope,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head query/key norms and the rotary embedding of one token per row.

    ``q``/``k``: the projections ``[batch, heads * head_dim]``; ``cos``/``sin``:
    ``[batch, 1, head_dim]``. Returns contiguous ``[batch, heads, head_dim]`` and
    ``[batch, kv_heads, head_dim]``.
    """
    batch = q.shape[0]
    q = q.view(batch, heads, -1)
    k = k.view(batch, kv_heads, -1)
    if q_weight is not None and k_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    q, k = rope(q[:, :, None], k[:, :, None], cos, sin)
    return q[:, :, 0].contiguous(), k[:, :, 0].contiguous()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The Qwen3 MLP's ``silu(gate) * up``."""
    return torch.nn.functional.silu(gate) * up


class DecodeOps:
    """``norm``, ``add_norm``, ``qk_rope`` and ``silu_mul``: compiled or plain."""

    def __init__(self, compiled: bool) -> None:
        self.compiled = compiled
        wrap: Callable[[Any], Any] = (
            # not fullgraph: past dynamo's recompile limit (shared by every engine of the
            # process: each model, dtype and batch size class is an entry) a function
            # runs as plain PyTorch ops, still correct, instead of failing the step
            (lambda fn: torch.compile(fn, options=COMPILE_OPTIONS)) if compiled else (lambda fn: fn)
        )
        self.norm = wrap(rms_norm)
        self.add_norm = wrap(add_norm)
        self.qk_rope = wrap(qk_rope)
        self.silu_mul = wrap(silu_mul)
