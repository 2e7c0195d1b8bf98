"""The simulator's task catalogue: instructions, set-up, validators and solution plans.

Everything about a task is plain JSON (``setup``, ``validation``, ``plan`` ride on the ``Task``
as extra fields), so tasks survive the HTTP server, dataset rows and config files unchanged.
Success is judged from the phone's state by validators (like ``settings get global wifi_on``
on a device), never from the model's claim; answer tasks compare the model's answer with what
the phone shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from cua_native.gym.protocol import Task, ValidatorResult
from cua_native.gym.sim.state import (
    TIMEOUT_CHOICES,
    Contact,
    PhoneState,
    ShopItem,
    add_note,
    set_airplane,
)

Spec = dict[str, Any]


def _task(
    number: int,
    instruction: str,
    *,
    app: str,
    difficulty: str,
    tags: list[str],
    validation: list[Spec],
    plan: list[Spec],
    setup: list[Spec] | None = None,
    max_steps: int = 12,
) -> Task:
    return Task(
        task_id=f"sim-{number:03d}",
        name=instruction.rstrip("."),
        instruction=instruction,
        description=instruction,
        tags=[app, difficulty, *tags],
        max_steps=max_steps,
        app=app,
        difficulty=difficulty,
        category=tags[0] if tags else app,
        validation=validation,
        setup=setup or [],
        plan=plan,
    )


def _setting(key: str, value: Any) -> Spec:
    return {"check": "setting", "key": key, "equals": value}


def catalogue() -> list[Task]:
    """All tasks, ordered by id. Deterministic: the seed of an execution varies the phone's
    data, and each task's ``setup`` pins whatever its instruction depends on."""
    t = _task
    return [
        t(
            1,
            "Turn on Wi-Fi.",
            app="settings",
            difficulty="easy",
            tags=["toggle"],
            setup=[{"set": "wifi_on", "value": False}, {"set": "airplane_mode_on", "value": False}],
            validation=[_setting("wifi_on", True)],
            plan=[{"do": "toggle", "key": "wifi", "on": True}],
        ),
        t(
            2,
            "Turn off Wi-Fi.",
            app="settings",
            difficulty="easy",
            tags=["toggle"],
            setup=[{"set": "wifi_on", "value": True}],
            validation=[_setting("wifi_on", False)],
            plan=[{"do": "toggle", "key": "wifi", "on": False}],
        ),
        t(
            3,
            "Turn on Bluetooth.",
            app="settings",
            difficulty="easy",
            tags=["toggle"],
            setup=[{"set": "bluetooth_on", "value": False}],
            validation=[_setting("bluetooth_on", True)],
            plan=[{"do": "toggle", "key": "bluetooth", "on": True}],
        ),
        t(
            4,
            "Turn off Bluetooth.",
            app="settings",
            difficulty="easy",
            tags=["toggle"],
            setup=[{"set": "bluetooth_on", "value": True}],
            validation=[_setting("bluetooth_on", False)],
            plan=[{"do": "toggle", "key": "bluetooth", "on": False}],
        ),
        t(
            5,
            "Turn on airplane mode.",
            app="settings",
            difficulty="easy",
            tags=["toggle"],
            validation=[_setting("airplane_mode_on", True)],
            plan=[{"do": "toggle", "key": "airplane", "on": True}],
        ),
        t(
            6,
            "Turn on dark mode.",
            app="settings",
            difficulty="medium",
            tags=["display"],
            validation=[_setting("dark_mode", True)],
            plan=[{"do": "dark", "on": True}],
        ),
        t(
            7,
            "Set the screen timeout to 5 minutes.",
            app="settings",
            difficulty="medium",
            tags=["display"],
            validation=[_setting("screen_timeout_s", 300)],
            plan=[{"do": "timeout", "seconds": 300}],
        ),
        t(
            8,
            "Set the screen timeout to 15 seconds.",
            app="settings",
            difficulty="medium",
            tags=["display"],
            validation=[_setting("screen_timeout_s", 15)],
            plan=[{"do": "timeout", "seconds": 15}],
        ),
        t(
            9,
            "Set the brightness to 80%.",
            app="settings",
            difficulty="medium",
            tags=["slider"],
            setup=[{"set": "brightness", "value": 30}],
            validation=[{"check": "near", "key": "brightness", "target": 80, "tolerance": 5}],
            plan=[{"do": "brightness", "target": 80}],
        ),
        t(
            10,
            "Set the brightness to 20%.",
            app="settings",
            difficulty="medium",
            tags=["slider"],
            setup=[{"set": "brightness", "value": 70}],
            validation=[{"check": "near", "key": "brightness", "target": 20, "tolerance": 5}],
            plan=[{"do": "brightness", "target": 20}],
        ),
        t(
            11,
            "Make the font size Large.",
            app="settings",
            difficulty="medium",
            tags=["display"],
            validation=[_setting("font_size", "Large")],
            plan=[{"do": "font", "size": "Large"}],
        ),
        t(
            12,
            "Turn on airplane mode, then turn Wi-Fi back on.",
            app="settings",
            difficulty="hard",
            tags=["multi-step", "toggle"],
            setup=[{"set": "wifi_on", "value": True}],
            validation=[_setting("airplane_mode_on", True), _setting("wifi_on", True)],
            plan=[
                {"do": "toggle", "key": "airplane", "on": True},
                {"do": "toggle", "key": "wifi", "on": True},
            ],
        ),
        t(
            13,
            "Open the Contacts app.",
            app="contacts",
            difficulty="easy",
            tags=["navigation"],
            validation=[{"check": "screen", "app": "contacts"}],
            plan=[{"do": "open", "app": "contacts"}],
            max_steps=5,
        ),
        t(
            14,
            "Open Notes.",
            app="notes",
            difficulty="easy",
            tags=["navigation"],
            validation=[{"check": "screen", "app": "notes"}],
            plan=[{"do": "open", "app": "notes"}],
            max_steps=5,
        ),
        t(
            15,
            "Open the Clock app.",
            app="clock",
            difficulty="easy",
            tags=["navigation"],
            validation=[{"check": "screen", "app": "clock"}],
            plan=[{"do": "open", "app": "clock"}],
            max_steps=5,
        ),
        t(
            16,
            "Go back to the home screen.",
            app="home",
            difficulty="easy",
            tags=["navigation"],
            setup=[{"open": "settings:display"}],
            validation=[{"check": "screen", "app": "home"}],
            plan=[{"do": "home"}],
            max_steps=5,
        ),
        t(
            17,
            "Open the display settings.",
            app="settings",
            difficulty="easy",
            tags=["navigation"],
            validation=[{"check": "screen", "app": "settings", "page": "display"}],
            plan=[{"do": "page", "app": "settings", "page": "display"}],
            max_steps=6,
        ),
        t(
            18,
            "Add a contact named Zoe Park with phone number 555-0100.",
            app="contacts",
            difficulty="medium",
            tags=["typing"],
            validation=[{"check": "contact", "name": "Zoe Park", "phone": "555-0100"}],
            plan=[{"do": "add_contact", "name": "Zoe Park", "phone": "555-0100"}],
            max_steps=15,
        ),
        t(
            19,
            "Save a new contact: Yuki Tanaka, 555-0199.",
            app="contacts",
            difficulty="medium",
            tags=["typing"],
            validation=[{"check": "contact", "name": "Yuki Tanaka", "phone": "555-0199"}],
            plan=[{"do": "add_contact", "name": "Yuki Tanaka", "phone": "555-0199"}],
            max_steps=15,
        ),
        t(
            20,
            "Delete the contact Olga Rossi.",
            app="contacts",
            difficulty="hard",
            tags=["long-press", "scroll"],
            setup=[{"contact": {"name": "Olga Rossi", "phone": "555-321-7788"}}],
            validation=[{"check": "no_contact", "name": "Olga Rossi"}],
            plan=[{"do": "delete_contact", "name": "Olga Rossi"}],
            max_steps=15,
        ),
        t(
            21,
            "What is Olga Rossi's phone number?",
            app="contacts",
            difficulty="medium",
            tags=["answer", "scroll"],
            setup=[{"contact": {"name": "Olga Rossi", "phone": "555-321-7788"}}],
            validation=[{"check": "answer", "expected": "555-321-7788", "match": "digits"}],
            plan=[
                {"do": "view_contact", "name": "Olga Rossi"},
                {"do": "answer", "text": "555-321-7788"},
            ],
            max_steps=12,
        ),
        t(
            22,
            "Create a note titled Shopping that says milk and tea.",
            app="notes",
            difficulty="medium",
            tags=["typing"],
            validation=[{"check": "note", "title": "Shopping", "body": "milk and tea"}],
            plan=[{"do": "note", "title": "Shopping", "body": "milk and tea"}],
            max_steps=15,
        ),
        t(
            23,
            "Write a note titled Todo with the text call mom.",
            app="notes",
            difficulty="medium",
            tags=["typing"],
            validation=[{"check": "note", "title": "Todo", "body": "call mom"}],
            plan=[{"do": "note", "title": "Todo", "body": "call mom"}],
            max_steps=15,
        ),
        t(
            24,
            "Delete the note titled Old ideas.",
            app="notes",
            difficulty="hard",
            tags=["long-press"],
            setup=[{"note": {"title": "Old ideas", "body": "A bike rack for the balcony"}}],
            validation=[{"check": "no_note", "title": "Old ideas"}],
            plan=[{"do": "delete_note", "title": "Old ideas"}],
            max_steps=12,
        ),
        t(
            25,
            "How many notes are in the Notes app?",
            app="notes",
            difficulty="medium",
            tags=["answer"],
            setup=[{"notes_count": 4}],
            validation=[{"check": "answer", "expected": "4", "match": "number"}],
            plan=[{"do": "open", "app": "notes"}, {"do": "answer", "text": "4"}],
            max_steps=8,
        ),
        t(
            26,
            "In the Shop app, open the product Quartz Vase.",
            app="shop",
            difficulty="hard",
            tags=["scroll"],
            setup=[{"item": {"name": "Quartz Vase", "price_cents": 4250}}],
            validation=[{"check": "item_open", "name": "Quartz Vase"}],
            plan=[{"do": "open_item", "name": "Quartz Vase"}],
            max_steps=25,
        ),
        t(
            27,
            "Add the Rustic Teapot from the Shop to the cart.",
            app="shop",
            difficulty="hard",
            tags=["scroll"],
            setup=[{"item": {"name": "Rustic Teapot", "price_cents": 2999}}],
            validation=[{"check": "in_cart", "name": "Rustic Teapot"}],
            plan=[{"do": "cart", "name": "Rustic Teapot"}],
            max_steps=25,
        ),
        t(
            28,
            "What does the Amber Candle cost in the Shop?",
            app="shop",
            difficulty="medium",
            tags=["answer"],
            setup=[{"item": {"name": "Amber Candle", "price_cents": 1275}}],
            validation=[{"check": "answer", "expected": "12.75", "match": "number"}],
            plan=[{"do": "open_item", "name": "Amber Candle"}, {"do": "answer", "text": "$12.75"}],
            max_steps=12,
        ),
        t(
            29,
            "Turn on the 6:30 AM alarm.",
            app="clock",
            difficulty="medium",
            tags=["toggle"],
            setup=[{"alarm": {"label": "6:30 AM", "on": False}}],
            validation=[{"check": "alarm", "label": "6:30 AM", "on": True}],
            plan=[{"do": "alarm", "label": "6:30 AM", "on": True}],
        ),
        t(
            30,
            "Turn off the 7:00 AM alarm.",
            app="clock",
            difficulty="medium",
            tags=["toggle"],
            setup=[{"alarm": {"label": "7:00 AM", "on": True}}],
            validation=[{"check": "alarm", "label": "7:00 AM", "on": False}],
            plan=[{"do": "alarm", "label": "7:00 AM", "on": False}],
        ),
        t(
            31,
            "Turn off Bluetooth, then create a note titled Status that says done.",
            app="settings",
            difficulty="hard",
            tags=["multi-step", "typing"],
            setup=[{"set": "bluetooth_on", "value": True}],
            validation=[
                _setting("bluetooth_on", False),
                {"check": "note", "title": "Status", "body": "done"},
            ],
            plan=[
                {"do": "toggle", "key": "bluetooth", "on": False},
                {"do": "note", "title": "Status", "body": "done"},
            ],
            max_steps=20,
        ),
        t(
            32,
            "Turn on dark mode and set the screen timeout to 10 minutes.",
            app="settings",
            difficulty="hard",
            tags=["multi-step", "display"],
            validation=[_setting("dark_mode", True), _setting("screen_timeout_s", 600)],
            plan=[{"do": "dark", "on": True}, {"do": "timeout", "seconds": 600}],
            max_steps=15,
        ),
        t(
            33,
            "What is the battery level? Answer with the percentage.",
            app="settings",
            difficulty="easy",
            tags=["answer"],
            setup=[{"set": "battery", "value": 68}],
            validation=[{"check": "answer", "expected": "68", "match": "number"}],
            plan=[{"do": "open", "app": "settings"}, {"do": "answer", "text": "68%"}],
            max_steps=8,
        ),
    ]


