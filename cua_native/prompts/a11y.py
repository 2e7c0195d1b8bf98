"""The accessibility tree as prompt text: OSWorld's XML (``GET /accessibility``, the AT-SPI
tree on Linux) linearised as OSWorld's agents read it — a header, then one tab-separated line
per element on screen that shows a name or text: ``tag``, ``name``, ``text``, ``position
(top-left x&y)``, ``size (w&h)`` in the screen's pixels — and cut to a length budget at a line
boundary. Pure; a tree that is not XML becomes no text (an observation is never lost to it).
"""

from __future__ import annotations

from xml.etree import ElementTree as ET

COMPONENT = "https://accessibility.ubuntu.example.org/ns/component"
STATE = "https://accessibility.ubuntu.example.org/ns/state"
HEADER = "tag\tname\ttext\tposition (top-left x&y)\tsize (w&h)"
INTRO = "Accessibility tree of the current screen:\n"
CUT = "\n[…]"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def linearize(xml: str, max_chars: int) -> str:
    """The tree's on-screen elements as lines under ``HEADER``, at most ``max_chars``
    characters (whole lines, ``CUT`` marking a cut); ``""`` for an empty or unreadable tree."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return ""
    lines = [HEADER]
    for node in root.iter():
        position = node.get(f"{{{COMPONENT}}}screencoord")
        size = node.get(f"{{{COMPONENT}}}size")
        if position is None or size is None or size.replace(" ", "") in ("(0,0)", "(-1,-1)"):
            continue
        if node.get(f"{{{STATE}}}showing") != "true":
            continue
        name, text = _one_line(node.get("name", "")), _one_line(node.text or "")
        if not name and not text:
            continue
        tag = node.tag.rsplit("}", 1)[-1]
        lines.append(f"{tag}\t{name}\t{text}\t{position}\t{size}")
    if len(lines) == 1:
        return ""
    out: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > max_chars - len(CUT):
            return "\n".join(out) + CUT if out else ""
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


def prompt_part(xml: str | None, max_chars: int) -> dict[str, str] | None:
    """The text part a user message gets (``None``: no tree, a zero budget or nothing on
    screen)."""
    if not xml or max_chars <= 0:
        return None
    text = linearize(xml, max_chars - len(INTRO))
    return {"type": "text", "text": INTRO + text} if text else None
