"""Async client of one desktop that speaks OSWorld's desktop-server API (port 5000 on OSWorld's
VMs; ``osworld_server.py`` here).

Every call has a timeout. Reads (screenshot, accessibility, file, screen size) are retried on
transport errors, timeouts and 5xx; ``/execute`` and ``/setup/*`` never are once sent (a command
could run twice), only when the request never reached the desktop (connect error). A desktop
that cannot be reached raises ``DesktopUnavailable`` (a ``GymError``: infrastructure, the
episode is rejected); a command that ran and failed is an ``ExecResult`` with its return code.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from cua_native.gym.protocol import GymError

log = logging.getLogger(__name__)


class DesktopUnavailable(GymError):
    """The desktop server could not be reached, timed out, or answered an unexpected error."""


@dataclass(frozen=True, slots=True)
class DesktopTimeouts:
    """Seconds per call (``connect`` applies to every call)."""

    connect: float = 5.0
    read: float = 30.0
    """Screenshot, accessibility tree, files, screen size."""
    execute: float = 150.0
    """A command (the server's own limit is 120 s)."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    returncode: int
    output: str
    error: str


class DesktopClient:
    """One desktop server at ``base_url`` (over the Unix socket ``uds`` when given: the host
    part of ``base_url`` is then only a name). Pass ``client`` to share a pool (``aclose`` then
    leaves it open)."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        uds: str | None = None,
        timeouts: DesktopTimeouts = DesktopTimeouts(),
        attempts: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._owns_client = client is None
        transport = httpx.AsyncHTTPTransport(uds=uds) if uds else None
        self._client = client or httpx.AsyncClient(transport=transport)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        read_timeout: float,
        idempotent: bool,
        **kwargs: Any,
    ) -> httpx.Response:
        timeout = httpx.Timeout(read_timeout, connect=self.timeouts.connect)
        for attempt in range(1, self.attempts + 1):
            try:
                response = await self._client.request(
                    method, f"{self.base_url}{path}", timeout=timeout, **kwargs
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                error = DesktopUnavailable(f"{path}: cannot reach desktop {self.base_url}: {exc!r}")
                error.__cause__, retry = exc, True
            except httpx.TimeoutException as exc:
                error = DesktopUnavailable(f"{path}: no answer within {read_timeout} s")
                error.__cause__, retry = exc, idempotent
            except httpx.TransportError as exc:
                error = DesktopUnavailable(f"{path}: connection failed mid-request: {exc!r}")
                error.__cause__, retry = exc, idempotent
            else:
                if response.status_code < 500:
                    return response
                error = DesktopUnavailable(
                    f"{path}: HTTP {response.status_code}: {response.text[:300]}"
                )
                retry = idempotent
            if not retry or attempt == self.attempts:
                raise error
            log.info("%s failed (attempt %d/%d), retrying: %s", path, attempt, self.attempts, error)
            await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    async def screenshot(self) -> bytes:
        response = await self._request(
            "GET", "/screenshot", read_timeout=self.timeouts.read, idempotent=True
        )
        if response.status_code != 200 or not response.content.startswith(b"\x89PNG"):
            raise DesktopUnavailable(f"/screenshot: HTTP {response.status_code}, no PNG")
        return response.content

    async def screen_size(self) -> tuple[int, int]:
        response = await self._request(
            "POST", "/screen_size", read_timeout=self.timeouts.read, idempotent=True
        )
        data = _json(response, "/screen_size")
        try:
            return int(data["width"]), int(data["height"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DesktopUnavailable(f"/screen_size: unexpected answer {data!r}") from exc

    async def accessibility(self) -> str:
        """The accessibility tree as OSWorld's ``{"AT": xml}`` gives it."""
        response = await self._request(
            "GET", "/accessibility", read_timeout=self.timeouts.read, idempotent=True
        )
        data = _json(response, "/accessibility")
        tree = data.get("AT") if isinstance(data, dict) else None
        if not isinstance(tree, str):
            raise DesktopUnavailable("/accessibility: answer has no 'AT' string")
        return tree

    async def file(self, path: str) -> bytes | None:
        """The file's bytes, ``None`` when the desktop says it does not exist (404)."""
        response = await self._request(
            "POST",
            "/file",
            read_timeout=self.timeouts.read,
            idempotent=True,
            data={"file_path": path},
        )
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise DesktopUnavailable(f"/file: HTTP {response.status_code}: {response.text[:200]}")
        return response.content

    async def execute(
        self, command: list[str] | str, *, shell: bool = False, route: str = "/execute"
    ) -> ExecResult:
        """Run a command on the desktop and wait for it (never retried once sent)."""
        response = await self._request(
            "POST",
            route,
            read_timeout=self.timeouts.execute,
            idempotent=False,
            json={"command": command, "shell": shell},
        )
        data = _json(response, route)
        if response.status_code != 200 or not isinstance(data, dict):
            raise DesktopUnavailable(f"{route}: HTTP {response.status_code}: {data!r}"[:300])
        return ExecResult(
            int(data.get("returncode", -1)), str(data.get("output", "")), str(data.get("error", ""))
        )

    async def launch(self, command: list[str] | str, *, shell: bool = False) -> None:
        response = await self._request(
            "POST",
            "/setup/launch",
            read_timeout=self.timeouts.read,
            idempotent=False,
            json={"command": command, "shell": shell},
        )
        if response.status_code != 200:
            raise DesktopUnavailable(f"/setup/launch: HTTP {response.status_code}")

    async def upload(self, path: str, data: bytes) -> None:
        response = await self._request(
            "POST",
            "/setup/upload",
            read_timeout=self.timeouts.read,
            idempotent=True,
            data={"file_path": path},
            files={"file_data": ("file", data)},
        )
        if response.status_code != 200:
            raise DesktopUnavailable(f"/setup/upload: HTTP {response.status_code}")

    async def window(self, route: str, name: str, *, strict: bool = False) -> bool:
        """``/setup/activate_window`` or ``/setup/close_window``: ``False`` when no window
        matches ``name``."""
        response = await self._request(
            "POST",
            route,
            read_timeout=self.timeouts.read,
            idempotent=True,
            json={"window_name": name, "strict": strict},
        )
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            raise DesktopUnavailable(f"{route}: HTTP {response.status_code}")
        return True

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _json(response: httpx.Response, route: str) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise DesktopUnavailable(f"{route}: answer is not JSON: {response.text[:200]}") from exc