# ---------------------------------------------------------------------------------- set-up
def _ensure_contact(state: PhoneState, spec: Spec) -> None:
    state.contacts = sorted(
        [
            *(c for c in state.contacts if c.name != spec["name"]),
            Contact(spec["name"], spec["phone"], ""),
        ],
        key=lambda c: c.name,
    )


def _ensure_item(state: PhoneState, spec: Spec) -> None:
    others = [i for i in state.catalogue if i.name != spec["name"]]
    if len(others) == len(state.catalogue):
        others = others[:-1]  # keep the catalogue's size: the new item replaces one
    names = sorted([*(i.name for i in others), spec["name"]])
    by_name = {i.name: i for i in others}
    state.catalogue = tuple(
        ShopItem(
            n,
            name,
            spec["price_cents"] if name == spec["name"] else by_name[name].price_cents,
            f"A {name.lower()} from our home collection.",
        )
        for n, name in enumerate(names)
    )


def apply_setup(state: PhoneState, task: Task, open_page: Callable[[str], None]) -> None:
    """Pin what the task's instruction depends on, on a freshly seeded phone."""
    for step in (task.model_extra or {}).get("setup", []):
        if "set" in step:
            if step["set"] == "airplane_mode_on":
                set_airplane(state, bool(step["value"]))
            else:
                setattr(state, step["set"], step["value"])
        elif "contact" in step:
            _ensure_contact(state, step["contact"])
        elif "note" in step:
            if not any(n.title == step["note"]["title"] for n in state.notes):
                add_note(state, step["note"]["title"], step["note"]["body"])
        elif "notes_count" in step:
            while len(state.notes) > step["notes_count"]:
                state.notes.pop()
            while len(state.notes) < step["notes_count"]:
                add_note(state, f"Note {len(state.notes) + 1}", "")
        elif "item" in step:
            _ensure_item(state, step["item"])
        elif "alarm" in step:
            for alarm in state.alarms:
                if alarm.label == step["alarm"]["label"]:
                    alarm.on = bool(step["alarm"]["on"])
        elif "open" in step:
            open_page(step["open"])
        else:
            raise ValueError(f"task {task.task_id}: unknown set-up step {step!r}")
    if state.screen_timeout_s not in dict(TIMEOUT_CHOICES):
        state.screen_timeout_s = 30


