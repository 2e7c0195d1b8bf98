"""Each generated token carries the weight version its request was built under (AReaL #1569).

AReaL 1.0.4's ``RemoteInfEngine.agenerate`` reads the engine's version twice per HTTP call: once
to build the request (``build_generation_request(..., version=self.get_version())``) and again,
after the answer came back, to label the answer's tokens (``[self.get_version()] * n``). The
trainer's ``set_version`` can land in between: a rollout worker whose loop parses an answer
after the trainer finished a weight update and announced the new version labels tokens the old
weights generated with the new version. Those labels are what the workflow's rows carry
(``versions``) and what AReaL's actor reads of them: its staleness statistics and its
version-based proximal log-prob approximations. Upstream fixed this after 1.0.4
(inclusionAI/AReaL PR #1569) by reading the version once per call and reusing it for the label.

The same fix, from our side of AReaL's backend API:

- ``PinnedVersions``, a mixin for AReaL's ``SGLangBackend``/``VLLMBackend`` subclasses, notes the
  version each request is built with (AReaL passes it to ``build_generation_request``) and how
  many tokens its parsed answer carries (``parse_generation_response``), in the turn's
  ``ServedVersions``;
- the episode opens ``served_versions()`` around its ``agenerate`` call (a context variable:
  AReaL builds and parses every HTTP call of ``agenerate`` in the caller's task) and takes
  ``ServedVersions.pinned(response.output_versions)``: one version per token, each segment (a
  call; a turn continued after an abort has several) labelled with the version it was built
  under, exactly as upstream labels it.

Engines that never fill the record (the in-process engine records the version of every decode
step itself) keep their own versions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from areal.api.io_struct import HttpGenerationResult, HttpRequest, ModelRequest


@dataclass(slots=True)
class ServedVersions:
    """The HTTP calls of one ``agenerate``: the version each was built with, and its tokens."""

    segments: list[tuple[int, int]] = field(default_factory=list)
    """``(version, tokens)`` per answered call, in order."""
    _pending: int | None = None

    def built(self, version: int) -> None:
        """A request is about to go out, built under weight version ``version``."""
        self._pending = int(version)

    def answered(self, tokens: int) -> None:
        """The pending request's answer was parsed; it carried ``tokens`` output tokens."""
        version, self._pending = self._pending, None
        if version is not None:
            self.segments.append((version, int(tokens)))

    def versions(self) -> list[int]:
        """One version per output token: each call's tokens labelled with its build version."""
        return [version for version, tokens in self.segments for _ in range(tokens)]

    def pinned(self, reported: Sequence[int]) -> list[int]:
        """The versions the tokens were requested under, when the record accounts for exactly
        the ``reported`` tokens; ``reported`` otherwise (an engine that filled no record)."""
        versions = self.versions()
        if not self.segments or len(versions) != len(reported):
            return [int(v) for v in reported]
        return versions


_CURRENT: ContextVar[ServedVersions | None] = ContextVar("cua_served_versions", default=None)


@contextmanager
def served_versions() -> Iterator[ServedVersions]:
    """Record the build version of every request the backends send inside the ``with`` block."""
    record = ServedVersions()
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


def current_served() -> ServedVersions | None:
    """The record of the ``agenerate`` call running in this task, if its caller opened one."""
    return _CURRENT.get()


class PinnedVersions:
    """Mixin for AReaL's remote backends (first in the bases): notes each request's build
    version and its answer's token count in the caller's ``ServedVersions``."""

    def build_generation_request(
        self, req: ModelRequest, with_lora: bool, version: int
    ) -> HttpRequest:
        record = current_served()
        if record is not None:
            record.built(version)
        request: HttpRequest = super().build_generation_request(  # type: ignore[misc]
            req, with_lora, version
        )
        return request

    def parse_generation_response(self, response: dict[str, Any]) -> HttpGenerationResult:
        result: HttpGenerationResult = super().parse_generation_response(  # type: ignore[misc]
            response
        )
        record = current_served()
        if record is not None:
            record.answered(len(result.output_tokens))
        return result
