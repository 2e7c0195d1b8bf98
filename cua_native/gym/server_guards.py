"""Abuse limits of the gym server: its settings, bearer auth and a request-body cap (ASGI).

Both middlewares answer FastAPI-style ``{"detail": ...}`` JSON before any route runs:
- ``BearerAuth``: 401 unless ``Authorization: Bearer <token>`` matches (constant-time compare);
- ``BodyLimit``: 413 when ``Content-Length`` or the streamed body exceeds ``max_body_bytes``.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_LIVE = 256
DEFAULT_IDLE_TTL_S = 1800.0
DEFAULT_MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one gym server holds at most (``docs/gym_protocol.md`` § "Limits").

    ``max_live``: executions live or being created; a create beyond it is answered 429.
    ``idle_ttl_s``: an execution no call touched for this long is closed by the reaper (a
    killed client's executions do not live forever); ``None`` disables the reaper.
    ``max_body_bytes``: larger request bodies are answered 413 before they are read whole.
    ``auth_token``: when set, every route needs ``Authorization: Bearer <auth_token>``.
    ``reap_interval_s``: how often the reaper looks (default: a quarter of the TTL, at most 60 s).
    """

    max_live: int = DEFAULT_MAX_LIVE
    idle_ttl_s: float | None = DEFAULT_IDLE_TTL_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    auth_token: str | None = None
    reap_interval_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_live < 1:
            raise ValueError(f"max_live must be at least 1, got {self.max_live}")
        if self.idle_ttl_s is not None and not self.idle_ttl_s > 0:
            raise ValueError(f"idle_ttl_s must be positive, got {self.idle_ttl_s}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ValueError("auth_token must not be empty")

    @property
    def reap_every_s(self) -> float | None:
        if self.idle_ttl_s is None:
            return None
        return self.reap_interval_s or min(60.0, self.idle_ttl_s / 4)


async def send_detail(
    send: Send, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """Answer ``{"detail": detail}`` with ``status``."""
    body = json.dumps({"detail": detail}).encode()
    all_headers = [(b"content-type", b"application/json"), *headers]
    all_headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """Refuses HTTP requests without the right bearer token (401)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            detail = "missing or wrong bearer token: send 'Authorization: Bearer <token>'"
            await send_detail(send, 401, detail, ((b"www-authenticate", b"Bearer"),))
            return
        await self.app(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes (413), by header or while streaming."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _detail(self) -> str:
        return f"request body larger than {self.limit} bytes (the server's max_body_bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await send_detail(send, 413, self._detail())
            return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _BodyTooLarge:
            if not started:
                await send_detail(send, 413, self._detail())
