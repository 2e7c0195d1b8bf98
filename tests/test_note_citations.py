"""Design notes are cited by name, never by number, and every cited name is a heading.

``docs/design-notes.md`` (the experiments) and ``docs/contracts.md`` give each note a heading; a citation is its GitHub anchor
(``docs/design-notes.md#vllm-chat-abort``), which survives notes being added, moved or split,
where "note 33" or "finding 5" silently pointed at another note after a renumbering.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "design-notes.md"
CONTRACTS = ROOT / "docs" / "contracts.md"
SCOPE = ("cua_native", "configs", "tests", "bench", "README.md")
NUMBERED = re.compile(r"\b(?:notes?|findings?)\b[\s,:#§]*\d+", re.IGNORECASE)
"""``note 33``, ``Notes 26–30``, ``findings 5 and 11``, ``design notes, 29``, ``note\\n34``."""
CITED = re.compile(r"design-notes\.md(?:#[\w-]+|:)(?:(?:[\s,]|#(?=\s)|\band\b|\bto\b)*#[\w-]+)*")
"""``design-notes.md#a``, ``design-notes.md: #a, #b``, ``design-notes.md#a to #b``, in comments too."""
THIS = Path(__file__).resolve()  # its examples are the forms it looks for


def text_files(root: Path = ROOT) -> dict[Path, str]:
    files: dict[Path, str] = {}
    for name in SCOPE:
        top = root / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path == THIS:
                continue
            try:
                files[path] = path.read_text()
            except UnicodeDecodeError:  # images, pickles
                continue
    return files


def numbered_citations(files: dict[Path, str]) -> list[str]:
    found = []
    for path, text in files.items():
        for match in NUMBERED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    return found


def anchors(markdown: str) -> list[str]:
    """GitHub's anchors of the headings (lower case, punctuation dropped, spaces to hyphens)."""
    slugs = []
    for line in markdown.splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            slugs.append(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return slugs


def test_no_note_is_cited_by_number() -> None:
    found = numbered_citations(text_files())
    assert not found, "cite design notes by name (docs/design-notes.md#anchor):\n" + "\n".join(
        found
    )


def test_the_check_sees_the_forms_numbers_took(tmp_path: Path) -> None:
    cases = ["(note 33)", "notes 26–30", "findings 5 and 11", "design notes, 29", "note\n34"]
    (tmp_path / "README.md").write_text("\n".join(cases))
    (tmp_path / "cua_native").mkdir()
    (tmp_path / "cua_native" / "x.py").write_text('"""Finding 5: see learning_note34/."""\n')
    files = {path: path.read_text() for path in tmp_path.rglob("*") if path.is_file()}
    found = [m.group(0) for text in files.values() for m in NUMBERED.finditer(text)]
    assert len(found) == len(cases) + 1  # a results folder's name (learning_note34) is no citation


def test_every_cited_name_is_a_heading_and_names_are_unique() -> None:
    notes = NOTES.read_text()
    slugs = anchors(notes)
    assert [s for s, n in Counter(slugs).items() if n > 1] == []
    texts = [*text_files().values(), *(p.read_text() for p in (ROOT / "docs").glob("*.md"))]
    runs = [run.group(0) for text in texts for run in CITED.finditer(text)]
    cited = {name for run in runs for name in re.findall(r"#([\w-]+)", run)}
    cited |= set(re.findall(r"\]\(#([\w-]+)\)", notes))
    assert cited, "no citation found: the pattern is broken"
    assert sorted(cited - set(slugs)) == []


def test_every_cited_contract_is_a_heading_and_names_are_unique() -> None:
    contracts = CONTRACTS.read_text()
    slugs = anchors(contracts)
    assert slugs and [s for s, n in Counter(slugs).items() if n > 1] == []
    texts = [*text_files().values(), *(p.read_text() for p in (ROOT / "docs").glob("*.md"))]
    pattern = re.compile(CITED.pattern.replace("design-notes", "contracts"))
    runs = [run.group(0) for text in texts for run in pattern.finditer(text)]
    cited = {name for run in runs for name in re.findall(r"#([\w-]+)", run)}
    assert "episode-observers" in cited  # the doc's own example: the pattern sees citations
    assert sorted(cited - set(slugs)) == []
