"""The desktop's AT-SPI accessibility tree as XML, in the form OSWorld's server answers
``GET /accessibility`` with on Linux (written for cua_native from that form, no OSWorld code):
a ``desktop-frame`` root, one element per accessible named by its role (spaces as ``-``), the
accessible's ``name``, its states (``st:<state>="true"``), attributes (``attr:``), on-screen
position and size when visible and showing (``cp:screencoord="(x, y)"``, ``cp:size="(w, h)"``),
value (``val:value``/``min``/``max``/``step``), actions (``act:<name>_desc``/``_kb``) and its
text as the element's text.

Run ON the desktop by ``osworld_server.py`` with a Python that has Debian's ``pyatspi``
(``python3-pyatspi``; the server's own venv lacks it), inside the desktop's D-Bus session
(``DBUS_SESSION_BUS_ADDRESS``: the accessibility bus is found through it). Prints the XML on
stdout. Bounded: depth, children per node and nodes in all (an application answering slowly
is bounded by the server's time limit on this process). Imports nothing from cua_native.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from typing import Any

import pyatspi

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
MAX_DEPTH = 50
MAX_WIDTH = 1024
MAX_NODES = 5000
MAX_TEXT = 10_000


def _states(node: Any) -> dict[str, str]:
    found = {}
    for state in node.getState().getStates():
        name = pyatspi.stateToString(state).replace(" ", "_") if state else ""
        if name and name != "invalid":
            found[f"{{{NS['st']}}}{name}"] = "true"
    return found


def _node(node: Any, depth: int, budget: list[int]) -> ET.Element:
    budget[0] -= 1
    attrib: dict[str, str] = {"name": node.name or ""}
    attrib.update(_states(node))
    try:
        for key, value in node.get_attributes().items():
            if key:
                attrib[f"{{{NS['attr']}}}{key}"] = str(value)
    except Exception:  # an accessible that went away mid-walk
        pass
    st = NS["st"]
    if attrib.get(f"{{{st}}}visible") == "true" and attrib.get(f"{{{st}}}showing") == "true":
        try:
            x, y, w, h = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
            attrib[f"{{{NS['cp']}}}screencoord"] = f"({x}, {y})"
            attrib[f"{{{NS['cp']}}}size"] = f"({w}, {h})"
        except NotImplementedError:
            pass
    text = ""
    try:
        text_obj = node.queryText()
        text = text_obj.getText(0, min(text_obj.characterCount, MAX_TEXT))
        text = text.replace("\ufffc", "").replace("\ufffd", "")
    except NotImplementedError:
        pass
    try:
        value = node.queryValue()
        for key, read in (
            ("value", lambda: value.currentValue),
            ("min", lambda: value.minimumValue),
            ("max", lambda: value.maximumValue),
            ("step", lambda: value.minimumIncrement),
        ):
            try:
                attrib[f"{{{NS['val']}}}{key}"] = str(read())
            except Exception:
                pass
    except NotImplementedError:
        pass
    try:
        action = node.queryAction()
        for i in range(action.nActions):
            name = action.getName(i).replace(" ", "-")
            attrib[f"{{{NS['act']}}}{name}_desc"] = action.getDescription(i)
            attrib[f"{{{NS['act']}}}{name}_kb"] = action.getKeyBinding(i)
    except NotImplementedError:
        pass
    role = (node.getRoleName() or "unknown").strip().replace(" ", "-") or "unknown"
    element = ET.Element(role, attrib)
    if text:
        element.text = text
    if depth >= MAX_DEPTH:
        return element
    try:
        count = node.childCount
        # a huge container (a spreadsheet's table): only the children on screen
        only_showing = count > MAX_WIDTH
        for i in range(min(count, MAX_WIDTH)):
            if budget[0] <= 0:
                break
            child = node.getChildAtIndex(i)
            if child is None:
                continue
            if only_showing and not child.getState().contains(pyatspi.STATE_SHOWING):
                continue
            element.append(_node(child, depth + 1, budget))
    except Exception:  # children that went away mid-walk: keep what was read
        pass
    return element


def tree() -> str:
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    root = ET.Element("desktop-frame")
    budget = [MAX_NODES]
    desktop = pyatspi.Registry.getDesktop(0)
    for i in range(desktop.childCount):
        app = desktop.getChildAtIndex(i)
        if app is not None and budget[0] > 0:
            root.append(_node(app, 1, budget))
    return ET.tostring(root, encoding="unicode")


if __name__ == "__main__":
    sys.stdout.write(tree())
