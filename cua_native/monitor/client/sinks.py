"""Where ingest batches go: the SQL store in-process, or a Training Monitor over HTTP.

A sink sends one batch and answers the ingest result (``training_id`` and ``{kind: [{client_id,
id}]}``). It raises ``SinkUnavailable`` when the batch may succeed later (timeout, connection
refused, 5xx, bad token) and ``SinkRejected`` when this batch will never be accepted (validation
error, unknown parent). Retrying, spilling and id resolution live in ``spill.SinkChannel``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from cua_native.monitor.ingest import IngestError


def check_monitor_url(url: str) -> str:
    """The base URL of a Training Monitor, or ``ValueError`` saying what is wrong with it."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"a monitor URL must look like http(s)://host[:port][/path], not {url!r}")
    if parsed.query or parsed.fragment:
        raise ValueError(f"a monitor URL takes no query or fragment: {url!r}")
    return url.rstrip("/")


class SinkUnavailable(Exception):
    """The sink cannot take the batch now; send it again later."""


class SinkRejected(Exception):
    """The sink will never accept this batch as it is."""


class SinkHalted(SinkUnavailable):
    """The sink refuses us as a whole (wrong token, no permission): nothing is sent until the
    configuration is fixed; records are kept for ``python -m cua_native.monitor drain``."""


def destination_id(kind: str, url: str) -> str:
    """A file-name-safe name for one destination (the spill and id-map files are keyed by it,
    so a run directory used with two monitors or two databases never mixes their ids)."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return f"{kind}-{digest}"


class Sink(Protocol):
    name: str
    """Short label for logs and stats (``sql``, ``http``)."""
    destination: str
    """Stable id of where the records go (``destination_id``): names the spill files."""
    address: str
    """Where the records go, without secrets (shown to the user, kept in the spill's meta)."""
    accepts_client_refs: bool
    """True when parents may be named by ``<ref>_client_id`` (the store resolves them)."""
    contract_only: bool
    """True when batches must hold only what the existing monitor's client sends (no
    ``client_id`` on the training, actions, observations and validations; step/eval/baseline
    client ids built on the remote training id)."""

    async def send(self, batch: dict[str, Any]) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


class SqlSink:
    """Writes batches to a ``MonitorStore`` (SQLite or PostgreSQL) on the store's own thread."""

    accepts_client_refs = True
    contract_only = False

    def __init__(self, store: Any, *, name: str = "sql", owns_store: bool = True) -> None:
        self.store = store
        self.name = name
        self._owns_store = owns_store
        self.address = store.engine.url.render_as_string(hide_password=True)
        self.destination = destination_id("sql", self.address)

    async def send(self, batch: dict[str, Any]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await self.store.aingest(batch)
        except (IngestError, ValidationError) as exc:
            raise SinkRejected(str(exc)) from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # database down, locked, disk full: all may pass
            raise SinkUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return result

    async def aclose(self) -> None:
        if self._owns_store:
            await asyncio.to_thread(self.store.close)


class HttpSink:
    """``POST {base_url}/api/ingest/batch`` with ``Authorization: Bearer <token>``.

    By default parents are sent as remote ids (what the existing Training Monitor understands);
    ``client_refs=True`` names them by client id instead (the cua_native dashboard accepts both).
    The JSON body is encoded in a worker thread: batches with token logprobs and screenshots are
    large, and encoding them must not hold the event loop.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float = 10.0,
        name: str = "http",
        client_refs: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        max_body_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.name = name
        self.accepts_client_refs = client_refs
        self.contract_only = not client_refs
        self.max_body_bytes = max_body_bytes
        self.address = check_monitor_url(base_url)
        self.destination = destination_id("http", self.address)
        self.url = self.address + "/api/ingest/batch"
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout), transport=transport
        )

    async def send(self, batch: dict[str, Any]) -> dict[str, Any]:
        body = await asyncio.to_thread(_encode, batch)
        if len(body) > self.max_body_bytes:
            raise SinkRejected(f"batch of {len(body)} bytes is over {self.max_body_bytes}")
        try:
            response = await self._client.post(self.url, content=body)
        except httpx.HTTPError as exc:  # timeouts, refused connections, protocol errors
            raise SinkUnavailable(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status in (401, 403):
            raise SinkHalted(f"HTTP {status}: {response.text[:500]}")
        if status >= 500 or status in (404, 408, 409, 425, 429):
            raise SinkUnavailable(f"HTTP {status}: {response.text[:500]}")
        if status >= 400:
            raise SinkRejected(f"HTTP {status}: {response.text[:2000]}")
        try:
            answer = response.json()
        except ValueError as exc:
            raise SinkUnavailable(f"HTTP {status}: answer is not JSON") from exc
        if not isinstance(answer, dict):
            raise SinkUnavailable(f"HTTP {status}: answer is not a JSON object")
        return answer

    async def aclose(self) -> None:
        await self._client.aclose()


def _encode(batch: dict[str, Any]) -> bytes:
    return json.dumps(batch, separators=(",", ":"), ensure_ascii=False).encode()


def id_pairs(
    kind: str,
    sent_client_ids: list[str],
    answer: dict[str, Any],
    wire_ids: list[str | None] | None = None,
) -> list[tuple[str, int]]:
    """The ``(client_id, id)`` pairs an answer gives for one array kind, keyed by the client ids
    we hold (``sent_client_ids``) even where the wire carried another (``wire_ids``).

    An answer entry naming a client id is matched by it; one without (the existing monitor's
    actions, observations, validations) is taken in the order the records were sent."""
    entries = answer.get(kind)
    if not isinstance(entries, list):
        return []
    wire = wire_ids if wire_ids is not None else list(sent_client_ids)
    by_wire = {w: own for w, own in zip(wire, sent_client_ids, strict=False) if w is not None}
    pairs: list[tuple[str, int]] = []
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), int):
            continue
        named = entry.get("client_id")
        if isinstance(named, str):
            own = by_wire.get(named)
        elif position < len(sent_client_ids):
            own = sent_client_ids[position]
        else:
            own = None
        if own is not None:
            pairs.append((own, entry["id"]))
    return pairs
