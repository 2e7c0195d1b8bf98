"""Set-based statements of the store: many rows in one statement, on either backend.

PostgreSQL (a network round trip and a statement execution per statement): a set of keys is one
array parameter (``= ANY(:keys)``), and a set of rows is one JSON parameter expanded by
``json_populate_recordset`` into ``INSERT … SELECT … RETURNING`` or ``UPDATE … FROM`` (with the
ids also as an array, so the rows are found by primary key, never by a scan of the table): one
statement whatever the number of rows, and psycopg never parses a query with thousands of
placeholders. SQLite (in process, nothing to save per statement): chunked ``IN (…)`` lists and
executemany.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, String, Table, any_, bindparam, insert, select, text, update
from sqlalchemy.types import ARRAY

IN_CHUNK = 500
"""Values per ``IN (…)`` list on SQLite (well under its bound-parameter limit)."""


def chunks(values: Iterable[Any], size: int = IN_CHUNK) -> Iterable[list[Any]]:
    items = list(values)
    for start in range(0, len(items), size):
        yield items[start : start + size]


def is_postgres(connection: Connection) -> bool:
    return connection.dialect.name == "postgresql"


def where_in(connection: Connection, column: Any, values: list[Any]) -> Iterable[Any]:
    """Conditions ``column IN values``: one per chunk on SQLite, a single array on PostgreSQL
    (values all of the column's type, text or integer)."""
    if not values:
        return
    if is_postgres(connection):
        item_type = String() if isinstance(values[0], str) else column.type
        yield column == any_(bindparam(None, values, type_=ARRAY(item_type)))
        return
    for part in chunks(values):
        yield column.in_(part)


def rows_where_in(
    connection: Connection,
    table: Table,
    column: Any,
    values: list[Any],
    columns: Any = None,
    lock: bool = False,
) -> list[Any]:
    """``SELECT columns (default: all) FROM table WHERE column IN values``; with ``lock``, the
    rows are locked to the end of the transaction (PostgreSQL ``FOR NO KEY UPDATE``, in
    ``column`` order; SQLite has one writer at a time and ignores it)."""
    found: list[Any] = []
    for condition in where_in(connection, column, values):
        statement = select(*(columns or [table])).where(condition)
        if lock:
            statement = statement.order_by(column).with_for_update(key_share=True)
        found.extend(connection.execute(statement))
    return found


def insert_rows(connection: Connection, table: Table, rows: list[dict[str, Any]]) -> list[Any]:
    """Insert rows (each run of rows with the same keys as one statement on PostgreSQL, one
    executemany on SQLite); answers ``(id, client_id)`` of rows that have a ``client_id``."""
    named: list[str] = [row["client_id"] for row in rows if row.get("client_id") is not None]
    keyed = "client_id" in table.c
    found: list[Any] = []
    for run in runs(rows):
        if is_postgres(connection):
            columns = ", ".join(_quoted(connection, name) for name in run[0])
            statement = text(
                f"INSERT INTO {_quoted(connection, table.name)} ({columns}) "
                f"SELECT {columns} FROM json_populate_recordset("
                f"NULL::{_quoted(connection, table.name)}, CAST(:rows AS json))"
                + (" RETURNING id, client_id" if keyed else "")
            )
            result = connection.execute(statement, {"rows": _json(run)})
            if keyed:
                found.extend(row for row in result if row[1] is not None)
        else:
            connection.execute(insert(table), run)
    if keyed and named and not is_postgres(connection):
        found = rows_where_in(
            connection, table, table.c.client_id, named, [table.c.id, table.c.client_id]
        )
    return found


def update_rows(
    connection: Connection, table: Table, rows: list[dict[str, Any]], only_null: str | None = None
) -> None:
    """``UPDATE table SET <keys> WHERE id = row_id`` for each dict (``row_id`` plus the columns
    to set), and only where column ``only_null`` is NULL when given; one statement per run of
    rows that set the same columns."""
    for run in runs(rows):
        if is_postgres(connection):
            name = _quoted(connection, table.name)
            sets = ", ".join(
                f"{_quoted(connection, key)} = data.{_quoted(connection, key)}"
                for key in run[0]
                if key != "row_id"
            )
            data = [{"id" if k == "row_id" else k: v for k, v in row.items()} for row in run]
            # the id array lets the planner see how few rows are meant: with the JSON alone it
            # guesses 100 and hash-joins them against a scan of the whole table
            statement = text(
                f"UPDATE {name} SET {sets} FROM json_populate_recordset("
                f"NULL::{name}, CAST(:rows AS json)) AS data WHERE {name}.id = data.id"
                f" AND {name}.id = ANY(CAST(:ids AS INTEGER[]))"
                + (f" AND {name}.{_quoted(connection, only_null)} IS NULL" if only_null else "")
            )
            ids = [row["id"] for row in data]
            connection.execute(statement, {"rows": _json(data), "ids": ids})
        else:
            by_id = update(table).where(table.c.id == bindparam("row_id"))
            if only_null:
                by_id = by_id.where(table.c[only_null].is_(None))
            connection.execute(by_id, run)


def runs(rows: list[dict[str, Any]]) -> Iterable[list[dict[str, Any]]]:
    """Consecutive rows that set the same columns (order kept)."""
    start = 0
    while start < len(rows):
        keys = rows[start].keys()
        end = start + 1
        while end < len(rows) and rows[end].keys() == keys:
            end += 1
        yield rows[start:end]
        start = end


def _quoted(connection: Connection, name: str) -> str:
    return connection.dialect.identifier_preparer.quote(name)


def _json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, default=_json_default, ensure_ascii=False)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column value")
