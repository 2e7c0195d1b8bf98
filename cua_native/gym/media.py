"""Allow-listed fetching of screenshot URLs (no SSRF).

Rules, checked on the first URL and again on every redirect hop:
- scheme must be ``http`` or ``https``;
- the host must be allow-listed: an entry matches the host exactly (case-insensitive), an entry
  ``*.example.com`` matches any subdomain of ``example.com`` (the same list vLLM gets as
  ``--allowed-media-domains``);
- the host must not resolve to a private, loopback, link-local, reserved or multicast address
  unless it is listed *exactly* (e.g. ``127.0.0.1`` for a local test server): a wildcard entry
  never opens the internal network.
The answer body is capped (``max_bytes``) and the whole fetch runs under one deadline. Residual
risk: DNS could change between our resolution and httpx's (rebinding); exact listing of public
object-store hosts keeps that window to hosts the operator trusts.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urljoin, urlsplit

import httpx

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
MAX_REDIRECTS = 3


class MediaFetchError(ValueError):
    """A media URL could not be fetched (HTTP error, too large, timeout, unreachable)."""


class MediaNotAllowed(MediaFetchError):
    """A media URL is refused by policy (scheme, host allow-list, internal address)."""


def _normalise_host(host: str) -> str:
    return host.strip().lower().rstrip(".").strip("[]")


def check_url_allowed(url: str, allowed_domains: Sequence[str]) -> tuple[str, bool]:
    """Check scheme and host of ``url``; returns ``(host, listed_exactly)``.

    Raises ``MediaNotAllowed`` with the reason.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise MediaNotAllowed(f"scheme {parts.scheme!r} is not allowed (only http/https): {url!r}")
    if parts.username or parts.password:
        raise MediaNotAllowed(f"credentials in media URLs are not allowed: {parts.hostname!r}")
    host = _normalise_host(parts.hostname or "")
    if not host:
        raise MediaNotAllowed(f"media URL has no host: {url!r}")
    entries = [_normalise_host(d) for d in allowed_domains if d and d.strip()]
    if host in entries:
        return host, True
    for entry in entries:
        if entry.startswith("*.") and host.endswith(entry[1:]):
            return host, False
    raise MediaNotAllowed(f"host {host!r} is not in the allowed media domains {sorted(entries)}")


def is_internal_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )


def check_addresses(host: str, addresses: Iterable[str], listed_exactly: bool) -> None:
    """Refuse a host that resolves to an internal address unless it is listed exactly."""
    if listed_exactly:
        return
    internal = sorted({a for a in addresses if is_internal_address(a)})
    if internal:
        raise MediaNotAllowed(
            f"host {host!r} resolves to internal address(es) {internal}; list it exactly to allow"
        )


async def _resolve(host: str, port: int) -> list[str]:
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise MediaFetchError(f"cannot resolve media host {host!r}: {exc}") from exc
    return [str(info[4][0]) for info in infos]


async def _check(url: str, allowed_domains: Sequence[str]) -> None:
    host, exact = check_url_allowed(url, allowed_domains)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    check_addresses(host, await _resolve(host, port), exact)


async def fetch_image_url(
    client: httpx.AsyncClient,
    url: str,
    allowed_domains: Sequence[str],
    timeout: float,  # noqa: ASYNC109 - the contract others call; enforced with asyncio.timeout
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> bytes:
    """The bytes at ``url`` (an image), after the policy checks above, within ``timeout`` s."""
    try:
        async with asyncio.timeout(timeout):
            return await _fetch(client, url, allowed_domains, timeout, max_bytes)
    except TimeoutError as exc:
        raise MediaFetchError(f"fetching {url!r} took longer than {timeout} s") from exc


async def _fetch(
    client: httpx.AsyncClient,
    url: str,
    allowed_domains: Sequence[str],
    request_timeout: float,
    max_bytes: int,
) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        await _check(url, allowed_domains)
        try:
            async with client.stream(
                "GET", url, timeout=request_timeout, follow_redirects=False
            ) as response:
                if response.is_redirect:
                    location = response.headers.get("location")
                    if not location:
                        raise MediaFetchError(f"redirect without a Location from {url!r}")
                    url = urljoin(url, location)
                    continue
                if response.status_code != 200:
                    raise MediaFetchError(
                        f"media URL answered HTTP {response.status_code}: {url!r}"
                    )
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > max_bytes:
                    raise MediaFetchError(f"media is {declared} bytes, over the {max_bytes} cap")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise MediaFetchError(f"media is over the {max_bytes} byte cap: {url!r}")
                    chunks.append(chunk)
                data = b"".join(chunks)
                if not data:
                    raise MediaFetchError(f"media URL returned no bytes: {url!r}")
                return data
        except httpx.HTTPError as exc:
            raise MediaFetchError(f"fetching {url!r} failed: {exc!r}") from exc
    raise MediaFetchError(f"more than {MAX_REDIRECTS} redirects fetching media")
