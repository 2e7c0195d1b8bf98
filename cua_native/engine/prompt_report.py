"""What a remote inference server said about the prompt of a turn
(docs/contracts.md#server-prompt-check).

AReaL's remote engines answer ``input_tokens = req.input_ids``: the ids the client sent, never
what the server built. The servers do say what they built: SGLang's ``meta_info.prompt_tokens``
(a count) and vLLM's ``usage.prompt_tokens`` plus, when asked with ``return_token_ids``, the
ids themselves (``prompt_token_ids``). A server that built another prompt (a chat template
or image expansion that differs from the prompt builder's, e.g. another pixel budget) generates
from ids the trainer never sees, so the turn cannot be trained on.

The episode opens a ``PromptReport`` around its ``agenerate`` call (``prompt_report()``, a
context variable: AReaL's ``RemoteInfEngine.agenerate`` builds and parses every HTTP call in
the caller's task, so the backend sees the episode's report). The backends of
``cua_native.engine.remote`` note each call's sent ids (``sent``) and what the server reported
(``received``); ``mismatch()`` names the first call whose server prompt differs. Engines that
never fill a report (in-process) leave it empty: nothing is checked, nothing is flagged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(slots=True)
class PromptReport:
    """The calls of one turn: ids sent, and the server's prompt count and ids (when given)."""

    calls: list[tuple[list[int], int | None, list[int] | None]] = field(default_factory=list)
    _pending: list[int] | None = None

    def sent(self, input_ids: Sequence[int]) -> None:
        """A request is about to go out with ``input_ids`` (the prompt the server must build)."""
        self._pending = list(input_ids)

    def received(self, count: int | None, ids: Sequence[int] | None, *, empty_abort: bool) -> None:
        """The server answered the pending request. ``empty_abort``: aborted before its prefill
        (SGLang then reports no prompt at all), which is not compared."""
        sent, self._pending = self._pending, None
        if sent is None or (empty_abort and not count and not ids):
            return
        self.calls.append((sent, count, None if ids is None else list(ids)))

    @property
    def checked(self) -> int:
        """How many calls the server reported a prompt for."""
        return sum(count is not None or ids is not None for _, count, ids in self.calls)

    def mismatch(self) -> str | None:
        """A line naming the first call whose server prompt differs from the ids sent."""
        for index, (sent, count, ids) in enumerate(self.calls):
            if ids is not None and ids != sent:
                first = next(
                    (i for i, (a, b) in enumerate(zip(ids, sent, strict=False)) if a != b),
                    min(len(ids), len(sent)),
                )
                return (
                    f"call {index}: the server built {len(ids)} prompt ids, first differing at "
                    f"position {first}, against {len(sent)} sent"
                )
            if count is not None and count != len(sent):
                return (
                    f"call {index}: the server reports {count} prompt tokens, {len(sent)} were sent"
                )
        return None


_CURRENT: ContextVar[PromptReport | None] = ContextVar("cua_prompt_report", default=None)


@contextmanager
def prompt_report() -> Iterator[PromptReport]:
    """Collect what the server reports about the prompts sent inside the ``with`` block."""
    report = PromptReport()
    token = _CURRENT.set(report)
    try:
        yield report
    finally:
        _CURRENT.reset(token)


def current_report() -> PromptReport | None:
    """The report of the turn being generated in this task, if its episode opened one."""
    return _CURRENT.get()
