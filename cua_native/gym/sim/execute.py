"""Canonical actions on the simulated phone.

Touch semantics (documented choices):
- ``click`` is a tap; ``double_click``/``triple_click`` are two/three taps (a toggle flips back).
- ``right_click``, ``middle_click`` and ``mouse_move`` are no-ops: a touch screen has no
  secondary buttons and no hover.
- ``long_press`` opens an element's context menu (notes, contacts); elsewhere a no-op.
- ``swipe`` is the FINGER direction (``up`` = content scrolls down to later items); without an
  end point it travels 40 % of the screen height (20 % of the width sideways) from its start
  or the centre. ``drag`` moves a slider when it starts on one, else scrolls like a swipe.
- ``scroll`` is a mouse wheel: positive ``dy`` moves the view up (to earlier items).
- ``type`` types into the focused field (nothing focused: no-op); a newline presses enter.
- ``key`` understands enter/back/home/menu/delete/space/tab names and single characters;
  a key name the phone does not know is refused (``ok=False``).
- ``tool_call`` is refused (``ok=False``): the phone has no tools.
Anything that makes no sense on the current screen is a no-op with ``ok=True``, like a phone.
"""

from __future__ import annotations

from dataclasses import dataclass

from cua_native.actions import models as m
from cua_native.actions.coords import PixelSpace
from cua_native.gym.sim.apps import APP_ROOT_PAGE, resolve_app
from cua_native.gym.sim.layout import DESIGN_H, DESIGN_W, Element, Layout
from cua_native.gym.sim.screens import build_layout, screen_for
from cua_native.gym.sim.state import (
    FONT_SIZES,
    Contact,
    Menu,
    PhoneState,
    add_note,
    set_airplane,
)

