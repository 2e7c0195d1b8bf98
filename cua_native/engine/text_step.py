"""One decode step of a Qwen3-family text stack over a ``KVArena``, eager or as CUDA graphs.

The step runs the model's own modules (embedding, projections, rotary embedding, output head)
and its own ``apply_rotary_pos_emb``; the elementwise work between the projections (norms,
residual adds, query/key norms + rotary, ``silu(gate) * up``) goes through ``DecodeOps``
(``decode_ops.py``: the same arithmetic, compiled into one kernel per group on CUDA); the
cache write and the attention over the arena are done here: the new key/value of each row
go to position ``write[i]`` of its slot (one ``index_copy_`` per tensor), then attention
over the first ``write[i] + 1`` positions of the slot, one of:

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

from cua_native.engine.decode_ops import DecodeOps
from cua_native.engine.kv_arena import KVArena
from cua_native.engine.stacked_weights import StackedLinear

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
    for layer in text.layers:
        for name in ("q_norm", "k_norm"):
            norm = getattr(layer.self_attn, name, None)
            if norm is not None and _norm_weight(norm) is None:
                return f"{name} is a {type(norm).__name__}, not an RMSNorm"
    if hasattr(text.layers[0].self_attn, "q_norm") != hasattr(text.layers[0].self_attn, "k_norm"):
        return "q_norm without k_norm"
    module = sys.modules[type(text.layers[0].self_attn).__module__]
    if not callable(getattr(module, "apply_rotary_pos_emb", None)):
        return "no apply_rotary_pos_emb in the model's module"
    return None


def _norm_weight(module: torch.nn.Module) -> tuple[torch.Tensor, float] | None:
    """A Qwen RMSNorm module's ``(weight, eps)``; ``None`` for other norm modules."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None or not type(module).__name__.endswith("RMSNorm"):
        return None
    weight = module.weight
    return (weight, float(eps)) if isinstance(weight, torch.Tensor) else None


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

    def __init__(
        self,
        model: PreTrainedModel,
        attention: str = "matmul",
        compiled: bool = False,
        stacked: bool = False,
    ) -> None:
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
        self.ops = DecodeOps(compiled)
        self._fused_mlp = getattr(config, "hidden_act", None) == "silu" and all(
            all(hasattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))
            for layer in self._text.layers
        )
        layers = self._text.layers
        self._qkv = [
            StackedLinear.of(a.q_proj, a.k_proj, a.v_proj) if stacked else None
            for a in (layer.self_attn for layer in layers)
        ]
        """Per layer, its query/key/value projections as one product (``stacked``)."""
        self._gate_up = [
            StackedLinear.of(layer.mlp.gate_proj, layer.mlp.up_proj)
            if stacked and self._fused_mlp
            else None
            for layer in layers
        ]
        """Per layer, its MLP's gate/up projections as one product (``stacked``)."""

    @property
    def stacked(self) -> bool:
        """Whether any layer's projections run stacked (``stacked_weights.py``)."""
        return any(s is not None for s in self._qkv + self._gate_up)

    def weights_changed(self) -> None:
        """The model's weights were updated: refresh the stacked copies (in place)."""
        for stack in self._qkv + self._gate_up:
            if stack is not None:
                stack.refresh()

    def _project_qkv(
        self, index: int, attn: Any, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        stack = self._qkv[index]
        if stack is None:
            return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q, k, v = stack(x)
        return q, k, v

    def warm_up(self, device: torch.device, batches: tuple[int, ...] = (1, 2, 4)) -> None:
        """Run ``ops`` on stand-in rows of ``batches`` sizes, with the step's layouts and
        the model's weights, so compiling happens here (a size of 1, then one dynamic
        batch size for all others) and not in the middle of a running batch."""
        text, first = self._text, self._text.layers[0]
        dtype = self._head.weight.dtype
        norm = _norm_weight(first.post_attention_layernorm)
        for batch in batches:
            hidden = text.embed_tokens(torch.zeros(batch, dtype=torch.long, device=device))
            pos = torch.zeros((1, batch, 1), dtype=torch.long, device=device)
            cos, sin = text.rotary_emb(
                hidden[:, None, :], pos.expand(3, batch, 1) if self._mrope else pos[0]
            )
            if norm is not None:  # distinct tensors: dynamo guards on arguments aliasing
                self.ops.norm(hidden, *norm)
                self.ops.add_norm(hidden, hidden.clone(), *norm)
            if self._qkv[0] is not None:  # the layouts the step passes: views of one product
                q, k, _ = self._project_qkv(0, first.self_attn, hidden)
            else:
                q = torch.zeros((batch, self.heads * self.head_dim), dtype=dtype, device=device)
                k = torch.zeros((batch, self.kv_heads * self.head_dim), dtype=dtype, device=device)
            self._qk_rope(first.self_attn, q, k, cos, sin)
            stack = self._gate_up[0]
            if stack is not None:
                self.ops.silu_mul(*stack(hidden))
            elif self._fused_mlp:
                gate = first.mlp.gate_proj(hidden)
                self.ops.silu_mul(gate, gate.clone())

    def _qk_rope(
        self,
        attn: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ops.qk_rope`` with ``attn``'s query/key norms (if it has them)."""
        q_norm = _norm_weight(attn.q_norm) if hasattr(attn, "q_norm") else None
        k_norm = _norm_weight(attn.k_norm) if hasattr(attn, "k_norm") else None
        pair: tuple[torch.Tensor, torch.Tensor] = self.ops.qk_rope(
            q,
            k,
            None if q_norm is None else q_norm[0],
            None if k_norm is None else k_norm[0],
            0.0 if q_norm is None else q_norm[1],
            cos,
            sin,
            self._rope,
            self.heads,
            self.kv_heads,
        )
        return pair

    def _normed(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        found = _norm_weight(module)
        normed: torch.Tensor = module(x) if found is None else self.ops.norm(x, *found)
        return normed

    def _add_normed(
        self, hidden: torch.Tensor, delta: torch.Tensor, module: torch.nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        found = _norm_weight(module)
        if found is None:
            hidden = hidden + delta
            normed: torch.Tensor = module(hidden)
            return hidden, normed
        pair: tuple[torch.Tensor, torch.Tensor] = self.ops.add_norm(hidden, delta, *found)
        return pair

    def _mlp(self, index: int, mlp: Any, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor
        stack = self._gate_up[index]
        if stack is not None:
            gate, up = stack(x)
            out = mlp.down_proj(self.ops.silu_mul(gate, up))
        elif not self._fused_mlp:
            out = mlp(x)
        else:
            out = mlp.down_proj(self.ops.silu_mul(mlp.gate_proj(x), mlp.up_proj(x)))
        return out

    def forward(self, arena: KVArena, batch: int, inputs: StepInputs) -> torch.Tensor:
        """Logits ``[batch, vocab]`` of the next token; writes each row's new key/value."""
        text = self._text
        hidden = text.embed_tokens(inputs.tokens)
        pos = inputs.positions.view(1, batch, 1)
        pos = pos.expand(3, batch, 1) if self._mrope else pos[0]
        cos, sin = text.rotary_emb(hidden[:, None, :], pos)
        attend = self._flash if self.attention == "flash" else self._matmul
        context, slots = self._context(arena, batch, inputs, hidden.device)
        layers = text.layers
        normed = self._normed(layers[0].input_layernorm, hidden)
        for index, layer in enumerate(layers):
            attn = layer.self_attn
            q_in, k_in, v_in = self._project_qkv(index, attn, normed)
            q, k = self._qk_rope(attn, q_in, k_in, cos, sin)
            v = v_in.view(batch, self.kv_heads, self.head_dim)
            keys, values = arena.keys[index][:batch], arena.values[index][:batch]
            self._write(keys, k, slots)
            self._write(values, v, slots)
            out = attend(q, keys, values, context, float(attn.scaling))
            delta = attn.o_proj(out.reshape(batch, self.heads * self.head_dim))
            hidden, normed = self._add_normed(hidden, delta, layer.post_attention_layernorm)
            following = layers[index + 1].input_layernorm if index + 1 < len(layers) else text.norm
            hidden, normed = self._add_normed(
                hidden, self._mlp(index, layer.mlp, normed), following
            )
        logits: torch.Tensor = self._head(normed)
        return logits

    def _write(self, store: torch.Tensor, new: torch.Tensor, slots: torch.Tensor) -> None:
        """Put each row's ``[heads, head_dim]`` at its flat position ``slots`` (one kernel)."""
        dim = store.shape[-1]
        store.view(-1, dim).index_copy_(0, slots, new.reshape(-1, dim))

    def _context(
        self, arena: KVArena, batch: int, inputs: StepInputs, device: torch.device
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """What every layer's attention shares: masks (matmul) or offsets (flash); and the
        flat ``[rows x heads]`` positions of ``head_dim`` vectors the new keys go to."""
        lengths = inputs.write + 1
        rows = torch.arange(batch, device=device)[:, None]
        heads = torch.arange(self.kv_heads, device=device)[None, :]
        write = inputs.write[:, None]
        cap = arena.capacity
        if arena.tokens_first:  # [slots, capacity, kv_heads, head_dim]
            slots = (rows * cap + write) * self.kv_heads + heads
        else:  # [slots, kv_heads, capacity, head_dim]
            slots = (rows * self.kv_heads + heads) * cap + write
        slots = slots.reshape(-1)
        if self.attention == "flash":
            starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
            return (starts, starts * cap, lengths.to(torch.int32)), slots
        valid = torch.arange(cap, device=device)[None, :] < lengths[:, None]
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=device)
        return (bias.masked_fill(~valid, float("-inf"))[:, None, None, :],), slots

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
        return torch.matmul(probs, values)  # [batch, kv_heads, group, head_dim]

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
        out: torch.Tensor = torch.ops.aten._flash_attention_forward(
            q,
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
        return out


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
