"""Screen builders: phone state → ``Layout`` (what is on screen and what touching it does).

Commands are short strings (``toggle:wifi``, ``nav:settings:display``, ``note:open:3``) that
``execute`` runs; the renderer draws the same elements, so what is seen is what is hit.
"""

from __future__ import annotations

from collections.abc import Callable

from cua_native.gym.sim.apps import APP_BY_ID, APPS
from cua_native.gym.sim.layout import (
    APPBAR_BOTTOM,
    DESIGN_H,
    DESIGN_W,
    NAV_TOP,
    STATUS_H,
    Box,
    Element,
    Layout,
)
from cua_native.gym.sim.state import FONT_SIZES, TIMEOUT_CHOICES, PhoneState, Screen

ROW_H = 160
MARGIN = 60


class _Builder:
    """Collects elements; rows inside the viewport are offset by the scroll and clipped."""

    def __init__(self, state: PhoneState) -> None:
        self.state = state
        self.elements: list[Element] = []
        self.viewport: Box | None = None
        self.content_height = 0.0

    def add(self, element: Element) -> None:
        self.elements.append(element)

    def app_bar(self, title: str, *, up: bool, action: Element | None = None) -> None:
        self.add(Element("appbar", "appbar", (0, STATUS_H, DESIGN_W, APPBAR_BOTTOM), title))
        if up:
            self.add(Element("up", "up", (10, 110, 150, 230), "Navigate up", tap="back"))
        if action is not None:
            self.add(action)

    def scroll_area(self, top: float, content_height: float) -> None:
        self.viewport = (0, top, DESIGN_W, NAV_TOP)
        self.content_height = content_height

    def row(self, index: int, row_h: float, element: Element) -> None:
        """Place a list row (``element.box`` given relative to the list top) under the scroll."""
        assert self.viewport is not None
        top = self.viewport[1] + index * row_h - self.state.screen.scroll
        box = (element.box[0], top, element.box[2], top + row_h)
        if box[3] <= self.viewport[1] or box[1] >= self.viewport[3]:
            return
        visible = (box[0], max(box[1], self.viewport[1]), box[2], min(box[3], self.viewport[3]))
        self.add(_replace(element, box=box, visible=visible))

    def layout(self) -> Layout:
        return Layout(tuple(self.elements), self.viewport, self.content_height)


def _replace(element: Element, **changes: object) -> Element:
    fields = {name: getattr(element, name) for name in element.__slots__}
    fields.update(changes)
    return Element(**fields)


def _full_row(element_id: str, kind: str, label: str, **kw: object) -> Element:
    return Element(element_id, kind, (0, 0, DESIGN_W, ROW_H), label, **kw)  # type: ignore[arg-type]


def _home(b: _Builder) -> None:
    b.add(Element("home:clock", "big_text", (0, 180, DESIGN_W, 400), "12:30", "Monday, June 2"))
    for i, app in enumerate(APPS):
        col, line = i % 4, i // 4
        cx, top = 135 + col * 270, 560 + line * 340
        b.add(
            Element(
                f"icon:{app.app_id}",
                "app_icon",
                (cx - 110, top, cx + 110, top + 290),
                app.label,
                value=app.app_id,
                tap=f"open:{app.app_id}",
            )
        )


def _recents(b: _Builder) -> None:
    b.app_bar("Recent apps", up=False)
    if not b.state.recents:
        b.add(Element("recents:empty", "text", (0, 1100, DESIGN_W, 1200), "No recent items"))
    for i, app_id in enumerate(b.state.recents[:4]):
        top = 300 + i * 480
        b.add(
            Element(
                f"recent:{app_id}",
                "card",
                (90, top, 990, top + 440),
                APP_BY_ID[app_id].label,
                value=app_id,
                tap=f"open:{app_id}",
            )
        )


