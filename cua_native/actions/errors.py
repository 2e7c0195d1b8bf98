"""Parse results: a dialect never raises on model text; a failure is a value with a kind."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from cua_native.actions.models import Action

ErrorKind = Literal["format", "tool_name", "tool_arg"]
ERROR_KINDS: tuple[ErrorKind, ...] = ("format", "tool_name", "tool_arg")


class ParseError(BaseModel):
    """Why model text gave no action.

    ``format``: no tool call could be read; ``tool_name``: the call names no known tool or
    action; ``tool_arg``: known action, but arguments missing, of the wrong type or out of range.
    """

    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str


class ParsedOutput(BaseModel):
    """What a dialect read from one model output."""

    model_config = ConfigDict(frozen=True)

    action: Action | None = None
    thought: str | None = None
    error: ParseError | None = None
    summary: str | None = None
    """A one-line description of the step (Qwen3-VL's ``Action:`` line), when the model gave one."""
    extra_calls: int = 0
    """Tool calls after the first; the first is the action, the rest are only counted."""
    warnings: tuple[str, ...] = ()
    """Lenient repairs that were made (clamped coordinates, synonyms, repaired JSON)."""

    @property
    def ok(self) -> bool:
        return self.action is not None and self.error is None

    def to_replay_json(self) -> dict[str, object]:
        """The replay line of ``docs/actions.md``."""
        return {
            "ok": self.ok,
            "action": self.action.model_dump(mode="json") if self.action is not None else None,
            "thought": self.thought,
            "error": self.error.model_dump() if self.error is not None else None,
        }


def failure(kind: ErrorKind, message: str, thought: str | None = None) -> ParsedOutput:
    return ParsedOutput(error=ParseError(kind=kind, message=message), thought=thought)
