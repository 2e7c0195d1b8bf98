"""Packed training rows without flash-attn, and each screenshot through the vision tower once.

Two model-level changes the cluster actor (``training.cluster.fsdp_actor``) installs on a
Qwen3-VL model; both leave every log-prob and gradient what one-row-at-a-time gives
(``tests/training/test_packing.py``: fp32, ≤ 1e-5):

- **Packed attention** (``PACKED_SDPA``, ``use_packed_attention``): an attention
  implementation registered with transformers' ``AttentionInterface`` that reads the packed
  micro-batch's sequence starts (``cu_seq_lens_q``, the keyword AReaL passes for flash
  attention's varlen path) and runs PyTorch's ``scaled_dot_product_attention`` causally on
  each sequence alone, so rows packed into one micro-batch never attend across their
  boundary. Without ``cu_seq_lens_q`` (the vision tower's per-image calls, generation) it is
  ``sdpa`` unchanged. Each sequence gets the same kernel a one-row micro-batch gets, and no
  ``T x T`` mask is built.
- **Vision once** (``share_screenshots``): the model's ``get_image_features`` is wrapped so
  that images whose pixel rows and ``grid_thw`` are equal — a per-turn row repeats the
  episode's earlier screenshots, and the rows of a GRPO group start from one screen — go
  through the vision tower once per forward; every copy's embeddings (merged and deepstack)
  are gathered from that one output, so their gradients add up in the shared tensor, as
  encoding each copy would. Equality is checked exactly (``torch.equal``) after a column-sum
  fingerprint buckets candidates; nothing is cached across forwards.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

PACKED_SDPA = "cua_packed_sdpa"
"""Name of the packed attention implementation in transformers' registries."""
PACKING_KWARGS = (
    "cu_seqlens",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
    "max_seqlen",
)
"""Packing keywords AReaL gives the model; never handed to the vision tower."""
_WRAPPED = "_cua_vision_once"


def packed_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, per packed sequence when ``cu_seq_lens_q`` is given.

    ``query``/``key``/``value``: ``[1, heads, T, head_dim]``; ``cu_seq_lens_q``: ``[n + 1]``
    starts of the ``n`` packed sequences (``cu_seq_lens_k`` equal: training, no cache).
    Returns ``[1, T, heads, head_dim]`` like ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    starts = kwargs.pop("cu_seq_lens_q", None)
    for name in PACKING_KWARGS:
        kwargs.pop(name, None)
    if starts is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        out: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, **kwargs
        )
        return out
    bounds = [int(b) for b in starts.tolist()]
    if bounds[0] != 0 or bounds[-1] != query.shape[2]:
        raise ValueError(
            f"cu_seq_lens_q {bounds[:3]}...{bounds[-1:]} does not cover the {query.shape[2]} "
            "packed positions"
        )
    kwargs["is_causal"] = bool(getattr(module, "is_causal", True))
    pieces = []
    for start, end in itertools.pairwise(bounds):
        if end > start:
            piece, _ = sdpa_attention_forward(
                module,
                query[:, :, start:end],
                key[:, :, start:end],
                value[:, :, start:end],
                None,
                **kwargs,
            )
            pieces.append(piece)
    return torch.cat(pieces, dim=1), None


def register_packed_attention() -> str:
    """Register ``PACKED_SDPA`` with transformers (attention and mask interfaces; the mask is
    ``sdpa``'s, ``None`` when AReaL passes no padding). Idempotent; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
    AttentionMaskInterface.register(PACKED_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return PACKED_SDPA


def use_packed_attention(model: Any) -> None:
    """Switch ``model`` (text and vision) to ``PACKED_SDPA``; raises ``RuntimeError`` if the
    text model's attention does not follow."""
    name = register_packed_attention()
    try:
        model.set_attn_implementation(name)
    except (ValueError, NotImplementedError):  # a transformers that checks names its own way
        config = model.config
        for sub in (config, *(getattr(config, k, None) for k in ("text_config", "vision_config"))):
            if sub is not None:
                sub._attn_implementation = name
    text = getattr(model.config, "text_config", model.config)
    if text._attn_implementation != name:
        raise RuntimeError(
            f"attention implementation {name!r} not taken by the text model "
            f"(it kept {text._attn_implementation!r}): packed rows would attend across rows"
        )


