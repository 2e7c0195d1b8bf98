"""Exact prompt tokenization that re-uses the ids of text it has seen before.

A Hugging Face ``tokenizers`` pipeline first cuts the input at its added tokens that match on
the raw text (``normalized=False``: ``<|im_start|>``, ``<|image_pad|>``, …) and then
normalizes, pre-tokenizes and runs the model on each piece on its own. So the ids of a rendered
chat template are the ids of its pieces, concatenated with the added tokens' ids between them.
An agent's prompt repeats almost every piece turn after turn (the system prompt with its tool
definitions, the instruction, the earlier turns' messages); ``SegmentTokenizer`` tokenizes each
distinct piece once and looks it up afterwards. On the embedded default that took tokenization
from 0.8 to 0.04 ms of a turn's CPU (cProfile over 800 turns of ``bench/perf/loop.py``'s episodes).

Exactness rests on the tokenizer having the structure above, so ``SegmentTokenizer.for_tokenizer``
checks that structure (no strip/single-word rules on the cut tokens, no special tokens added by
post-processing, no truncation or padding) and compares both ways on a probe text holding every
added token; any difference and it returns ``None``, and callers tokenize whole prompts.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_CACHE_SIZE = 8192
"""Distinct pieces kept (least recently used dropped first); a piece is a message's text
between two added tokens, so this covers the live turns of a few thousand episodes."""


class SegmentTokenizer:
    """``encode(text)`` = ``tokenizer(text)["input_ids"]``, with each piece's ids cached.

    Thread-safe (the cache is ``functools.lru_cache``); holds no per-prompt state."""

    def __init__(self, backend: Any, cut_tokens: dict[str, int], cache_size: int) -> None:
        self._backend = backend
        self._cut_ids = cut_tokens
        longest_first = sorted(cut_tokens, key=len, reverse=True)
        # Longest alternative first: at each position the longest added token wins, as in the
        # tokenizers library's leftmost-longest matching.
        self._cut = re.compile("|".join(re.escape(token) for token in longest_first))
        self._piece_ids = lru_cache(maxsize=cache_size)(self._encode_piece)

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Any, cache_size: int = DEFAULT_CACHE_SIZE
    ) -> SegmentTokenizer | None:
        """A segment tokenizer equivalent to ``tokenizer``, or ``None`` where it cannot be one
        (not a ``tokenizers``-backed tokenizer, strip rules on added tokens, post-processing
        that adds tokens, or a probe that tokenizes differently)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(tokenizer, "split_special_tokens", False):
            return None
        if backend.truncation is not None or backend.padding is not None:
            return None
        post = backend.post_processor
        if post is not None and post.num_special_tokens_to_add(False) != 0:
            return None
        cut: dict[str, int] = {}
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.normalized:
                continue  # matched inside a piece by the library itself
            if token.lstrip or token.rstrip or token.single_word:
                return None
            cut[token.content] = int(token_id)
        if not cut:
            return None
        segmented = cls(backend, cut, cache_size)
        probe = probe_text(list(cut))
        if segmented.encode(probe) != list(tokenizer(probe)["input_ids"]):
            logger.warning(
                "the segment tokenizer disagrees with %s on its probe; prompts are tokenized whole",
                type(tokenizer).__name__,
            )
            return None
        return segmented

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        for match in self._cut.finditer(text):
            if match.start() > start:
                ids += self._piece_ids(text[start : match.start()])
            ids.append(self._cut_ids[match.group()])
            start = match.end()
        if start < len(text):
            ids += self._piece_ids(text[start:])
        return ids

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        return tuple(self._backend.encode(piece, add_special_tokens=False).ids)


def probe_text(tokens: list[str]) -> str:
    """Text that exercises every cut: each token between pieces with leading and trailing
    whitespace, newlines, digits, non-ASCII and a token's own characters, and tokens back to
    back."""
    pieces = [" a\n", "\n\n", "  x ", "1234 ", "é€😀 ", "<|", "|>", "\t", " <tool_call>\n{}"]
    parts: list[str] = []
    for index, token in enumerate(tokens):
        parts += [pieces[index % len(pieces)], token, token]
    return "".join(parts) + " end\n"
