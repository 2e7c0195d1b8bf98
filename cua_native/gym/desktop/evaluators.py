"""OSWorld task evaluators (the task JSON's ``evaluator`` entry), for the subset of getters and
metrics cua_native's desktop tasks use. Success is judged only from the desktop's state — file
contents, command output — read through the desktop server, never from the agent's answer.

``evaluator``: ``{"func": name | [names], "result": getter | [getters], "expected": getter |
[getters], "conj": "and" | "or"}`` as in OSWorld. Getters: ``vm_file`` (``path``: the file's
bytes, ``None`` if absent), ``vm_command_line`` (``command``, ``shell``: its standard output),
``rule`` (``rules``). Metrics: ``exact_match`` and ``check_include_exclude`` (OSWorld's
semantics; text is compared with trailing newlines removed), and ``ods_cell_equals``
(cua_native's: ``rules`` ``{"cell": "A1", "expected": value}`` against the first sheet of an
OpenDocument spreadsheet, numbers compared as numbers). A getter that cannot reach the desktop
raises ``DesktopUnavailable`` (infrastructure); a missing file scores 0 (the agent's failure).

``{"func": "infeasible"}`` (OSWorld's, no getters): the request is impossible, and the only
judge is the agent's final action — success exactly when it declared the task infeasible
(``protocol.FAIL_ANSWER``, from ``terminate(failure)``). As in OSWorld's ``DesktopEnv.evaluate``,
that declaration scores 0 on every other task, whatever the state.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from xml.etree import ElementTree as ET

from cua_native.gym.desktop.client import DesktopClient
from cua_native.gym.protocol import FAIL_ANSWER, Evaluation, ValidatorResult

Getter = Callable[[DesktopClient, Mapping[str, Any]], Awaitable[Any]]
Metric = Callable[[Any, Any], tuple[float, str]]


class EvaluatorError(ValueError):
    """The task's evaluator names a getter or metric outside the supported subset."""


async def _vm_file(client: DesktopClient, spec: Mapping[str, Any]) -> bytes | None:
    return await client.file(str(spec["path"]))


async def _vm_command_line(client: DesktopClient, spec: Mapping[str, Any]) -> str:
    command = spec["command"]
    shell = bool(spec.get("shell", isinstance(command, str)))
    return (await client.execute(command, shell=shell)).output


async def _rule(client: DesktopClient, spec: Mapping[str, Any]) -> Any:
    return spec.get("rules", {})


GETTERS: dict[str, Getter] = {
    "vm_file": _vm_file,
    "vm_command_line": _vm_command_line,
    "rule": _rule,
}


def _text(result: Any) -> str | None:
    if result is None:
        return None
    if isinstance(result, bytes):
        result = result.decode("utf-8", errors="replace")
    return str(result).rstrip("\n")


def exact_match(result: Any, rules: Any) -> tuple[float, str]:
    text = _text(result)
    if text is None:
        return 0.0, "nothing to compare (file or output missing)"
    expected = str(rules["expected"])
    return (1.0, "matches") if text == expected else (0.0, f"got {text[:80]!r}")


def check_include_exclude(result: Any, rules: Any) -> tuple[float, str]:
    text = _text(result)
    if text is None:
        return 0.0, "nothing to compare (file or output missing)"
    missing = [s for s in rules.get("include", []) if s not in text]
    present = [s for s in rules.get("exclude", []) if s in text]
    if missing or present:
        return 0.0, f"missing {missing}, unwanted {present}"
    return 1.0, "includes and excludes as required"


_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"


def ods_cell(data: bytes, cell: str) -> str | None:
    """The value of ``cell`` (e.g. ``B3``) in the first sheet of an .ods file: a number's
    ``office:value``, else the cell's text; ``None`` for an empty cell."""
    match = re.fullmatch(r"([A-Z]+)([1-9][0-9]*)", cell.upper())
    if match is None:
        raise EvaluatorError(f"not a cell name: {cell!r}")
    col = 0
    for ch in match.group(1):
        col = col * 26 + ord(ch) - 64
    row_index, col_index = int(match.group(2)) - 1, col - 1
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        root = ET.fromstring(archive.read("content.xml"))
    table = root.find(f".//{{{_TABLE}}}table")
    if table is None:
        return None
    row_at = 0
    for row in table.iter(f"{{{_TABLE}}}table-row"):
        rows = int(row.get(f"{{{_TABLE}}}number-rows-repeated", "1"))
        if row_at <= row_index < row_at + rows:
            col_at = 0
            for c in row:
                if c.tag not in (f"{{{_TABLE}}}table-cell", f"{{{_TABLE}}}covered-table-cell"):
                    continue
                cols = int(c.get(f"{{{_TABLE}}}number-columns-repeated", "1"))
                if col_at <= col_index < col_at + cols:
                    value = c.get(f"{{{_OFFICE}}}value")
                    if value is not None:
                        return value
                    text = "\n".join("".join(p.itertext()) for p in c.iter(f"{{{_TEXT}}}p"))
                    return text or None
                col_at += cols
            return None
        row_at += rows
    return None


