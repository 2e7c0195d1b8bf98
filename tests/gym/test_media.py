"""Allow-listed screenshot URL fetching against a real loopback server."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

from cua_native.gym.media import (
    MediaFetchError,
    MediaNotAllowed,
    check_addresses,
    check_url_allowed,
    fetch_image_url,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def _media_app() -> FastAPI:
    app = FastAPI()

    @app.get("/shot.png")
    async def shot() -> Response:
        return Response(PNG, media_type="image/png")

    @app.get("/big.png")
    async def big() -> Response:
        return Response(b"x" * 5000, media_type="image/png")

    @app.get("/missing.png")
    async def missing() -> Response:
        return Response(b"nope", status_code=404)

    @app.get("/to-other")
    async def to_other() -> RedirectResponse:
        return RedirectResponse("http://localhost:1/secret")

    @app.get("/to-self")
    async def to_self() -> RedirectResponse:
        return RedirectResponse("/shot.png")

    return app


def test_policy_checks() -> None:
    assert check_url_allowed("https://a.example.com/x.png", ["A.example.com"]) == (
        "a.example.com",
        True,
    )
    assert check_url_allowed("https://b.a.example.com/x", ["*.example.com"]) == (
        "b.a.example.com",
        False,
    )
    refused = [
        ("file:///etc/passwd", ["example.com"], "scheme"),
        ("gopher://example.com/", ["example.com"], "scheme"),
        ("https://evil.com/x.png", ["example.com"], "not in the allowed"),
        ("https://example.com.evil.com/x", ["example.com"], "not in the allowed"),
        ("https://example.com/x", ["*.example.com"], "not in the allowed"),
        ("https://user:pw@example.com/x", ["example.com"], "credentials"),
        ("http:///x", ["example.com"], "no host"),
    ]
    for url, allowed, reason in refused:
        with pytest.raises(MediaNotAllowed, match=reason):
            check_url_allowed(url, allowed)
    with pytest.raises(MediaNotAllowed, match="internal"):
        check_addresses("x.example.com", ["93.184.216.34", "10.0.0.5"], listed_exactly=False)
    with pytest.raises(MediaNotAllowed, match="internal"):
        check_addresses("x.example.com", ["::ffff:127.0.0.1"], listed_exactly=False)
    check_addresses("x.example.com", ["93.184.216.34"], listed_exactly=False)
    check_addresses("127.0.0.1", ["127.0.0.1"], listed_exactly=True)


async def test_fetch_over_loopback(serve) -> None:
    async with serve(_media_app()) as url, httpx.AsyncClient() as client:
        assert await fetch_image_url(client, f"{url}/shot.png", ["127.0.0.1"], 5.0) == PNG
        assert await fetch_image_url(client, f"{url}/to-self", ["127.0.0.1"], 5.0) == PNG
        with pytest.raises(MediaNotAllowed, match="not in the allowed"):
            await fetch_image_url(client, f"{url}/shot.png", ["example.com"], 5.0)
        with pytest.raises(MediaNotAllowed, match="localhost"):
            await fetch_image_url(client, f"{url}/to-other", ["127.0.0.1"], 5.0)
        with pytest.raises(MediaFetchError, match="HTTP 404"):
            await fetch_image_url(client, f"{url}/missing.png", ["127.0.0.1"], 5.0)
        with pytest.raises(MediaFetchError, match="cap"):
            await fetch_image_url(client, f"{url}/big.png", ["127.0.0.1"], 5.0, max_bytes=1000)
