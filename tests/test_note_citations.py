"""Notes are cited by file and name, never by number, and every cited file and anchor exists.

A contract lives under its heading in ``docs/contracts.md``; an experiment's note is the
``README.md`` beside its outputs (``bench/experiments/results/rotary-base/README.md``). A
citation is the file and its heading's GitHub anchor (``docs/contracts.md#vllm-chat-abort``),
which survives notes being added, moved or split, where "note 33" or "finding 5" silently
pointed at another note after a renumbering. Code, configs and docs cite with the path from the
repository root; a Markdown link (``[x](../docs/contracts.md#pause-clock)``, ``[x](#pause-clock)``)
from the file that holds it, as GitHub resolves it.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPE = (
    "cua_native",
    "configs",
    "tests",
    "bench",
    "scripts",
    "docs",
    "README.md",
    "CONTRIBUTING.md",
)
NUMBERED = re.compile(r"\b(?:notes?|findings?)\b[\s,:#§]*\d+", re.IGNORECASE)
"""``note 33``, ``Notes 26–30``, ``findings 5 and 11``, ``design notes, 29``, ``note\\n34``."""
LINK = re.compile(r"\]\(([^)\s]*?\.md)?(?:#([\w-]+))?\)")
"""A Markdown link to a Markdown file and/or an anchor: ``](../x/README.md#a)``, ``](#a)``."""
CITED = re.compile(
    r"(?<![\w./-])((?:[\w-]+/)+[\w.-]+\.md|README\.md|CONTRIBUTING\.md)(?:#([\w-]+))?"
)
"""A path from the repository root, with or without an anchor, in code, configs or prose."""
THIS = Path(__file__).resolve()  # its examples are the forms it looks for
VENDORED = ("tests/monitor/contract/vendored", "tests/slime/vendor", "tests/fixtures")


def text_files(root: Path = ROOT) -> dict[Path, str]:
    files: dict[Path, str] = {}
    for name in SCOPE:
        top = root / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            relative = path.relative_to(root).as_posix()
            if (
                not path.is_file()
                or "__pycache__" in path.parts
                or path == THIS
                or relative.startswith(VENDORED)
                or path.suffix
                in (".log", ".json", ".jsonl", ".png")  # a run's output quotes as it ran
            ):
                continue
            try:
                files[path] = path.read_text()
            except UnicodeDecodeError:  # images, pickles
                continue
    return files


def numbered_citations(files: dict[Path, str], root: Path = ROOT) -> list[str]:
    found = []
    for path, text in files.items():
        for match in NUMBERED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(root)}:{line}: {match.group(0)!r}")
    return found


def anchors(markdown: str) -> list[str]:
    """GitHub's anchors of the headings (lower case, punctuation dropped, spaces to hyphens)."""
    slugs = []
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6} (.+)", line)
        if match:
            slugs.append(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return slugs


def citations(path: Path, text: str, root: Path = ROOT) -> list[tuple[Path, str | None, int]]:
    """Every (file, anchor or None, line) that ``text`` cites."""
    cited: list[tuple[Path, str | None, int]] = []
    links = []
    if path.suffix == ".md":
        for match in LINK.finditer(text):
            target, anchor = match.group(1), match.group(2)
            if target is None and anchor is None:
                continue
            if target is not None and re.match(r"\w+://", target):
                continue
            line = text.count("\n", 0, match.start()) + 1
            cited.append(((path.parent / target) if target else path, anchor, line))
            links.append(match.span())
    for match in CITED.finditer(text):
        if any(start <= match.start() < end for start, end in links):
            continue
        line = text.count("\n", 0, match.start()) + 1
        cited.append((root / match.group(1), match.group(2), line))
    return cited


def broken_citations(files: dict[Path, str], root: Path = ROOT) -> list[str]:
    """One line per citation whose file or anchor does not exist."""
    broken = []
    headings: dict[Path, list[str]] = {}
    for path, text in files.items():
        for target, anchor, line in citations(path, text, root):
            where = f"{path.relative_to(root)}:{line}"
            target = target.resolve()
            if not target.is_file():
                broken.append(f"{where}: no file {target}")
                continue
            if anchor is None:
                continue
            if target not in headings:
                headings[target] = anchors(target.read_text())
            if anchor not in headings[target]:
                broken.append(f"{where}: no heading #{anchor} in {target.relative_to(root)}")
    return broken


def test_no_note_is_cited_by_number() -> None:
    found = numbered_citations(text_files())
    assert not found, "cite a note by file and name (docs/contracts.md#anchor):\n" + "\n".join(
        found
    )


def test_every_cited_file_and_anchor_exists() -> None:
    files = text_files()
    cited = [c for path, text in files.items() for c in citations(path, text)]
    assert len({c[0] for c in cited if c[1]}) > 20, "few citations found: the patterns are broken"
    assert broken_citations(files) == []


def test_headings_are_unique_in_every_note() -> None:
    notes = [ROOT / "docs" / "contracts.md", *sorted(ROOT.glob("bench/*/results/*/README.md"))]
    assert len(notes) > 20
    for note in notes:
        slugs = anchors(note.read_text())
        assert slugs and [s for s, n in Counter(slugs).items() if n > 1] == [], note


def test_the_check_sees_the_forms_numbers_took(tmp_path: Path) -> None:
    cases = ["(note 33)", "notes 26–30", "findings 5 and 11", "design notes, 29", "note\n34"]
    (tmp_path / "README.md").write_text("\n".join(cases))
    (tmp_path / "cua_native").mkdir()
    (tmp_path / "cua_native" / "x.py").write_text('"""Finding 5: see learning_note34/."""\n')
    files = {path: path.read_text() for path in tmp_path.rglob("*") if path.is_file()}
    found = numbered_citations(files, tmp_path)
    assert len(found) == len(cases) + 1  # a results folder's name (learning_note34) is no citation


def test_the_check_fails_on_a_missing_file_or_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "contracts.md").write_text("# Contracts\n\n## Pause clock\n\ntext\n")
    note = tmp_path / "bench" / "experiments" / "results" / "rotary-base"
    note.mkdir(parents=True)
    (note / "README.md").write_text(
        "# Rotary base\n\n[ok](../../../../docs/contracts.md#pause-clock) [ok](#rotary-base)\n"
        "[bad](../../../../docs/contracts.md#pause) [bad](#rotary) [bad](../gone/README.md)\n"
        "```\n# not a heading\n```\n"
    )
    (tmp_path / "x.py").write_text(
        '"""docs/contracts.md#pause-clock, bench/experiments/results/rotary-base/README.md#rotary-base;\n'
        'docs/contracts.md#pause-clocks, docs/gone.md#a, README.md#not-a-heading."""\n'
    )
    (tmp_path / "README.md").write_text("# Top\n")
    files = {path: path.read_text() for path in tmp_path.rglob("*") if path.is_file()}
    broken = sorted(broken_citations(files, tmp_path))
    root = tmp_path.resolve()
    assert broken == sorted(
        [
            "bench/experiments/results/rotary-base/README.md:4: no heading #pause in docs/contracts.md",
            "bench/experiments/results/rotary-base/README.md:4: no heading #rotary in "
            "bench/experiments/results/rotary-base/README.md",
            f"bench/experiments/results/rotary-base/README.md:4: no file "
            f"{root}/bench/experiments/results/gone/README.md",
            "x.py:2: no heading #pause-clocks in docs/contracts.md",
            f"x.py:2: no file {root}/docs/gone.md",
            "x.py:2: no heading #not-a-heading in README.md",
        ]
    )