def ods_cell_equals(result: Any, rules: Any) -> tuple[float, str]:
    if not isinstance(result, bytes):
        return 0.0, "spreadsheet missing"
    try:
        value = ods_cell(result, str(rules["cell"]))
    except (zipfile.BadZipFile, KeyError, ET.ParseError) as exc:
        return 0.0, f"not an OpenDocument spreadsheet: {exc}"
    expected = rules["expected"]
    try:
        same = value is not None and float(value) == float(expected)
    except (TypeError, ValueError):
        same = value == str(expected)
    return (1.0, f"{rules['cell']} = {value}") if same else (0.0, f"{rules['cell']} = {value!r}")


METRICS: dict[str, Metric] = {
    "exact_match": exact_match,
    "check_include_exclude": check_include_exclude,
    "ods_cell_equals": ods_cell_equals,
}


INFEASIBLE = "infeasible"


def _listed(value: Any, n: int) -> list[Any]:
    return list(value) if isinstance(value, list) else [value] * n


def check_evaluator(evaluator: Mapping[str, Any]) -> None:
    """Raise ``EvaluatorError`` for an evaluator outside the supported subset (at task load)."""
    if evaluator.get("func") == INFEASIBLE:
        extra = sorted(set(evaluator) - {"func", "postconfig"})
        if extra:
            raise EvaluatorError(f"an 'infeasible' evaluator takes no {extra}")
        return
    funcs = _listed(evaluator.get("func"), 1)
    for func in funcs:
        if func not in METRICS:
            raise EvaluatorError(f"metric {func!r} is not supported; supported: {sorted(METRICS)}")
    for key in ("result", "expected"):
        for spec in _listed(evaluator.get(key), len(funcs)):
            if not isinstance(spec, Mapping) or spec.get("type") not in GETTERS:
                raise EvaluatorError(
                    f"{key} getter {spec!r} is not supported; supported: {sorted(GETTERS)}"
                )
    if evaluator.get("conj", "and") not in ("and", "or"):
        raise EvaluatorError(f"conj must be 'and' or 'or', got {evaluator.get('conj')!r}")


def _judged_by_answer(name: str, passed: bool, message: str) -> Evaluation:
    reward = 1.0 if passed else 0.0
    validator = ValidatorResult(name, passed, reward, message=message)
    return Evaluation(reward=reward, success=passed, validators=(validator,))


async def evaluate(
    evaluator: Mapping[str, Any], client: DesktopClient, answer: str | None = None
) -> Evaluation:
    """Run the evaluator against the desktop: one validator per metric, combined by ``conj``.
    ``answer`` (``protocol.final_answer`` of the agent's final action) is read only for
    ``FAIL_ANSWER``: the whole judgement of an ``infeasible`` task, 0 on any other."""
    check_evaluator(evaluator)
    declared = answer == FAIL_ANSWER
    if evaluator["func"] == INFEASIBLE:
        said = "declared it infeasible" if declared else "did not declare it infeasible"
        return _judged_by_answer(INFEASIBLE, declared, f"the agent {said}")
    if declared:
        return _judged_by_answer(
            "declared_infeasible", False, "a feasible task declared infeasible"
        )
    funcs = _listed(evaluator["func"], 1)
    results = _listed(evaluator["result"], len(funcs))
    expected = _listed(evaluator["expected"], len(funcs))
    validators = []
    for func, result_spec, expected_spec in zip(funcs, results, expected, strict=True):
        result = await GETTERS[result_spec["type"]](client, result_spec)
        rules = await GETTERS[expected_spec["type"]](client, expected_spec)
        score, message = METRICS[func](result, rules)
        validators.append(ValidatorResult(func, score >= 1.0, score, message=message))
    scores = [v.score for v in validators]
    reward = min(scores) if evaluator.get("conj", "and") == "and" else max(scores)
    return Evaluation(reward=reward, success=reward >= 1.0, validators=tuple(validators))