SWIPE_TRAVEL_Y = 0.4 * DESIGN_H
SWIPE_TRAVEL_X = 0.2 * DESIGN_W
MAX_FIELD_CHARS = 500
_MODIFIERS = frozenset({"ctrl", "control", "alt", "meta", "cmd", "command", "super", "win"})
_KEY_ALIASES: dict[str, str] = {
    **dict.fromkeys(("enter", "return", "kp_enter", "keycode_enter"), "enter"),
    **dict.fromkeys(("back", "escape", "esc", "keycode_back"), "back"),
    **dict.fromkeys(("home", "keycode_home"), "home"),
    **dict.fromkeys(
        ("menu", "app_switch", "recents", "keycode_app_switch", "keycode_menu"), "recents"
    ),
    **dict.fromkeys(("backspace", "del", "delete", "keycode_del"), "delete"),
    **dict.fromkeys(("space", "keycode_space"), "space"),
    **dict.fromkeys(("tab", "keycode_tab"), "tab"),
    "shift": "shift",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool = True
    error: str | None = None
    feedback: str | None = None


class Phone:
    """Applies actions to one ``PhoneState`` whose screen is ``space`` pixels large."""

    def __init__(self, state: PhoneState, space: PixelSpace, user_reply: str) -> None:
        self.state = state
        self.space = space
        self.user_reply = user_reply

    # -- entry point ---------------------------------------------------------------------------
    def apply(self, action: m.Action) -> Outcome:
        s = self.state
        s.turn += 1
        match action:
            case m.Click() | m.DoubleClick() | m.TripleClick():
                taps = {"click": 1, "double_click": 2, "triple_click": 3}[action.type]
                for _ in range(taps):
                    self.tap(*self.design(action.x, action.y))
            case m.LongPress():
                self.long_press(*self.design(action.x, action.y))
            case m.RightClick() | m.MiddleClick() | m.MouseMove() | m.Wait():
                pass
            case m.Swipe():
                self.swipe(action)
            case m.Drag():
                start = (
                    self.design(action.x, action.y)
                    if action.x is not None and action.y is not None
                    else s.pointer or (DESIGN_W / 2, DESIGN_H / 2)
                )
                self.move_finger(start, self.design(action.x2, action.y2))
            case m.Scroll():
                self.wheel(action)
            case m.TypeText():
                self.type_text(action.text)
            case m.Key():
                return self.keys(action.keys)
            case m.SystemButton():
                self.command(
                    {"enter": "enter", "menu": "recents"}.get(action.button, action.button)
                )
            case m.OpenApp():
                app = resolve_app(action.name)
                if app is not None:
                    self.command(f"open:{app.app_id}")
            case m.Answer():
                s.answer = action.text
            case m.AskUser():
                return Outcome(feedback=self.user_reply)
            case m.Terminate():
                s.terminated = action.status
            case m.ToolCall():
                return Outcome(
                    ok=False, error=f"tool {action.name!r} is not available on the simulated phone"
                )
        return Outcome()

    def design(self, x: float, y: float) -> tuple[float, float]:
        """Normalized point → device pixel (``PixelSpace``) → design pixel of the layout."""
        px, py = self.space.from_unit(x, y)
        return px * DESIGN_W / self.space.width, py * DESIGN_H / self.space.height

    # -- touches -------------------------------------------------------------------------------
    def tap(self, x: float, y: float) -> None:
        self.state.pointer = (x, y)
        layout = build_layout(self.state)
        element = layout.hit(x, y)
        if layout.modal and (element is None or not element.id.startswith("menu:")):
            self.state.menu = None
            return
        if element is not None and element.tap is not None:
            if element.kind == "slider":
                self.set_slider(element, x)
            else:
                self.command(element.tap)

    def long_press(self, x: float, y: float) -> None:
        self.state.pointer = (x, y)
        layout = build_layout(self.state)
        if layout.modal:
            self.state.menu = None
            return
        element = layout.hit(x, y, long=True)
        if element is not None and element.long is not None:
            self.command(element.long)

    def swipe(self, action: m.Swipe) -> None:
        start = (
            self.design(action.x, action.y)
            if action.x is not None and action.y is not None
            else (DESIGN_W / 2, DESIGN_H / 2)
        )
        if action.x2 is not None and action.y2 is not None:
            end = self.design(action.x2, action.y2)
        elif action.direction is not None:
            dx, dy = {
                "up": (0, -SWIPE_TRAVEL_Y),
                "down": (0, SWIPE_TRAVEL_Y),
                "left": (-SWIPE_TRAVEL_X, 0),
                "right": (SWIPE_TRAVEL_X, 0),
            }[action.direction]
            end = (
                min(DESIGN_W - 1, max(0.0, start[0] + dx)),
                min(DESIGN_H - 1, max(0.0, start[1] + dy)),
            )
        else:
            return
        self.move_finger(start, end)

    def move_finger(self, start: tuple[float, float], end: tuple[float, float]) -> None:
        """A finger pressed at ``start`` and released at ``end``: drags a slider or scrolls."""
        self.state.pointer = end
        layout = build_layout(self.state)
        if layout.modal:
            return
        element = layout.hit(*start)
        if element is not None and element.kind == "slider":
            self.set_slider(element, end[0])
        elif layout.in_viewport(*start) or (layout.viewport is not None and start[1] > 250):
            self.scroll_by(layout, start[1] - end[1])

    def wheel(self, action: m.Scroll) -> None:
        layout = build_layout(self.state)
        if not layout.modal:
            self.scroll_by(layout, -action.dy * DESIGN_H / self.space.height)

    def scroll_by(self, layout: Layout, delta: float) -> None:
        screen = self.state.screen
        screen.scroll = min(layout.max_scroll, max(0.0, screen.scroll + delta))

    def set_slider(self, element: Element, x: float) -> None:
        x0, _, x1, _ = element.box
        self.state.brightness = round(100 * min(1.0, max(0.0, (x - x0) / (x1 - x0))))

    # -- keyboard ------------------------------------------------------------------------------
    def type_text(self, text: str) -> None:
        for i, chunk in enumerate(text.split("\n")):
            if i:
                self.command("enter")
            focus = self.state.focus
            if focus is None or not chunk:
                continue
            current = self.state.fields.get(focus, "")
            self.state.fields[focus] = (current + chunk)[:MAX_FIELD_CHARS]
            if focus == "field:search":
                self.state.screen.scroll = 0.0

    def keys(self, keys: list[str]) -> Outcome:
        names = [k.strip().lower() for k in keys]
        if any(n in _MODIFIERS for n in names):
            return Outcome()
        shift = "shift" in names
        for name in names:
            key = _KEY_ALIASES.get(name.replace("-", "_").replace(" ", "_"))
            if key is None and len(name) == 1:
                self.type_text(name.upper() if shift else name)
            elif key is None:
                return Outcome(ok=False, error=f"unknown key {name!r} on the simulated phone")
            elif key == "space":
                self.type_text(" ")
            elif key == "delete":
                focus = self.state.focus
                if focus is not None:
                    self.state.fields[focus] = self.state.fields.get(focus, "")[:-1]
            elif key == "tab":
                self.focus_next()
            elif key != "shift":
                self.command(key)
        return Outcome()

    def focus_next(self) -> None:
        order = {"field:name": "field:phone", "field:title": "field:body"}
        focus = self.state.focus
        if focus in order:
            self.state.screen.focus = order[focus]

    # -- commands ------------------------------------------------------------------------------
    def command(self, command: str) -> None:
        s = self.state
        head, _, rest = command.partition(":")
        match head:
            case "back":
                self.back()
            case "home":
                self.leave_page()
                s.stack = [s.stack[0]]
            case "recents":
                if s.screen.app != "recents":
                    self.leave_page()
                    s.stack.append(screen_for("recents", "main"))
            case "open":
                self.leave_page()
                s.stack = [s.stack[0], screen_for(rest, APP_ROOT_PAGE[rest])]
                s.recents = [rest, *(a for a in s.recents if a != rest)]
            case "enter":
                self.enter()
            case "nav":
                self.navigate(rest)
            case "toggle":
                self.toggle(rest)
            case "timeout":
                s.screen_timeout_s = int(rest)
            case "font" if rest in FONT_SIZES:
                s.font_size = rest
            case "focus":
                s.screen.focus = rest
            case "contacts" if rest == "save":
                self.save_contact()
            case "note" if rest == "save":
                self.save_note_and_leave()
            case "cart":
                s.cart[int(rest)] = s.cart.get(int(rest), 0) + 1
            case "alarm":
                alarm = next(a for a in s.alarms if a.alarm_id == int(rest))
                alarm.on = not alarm.on
            case "menu":
                self.open_menu(rest)
            case "delete":
                self.delete(rest)
            case "close":
                s.menu = None

    def back(self) -> None:
        s = self.state
        if s.menu is not None:
            s.menu = None
        elif s.focus is not None:
            s.screen.focus = None  # the first back hides the keyboard
        elif len(s.stack) > 1:
            self.leave_page()
            s.stack.pop()

    def leave_page(self) -> None:
        """Leaving the note editor keeps a non-empty draft (like Keep); menus close."""
        s = self.state
        s.menu = None
        if s.screen.key == ("notes", "edit"):
            self.save_note()

    def navigate(self, target: str) -> None:
        app, page, *arg = target.split(":", 2)
        screen = screen_for(app, page, arg[0] if arg else None)
        if (app, page) == ("contacts", "add"):
            screen.fields = {"field:name": "", "field:phone": ""}
            screen.focus = "field:name"
        elif (app, page) == ("notes", "edit"):
            note = self.state.note(int(arg[0])) if arg else None
            screen.fields = {
                "field:title": note.title if note else "",
                "field:body": note.body if note else "",
            }
            screen.focus = "field:body" if note else "field:title"
        self.state.menu = None
        self.state.stack.append(screen)

    def toggle(self, name: str) -> None:
        s = self.state
        if name == "wifi":
            s.wifi_on = not s.wifi_on
        elif name == "bluetooth":
            s.bluetooth_on = not s.bluetooth_on
        elif name == "airplane":
            set_airplane(s, not s.airplane_mode_on)
        elif name == "dark":
            s.dark_mode = not s.dark_mode

    def enter(self) -> None:
        focus = self.state.focus
        if focus in ("field:name", "field:title"):
            self.focus_next()
        elif focus == "field:phone":
            self.save_contact()
        elif focus == "field:body":
            self.save_note_and_leave()
        elif focus == "field:search":
            self.state.screen.focus = None

    def save_contact(self) -> None:
        s = self.state
        name = " ".join(s.fields.get("field:name", "").split())
        phone = s.fields.get("field:phone", "").strip()
        if not name or not phone:
            return  # the form stays open, like an app that refuses an empty contact
        s.contacts = sorted([*s.contacts, Contact(name, phone, "")], key=lambda c: c.name)
        s.stack.pop()

    def save_note(self) -> None:
        s = self.state
        if not s.fields:
            return
        title = s.fields.get("field:title", "").strip()
        body = s.fields.get("field:body", "").strip()
        existing = s.note(int(s.screen.arg)) if s.screen.arg else None
        if existing is not None:
            existing.title, existing.body = title, body
        elif title or body:
            add_note(s, title, body)
        s.screen.fields = {}

    def save_note_and_leave(self) -> None:
        self.save_note()
        self.state.stack.pop()

    def open_menu(self, target: str) -> None:
        kind, _, key = target.partition(":")
        s = self.state
        if kind == "note" and (note := s.note(int(key))) is not None:
            s.menu = Menu(
                note.title or "(untitled)",
                ((f"delete:note:{key}", "Delete note"), ("close", "Cancel")),
            )
        elif kind == "contact" and s.contact(key) is not None:
            s.menu = Menu(key, ((f"delete:contact:{key}", "Delete contact"), ("close", "Cancel")))

    def delete(self, target: str) -> None:
        kind, _, key = target.partition(":")
        s = self.state
        if kind == "note":
            s.notes = [n for n in s.notes if n.note_id != int(key)]
        elif kind == "contact":
            s.contacts = [c for c in s.contacts if c.name != key]
        s.menu = None
