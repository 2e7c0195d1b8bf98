"""``python -m cua_native.monitor serve|migrate|drain|tasks``: the dashboard server, schema
migrations, delivery of what a run left undelivered, and a run's success per task."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cua_native import cli_checks
from cua_native.monitor.service import tasks

LOG = logging.getLogger("cua_native.monitor")


def _run_dir(args: argparse.Namespace) -> Path:
    if args.run_dir is not None:
        return Path(args.run_dir)
    url: str | None = args.db
    if url and url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).resolve().parent
    return Path.cwd()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cua_native.monitor")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the dashboard (and the ingest endpoint)")
    migrate = commands.add_parser(
        "migrate", help="bring the database schema to the newest revision"
    )
    drain = commands.add_parser(
        "drain", help="deliver the records a run left undelivered (its monitor_spill)"
    )
    drain.add_argument("run_dir", help="the run directory (its workers' directories included)")
    drain.add_argument("--token", help="bearer token for a Training Monitor (or CUA_MONITOR_TOKEN)")
    drain.add_argument("--db", help="database URL, when the spill's has a password")
    tasks.add_arguments(
        commands.add_parser(
            "tasks", help="success per task: baseline, training blocks, evaluations (SQLite)"
        )
    )
    for sub in (serve, migrate):
        sub.add_argument("--db", help="SQLAlchemy URL (default: SQLite monitor.db in --run-dir)")
        sub.add_argument("--run-dir", help="run directory holding screenshots/ (default: the DB's)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--token", help="access token for pages; required for ingest")
    serve.add_argument(
        "--max-body-mb", type=float, default=64.0, help="largest ingest body accepted (MiB)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "drain":
        from cua_native.monitor.client.drain import run

        return run(args.run_dir, args.token, args.db)
    if args.command == "tasks":
        return tasks.run(args)
    if args.db is None and args.run_dir is None:
        print("give --db URL or --run-dir DIR", file=sys.stderr)
        return 2
    try:
        if args.db is not None:
            cli_checks.check_db_url(args.db)
        cli_checks.check_run_dir(_run_dir(args))
    except cli_checks.BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from cua_native.monitor.db.store import MonitorStore

    try:
        store = MonitorStore.open(args.db, run_dir=_run_dir(args))
    except Exception as error:  # the database refused: one line, not a SQLAlchemy traceback
        print(
            f"error: --db: cannot open the database: {type(error).__name__}: {error}".split("\n")[
                0
            ],
            file=sys.stderr,
        )
        return 1
    try:
        if args.command == "migrate":
            LOG.info("schema at head: %s", store.engine.url.render_as_string(hide_password=True))
            return 0
        import uvicorn

        from cua_native.monitor.service.dashboard.app import AccessLogRedactor, create_app

        if args.host not in ("127.0.0.1", "localhost", "::1") and args.token is None:
            LOG.warning(
                "serving on %s without --token: anyone who can reach it can read it", args.host
            )
        logging.getLogger("uvicorn.access").addFilter(AccessLogRedactor())
        app = create_app(store, token=args.token, max_body_bytes=int(args.max_body_mb * 2**20))
        uvicorn.run(app, host=args.host, port=args.port)
        return 0
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
