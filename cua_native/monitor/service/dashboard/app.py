"""FastAPI app: server-rendered pages over a ``MonitorStore`` and ``POST /api/ingest/batch``.

Page handlers are plain ``def`` functions, so FastAPI runs their DB queries in its thread pool,
never on the event loop. With a token, every request needs it: ``Authorization: Bearer <t>``,
the cookie that ``?token=<t>`` sets, or the query itself. Ingest accepts only the bearer header and
is refused when the server has no token. A body the parser cannot read (not JSON, or nested
beyond its recursion limit) is answered 400/422 with one line, never 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.ingest import MAX_DEPTH, IngestError
from cua_native.monitor.screenshots import MEDIA_TYPES, ScreenshotError
from cua_native.monitor.service.dashboard import queries
from cua_native.monitor.service.dashboard.plots import Series, eval_chart, line_chart

HERE = Path(__file__).resolve().parent
TOKEN_COOKIE = "cua_monitor_token"
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Twice what the recorder's HTTP sink sends at most (``HttpSink.max_body_bytes``)."""
INGEST_PATH = "/api/ingest/batch"


class AccessLogRedactor(logging.Filter):
    """Masks ``token=`` values in uvicorn's access-log lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN_QUERY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args
            )
        return True


_TOKEN_QUERY = re.compile(r"((?:^|[?&])token=)[^&\s]*")


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _matches(given: str | None, token: str) -> bool:
    return given is not None and secrets.compare_digest(given.encode(), token.encode())


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["fromjson"] = queries.loads
    templates.env.filters["num"] = lambda v, digits=3: "—" if v is None else f"{v:.{digits}g}"
    templates.env.filters["ts"] = lambda v: "—" if v is None else v.strftime("%Y-%m-%d %H:%M:%S")
    return templates


def _too_large(limit: int) -> Response:
    return JSONResponse({"error": f"body over {limit} bytes"}, status_code=413)


MAX_ID = 2**63 - 1


def _check_id(value: int) -> None:
    """Ids beyond the databases' integers are simply not there (not a 500)."""
    if not 0 < value <= MAX_ID:
        raise HTTPException(404, "no such record")


def create_app(
    store: MonitorStore, token: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    """The dashboard over ``store``; ``token`` protects every page and enables ingest.

    A page opened with ``?token=`` sets the cookie and is redirected to the same address
    without it, so the token does not stay in the address bar, history or later access-log
    lines (``AccessLogRedactor`` masks it in the first one)."""
    app = FastAPI(title="cua_native Training Monitor", docs_url=None, redoc_url=None)
    templates = _templates()
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    @app.middleware("http")
    async def _auth(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if token is None or request.url.path == INGEST_PATH:
            return await call_next(request)
        query_token = request.query_params.get("token")
        if _matches(query_token, token):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return response
        if _matches(_bearer(request), token) or _matches(request.cookies.get(TOKEN_COOKIE), token):
            return await call_next(request)
        return JSONResponse({"error": "missing or wrong access token"}, status_code=401)

    def page(request: Request, name: str, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, context)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/")
    def trainings_page(request: Request) -> Response:
        with store.session() as session:
            rows = queries.trainings(session)
        return page(request, "trainings.html", rows=rows)

    @app.get("/trainings/{training_id}")
    def training_page(request: Request, training_id: int) -> Response:
        _check_id(training_id)
        with store.session() as session:
            data = queries.training(session, training_id)
        if data is None:
            raise HTTPException(404, f"no training {training_id}")
        steps = data["steps"]
        charts = [
            line_chart(
                "reward mean",
                [
                    Series(
                        "reward mean",
                        [(s.step, s.reward_mean) for s in steps if s.reward_mean is not None],
                    )
                ],
            ),
            line_chart(
                "success rate",
                [
                    Series(
                        "success rate",
                        [(s.step, data["success"][s.id]) for s in steps if s.id in data["success"]],
                    )
                ],
            ),
        ]
        losses = [(s.step, s.loss) for s in steps if s.loss is not None]
        kls = [(s.step, s.kl_divergence) for s in steps if s.kl_divergence is not None]
        if losses or kls:
            charts.append(line_chart("loss / KL", [Series("loss", losses), Series("KL", kls)]))
        evaluation = eval_chart(data)
        if evaluation is not None:
            charts.append(evaluation)
        return page(request, "training.html", charts=[Markup(c) for c in charts], **data)

    def source_page(request: Request, kind: str, source_id: int) -> Response:
        _check_id(source_id)
        with store.session() as session:
            data = queries.source(session, kind, source_id)
        if data is None:
            raise HTTPException(404, f"no {kind} {source_id}")
        return page(request, "source.html", **data)

    @app.get("/{training_id:int}")
    def training_link(training_id: int) -> Response:
        """The link the existing monitor's client logs: ``{base}/{training_id}?project_id=…``."""
        _check_id(training_id)
        return RedirectResponse(f"/trainings/{training_id}", status_code=307)

    @app.get("/steps/{source_id}")
    def step_page(request: Request, source_id: int) -> Response:
        return source_page(request, "step", source_id)

    @app.get("/evals/{source_id}")
    def eval_page(request: Request, source_id: int) -> Response:
        return source_page(request, "eval", source_id)

    @app.get("/baselines/{source_id}")
    def baseline_page(request: Request, source_id: int) -> Response:
        return source_page(request, "baseline", source_id)

    @app.get("/rollouts/{rollout_id}")
    def rollout_page(request: Request, rollout_id: int) -> Response:
        _check_id(rollout_id)
        with store.session() as session:
            data = queries.rollout(session, rollout_id)
        if data is None:
            raise HTTPException(404, f"no rollout {rollout_id}")
        return page(request, "rollout.html", **data)

    @app.get("/screenshots/{relative:path}")
    def screenshot(relative: str) -> Response:
        try:
            path = store.screenshots.resolve(f"screenshots/{relative}")
        except (ScreenshotError, ValueError, OSError) as exc:  # NUL bytes, odd names
            raise HTTPException(404, "not a stored screenshot") from exc
        return FileResponse(
            path,
            media_type=MEDIA_TYPES[path.suffix],
            headers={"Cache-Control": "public, max-age=31536000, immutable"},
        )

    @app.post(INGEST_PATH)
    async def ingest(request: Request) -> Response:
        """Token first, then the body (capped at ``max_body_bytes``, read as it streams), then
        JSON parsing and the store, both off the event loop."""
        if token is None:
            return JSONResponse(
                {"error": "ingest is disabled: start the server with --token"}, status_code=403
            )
        if not _matches(_bearer(request), token):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            return _too_large(max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                return _too_large(max_body_bytes)
            chunks.append(chunk)
        try:
            batch = await asyncio.to_thread(json.loads, b"".join(chunks))
        except ValueError as exc:
            return JSONResponse({"error": f"body is not JSON: {exc}"}, status_code=400)
        except RecursionError:  # the parser's own limit, far beyond the contract's
            return JSONResponse(
                {"error": f"body nests JSON deeper than a record may ({MAX_DEPTH} levels)"},
                status_code=422,
            )
        if not isinstance(batch, dict):
            return JSONResponse({"error": "body must be a JSON object"}, status_code=422)
        try:
            answer = await store.aingest(batch)
        except IngestError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        return JSONResponse(answer)

    return app