# ---------------------------------------------------------------------------------- validators
def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def _number(text: str) -> float | None:
    found = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(found[0]) if len(found) == 1 else None


def _answer_matches(answer: str | None, expected: str, match: str) -> bool:
    if not answer:
        return False
    if match == "digits":
        return _digits(answer) == _digits(expected)
    if match == "number":
        got = _number(answer)
        return got is not None and abs(got - float(expected)) < 1e-6
    return _normal(answer) == _normal(expected)


def check(state: PhoneState, spec: Spec, answer: str | None) -> tuple[bool, str]:
    """One validator: did the phone end up as the task wants? (passed, message)."""
    kind = spec["check"]
    if kind == "setting":
        value = getattr(state, spec["key"])
        return value == spec["equals"], f"{spec['key']} = {value!r} (want {spec['equals']!r})"
    if kind == "near":
        value = getattr(state, spec["key"])
        ok = abs(value - spec["target"]) <= spec["tolerance"]
        return ok, f"{spec['key']} = {value} (want {spec['target']} ± {spec['tolerance']})"
    if kind == "screen":
        screen = state.screen
        ok = screen.app == spec["app"] and spec.get("page", screen.page) == screen.page
        return ok, f"screen {screen.app}/{screen.page}"
    if kind == "contact":
        contact = state.contact(spec["name"])
        ok = contact is not None and _digits(contact.phone) == _digits(spec["phone"])
        return ok, f"contact {spec['name']!r}: {contact.phone if contact else 'missing'}"
    if kind == "no_contact":
        missing = state.contact(spec["name"]) is None
        return missing, f"contact {spec['name']!r} {'deleted' if missing else 'still there'}"
    if kind == "note":
        found = [n for n in state.notes if _normal(n.title) == _normal(spec["title"])]
        ok = any(_normal(n.body) == _normal(spec["body"]) for n in found)
        bodies = [n.body for n in found]
        return ok, f"notes titled {spec['title']!r}: {bodies or 'none'}"
    if kind == "no_note":
        left = [n for n in state.notes if _normal(n.title) == _normal(spec["title"])]
        return not left, f"{len(left)} note(s) titled {spec['title']!r} left"
    if kind == "item_open":
        arg = state.screen.arg if state.screen.key == ("shop", "item") else None
        item = state.item(int(arg)) if arg is not None else None
        ok = item is not None and item.name == spec["name"]
        return ok, f"open product: {item.name if item else 'none'}"
    if kind == "in_cart":
        item = state.item_named(spec["name"])
        count = state.cart.get(item.item_id, 0) if item else 0
        return count > 0, f"{count} × {spec['name']} in the cart"
    if kind == "alarm":
        alarm = next((a for a in state.alarms if a.label == spec["label"]), None)
        ok = alarm is not None and alarm.on == spec["on"]
        return ok, f"alarm {spec['label']}: {'on' if alarm and alarm.on else 'off'}"
    if kind == "answer":
        ok = _answer_matches(answer, spec["expected"], spec.get("match", "text"))
        return ok, f"answer {answer!r} (want {spec['expected']!r})"
    raise ValueError(f"unknown validator kind {kind!r}")


def validate(task: Task, state: PhoneState, answer: str | None) -> list[ValidatorResult]:
    specs = task.validation if isinstance(task.validation, list) else []
    results = []
    for i, spec in enumerate(specs):
        passed, message = check(state, spec, answer)
        results.append(
            ValidatorResult(
                id=f"{task.task_id}:{i}:{spec['check']}",
                passed=passed,
                score=1.0 if passed else 0.0,
                weight=float(spec.get("weight", 1.0)),
                message=message,
            )
        )
    return results
