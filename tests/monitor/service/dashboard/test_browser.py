"""The rollout page in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

In CI (``CI`` set) a missing browser fails the test instead of skipping it."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.service.dashboard.app import create_app

from .conftest import TOKEN  # type: ignore[import-not-found]

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CUA_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PAGE_SHOT = Path(os.environ.get("CUA_TEST_PAGE_SHOT", "/tmp/cua_monitor_rollout_page.png"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def server(
    filled_store: tuple[MonitorStore, dict[str, Any]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    store, answer = filled_store
    port = _free_port()
    config = uvicorn.Config(
        create_app(store, token=TOKEN), host="127.0.0.1", port=port, log_level="warning"
    )
    uv_server = uvicorn.Server(config)
    thread = threading.Thread(target=uv_server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120  # generous: CI machines are busy
        while not uv_server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("dashboard server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", answer
    finally:
        uv_server.should_exit = True
        thread.join(timeout=10)


def _require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"chromium not found at {CHROMIUM} (source .ci/services.sh)")
        pytest.skip(f"chromium not found at {CHROMIUM} (apt-get install chromium)")


def test_rollout_page_in_chromium(server: tuple[str, dict[str, Any]]) -> None:
    _require_chromium()
    from playwright.sync_api import sync_playwright

    base, answer = server
    rollout_id = answer["rollouts"][0]["id"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(f"{base}/rollouts/{rollout_id}?token={TOKEN}", wait_until="load")
            images = page.locator("img.screenshot")
            assert images.count() == 3
            for index in range(3):
                natural = images.nth(index).evaluate("img => img.complete && img.naturalWidth")
                assert natural == 360

            def centre_in_image(turn: int, selector: str) -> tuple[float, float]:
                image = page.locator(f"#turn-{turn} img.screenshot").bounding_box()
                shape = page.locator(f"#turn-{turn} {selector}").bounding_box()
                assert image is not None and shape is not None
                return (
                    (shape["x"] + shape["width"] / 2 - image["x"]) / image["width"],
                    (shape["y"] + shape["height"] / 2 - image["y"]) / image["height"],
                )

            click = centre_in_image(1, "circle.point")
            assert click == pytest.approx((0.25, 0.5), abs=0.01)
            swipe = page.locator("#turn-2 line.arrow")
            assert swipe.get_attribute("y1") == "512.0" and swipe.get_attribute("y2") == "128.0"
            assert centre_in_image(2, "line.arrow") == pytest.approx((0.5, 0.5), abs=0.02)
            caption = page.locator("#turn-3 text.caption")
            assert caption.text_content() == "hello world"
            assert centre_in_image(3, "text.caption")[1] > 0.8
            page.locator("#turn-1 details.tokens summary").click()
            assert page.locator("#turn-1 span.tok").first.is_visible()
            page.screenshot(path=str(PAGE_SHOT), full_page=True)
        finally:
            browser.close()
    assert PAGE_SHOT.stat().st_size > 0
