"""One decode step of a Qwen3-family text stack over a ``KVArena``, eager or as CUDA graphs.

The step runs the model's own modules (embedding, norms, projections, rotary embedding, MLP,
output head) and its own ``apply_rotary_pos_emb``; only the cache write and the attention
over the arena are done here: the new key/value of each row go to position ``write[i]`` of
its slot, then attention over the first ``write[i] + 1`` positions of the slot, one of:

* ``flash`` (CUDA, bf16/fp16): PyTorch's flash-attention variable-length kernel
  (``aten._flash_attention_forward`` with ``seqused_k``) over the tokens-first arena: it
  reads only each row's used positions, grouped-query heads natively;
* ``matmul`` (any device and dtype): two batched matmuls over the slot's ``capacity``
  positions with the unused ones masked (grouped-query heads share their key/value head
  through a reshape, no copy); softmax in float32 as in transformers' eager attention.

Supported: text stacks whose layers are ``q/k/v/o_proj`` (+ optional ``q_norm``/``k_norm``)
attention with full (non-sliding) attention, ``input_layernorm``/``post_attention_layernorm``
and an ``mlp`` module: ``qwen3`` and ``qwen3_vl_text``. ``unsupported_reason`` says why
another model is not, and the engine then keeps its concatenating decoder.

``DecodeGraphs`` captures the step once per batch bucket and replays it. Graphs hold
pointers to the weights and the arena: weight updates copy in place (``weights.copy_into``),
so graphs stay valid across them; a new arena storage (``KVArena.generation``) drops them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from cua_native.engine.kv_arena import KVArena

SUPPORTED_TEXT_MODELS = ("qwen3", "qwen3_vl_text")
ATTENTION_KINDS = ("auto", "flash", "matmul")


def pick_attention(kind: str, device: torch.device, dtype: torch.dtype) -> str:
    """Resolve ``auto``: ``flash`` on CUDA in half precision where PyTorch has the kernel."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {kind!r}")
    flash_ok = (
        device.type == "cuda"
        and dtype in (torch.bfloat16, torch.float16)
        and hasattr(torch.ops.aten, "_flash_attention_forward")
    )
    if kind == "flash" and not flash_ok:
        raise ValueError("flash decode attention needs CUDA and bf16/fp16 weights")
    if kind == "auto":
        return "flash" if flash_ok else "matmul"
    return kind


def _text_model(model: PreTrainedModel) -> Any:
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", inner)


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """``None`` when ``TextStack`` can decode ``model``, else the reason it cannot."""
    text = _text_model(model)
    config = getattr(text, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TEXT_MODELS:
        return f"text model type {kind!r} is not one of {SUPPORTED_TEXT_MODELS}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        return f"layer types {sorted(set(types))}"
    rope = getattr(getattr(text, "rotary_emb", None), "rope_type", "default")
    if "dynamic" in str(rope) or "longrope" in str(rope):
        return f"rope type {rope!r} changes with the sequence length"
    module = sys.modules[type(text.layers[0].self_attn).__module__]
    if not callable(getattr(module, "apply_rotary_pos_emb", None)):
        return "no apply_rotary_pos_emb in the model's module"
    return None


def _rms_norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The Qwen RMSNorm module's function (float32 statistics, weight applied after the cast
    back) through PyTorch's one-kernel ``rms_norm``; other norm modules are called as is."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None or not type(module).__name__.endswith("RMSNorm"):
        out: torch.Tensor = module(x)
        return out
    normed = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    weight: torch.Tensor = module.weight  # type: ignore[assignment]  # nn.Module.__getattr__
    return weight * normed.to(x.dtype)


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Per-row inputs of one step, ``[batch]`` long tensors on the model's device."""

    tokens: torch.Tensor
    positions: torch.Tensor
    """Rotary position of the new token (all three M-RoPE planes are equal for text)."""
    write: torch.Tensor
    """Arena position the new key/value go to (= the row's length before the step)."""


