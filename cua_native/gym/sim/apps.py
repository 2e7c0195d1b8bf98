"""The launcher's apps: names, synonyms for ``open_app`` and icon colours."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class App:
    app_id: str
    label: str
    color: tuple[int, int, int]
    synonyms: tuple[str, ...] = ()


APPS: tuple[App, ...] = (
    App("settings", "Settings", (96, 125, 139), ("setting", "system settings", "preferences")),
    App(
        "contacts", "Contacts", (26, 115, 232), ("contact", "people", "phone book", "address book")
    ),
    App("notes", "Notes", (251, 188, 4), ("note", "keep", "memo", "memos", "notepad")),
    App("shop", "Shop", (52, 168, 83), ("store", "catalogue", "catalog", "shopping", "market")),
    App("clock", "Clock", (124, 77, 255), ("alarm", "alarms", "timer", "clock app")),
)
APP_BY_ID: dict[str, App] = {a.app_id: a for a in APPS}
APP_ROOT_PAGE: dict[str, str] = {
    "settings": "main",
    "contacts": "list",
    "notes": "list",
    "shop": "list",
    "clock": "main",
}


def _normal(name: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9 ]", " ", name.casefold())).strip()


def resolve_app(name: str) -> App | None:
    """The app an ``open_app`` name means: id, label or synonym, case-insensitive."""
    wanted = _normal(name)
    for app in APPS:
        if wanted in {app.app_id, _normal(app.label), *app.synonyms}:
            return app
    return None
