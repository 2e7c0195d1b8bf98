from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.service.dashboard.app import create_app
from cua_native.monitor.service.dashboard.overlay import shapes_for
from cua_native.monitor.service.dashboard.plots import Series, line_chart

from .conftest import TOKEN, realistic_batch  # type: ignore[import-not-found]

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def client_for(store: MonitorStore, token: str | None = TOKEN) -> TestClient:
    return TestClient(create_app(store, token=token))


def test_every_page_renders(filled_store: tuple[MonitorStore, dict[str, Any]]) -> None:
    store, answer = filled_store
    client = client_for(store)
    home = client.get("/", headers=AUTH)
    assert home.status_code == 200 and "demo-run" in home.text
    training = client.get(f"/trainings/{answer['training_id']}", headers=AUTH)
    assert training.status_code == 200
    assert training.text.count('<svg class="chart"') >= 3  # reward, success, loss/KL
    assert "polyline" in training.text
    step = client.get(f"/steps/{answer['steps'][0]['id']}", headers=AUTH)
    assert step.status_code == 200 and "Turn on Wi-Fi" in step.text and "success" in step.text
    rollout_id = answer["rollouts"][0]["id"]
    page = client.get(f"/rollouts/{rollout_id}", headers=AUTH)
    assert page.status_code == 200
    assert page.text.count('class="screenshot"') == 3
    assert 'class="point" data-action="click" cx="90.0" cy="320.0"' in page.text
    assert (
        'class="arrow" data-action="swipe" x1="180.0" y1="512.0" x2="180.0" y2="128.0"' in page.text
    )
    assert ">hello world</text>" in page.text
    assert "5 tokens with log-probs" in page.text and "hsl(" in page.text
    assert "wifi_enabled" in page.text
    shot = re.search(r'src="(/screenshots/[^"]+)"', page.text)
    assert shot is not None
    image = client.get(shot.group(1), headers=AUTH)
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    for missing in (
        "/trainings/999",
        "/steps/999",
        "/evals/999",
        "/baselines/999",
        "/rollouts/999",
    ):
        assert client.get(missing, headers=AUTH).status_code == 404


def test_pages_survive_missing_optional_fields(tmp_path: Any) -> None:
    store = MonitorStore.open(None, run_dir=tmp_path)
    try:
        answer = store.ingest(
            {
                "training": {
                    "client_id": "t",
                    "run_name": "bare",
                    "log_path": "",
                    "model_name": "m",
                },
                "tasks": [{"client_id": "k", "task_id": "k", "name": "n", "description": "d"}],
                "evals": [
                    {"client_id": "e", "training_client_id": "t", "step": 3, "model_path": "m"}
                ],
                "rollouts": [
                    {
                        "client_id": "r",
                        "rollout_id": "r",
                        "eval_client_id": "e",
                        "task_client_id": "k",
                        "model_path": "m",
                    }
                ],
                "turns": [{"client_id": "r1", "rollout_client_id": "r", "turn": 1}],
                "actions": [{"client_id": "a", "turn_client_id": "r1", "tool_args": "not json"}],
            }
        )
        client = client_for(store, token=None)
        assert "bare" in client.get("/").text
        assert client.get(f"/trainings/{answer['training_id']}").status_code == 200
        assert client.get(f"/evals/{answer['evals'][0]['id']}").status_code == 200
        page = client.get(f"/rollouts/{answer['rollouts'][0]['id']}")
        assert page.status_code == 200 and "no screenshot" in page.text
    finally:
        store.close()


def test_token_guards_pages_and_sets_cookie(
    filled_store: tuple[MonitorStore, dict[str, Any]],
) -> None:
    store, _ = filled_store
    client = client_for(store)
    assert client.get("/").status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    first = client.get(f"/trainings/1?token={TOKEN}&x=1", follow_redirects=False)
    assert first.status_code == 303 and "cua_monitor_token" in first.headers["set-cookie"]
    assert first.headers["location"] == "/trainings/1?x=1"  # the token leaves the address
    assert client.get("/").status_code == 200  # the cookie now authorizes


def test_screenshot_path_traversal_is_refused(
    filled_store: tuple[MonitorStore, dict[str, Any]],
) -> None:
    store, _ = filled_store
    (store.run_dir / "secret.png").write_bytes(b"\x89PNG secret")
    client = client_for(store)
    for path in (
        "/screenshots/../secret.png",
        "/screenshots/%2e%2e/secret.png",
        "/screenshots/..%2fmonitor.db",
    ):
        response = client.get(path, headers=AUTH)
        assert response.status_code == 404, path
        assert b"PNG secret" not in response.content


def test_ingest_endpoint_requires_bearer(tmp_path: Any) -> None:
    store = MonitorStore.open(None, run_dir=tmp_path)
    try:
        batch = realistic_batch()
        assert (
            client_for(store, token=None).post("/api/ingest/batch", json=batch).status_code == 403
        )
        client = client_for(store)
        assert client.post("/api/ingest/batch", json=batch).status_code == 401
        client.get(f"/?token={TOKEN}")  # a page cookie must not authorize ingest
        assert client.post("/api/ingest/batch", json=batch).status_code == 401
        ok = client.post("/api/ingest/batch", json=batch, headers=AUTH)
        assert ok.status_code == 200
        body = ok.json()
        assert isinstance(body["training_id"], int)
        assert [m["client_id"] for m in body["turns"]] == ["ro-1:1", "ro-1:2", "ro-1:3"]
        again = client.post(
            "/api/ingest/batch",
            json={"rollouts": [{"client_id": "ro-1", "status_message": "again"}]},
            headers=AUTH,
        )
        assert again.json()["rollouts"] == body["rollouts"]
        bad = client.post(
            "/api/ingest/batch",
            json={"turns": [{"client_id": "x", "rollout_client_id": "missing", "turn": 1}]},
            headers=AUTH,
        )
        assert bad.status_code == 422 and "missing" in bad.json()["error"]
    finally:
        store.close()


def test_overlay_shapes() -> None:
    assert shapes_for("long_press", {"x": 0.5, "y": 0.5}, 100, 200)[0].y == 100.0
    swipe = shapes_for("swipe", {"direction": "up"}, 100, 100)[0]
    assert (swipe.x, swipe.y, swipe.x2, swipe.y2) == (50.0, 50.0, 50.0, 20.0)
    assert shapes_for("click", {"x": "bad"}, 100, 100) == []
    assert shapes_for("click", "not a dict", 100, 100) == []


def test_line_chart_handles_empty_and_single_points() -> None:
    assert "no data yet" in line_chart("reward", [Series("r", [])])
    svg = line_chart("reward", [Series("r", [(1, 0.5)])])
    assert svg.startswith("<svg") and "<circle" in svg


def test_eval_chart_shows_baseline_and_evals_with_task_intervals() -> None:
    from types import SimpleNamespace

    from cua_native.monitor.service.dashboard.plots import eval_chart

    data = {
        "baselines": [SimpleNamespace(id=1, step=None, success_rate=0.25)],
        "evals": [SimpleNamespace(id=7, step=3, success_rate=0.5)],
        "outcomes": {
            ("baseline", 1): {"a": [True, False], "b": [False, False]},
            ("eval", 7): {"a": [True, True], "b": [False, True]},
        },
    }
    svg = eval_chart(data)
    assert svg is not None and svg.count('class="interval"') == 2
    assert "baseline @ -1" in svg and "eval @ 3" in svg and "95% CI" in svg
    assert eval_chart({"baselines": [], "evals": [], "outcomes": {}}) is None