def image_owners(pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[list[int], list[int]]:
    """For each image of a ``pixel_values``/``grid_thw`` batch (Qwen-VL layout: each image's
    ``t*h*w`` patch rows one after another), the index of the first image with equal
    ``grid_thw`` and equal pixel rows (itself when it is the first), and the list of those
    first images in order. Exact: candidates found by a fingerprint are compared with
    ``torch.equal``."""
    grids = [tuple(int(x) for x in g) for g in grid_thw.tolist()]
    sizes = [t * h * w for t, h, w in grids]
    if sum(sizes) != pixel_values.shape[0]:
        raise ValueError(
            f"grid_thw counts {sum(sizes)} patch rows, pixel_values has {pixel_values.shape[0]}"
        )
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    values = pixel_values.detach()
    fingerprints = torch.stack(
        [values[a:b].sum(0, dtype=torch.float64) for a, b in itertools.pairwise(offsets)]
    )
    keys = [f.tobytes() for f in fingerprints.cpu().numpy()]
    owner: list[int] = []
    firsts: list[int] = []
    buckets: dict[tuple[tuple[int, ...], bytes], list[int]] = {}
    for i, (grid, key) in enumerate(zip(grids, keys, strict=True)):
        found = i
        rows = pixel_values[offsets[i] : offsets[i + 1]]
        for j in buckets.get((grid, key), []):
            if torch.equal(rows, pixel_values[offsets[j] : offsets[j + 1]]):
                found = j
                break
        if found == i:
            buckets.setdefault((grid, key), []).append(i)
            firsts.append(i)
        owner.append(found)
    return owner, firsts


def row_groups(multi_modal_input: Sequence[dict[str, Any]]) -> list[int]:
    """Per row of a batch (its ``multi_modal_input`` entries: ``pixel_values``,
    ``image_grid_thw``), the id of its group: rows that share an image, directly or through
    other rows, get one id (the smallest row index among them)."""
    image_row: list[int] = []
    pixels: list[torch.Tensor] = []
    grids: list[torch.Tensor] = []
    for row, entry in enumerate(multi_modal_input):
        grid = entry.get("image_grid_thw")
        if grid is None or entry.get("pixel_values") is None:
            continue
        image_row += [row] * int(grid.shape[0])
        pixels.append(entry["pixel_values"])
        grids.append(grid)
    parent = list(range(len(multi_modal_input)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    if pixels:
        dtype = pixels[0].dtype
        owner, _ = image_owners(torch.cat([p.to(dtype) for p in pixels]), torch.cat(grids))
        for image, first in enumerate(owner):
            a, b = root(image_row[image]), root(image_row[first])
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(multi_modal_input))]


def allocate_groups(
    lengths: Sequence[int], groups: Sequence[int], max_tokens: int, min_bins: int = 1
) -> list[list[int]]:
    """Rows into micro-batches of at most ``max_tokens`` tokens, keeping each group's rows
    (``row_groups``) together: first fit decreasing over groups, a group longer than
    ``max_tokens`` cut into runs of consecutive rows that fit (an episode's turns are
    consecutive rows); then bins split (the one with most rows, in halves)
    until there are ``min_bins``. Returns each bin's row indices, ascending; bins ordered by
    their first row. Raises ``ValueError`` when ``min_bins`` exceeds the rows."""
    if min_bins > len(lengths):
        raise ValueError(f"{min_bins} micro-batches asked for {len(lengths)} rows")
    members: dict[int, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    units: list[list[int]] = []
    for rows in members.values():
        chunk: list[int] = []
        for r in rows:
            if chunk and sum(lengths[c] for c in chunk) + lengths[r] > max_tokens:
                units.append(chunk)
                chunk = []
            chunk.append(r)
        units.append(chunk)
    units.sort(key=lambda u: (-sum(lengths[r] for r in u), u[0]))
    bins: list[list[int]] = []
    loads: list[int] = []
    for unit in units:
        size = sum(lengths[r] for r in unit)
        for k, load in enumerate(loads):
            if load + size <= max_tokens:
                bins[k] += unit
                loads[k] += size
                break
        else:
            bins.append(list(unit))
            loads.append(size)
    while len(bins) < min_bins:
        widest = max(range(len(bins)), key=lambda k: len(bins[k]))
        rows = sorted(bins.pop(widest))
        half = len(rows) // 2
        bins += [rows[:half], rows[half:]]
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def _gather(parts: Sequence[torch.Tensor], order: Sequence[int]) -> torch.Tensor:
    return torch.cat([parts[k] for k in order], dim=0)


def encode_images_once(
    get_image_features: Callable[..., Any],
    merge: int,
    pixel_values: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """``get_image_features(pixel_values, image_grid_thw, **kwargs)`` with each distinct
    image encoded once: the output has every image's entries, in the input's order.
    ``merge``: the vision tower's ``spatial_merge_size`` (``merge**2`` patches per token)."""
    for name in PACKING_KWARGS:
        kwargs.pop(name, None)
    if image_grid_thw is None or image_grid_thw.shape[0] < 2:
        return get_image_features(pixel_values, image_grid_thw, **kwargs)
    owner, firsts = image_owners(pixel_values, image_grid_thw)
    if len(firsts) == len(owner):
        return get_image_features(pixel_values, image_grid_thw, **kwargs)
    slot = {image: k for k, image in enumerate(firsts)}
    order = [slot[o] for o in owner]
    patches = [int(t * h * w) for t, h, w in image_grid_thw.tolist()]
    starts = [sum(patches[:i]) for i in range(len(patches))]
    unique_pixels = torch.cat([pixel_values[starts[i] : starts[i] + patches[i]] for i in firsts])
    out = get_image_features(unique_pixels, image_grid_thw[firsts], **kwargs)
    unique_patches = [patches[i] for i in firsts]
    unique_tokens = [n // (merge * merge) for n in unique_patches]
    pooled = out.pooler_output
    if isinstance(pooled, torch.Tensor):
        out.pooler_output = _gather(torch.split(pooled, unique_tokens), order)
    else:
        out.pooler_output = tuple(pooled[k] for k in order)
    deepstack = getattr(out, "deepstack_features", None)
    if deepstack is not None:
        out.deepstack_features = [
            _gather(torch.split(layer, unique_tokens), order) for layer in deepstack
        ]
    hidden = getattr(out, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor) and hidden.shape[0] == sum(unique_patches):
        out.last_hidden_state = _gather(torch.split(hidden, unique_patches), order)
    return out


def _encode_each(
    get_image_features: Callable[..., Any],
    pixel_values: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    for name in PACKING_KWARGS:
        kwargs.pop(name, None)
    return get_image_features(pixel_values, image_grid_thw, **kwargs)


def share_screenshots(model: Any, *, dedupe: bool = True) -> None:
    """Make ``model`` (a Qwen3-VL ``...ForConditionalGeneration`` or its inner ``model``)
    encode each distinct image of a forward once (``encode_images_once``); with ``dedupe``
    off, every copy as before. Either way the vision tower never sees the text's packing
    keywords (newer transformers hand them on, and its attention would then split the
    patches by the text's lengths). Idempotent: the first call decides."""
    child: Any = getattr(model, "model", None)
    inner: Any = child if hasattr(child, "visual") else model
    if getattr(inner, _WRAPPED, False):
        return
    original = inner.get_image_features
    if dedupe:
        merge = int(inner.visual.spatial_merge_size)
        inner.get_image_features = functools.partial(encode_images_once, original, merge)
    else:
        inner.get_image_features = functools.partial(_encode_each, original)
    setattr(inner, _WRAPPED, True)
