"""The layer table of ``docs/architecture.md`` holds for every import in ``cua_native/``.

The table is read from the doc itself (its one statement): a module imports only modules of its
own layer and of layers with a smaller number, and layers that share a number never import each
other. Every ``import``/``from`` counts, at module level, in a function or under
``TYPE_CHECKING``; every module must be in a layer and every listed path must exist.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "cua_native"
DOC = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Layer:
    number: int
    name: str
    paths: tuple[str, ...]
    """Repository-relative: a folder ends with ``/``, a module with ``.py``."""


@dataclass(frozen=True)
class Violation:
    where: str
    target: str
    source_layer: Layer
    target_layer: Layer

    def __str__(self) -> str:
        return (
            f"{self.where}: layer {self.source_layer.number} {self.source_layer.name} imports "
            f"{self.target} of layer {self.target_layer.number} {self.target_layer.name}"
        )


def read_table(text: str) -> list[Layer]:
    """The rows of the table under ``## Layers``: ``| # | layer | modules | job |``."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header[:3] == ["#", "layer", "modules"], header
    layers = []
    for row in rows[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        layers.append(Layer(int(cells[0]), cells[1], tuple(re.findall(r"`([^`]+)`", cells[2]))))
    return layers


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(path: Path, layers: list[Layer]) -> Layer | None:
    """The layer whose longest listed path holds ``path``."""
    relative = path.relative_to(ROOT).as_posix()
    best: tuple[int, Layer] | None = None
    for layer in layers:
        for listed in layer.paths:
            holds = relative.startswith(listed) if listed.endswith("/") else relative == listed
            if holds and (best is None or len(listed) > best[0]):
                best = (len(listed), layer)
    return best[1] if best else None


def imported_modules(path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """``(line, module)`` for every package module that ``path`` imports, wherever it does."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # ``from a import b`` imports the module a.b when there is one, else a's name b
            candidates = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        else:
            continue
        for candidate in candidates:
            if candidate != PACKAGE and not candidate.startswith(PACKAGE + "."):
                continue
            while candidate and candidate not in modules:  # ``import a.b.name`` → module a.b
                candidate = candidate.rpartition(".")[0]
            if candidate:
                found.add((node.lineno, candidate))
    return sorted(found)


def violations(layers: list[Layer]) -> tuple[list[str], list[Violation]]:
    """Modules in no layer, and imports against the table."""
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(path): path for path in files}
    unplaced = [str(path.relative_to(ROOT)) for path in files if layer_of(path, layers) is None]
    found = []
    for path in files:
        source = layer_of(path, layers)
        if source is None:
            continue
        for line, target in imported_modules(path, modules):
            target_layer = layer_of(modules[target], layers)
            if target_layer is None or target_layer == source:
                continue
            if target_layer.number >= source.number:
                where = f"{path.relative_to(ROOT)}:{line}"
                found.append(Violation(where, target, source, target_layer))
    return unplaced, found


@pytest.fixture(scope="module")
def layers() -> list[Layer]:
    return read_table(DOC.read_text())


def test_every_import_follows_the_layer_table(layers: list[Layer]) -> None:
    unplaced, found = violations(layers)
    assert not unplaced, f"modules in no layer of {DOC.name}: {unplaced}"
    assert not found, "imports against the layer table:\n" + "\n".join(map(str, found))


def test_the_table_is_numbered_in_order_and_every_listed_path_exists(
    layers: list[Layer],
) -> None:
    numbers = [layer.number for layer in layers]
    assert numbers[0] == 1 and numbers == sorted(numbers), numbers
    missing = [p for layer in layers for p in layer.paths if not (ROOT / p).exists()]
    assert not missing


def test_an_upward_and_a_sideways_import_are_caught(layers: list[Layer]) -> None:
    """The check itself: in a table where rollout sits above gym, today's imports of gym by
    rollout are violations; where the store shares its number with the client and the service,
    their imports of it are."""
    swapped = [
        Layer(
            1 if layer.name == "rollout" else 6 if layer.name == "gym" else layer.number,
            layer.name,
            layer.paths,
        )
        for layer in layers
    ]
    _, found = violations(swapped)
    assert any(v.source_layer.name == "rollout" and v.target_layer.name == "gym" for v in found)
    store_beside = [
        Layer(9 if layer.name == "monitor store" else layer.number, layer.name, layer.paths)
        for layer in layers
    ]
    _, found = violations(store_beside)
    sideways = {(v.source_layer.name, v.target_layer.name) for v in found}
    assert ("monitor client", "monitor store") in sideways
    assert ("monitor service", "monitor store") in sideways
