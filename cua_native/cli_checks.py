"""Checks of command-line input that run before anything heavy is imported or loaded.

Each check raises ``BadInput`` (a ``ValueError``) whose message is the one line a command prints
before exiting non-zero: URLs, paths, devices and the database are checked before a model is
loaded, so a typo costs a second, not a minute of loading and a traceback. Only light modules
are imported here, lazily: SQLAlchemy and the database's driver (a server database is connected
to once, to see that it answers) and httpx.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

DEVICES = ("cpu", "cuda")


class BadInput(ValueError):
    """Bad command-line input; the message is one line naming the option and the fix."""


def check_http_url(value: str, option: str) -> str:
    """``http(s)://host[:port][/path]``, returned without a trailing slash."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"{option}: expected http(s)://host[:port][/path], got {value!r}")
    try:
        parts.port  # noqa: B018 - raises for a bad port
    except ValueError:
        raise BadInput(f"{option}: bad port in {value!r}") from None
    return value.rstrip("/")


def check_run_dir(value: str | Path, option: str = "--run-dir") -> Path:
    """A directory, or a path one can be created at: nothing is created here (a run that stops
    on a later check leaves no trace)."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise BadInput(f"{option}: {str(path)!r} is a file, not a directory")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise BadInput(f"{option}: cannot create {str(path)!r}: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK) or str(existing).startswith("/proc"):
        raise BadInput(f"{option}: cannot create {str(path)!r}: {str(existing)!r} is not writable")
    return path


def check_db_url(value: str, option: str = "--db") -> None:
    """``sqlite`` (the run directory's database) or a SQLAlchemy URL whose driver is installed;
    a SQLite file's directory must exist."""
    if value == "sqlite":
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(value)
    except ArgumentError:
        raise BadInput(
            f"{option}: {value!r} is not a database URL (use 'sqlite', sqlite:///PATH or"
            " postgresql://USER@HOST/DB)"
        ) from None
    try:
        url.get_dialect()
    except NoSuchModuleError:
        raise BadInput(
            f"{option}: unknown database kind {url.drivername!r} in {value!r} (use 'sqlite',"
            " sqlite:///PATH or postgresql://USER@HOST/DB)"
        ) from None
    except ImportError as error:
        raise BadInput(
            f"{option}: the driver for {url.drivername!r} is not installed: {error}"
        ) from None
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and database and database != ":memory:":
        parent = Path(database).expanduser().resolve().parent
        if not parent.is_dir():
            raise BadInput(f"{option}: directory {str(parent)!r} of the SQLite file does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise BadInput(f"{option}: cannot write in {str(parent)!r}")


def check_db_reachable(value: str, option: str = "--db", timeout_s: float = 10.0) -> None:
    """A server database (PostgreSQL) at ``value`` accepts a connection within ``timeout_s``.

    SQLite needs no server (``check_db_url`` checks its directory; nothing is created here).
    Call after ``check_db_url``. The message shows the URL without its password."""
    if value == "sqlite":
        return
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    url = make_url(value)
    if url.get_backend_name() == "sqlite":
        return
    shown = url.render_as_string(hide_password=True)
    timeout = {"connect_timeout": max(1, round(timeout_s))}  # libpq's, in whole seconds
    engine = create_engine(
        url, connect_args=timeout if url.get_backend_name() == "postgresql" else {}
    )
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()
        raise BadInput(
            f"{option}: cannot connect to the database {shown}: {reason[0] if reason else error}"
        ) from None
    finally:
        engine.dispose()


def check_monitor_db(value: str | None, option: str = "cua.monitor_db") -> None:
    """``cua.monitor_db`` as a config sets it: null (no store), ``sqlite`` (the run
    directory's file), or a URL that ``check_db_url`` accepts and whose server answers."""
    if value is None or value == "sqlite":
        return
    check_db_url(value, option)
    check_db_reachable(value, option)


def check_model_dir(value: str, option: str = "--model") -> None:
    """A local model directory (``config.json`` inside); hub ids are not fetched (no network)."""
    path = Path(value).expanduser()
    if not path.exists():
        raise BadInput(f"{option}: {value!r} is not a model directory (it does not exist)")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise BadInput(f"{option}: {value!r} is not a model directory (no config.json)")


def check_device(value: str, option: str = "--device") -> None:
    """``cpu``, ``cuda`` or ``cuda:N``."""
    base, _, index = value.partition(":")
    if base not in DEVICES or (index and (base != "cuda" or not index.isdigit())):
        raise BadInput(f"{option}: unknown device {value!r}; use cpu, cuda or cuda:N")


def check_positive(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise BadInput(f"{option} must be at least 1, got {value}")


def check_gym_reachable(base_url: str, gym_id: str, option: str = "--gym-url") -> None:
    """Something answers HTTP at ``base_url`` (10 s budget; nothing is created). Whether the gym
    id exists is the task list's business (a one-line error too)."""
    import httpx

    url = f"{base_url.rstrip('/')}/api/v1/{gym_id}/tasks"
    try:
        httpx.get(url, timeout=10.0)
    except httpx.HTTPError as error:
        raise BadInput(f"{option}: cannot reach the gym at {base_url}: {error!r}") from None
