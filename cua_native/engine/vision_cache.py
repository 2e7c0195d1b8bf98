"""Vision-encoder outputs cached by image content: each screenshot is encoded once, not once per
prompt that shows it (worker thread only, except ``image_keys``).

MAI-UI's history shows up to three screenshots per prompt, so without a cache every screenshot
goes through the vision tower three times per episode, and a GRPO group's ``n`` samples of one
prompt encode the same images ``n`` times. The Qwen-VL vision towers encode each image on its
own (attention within an image via ``cu_seqlens``, patch rows and merger per image), so one
image's features do not depend on which other images share the call: caching them per image
gives the model's own result (``tests/engine/test_vision_cache.py``: fp32 log-probs against one
plain forward pass).

* ``image_keys``: one key per image, a SHA-1 hash tree of its ``image_grid_thw`` row and its
  rows of ``pixel_values`` (the bytes the encoder reads; computed off the worker, in input
  preparation, the chunks in parallel).
* ``VisionCache``: key -> the image's merged embeddings and its deepstack features on the
  model's device, least recently used first out, bounded in bytes. Cleared on every weight
  update (the tower may have changed).
* ``CachedVisionForward``: the prefill forward of a Qwen3-VL-style model (``get_image_features``
  returning deepstack features, a language model taking ``visual_pos_masks`` and
  ``deepstack_visual_embeds``) with the encoder outputs taken from the cache: the same steps as
  the model's ``forward`` (``masked_scatter`` of the image embeddings into the token
  embeddings, the language model, the head on the last position). ``supports`` says whether a
  model has that shape; others keep the plain forward.
"""

from __future__ import annotations

import hashlib
import inspect
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import torch

CHUNK_BYTES = 4 << 20
"""Images are hashed in chunks of this many bytes (in parallel where an executor is given)."""


def image_keys(
    pixel_values: torch.Tensor, grid_thw: torch.Tensor, executor: Executor | None = None
) -> tuple[str, ...]:
    """One content key per image, in order: the SHA-1 of its grid row, the dtype and the
    SHA-1s of its ``pixel_values`` rows in ``CHUNK_BYTES`` chunks (a hash tree, so the chunks
    can be hashed in parallel: a 1088x2400 screenshot is 62 MB of float32 rows)."""
    pixels = pixel_values.detach().cpu().contiguous()
    raw = pixels.reshape(pixels.shape[0], -1).view(torch.uint8)  # any dtype, as bytes
    grids = grid_thw.detach().cpu().to(torch.long)
    rows_per_chunk = max(1, CHUNK_BYTES // max(1, raw.shape[1]))
    spans: list[tuple[int, int]] = []
    chunks: list[tuple[int, int]] = []
    start = 0
    for row in grids:
        n = int(row.prod())
        first = len(chunks)
        chunks += [
            (a, min(a + rows_per_chunk, start + n)) for a in range(start, start + n, rows_per_chunk)
        ]
        spans.append((first, len(chunks)))
        start += n
    if start != pixels.shape[0]:
        raise ValueError(f"pixel rows {pixels.shape[0]} != patches in the grids {start}")

    def digest(span: tuple[int, int]) -> bytes:
        data = raw[span[0] : span[1]].numpy().data  # no copy: the rows' buffer
        return hashlib.sha1(data, usedforsecurity=False).digest()

    digests = list(executor.map(digest, chunks) if executor is not None else map(digest, chunks))
    keys: list[str] = []
    for row, (first, last) in zip(grids, spans, strict=True):
        top = hashlib.sha1(row.numpy().tobytes(), usedforsecurity=False)
        top.update(str(pixels.dtype).encode())
        top.update(b"".join(digests[first:last]))
        keys.append(top.hexdigest())
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a prompt: its key, its ``pixel_values`` rows and its grid row ``[3]``."""

    key: str
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """One image's encoder outputs: merged embeddings ``[tokens, hidden]`` and one
    ``[tokens, hidden]`` tensor per deepstack layer."""

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        tensors = (self.embeds, *self.deepstack)
        return sum(t.numel() * t.element_size() for t in tensors)


class VisionCache:
    """Encoded images by key, least recently used evicted first past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, EncodedImage] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> EncodedImage | None:
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return found

    def put(self, key: str, image: EncodedImage) -> None:
        """Keep ``image`` unless it alone exceeds the bound; evict the oldest to fit."""
        if image.nbytes > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._entries[key] = image
        self.bytes += image.nbytes
        while self.bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


