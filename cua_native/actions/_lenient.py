"""Lenient reading of model text: thinking blocks, ``<tool_call>`` bodies and non-strict JSON.

Shared by the MAI-UI and Qwen3-VL dialects. Every function here is pure and bounded: tags are
found with linear regexes, brace matching is an iterative string-aware scan capped at
``MAX_OBJECT_CHARS``, and the slow repairs (json5, ``ast.literal_eval``) only run on short text.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
from dataclasses import dataclass
from typing import Any

import json5

from cua_native.actions.errors import ErrorKind

MAX_OBJECT_CHARS = 32_768
"""Longest tool-call JSON we try to read; longer objects are a ``format`` error."""
MAX_REPAIR_CHARS = 8_192
"""json5 / ``ast.literal_eval`` repairs only run on candidates up to this size."""
MAX_TAGS = 1_024
"""Tags beyond this many are not looked at (they only change ``extra_calls``)."""
MAX_BARE_OBJECTS = 8
"""Without a ``<tool_call>`` tag, this many ``{`` positions are tried as a bare call."""

_DECODER = json.JSONDecoder(strict=False)  # strict=False: raw newlines/tabs inside strings
_SCAN_RE = re.compile(r"""[{}\[\]"'\\]""")
_OPEN_CALL_RE = re.compile(r"<\s*tool_call\s*>", re.IGNORECASE)
_CLOSE_CALL_RE = re.compile(r"<\s*/\s*tool_call\s*>", re.IGNORECASE)
_CLOSERS = {"{": "}", "[": "]"}


class Failure(Exception):
    """Internal signal of a failed parse; dialects turn it into a ``ParseError`` value."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class Thinking:
    """The reasoning part of an output, the text after it, and any text before it."""

    thought: str | None
    rest: str
    before: str = ""
    """Text before the thinking block (e.g. a ``<tool_call>`` written ahead of it)."""


def clean_thought(text: str | None) -> str | None:
    """Strip whitespace and wrapping quotes like the reference agent; empty → ``None``."""
    if text is None:
        return None
    cleaned = text.strip().strip('"').strip()
    return cleaned or None


def split_thinking(text: str, open_tags: tuple[str, ...], close_tags: tuple[str, ...]) -> Thinking:
    """Split the thinking block (``<thinking>…</thinking>``, or ``…</think>`` with the opening tag
    prefilled by the chat template) from the rest.

    Contract (as MAI-UI's and Qwen-Agent's own parsers read it):
    - the block runs from the earliest tag to the first closing tag after it; a ``<tool_call>``
      inside it is reasoning, never the action: calls are read from ``rest`` only;
    - tags inside a tool call (``</think>`` typed as text) are not a block: a block counts when it
      starts before the first ``<tool_call>`` or a ``<tool_call>`` follows it;
    - a block that opens before any tool call and never closes is a truncated output
      (``Failure("format")``), even when a ``<tool_call>`` follows inside it;
    - without any tag there is no thinking block.
    """
    first_call = _OPEN_CALL_RE.search(text)
    call_at = first_call.start() if first_call is not None else len(text)
    open_at, open_len = _first_of(text, open_tags)
    close_at, close_len = _first_of(text, close_tags)
    if open_at >= 0 and (close_at < 0 or open_at < close_at):
        anchor, body_start = open_at, open_at + open_len
        close_at, close_len = _first_of(text, close_tags, body_start)
        if close_at < 0:
            if open_at < call_at:
                raise Failure("format", "output ends inside the thinking block (truncated?)")
            return Thinking(None, text)
    elif close_at >= 0:
        open_at, anchor, body_start = 0, close_at, 0
    else:
        return Thinking(None, text)
    rest_at = close_at + close_len
    if anchor > call_at and _OPEN_CALL_RE.search(text, rest_at) is None:
        return Thinking(None, text)  # tags inside the (last) tool call, not a thinking block
    return Thinking(clean_thought(text[body_start:close_at]), text[rest_at:], text[:open_at])


def calls_before(thinking: Thinking, warnings: list[str]) -> int:
    """``<tool_call>`` blocks written ahead of the thinking block: ignored (the action is the call
    after the block, as upstream reads it), counted and warned about."""
    count = len(_OPEN_CALL_RE.findall(thinking.before)) if thinking.before else 0
    if count:
        warnings.append(f"ignored {count} <tool_call> block(s) before the thinking block")
    return count


def _first_of(text: str, needles: tuple[str, ...], start: int = 0) -> tuple[int, int]:
    """Position and length of the earliest of ``needles`` in ``text[start:]`` (``-1`` if none)."""
    best, length = -1, 0
    for needle in needles:
        at = text.find(needle, start)
        if at >= 0 and (best < 0 or at < best):
            best, length = at, len(needle)
    return best, length


@dataclass(frozen=True, slots=True)
class ToolCallBlocks:
    """``<tool_call>`` bodies in order; a body runs to its close tag, the next open tag or the end."""

    prefix: str
    bodies: tuple[str, ...]
    closed: tuple[bool, ...]
    first_start: int = 0
    """Offset of the first body in the text (its JSON may run past a tag quoted in a string)."""


def tool_call_blocks(text: str) -> ToolCallBlocks:
    opens = [m.span() for _, m in zip(range(MAX_TAGS), _OPEN_CALL_RE.finditer(text), strict=False)]
    if not opens:
        return ToolCallBlocks(text, (), ())
    closes = [
        m.span() for _, m in zip(range(MAX_TAGS), _CLOSE_CALL_RE.finditer(text), strict=False)
    ]
    close_starts = [start for start, _ in closes]
    bodies: list[str] = []
    closed: list[bool] = []
    for index, (_, body_start) in enumerate(opens):
        next_open = opens[index + 1][0] if index + 1 < len(opens) else len(text)
        ci = bisect.bisect_left(close_starts, body_start)
        if ci < len(closes) and close_starts[ci] < next_open:
            bodies.append(text[body_start : close_starts[ci]])
            closed.append(True)
        else:
            bodies.append(text[body_start:next_open])
            closed.append(False)
    return ToolCallBlocks(text[: opens[0][0]], tuple(bodies), tuple(closed), opens[0][1])


def balanced_end(text: str, start: int) -> int | None:
    """Index just past the bracket matching ``text[start]``; ``None`` if it does not close.

    String-aware for both quote styles (single quotes appear in Python-literal outputs), so
    braces inside text arguments do not count.
    """
    stack: list[str] = []
    quote: str | None = None
    skip_until = -1
    limit = min(len(text), start + MAX_OBJECT_CHARS)
    for match in _SCAN_RE.finditer(text, start, limit):
        at = match.start()
        if at < skip_until:
            continue
        char = match.group()
        if quote is not None:
            if char == "\\":
                skip_until = at + 2
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in _CLOSERS:
            stack.append(_CLOSERS[char])
        elif char in "}]":
            if not stack or stack.pop() != char:
                return None
            if not stack:
                return at + 1
    return None


def load_object(text: str, warnings: list[str], what: str = "tool-call JSON") -> dict[str, Any]:
    """The first JSON object in ``text``, repaired when the intent is unambiguous.

    Strict JSON first (``raw_decode``, ignoring trailing text such as an extra ``}`` or a code
    fence); then the brace-balanced candidate through json5 (single quotes, trailing commas,
    unquoted keys) and ``ast.literal_eval`` (Python ``True``/``None``).
    """
    start = text.find("{")
    if start < 0:
        raise Failure("format", f"no JSON object in the {what}")
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict):
        tail = text[end : end + 200]
        tag = tail.find("<")
        trailing = (tail if tag < 0 else tail[:tag]).strip().strip("`").strip()
        if trailing:
            warnings.append(f"ignored text after the {what}: {trailing[:24]!r}")
        return value
    close = balanced_end(text, start)
    if close is None:
        if len(text) - start > MAX_OBJECT_CHARS:
            raise Failure("format", f"{what} is longer than {MAX_OBJECT_CHARS} characters")
        raise Failure("format", f"{what} is not closed (truncated output?)")
    repaired = repair_object(text[start:close])
    if repaired is None:
        snippet = text[start : min(close, start + 60)]
        raise Failure("format", f"{what} could not be read, even leniently: {snippet!r}")
    warnings.append(f"repaired non-strict {what}")
    return repaired


def repair_object(candidate: str) -> dict[str, Any] | None:
    """json5, then a Python literal; ``None`` if neither gives an object."""
    if len(candidate) > MAX_REPAIR_CHARS:
        return None
    for loader in (json5.loads, _python_literal):
        try:
            value = loader(candidate)
        except Exception:  # any failure of a repair attempt just means "not this one"
            continue
        if isinstance(value, dict):
            return value
    return None


def _python_literal(candidate: str) -> Any:
    """A Python literal limited to what JSON can hold (tuples become lists; bytes, sets fail)."""
    return json.loads(json.dumps(ast.literal_eval(candidate)))


def bare_call(text: str, warnings: list[str]) -> dict[str, Any] | None:
    """A call object written without ``<tool_call>`` tags (fenced, or plain JSON), if any."""
    position = 0
    for _ in range(MAX_BARE_OBJECTS):
        start = text.find("{", position)
        if start < 0:
            return None
        attempt: list[str] = []
        try:
            value = load_object(text[start:], attempt)
        except Failure:
            value = None
        if value is not None and looks_like_call(value):
            warnings.extend(attempt)
            warnings.append("no <tool_call> tag; read a bare JSON call")
            return value
        position = start + 1
    return None


def looks_like_call(value: dict[str, Any]) -> bool:
    return ("name" in value and "arguments" in value) or "action" in value or "function" in value
