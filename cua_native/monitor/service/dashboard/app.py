"""FastAPI app: server-rendered pages over a ``MonitorStore`` and ``POST /api/ingest/batch``.

Page handlers are plain ``def`` functions, so FastAPI runs their DB queries in its thread pool,
never on the event loop. With a token, every request needs it: ``Authorization: Bearer <t>``,
the cookie that ``?token=<t>`` sets, or the query itself. Ingest accepts only the bearer header and
is refused when the server has no token.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import Body, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from cua_native.monitor.ingest import IngestError
from cua_native.monitor.screenshots import MEDIA_TYPES, ScreenshotError
from cua_native.monitor.service.dashboard import queries
from cua_native.monitor.service.dashboard.plots import Series, eval_chart, line_chart
from cua_native.monitor.service.store import MonitorStore

HERE = Path(__file__).resolve().parent
TOKEN_COOKIE = "cua_monitor_token"
INGEST_PATH = "/api/ingest/batch"


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


def create_app(store: MonitorStore, token: str | None = None) -> FastAPI:
    """The dashboard over ``store``; ``token`` protects every page and enables ingest."""
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
            response = await call_next(request)
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
        with store.session() as session:
            data = queries.source(session, kind, source_id)
        if data is None:
            raise HTTPException(404, f"no {kind} {source_id}")
        return page(request, "source.html", **data)

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
        with store.session() as session:
            data = queries.rollout(session, rollout_id)
        if data is None:
            raise HTTPException(404, f"no rollout {rollout_id}")
        return page(request, "rollout.html", **data)

    @app.get("/screenshots/{relative:path}")
    def screenshot(relative: str) -> Response:
        try:
            path = store.screenshots.resolve(f"screenshots/{relative}")
        except ScreenshotError as exc:
            raise HTTPException(404, str(exc)) from exc
        return FileResponse(
            path,
            media_type=MEDIA_TYPES[path.suffix],
            headers={"Cache-Control": "public, max-age=31536000, immutable"},
        )

    @app.post(INGEST_PATH)
    def ingest(request: Request, batch: dict[str, Any] = Body(...)) -> Response:  # noqa: B008
        if token is None:
            return JSONResponse(
                {"error": "ingest is disabled: start the server with --token"}, status_code=403
            )
        if not _matches(_bearer(request), token):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        try:
            answer = store.ingest(batch)
        except IngestError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        return JSONResponse(answer)

    return app