class CachedVisionForward:
    """A Qwen3-VL-style prefill forward whose image features come from a ``VisionCache``."""

    def __init__(self, model: Any, cache: VisionCache) -> None:
        self._model = model
        self._inner = model.model
        self._cache = cache
        self._image_token_id = int(model.config.image_token_id)

    @staticmethod
    def supports(model: Any) -> bool:
        """True for models with Qwen3-VL's shape (see the module docstring)."""
        inner = getattr(model, "model", None)
        language = getattr(inner, "language_model", None)
        if language is None or not callable(getattr(inner, "get_image_features", None)):
            return False
        if getattr(model.config, "image_token_id", None) is None:
            return False
        if not callable(getattr(model, "lm_head", None)):
            return False
        params = inspect.signature(language.forward).parameters
        return "deepstack_visual_embeds" in params and "visual_pos_masks" in params

    def encode(self, images: list[ImageInput]) -> EncodedImage:
        """The concatenated encoder outputs of ``images`` (in order), encoding in one call
        only the images the cache lacks (each once, however often it appears)."""
        found: dict[str, EncodedImage] = {}
        missing: dict[str, ImageInput] = {}
        for image in images:
            if image.key in found or image.key in missing:
                continue
            hit = self._cache.get(image.key)
            if hit is None:
                missing[image.key] = image
            else:
                found[image.key] = hit
        if missing:
            found.update(self._encode(list(missing.values())))
        parts = [found[image.key] for image in images]
        levels = len(parts[0].deepstack)
        return EncodedImage(
            embeds=torch.cat([p.embeds for p in parts]),
            deepstack=tuple(torch.cat([p.deepstack[i] for p in parts]) for i in range(levels)),
        )

    def _encode(self, images: list[ImageInput]) -> dict[str, EncodedImage]:
        device = next(self._model.parameters()).device
        pixels = torch.cat([image.pixel_values for image in images]).to(device)
        grids = torch.stack([image.grid_thw for image in images]).to(device)
        out = self._inner.get_image_features(pixels, grids, return_dict=True)
        embeds = out.pooler_output  # one tensor per image
        tokens = [e.shape[0] for e in embeds]
        deepstack = [torch.split(level, tokens) for level in out.deepstack_features or []]
        result: dict[str, EncodedImage] = {}
        for j, image in enumerate(images):
            encoded = EncodedImage(
                embeds=embeds[j], deepstack=tuple(level[j] for level in deepstack)
            )
            self._cache.put(image.key, encoded)
            result[image.key] = encoded
        return result

    def __call__(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        images: list[ImageInput],
    ) -> torch.Tensor:
        """Next-token logits ``[B, V]`` of left-padded ``ids`` (the model's own forward
        with ``logits_to_keep=1``, image features from the cache); ``images`` in the order
        their placeholders appear (row by row)."""
        encoded = self.encode(images)
        embeds = self._inner.get_input_embeddings()(ids)
        visual = ids == self._image_token_id
        if int(visual.sum()) != encoded.embeds.shape[0]:
            raise ValueError(
                f"{int(visual.sum())} image tokens but {encoded.embeds.shape[0]} image features"
            )
        embeds = embeds.masked_scatter(
            visual[..., None].expand_as(embeds), encoded.embeds.to(embeds.dtype)
        )
        out = self._inner.language_model(
            input_ids=None,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            inputs_embeds=embeds,
            use_cache=True,
            visual_pos_masks=visual,
            deepstack_visual_embeds=list(encoded.deepstack) or None,
        )
        logits: torch.Tensor = self._model.lm_head(out.last_hidden_state[:, -1:, :])
        return logits[:, -1, :]
