"""Solution paths: the next canonical action towards a task's goal, read off the current screen.

A task's ``plan`` is a list of goals (``toggle wifi on``, ``add contact …``). The solver looks at
the phone's state and the current layout, skips goals already met, and returns one action for
the first open goal plus the label of what it touches (the thought of a demonstration says
"Tap <label>."; ``None`` for actions that touch no element). It taps
elements at the centre of their visible hit box, scrolls lists with finger swipes, and types
into focused fields, so every action it takes is one a model could take from the screenshot.
"""

from __future__ import annotations

from typing import Any, Literal

from cua_native.actions import models as m
from cua_native.gym.protocol import Task
from cua_native.gym.sim.apps import APP_BY_ID
from cua_native.gym.sim.layout import DESIGN_H, Layout, centre_unit
from cua_native.gym.sim.screens import ROW_H
from cua_native.gym.sim.state import PhoneState

SwipeStyle = Literal["direction", "points"]
"""``direction``: MAI-UI's swipe (a direction and a start); ``points``: Qwen's (start and end)."""

Step = tuple[m.Action, str | None]
"""An action and the label of what it touches (for a demonstration's thought), if anything."""

_RADIO = {"wifi": "wifi_on", "bluetooth": "bluetooth_on", "airplane": "airplane_mode_on"}
_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("settings", "display"): ("main", "display"),
    ("settings", "timeout"): ("main", "display", "timeout"),
}
"""Pages reached through other pages of the same app (the rest are one tap from the root)."""