class TextStack:
    """The decode step of one model; see the module docstring."""

    def __init__(self, model: PreTrainedModel, attention: str = "matmul") -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"fast decode unsupported: {reason}")
        self._text = _text_model(model)
        self._head = model.get_output_embeddings()
        self._mrope = getattr(getattr(model, "model", None), "get_rope_index", None) is not None
        first = self._text.layers[0].self_attn
        self._rope = sys.modules[type(first).__module__].apply_rotary_pos_emb
        config = self._text.config
        self.layers = len(self._text.layers)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(first.head_dim)
        self.attention = attention

    def forward(self, arena: KVArena, batch: int, inputs: StepInputs) -> torch.Tensor:
        """Logits ``[batch, vocab]`` of the next token; writes each row's new key/value."""
        text = self._text
        hidden = text.embed_tokens(inputs.tokens)[:, None, :]
        pos = inputs.positions.view(1, batch, 1)
        pos = pos.expand(3, batch, 1) if self._mrope else pos[0]
        cos, sin = text.rotary_emb(hidden, pos)
        rows = torch.arange(batch, device=hidden.device)
        attend = self._flash if self.attention == "flash" else self._matmul
        context = self._context(arena, batch, inputs, hidden.device)
        for index, layer in enumerate(text.layers):
            attn = layer.self_attn
            normed = _rms_norm(layer.input_layernorm, hidden)
            q = attn.q_proj(normed).view(batch, 1, self.heads, self.head_dim)
            k = attn.k_proj(normed).view(batch, 1, self.kv_heads, self.head_dim)
            v = attn.v_proj(normed).view(batch, 1, self.kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = _rms_norm(attn.q_norm, q), _rms_norm(attn.k_norm, k)
            q, k = self._rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            keys, values = arena.keys[index][:batch], arena.values[index][:batch]
            if arena.tokens_first:
                keys[rows, inputs.write] = k[:, :, 0]
                values[rows, inputs.write] = v[:, 0]
            else:
                keys[rows, :, inputs.write] = k[:, :, 0]
                values[rows, :, inputs.write] = v[:, 0]
            out = attend(q, keys, values, context, float(attn.scaling))
            hidden = hidden + attn.o_proj(out.reshape(batch, 1, self.heads * self.head_dim))
            hidden = hidden + layer.mlp(_rms_norm(layer.post_attention_layernorm, hidden))
        logits: torch.Tensor = self._head(_rms_norm(text.norm, hidden)[:, 0])
        return logits

    def _context(
        self, arena: KVArena, batch: int, inputs: StepInputs, device: torch.device
    ) -> tuple[torch.Tensor, ...]:
        """What every layer's attention shares: masks (matmul) or offsets (flash)."""
        lengths = inputs.write + 1
        if self.attention == "flash":
            starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
            return starts, starts * arena.capacity, lengths.to(torch.int32)
        valid = torch.arange(arena.capacity, device=device)[None, :] < lengths[:, None]
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=device)
        return (bias.masked_fill(~valid, float("-inf"))[:, None, None, :],)

    def _matmul(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        context: tuple[torch.Tensor, ...],
        scaling: float,
    ) -> torch.Tensor:
        (bias,) = context
        batch = q.shape[0]
        grouped = q.reshape(batch, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
        scores = torch.matmul(grouped, keys.transpose(-1, -2)).float() * scaling
        probs = torch.softmax(scores + bias, dim=-1).to(grouped.dtype)
        return torch.matmul(probs, values)

    def _flash(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        context: tuple[torch.Tensor, ...],
        scaling: float,
    ) -> torch.Tensor:
        cum_q, cum_k, used = context
        batch, capacity = keys.shape[0], keys.shape[1]
        out = torch.ops.aten._flash_attention_forward(
            q[:, :, 0].contiguous(),
            keys.reshape(batch * capacity, self.kv_heads, self.head_dim),
            values.reshape(batch * capacity, self.kv_heads, self.head_dim),
            cum_q,
            cum_k,
            1,
            capacity,
            0.0,
            False,
            False,
            scale=scaling,
            seqused_k=used,
        )[0]
        return out  # type: ignore[no-any-return]  # torch.ops are untyped


class DecodeGraphs:
    """CUDA graphs of ``TextStack.forward``, one per batch bucket, for one arena storage."""

    def __init__(self, step: Callable[[KVArena, int, StepInputs], torch.Tensor]) -> None:
        self._step = step
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, StepInputs, torch.Tensor]] = {}
        self._generation: int | None = None
        self._pool: Any = None
        self.captures = 0

    def run(self, arena: KVArena, batch: int, inputs: StepInputs) -> torch.Tensor:
        """Replay (capturing first if needed) the step for ``batch`` rows with ``inputs``.

        The returned logits live in the graph's memory: read them before the next call.
        """
        if arena.generation != self._generation:
            self.clear()  # their pool goes with them: a fresh one for the new storage
            self._generation = arena.generation
        entry = self._graphs.get(batch)
        if entry is None:
            # the warm-up runs these very inputs; the replay below repeats them (the same
            # keys/values land in the same positions), so running them twice is harmless
            entry = self._capture(arena, batch, inputs)
            self._graphs[batch] = entry
        graph, static, logits = entry
        static.tokens.copy_(inputs.tokens)
        static.positions.copy_(inputs.positions)
        static.write.copy_(inputs.write)
        graph.replay()
        return logits

    def _capture(
        self, arena: KVArena, batch: int, inputs: StepInputs
    ) -> tuple[torch.cuda.CUDAGraph, StepInputs, torch.Tensor]:
        static = StepInputs(inputs.tokens.clone(), inputs.positions.clone(), inputs.write.clone())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(arena, batch, static)  # warm-up: lazy initialisation off the graph
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = self._step(arena, batch, static)
        self._pool = graph.pool()
        self.captures += 1
        return graph, static, logits

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None
        self._generation = None
