"""Replay model outputs through the dialects: ``python -m cua_native.replay FILE.jsonl [...] [--json]``.

Each input line is ``{"dialect", "text", "image_size"?, "expect"?, "options"?, "source"?}``
(``docs/actions.md``; ``options`` are keyword options of ``get_dialect``). ``expect`` is a
canonical action (coordinates compared within one grid step) or ``{"error": "<kind>"}``.
``--json`` prints one result object per input line; otherwise a summary is printed. The exit code
is 1 when any ``expect`` is not met or any line cannot be read, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from cua_native.actions.dialects import Dialect, get_dialect
from cua_native.actions.errors import ERROR_KINDS, ParsedOutput
from cua_native.actions.models import action_from_json, action_to_json

_POINT_FIELDS = frozenset({"x", "y", "x2", "y2"})


class LineError(ValueError):
    """An input line that cannot be replayed (bad JSON, unknown dialect, bad ``expect``)."""


@dataclass(frozen=True, slots=True)
class LineResult:
    file: str
    line: int
    dialect: str | None
    parsed: ParsedOutput | None
    unreadable: str | None = None
    mismatch: str | None = None


@dataclass(slots=True)
class Summary:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    lines: int = 0

    def add(self, result: LineResult) -> None:
        self.lines += 1
        where = f"{result.file}:{result.line}"
        if result.unreadable is not None:
            self.outcomes[("-", "unreadable")] += 1
            self.problems.append(f"{where}: unreadable: {result.unreadable}")
            return
        assert result.parsed is not None and result.dialect is not None
        error = result.parsed.error
        self.outcomes[(result.dialect, "ok" if error is None else f"error:{error.kind}")] += 1
        if result.mismatch is not None:
            self.problems.append(f"{where}: mismatch: {result.mismatch}")

    def write(self, out: TextIO) -> None:
        out.write(f"{'dialect':<20} {'outcome':<18} {'count':>7}\n")
        for (dialect, outcome), count in sorted(self.outcomes.items()):
            out.write(f"{dialect:<20} {outcome:<18} {count:>7}\n")
        out.write(f"{self.lines} lines, {len(self.problems)} problems\n")
        for problem in self.problems:
            out.write(f"{problem}\n")


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


def replay_line(
    raw: str, file: str, number: int, dialects: dict[tuple[str, str], Dialect]
) -> LineResult:
    """Parse one input line; a line that cannot be replayed is reported, never raised."""
    try:
        record = json.loads(raw)
        if not isinstance(record, dict):
            raise LineError("a line must be a JSON object")
        dialect_name, dialect = _dialect_for(record, dialects)
        text = record.get("text")
        if not isinstance(text, str):
            raise LineError('"text" must be a string')
        image_size = _image_size(record.get("image_size"))
        parsed = dialect.parse(text, image_size=image_size)
        mismatch = None
        if "expect" in record:
            step = dialect.coordinate_step(image_size)
            mismatch = expectation_mismatch(record["expect"], parsed, step)
        return LineResult(file, number, dialect_name, parsed, mismatch=mismatch)
    except (ValueError, LineError) as error:  # json.JSONDecodeError is a ValueError
        return LineResult(file, number, None, None, unreadable=str(error)[:300])


def _dialect_for(
    record: dict[str, Any], dialects: dict[tuple[str, str], Dialect]
) -> tuple[str, Dialect]:
    name = record.get("dialect")
    if not isinstance(name, str):
        raise LineError('"dialect" must be a string')
    options = record.get("options") or {}
    if not isinstance(options, dict):
        raise LineError('"options" must be an object')
    key = (name, json.dumps(options, sort_keys=True))
    if key not in dialects:
        dialects[key] = get_dialect(name, **options)
    return name, dialects[key]


def _image_size(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        return value[0], value[1]
    raise LineError(f'"image_size" must be [width, height] positive integers, got {value!r}')


def expectation_mismatch(expect: Any, parsed: ParsedOutput, step: float) -> str | None:
    """Why ``parsed`` does not meet ``expect``, or ``None`` when it does."""
    if isinstance(expect, dict) and set(expect) == {"error"}:
        kind = expect["error"]
        if kind not in ERROR_KINDS:
            raise LineError(f"expected error kind must be one of {ERROR_KINDS}, got {kind!r}")
        if parsed.error is None:
            return f"expected a {kind} error, got {_describe(parsed)}"
        if parsed.error.kind != kind:
            return f"expected a {kind} error, got {_describe(parsed)}"
        return None
    try:
        wanted = action_to_json(action_from_json(expect))
    except ValidationError as error:
        raise LineError(f'"expect" is not a canonical action: {error.errors()[0]["msg"]}') from None
    if parsed.action is None:
        return f"expected {json.dumps(wanted)}, got {_describe(parsed)}"
    got = action_to_json(parsed.action)
    if not _same(wanted, got, step):
        return f"expected {json.dumps(wanted)}, got {json.dumps(got)}"
    return None


def _same(wanted: dict[str, Any], got: dict[str, Any], step: float) -> bool:
    if wanted.keys() != got.keys():
        return False
    for key, value in wanted.items():
        other = got[key]
        if key in _POINT_FIELDS and value is not None and other is not None:
            if abs(value - other) > step + 1e-9:
                return False
        elif value != other:
            return False
    return True


def _describe(parsed: ParsedOutput) -> str:
    if parsed.error is not None:
        return f"{parsed.error.kind} error ({parsed.error.message})"
    return json.dumps(action_to_json(parsed.action)) if parsed.action is not None else "nothing"


def _json_line(result: LineResult) -> dict[str, object]:
    if result.parsed is not None:
        return result.parsed.to_replay_json()
    return {
        "ok": False,
        "action": None,
        "thought": None,
        "error": {"kind": "unreadable_line", "message": result.unreadable},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cua_native.replay",
        description="Parse recorded model outputs with the cua_native dialects.",
    )
    parser.add_argument("files", nargs="+", type=Path, help="JSONL files in the replay format")
    parser.add_argument("--json", action="store_true", help="print one result object per line")
    args = parser.parse_args(argv)
    out = sys.stdout
    dialects: dict[tuple[str, str], Dialect] = {}
    summary = Summary()
    for path in args.files:
        try:
            lines = list(read_lines(path))
        except OSError as error:
            failed = LineResult(str(path), 0, None, None, unreadable=str(error))
            summary.add(failed)
            if args.json:
                out.write(json.dumps(_json_line(failed)) + "\n")
            continue
        for number, raw in lines:
            result = replay_line(raw, str(path), number, dialects)
            summary.add(result)
            if args.json:
                out.write(json.dumps(_json_line(result), ensure_ascii=False) + "\n")
    if not args.json:
        summary.write(out)
    else:
        for problem in summary.problems:
            sys.stderr.write(f"{problem}\n")
    return 1 if summary.problems else 0


if __name__ == "__main__":
    sys.exit(main())