class Solver:
    def __init__(self, state: PhoneState, layout: Layout, swipe_style: SwipeStyle) -> None:
        self.state = state
        self.layout = layout
        self.swipe_style = swipe_style

    # ------------------------------------------------------------------ primitives
    def tap(self, element_id: str, what: str) -> Step | None:
        element = self.layout.by_id(element_id)
        blocked = self.layout.modal and not element_id.startswith("menu:")
        if element is None or not element.fully_visible or blocked:
            return None
        x, y = centre_unit(element)
        return m.Click(x=x, y=y), what

    def long_press(self, element_id: str, what: str) -> Step | None:
        element = self.layout.by_id(element_id)
        if element is None or not element.fully_visible:
            return None
        x, y = centre_unit(element)
        return m.LongPress(x=x, y=y), what

    def swipe(self, later: bool) -> Step:
        """Scroll the list: a finger moving up shows later rows, down shows earlier ones."""
        start, end = (0.72, 0.32) if later else (0.32, 0.72)
        if self.swipe_style == "direction":
            action = m.Swipe(direction="up" if later else "down", x=0.5, y=start)
        else:
            action = m.Swipe(x=0.5, y=start, x2=0.5, y2=end)
        return action, f"the list {'up' if later else 'down'}"

    def back(self) -> Step:
        return m.SystemButton(button="back"), None

    def reach_row(self, element_id: str, index: int, what: str, *, long: bool = False) -> Step:
        """Tap (or long-press) a list row, scrolling it fully into view first."""
        act = self.long_press if long else self.tap
        step = act(element_id, what)
        if step is not None:
            return step
        viewport = self.layout.viewport
        assert viewport is not None, "reach_row on a screen without a list"
        top = viewport[1] + index * ROW_H - self.state.screen.scroll
        return self.swipe(later=top >= viewport[1])

    # ------------------------------------------------------------------ navigation
    def goto(self, app: str, page: str | None = None) -> Step | None:
        """The next action towards ``app``/``page`` (its root page if ``page`` is None)."""
        s = self.state
        if s.menu is not None:
            return self.back()
        if app == "home":
            return None if s.screen.app == "home" else (m.SystemButton(button="home"), None)
        if s.screen.app != app:
            label = APP_BY_ID[app].label
            return m.OpenApp(name=label), label
        path = _PATHS.get((app, page or ""), (page,) if page else ())
        here = s.screen.page
        if page is None or here == page:
            if page is None and here not in ("main", "list") and len(s.stack) > 2:
                return self.back()
            return None
        if here in path:
            following = path[path.index(here) + 1]
            return self.tap(f"nav:{following}", f"{following.title()}") or self.back()
        return self.back()

    # ------------------------------------------------------------------ goals
    def step_for(self, goal: dict[str, Any]) -> Step | None:
        """The next action for ``goal``, or ``None`` when it is already met."""
        s = self.state
        do = goal["do"]
        if do == "toggle":
            if getattr(s, _RADIO[goal["key"]]) == goal["on"]:
                return None
            label = {"wifi": "Wi-Fi", "bluetooth": "Bluetooth", "airplane": "Airplane mode"}
            return self.goto("settings", "main") or self.tap(
                f"toggle:{goal['key']}", f"the {label[goal['key']]} switch"
            )
        if do == "dark":
            if s.dark_mode == goal["on"]:
                return None
            return self.goto("settings", "display") or self.tap(
                "toggle:dark", "the Dark mode switch"
            )
        if do == "timeout":
            if s.screen_timeout_s == goal["seconds"]:
                return None
            return self.goto("settings", "timeout") or self.tap(
                f"timeout:{goal['seconds']}", "the timeout option"
            )
        if do == "brightness":
            if abs(s.brightness - goal["target"]) <= 3:
                return None
            return self.goto("settings", "display") or self.slide(goal["target"])
        if do == "font":
            if s.font_size == goal["size"]:
                return None
            return self.goto("settings", "display") or self.tap(
                f"font:{goal['size']}", f"the {goal['size']} font size"
            )
        if do == "open":
            return self.goto(goal["app"])
        if do == "home":
            return self.goto("home")
        if do == "page":
            return self.goto(goal["app"], goal["page"])
        if do == "add_contact":
            return self.add_contact(goal["name"], goal["phone"])
        if do == "delete_contact":
            return self.delete_contact(goal["name"])
        if do == "view_contact":
            if s.screen.key == ("contacts", "detail") and s.screen.arg == goal["name"]:
                return None
            return self.goto("contacts") or self.contact_row(goal["name"], long=False)
        if do == "note":
            return self.write_note(goal["title"], goal["body"])
        if do == "delete_note":
            return self.delete_note(goal["title"])
        if do == "open_item":
            return self.open_item(goal["name"])
        if do == "cart":
            item = s.item_named(goal["name"])
            if item is not None and s.cart.get(item.item_id, 0) > 0:
                return None
            if s.screen.key == ("shop", "item") and item and s.screen.arg == str(item.item_id):
                return self.tap("item:cart", "Add to cart")
            return self.open_item(goal["name"])
        if do == "alarm":
            alarm = next(a for a in s.alarms if a.label == goal["label"])
            if alarm.on == goal["on"]:
                return None
            return self.goto("clock") or self.reach_row(
                f"alarm:{alarm.alarm_id}", s.alarms.index(alarm), f"the {alarm.label} alarm"
            )
        if do == "answer":
            if s.answer is not None:
                return None
            return m.Answer(text=goal["text"]), None
        raise ValueError(f"unknown plan step {goal!r}")

    def slide(self, target: int) -> Step | None:
        element = self.layout.by_id("slider:brightness")
        if element is None:
            return None
        x0, y0, x1, y1 = element.box
        x = (x0 + (x1 - x0) * target / 100) / 1080
        y = (y0 + y1) / 2 / DESIGN_H
        return m.Click(x=x, y=y), f"the brightness slider at {target}%"

    def contact_row(self, name: str, *, long: bool) -> Step:
        names = [c.name for c in self.state.contacts]
        return self.reach_row(f"contact:{name}", names.index(name), name, long=long)

    def add_contact(self, name: str, phone: str) -> Step | None:
        s = self.state
        if (c := s.contact(name)) is not None and c.phone == phone:
            return None
        if s.screen.key != ("contacts", "add"):
            return self.goto("contacts") or self.tap("contacts:add", "Add contact")
        return self.fill_form(
            (("field:name", name, "the Name field"), ("field:phone", phone, "the Phone field")),
            ("contacts:save", "Save"),
        )

    def fill_form(
        self, fields: tuple[tuple[str, str, str], ...], save: tuple[str, str]
    ) -> Step | None:
        s = self.state
        for field_id, text, what in fields:
            current = s.fields.get(field_id, "")
            if current == text:
                continue
            if current:
                return m.Key(keys=["delete"]), what
            if s.focus != field_id:
                return self.tap(field_id, what)
            return m.TypeText(text=text), what
        return self.tap(*save)

    def delete_contact(self, name: str) -> Step | None:
        s = self.state
        if s.contact(name) is None:
            return None
        if s.menu is not None:
            return self.tap("menu:0", "Delete contact") if s.menu.title == name else self.back()
        return self.goto("contacts") or self.contact_row(name, long=True)

    def write_note(self, title: str, body: str) -> Step | None:
        s = self.state
        if any(n.title == title and n.body == body for n in s.notes):
            return None
        if s.screen.key != ("notes", "edit") or s.screen.arg is not None:
            return self.goto("notes") or self.tap("note:new", "New note")
        return self.fill_form(
            (("field:title", title, "the Title field"), ("field:body", body, "the note text")),
            ("note:save", "Save"),
        )

    def delete_note(self, title: str) -> Step | None:
        s = self.state
        note = next((n for n in s.notes if n.title == title), None)
        if note is None:
            return None
        if s.menu is not None:
            return self.tap("menu:0", "Delete note") if s.menu.title == title else self.back()
        if s.screen.key != ("notes", "list"):
            return self.goto("notes") or self.back()
        return self.reach_row(
            f"note:{note.note_id}", s.notes.index(note), f"the note {title}", long=True
        )

    def open_item(self, name: str) -> Step | None:
        s = self.state
        item = s.item_named(name)
        if item is None:
            return None
        if s.screen.key == ("shop", "item"):
            return None if s.screen.arg == str(item.item_id) else self.back()
        if (step := self.goto("shop")) is not None:
            return step
        query = s.fields.get("field:search", "")
        if query and query != name:
            return m.Key(keys=["delete"]), "Clear the search field."
        if not query:
            if s.focus != "field:search":
                return self.tap("field:search", "the search field")
            return m.TypeText(text=name), "the search field"
        return self.tap(f"item:{item.item_id}", name)


def next_step(
    task: Task, state: PhoneState, layout: Layout, swipe_style: SwipeStyle = "direction"
) -> Step | None:
    """The next (action, description) of the task's solution, or ``None`` when it is done."""
    plan = (task.model_extra or {}).get("plan") or []
    solver = Solver(state, layout, swipe_style)
    for goal in plan:
        step = solver.step_for(goal)
        if step is not None:
            return step
    if any(goal["do"] == "answer" for goal in plan) or state.terminated is not None:
        return None
    return m.Terminate(status="success"), None