def _settings_main(b: _Builder) -> None:
    s = b.state
    b.app_bar("Settings", up=False)
    rows = [
        _full_row(
            "toggle:wifi",
            "toggle_row",
            "Wi-Fi",
            detail="HomeNet" if s.wifi_on else "Off",
            value=s.wifi_on,
            tap="toggle:wifi",
        ),
        _full_row(
            "toggle:bluetooth",
            "toggle_row",
            "Bluetooth",
            detail="On" if s.bluetooth_on else "Off",
            value=s.bluetooth_on,
            tap="toggle:bluetooth",
        ),
        _full_row(
            "toggle:airplane",
            "toggle_row",
            "Airplane mode",
            detail="On" if s.airplane_mode_on else "Off",
            value=s.airplane_mode_on,
            tap="toggle:airplane",
        ),
        _full_row(
            "nav:display",
            "nav_row",
            "Display",
            detail="Brightness, dark mode, screen timeout",
            tap="nav:settings:display",
        ),
        _full_row("battery", "info_row", "Battery", detail=f"{s.battery}%"),
        _full_row("about", "info_row", "About phone", detail="Simulated phone 1.0"),
    ]
    b.scroll_area(APPBAR_BOTTOM, len(rows) * ROW_H)
    for i, row in enumerate(rows):
        b.row(i, ROW_H, row)


def _settings_display(b: _Builder) -> None:
    s = b.state
    timeout = dict(TIMEOUT_CHOICES).get(s.screen_timeout_s, f"{s.screen_timeout_s} seconds")
    b.app_bar("Display", up=True)
    b.add(
        Element(
            "brightness:label",
            "text",
            (MARGIN, 290, 700, 370),
            "Brightness",
            detail=f"{s.brightness}%",
        )
    )
    b.add(
        Element(
            "slider:brightness",
            "slider",
            (MARGIN + 30, 390, DESIGN_W - MARGIN - 30, 490),
            "Brightness slider",
            value=s.brightness,
            tap="slider:brightness",
        )
    )
    b.add(
        Element(
            "toggle:dark",
            "toggle_row",
            (0, 540, DESIGN_W, 700),
            "Dark mode",
            detail="On" if s.dark_mode else "Off",
            value=s.dark_mode,
            tap="toggle:dark",
        )
    )
    b.add(
        Element(
            "nav:timeout",
            "nav_row",
            (0, 700, DESIGN_W, 860),
            "Screen timeout",
            detail=f"After {timeout} of inactivity",
            tap="nav:settings:timeout",
        )
    )
    b.add(Element("font:label", "text", (MARGIN, 900, 700, 980), "Font size"))
    for i, size in enumerate(FONT_SIZES):
        x0 = MARGIN + i * 330
        b.add(
            Element(
                f"font:{size}",
                "chip",
                (x0, 1010, x0 + 300, 1130),
                size,
                value=s.font_size == size,
                tap=f"font:{size}",
            )
        )


def _settings_timeout(b: _Builder) -> None:
    b.app_bar("Screen timeout", up=True)
    b.scroll_area(APPBAR_BOTTOM, len(TIMEOUT_CHOICES) * ROW_H)
    for i, (seconds, label) in enumerate(TIMEOUT_CHOICES):
        b.row(
            i,
            ROW_H,
            _full_row(
                f"timeout:{seconds}",
                "radio_row",
                label,
                value=b.state.screen_timeout_s == seconds,
                tap=f"timeout:{seconds}",
            ),
        )


def _contacts_list(b: _Builder) -> None:
    b.app_bar(
        "Contacts",
        up=False,
        action=Element(
            "contacts:add",
            "icon_button",
            (900, 110, 1040, 230),
            "Add contact",
            value="+",
            tap="nav:contacts:add",
        ),
    )
    contacts = b.state.contacts
    b.scroll_area(APPBAR_BOTTOM, len(contacts) * ROW_H)
    for i, c in enumerate(contacts):
        b.row(
            i,
            ROW_H,
            _full_row(
                f"contact:{c.name}",
                "avatar_row",
                c.name,
                tap=f"nav:contacts:detail:{c.name}",
                long=f"menu:contact:{c.name}",
            ),
        )


