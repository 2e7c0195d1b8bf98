"""Alembic environment: runs on the connection handed in ``config.attributes["connection"]``."""

from __future__ import annotations

from alembic import context

from cua_native.monitor.db.schema import Base


def _run() -> None:
    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


_run()