def _contacts_detail(b: _Builder) -> None:
    contact = b.state.contact(b.state.screen.arg or "")
    b.app_bar("Contact", up=True)
    if contact is None:
        b.add(Element("contact:missing", "text", (0, 1100, DESIGN_W, 1200), "Contact deleted"))
        return
    b.add(Element("contact:avatar", "avatar", (390, 330, 690, 630), contact.name))
    b.add(Element("contact:name", "title", (0, 670, DESIGN_W, 780), contact.name))
    b.add(
        Element(
            "contact:phone", "info_row", (0, 840, DESIGN_W, 1000), "Phone", detail=contact.phone
        )
    )
    b.add(
        Element(
            "contact:email", "info_row", (0, 1000, DESIGN_W, 1160), "Email", detail=contact.email
        )
    )
    b.add(Element("contact:call", "button", (MARGIN, 1240, 510, 1370), "Call", tap="noop"))
    b.add(Element("contact:message", "button", (570, 1240, 1020, 1370), "Message", tap="noop"))


def _field(b: _Builder, field_id: str, label: str, box: Box) -> None:
    b.add(
        Element(
            field_id,
            "field",
            box,
            label,
            value=b.state.fields.get(field_id, ""),
            detail="focused" if b.state.focus == field_id else "",
            tap=f"focus:{field_id}",
        )
    )


def _contacts_add(b: _Builder) -> None:
    b.app_bar("New contact", up=True)
    _field(b, "field:name", "Name", (MARGIN, 320, DESIGN_W - MARGIN, 470))
    _field(b, "field:phone", "Phone", (MARGIN, 520, DESIGN_W - MARGIN, 670))
    b.add(
        Element(
            "contacts:save",
            "button",
            (MARGIN, 760, DESIGN_W - MARGIN, 890),
            "Save",
            tap="contacts:save",
        )
    )


def _notes_list(b: _Builder) -> None:
    b.app_bar("Notes", up=False)
    notes = b.state.notes
    b.scroll_area(APPBAR_BOTTOM, len(notes) * (ROW_H + 40) + 200)
    if not notes:
        b.add(Element("notes:empty", "text", (0, 1100, DESIGN_W, 1200), "No notes yet"))
    for i, note in enumerate(notes):
        b.row(
            i,
            ROW_H + 40,
            Element(
                f"note:{note.note_id}",
                "note_row",
                (0, 0, DESIGN_W, 0),
                note.title or "(untitled)",
                detail=note.body,
                tap=f"nav:notes:edit:{note.note_id}",
                long=f"menu:note:{note.note_id}",
            ),
        )
    b.add(
        Element(
            "note:new", "fab", (700, 2050, 1020, 2200), "New note", value="+", tap="nav:notes:edit"
        )
    )


def _notes_edit(b: _Builder) -> None:
    b.app_bar(
        "Edit note",
        up=True,
        action=Element("note:save", "text_button", (820, 110, 1050, 230), "Save", tap="note:save"),
    )
    _field(b, "field:title", "Title", (MARGIN, 300, DESIGN_W - MARGIN, 450))
    _field(b, "field:body", "Note", (MARGIN, 490, DESIGN_W - MARGIN, 1300))


def _shop_list(b: _Builder) -> None:
    cart = sum(b.state.cart.values())
    b.app_bar(
        "Shop",
        up=False,
        action=Element("shop:cart", "badge", (760, 120, 1040, 220), f"Cart ({cart})"),
    )
    _field(b, "field:search", "Search products", (MARGIN, 270, DESIGN_W - MARGIN, 390))
    query = b.state.fields.get("field:search", "").strip().casefold()
    items = [i for i in b.state.catalogue if query in i.name.casefold()]
    b.scroll_area(410, len(items) * ROW_H)
    for i, item in enumerate(items):
        b.row(
            i,
            ROW_H,
            _full_row(
                f"item:{item.item_id}",
                "price_row",
                item.name,
                detail=item.price_text,
                tap=f"nav:shop:item:{item.item_id}",
            ),
        )


def _shop_item(b: _Builder) -> None:
    item = b.state.item(int(b.state.screen.arg or -1))
    b.app_bar("Product", up=True)
    if item is None:
        return
    b.add(Element("item:picture", "picture", (140, 300, 940, 1000), item.name, value=item.item_id))
    b.add(Element("item:name", "title", (0, 1040, DESIGN_W, 1150), item.name))
    b.add(Element("item:price", "text", (MARGIN, 1170, DESIGN_W, 1250), item.price_text))
    b.add(Element("item:description", "text", (MARGIN, 1270, DESIGN_W, 1350), item.description))
    in_cart = b.state.cart.get(item.item_id, 0)
    b.add(
        Element(
            "item:cart",
            "button",
            (MARGIN, 1420, DESIGN_W - MARGIN, 1550),
            "Add to cart",
            detail=f"{in_cart} in cart" if in_cart else "",
            tap=f"cart:{item.item_id}",
        )
    )


def _clock(b: _Builder) -> None:
    b.app_bar("Clock", up=False)
    b.add(Element("clock:time", "big_text", (0, 280, DESIGN_W, 520), "12:30", "Monday, June 2"))
    alarms = b.state.alarms
    b.scroll_area(560, len(alarms) * ROW_H)
    for i, alarm in enumerate(alarms):
        b.row(
            i,
            ROW_H,
            _full_row(
                f"alarm:{alarm.alarm_id}",
                "toggle_row",
                alarm.label,
                detail=alarm.repeat,
                value=alarm.on,
                tap=f"alarm:{alarm.alarm_id}",
            ),
        )


_PAGES: dict[tuple[str, str], Callable[[_Builder], None]] = {
    ("home", "main"): _home,
    ("recents", "main"): _recents,
    ("settings", "main"): _settings_main,
    ("settings", "display"): _settings_display,
    ("settings", "timeout"): _settings_timeout,
    ("contacts", "list"): _contacts_list,
    ("contacts", "detail"): _contacts_detail,
    ("contacts", "add"): _contacts_add,
    ("notes", "list"): _notes_list,
    ("notes", "edit"): _notes_edit,
    ("shop", "list"): _shop_list,
    ("shop", "item"): _shop_item,
    ("clock", "main"): _clock,
}
PAGES: frozenset[tuple[str, str]] = frozenset(_PAGES)


def _nav_bar(b: _Builder) -> None:
    for i, (name, command) in enumerate(
        (("Back", "back"), ("Home", "home"), ("Recents", "recents"))
    ):
        cx = 270 + i * 270
        b.add(
            Element(
                f"nav:{command}",
                "nav_button",
                (cx - 110, NAV_TOP, cx + 110, DESIGN_H),
                name,
                value=command,
                tap=command,
            )
        )


def _menu(b: _Builder) -> None:
    menu = b.state.menu
    assert menu is not None
    top = 900
    height = 140 + len(menu.options) * 150
    b.add(Element("menu", "menu", (120, top, 960, top + height), menu.title))
    for i, (command, label) in enumerate(menu.options):
        y = top + 130 + i * 150
        b.add(Element(f"menu:{i}", "menu_item", (120, y, 960, y + 150), label, tap=command))


def build_layout(state: PhoneState) -> Layout:
    """Everything on the current screen, system bars and any open menu included."""
    b = _Builder(state)
    _PAGES[state.screen.key](b)
    layout_body = b.elements
    b.elements = []
    b.add(Element("status", "status_bar", (0, 0, DESIGN_W, STATUS_H)))
    b.elements.extend(layout_body)
    _nav_bar(b)
    modal = state.menu is not None
    if modal:
        _menu(b)
    layout = b.layout()
    return Layout(layout.elements, layout.viewport, layout.content_height, modal)


def screen_for(app: str, page: str, arg: str | None = None) -> Screen:
    if (app, page) not in PAGES:
        raise ValueError(f"unknown screen {app}/{page}")
    return Screen(app, page, arg)
