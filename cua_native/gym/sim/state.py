"""The simulated phone's state: settings, app data and the navigation stack.

Everything a validator reads lives here (like ``settings get global wifi_on`` on a device). The
state is plain mutable data owned by one execution; it is built from a seed and nothing else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

TIMEOUT_CHOICES: tuple[tuple[int, str], ...] = (
    (15, "15 seconds"),
    (30, "30 seconds"),
    (60, "1 minute"),
    (120, "2 minutes"),
    (300, "5 minutes"),
    (600, "10 minutes"),
    (1800, "30 minutes"),
)
FONT_SIZES: tuple[str, ...] = ("Small", "Default", "Large")
CATALOGUE_SIZE = 120

_FIRST = (
    "Alice",
    "Bob",
    "Carla",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kira",
    "Liam",
    "Maya",
    "Nikhil",
    "Olga",
    "Pablo",
    "Quinn",
    "Rosa",
    "Sven",
    "Tara",
)
_LAST = ("Smith", "Jones", "Garcia", "Chen", "Muller", "Okafor", "Rossi", "Sato", "Novak", "Silva")
_NOTES = (
    ("Groceries", "eggs, bread, apples"),
    ("Meeting", "Project sync on Monday at 10"),
    ("Books to read", "Dune, Emma, Ulysses"),
    ("Gym plan", "Squats, rows, 20 min run"),
    ("Old ideas", "A bike rack for the balcony"),
    ("Packing list", "Passport, charger, socks"),
    ("Recipes", "Lentil soup with cumin"),
)
_ADJ = (
    "Amber",
    "Bamboo",
    "Cedar",
    "Copper",
    "Denim",
    "Ember",
    "Frosted",
    "Golden",
    "Harbor",
    "Ivory",
    "Jade",
    "Linen",
    "Marble",
    "Navy",
    "Olive",
    "Pewter",
    "Quartz",
    "Rustic",
)
_NOUN = (
    "Backpack",
    "Blanket",
    "Bottle",
    "Candle",
    "Clock",
    "Kettle",
    "Lamp",
    "Mug",
    "Notebook",
    "Pillow",
    "Planter",
    "Scarf",
    "Speaker",
    "Teapot",
    "Tray",
    "Vase",
    "Wallet",
)
_ALARMS = ((6, 30, "Weekdays"), (7, 0, "Every day"), (8, 15, "Weekends"), (21, 45, "Once"))


@dataclass(slots=True)
class Contact:
    name: str
    phone: str
    email: str


@dataclass(slots=True)
class Note:
    note_id: int
    title: str
    body: str


@dataclass(frozen=True, slots=True)
class ShopItem:
    item_id: int
    name: str
    price_cents: int
    description: str

    @property
    def price_text(self) -> str:
        return f"${self.price_cents // 100}.{self.price_cents % 100:02d}"


@dataclass(slots=True)
class Alarm:
    alarm_id: int
    hour: int
    minute: int
    repeat: str
    on: bool

    @property
    def label(self) -> str:
        suffix = "AM" if self.hour < 12 else "PM"
        hour = self.hour % 12 or 12
        return f"{hour}:{self.minute:02d} {suffix}"


@dataclass(slots=True)
class Screen:
    """One entry of the navigation stack: an app page, its argument and its scroll offset."""

    app: str
    page: str
    arg: str | None = None
    scroll: float = 0.0
    fields: dict[str, str] = field(default_factory=dict)
    """Text of the page's input fields, by field id."""
    focus: str | None = None
    """The focused field (the keyboard is up)."""

    @property
    def key(self) -> tuple[str, str]:
        return self.app, self.page


@dataclass(slots=True)
class Menu:
    """A context menu opened by a long press: (command, label) options."""

    title: str
    options: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class PhoneState:
    wifi_on: bool = True
    bluetooth_on: bool = False
    airplane_mode_on: bool = False
    dark_mode: bool = False
    brightness: int = 50
    """Percent, 0-100."""
    screen_timeout_s: int = 30
    font_size: str = "Default"
    battery: int = 80
    contacts: list[Contact] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    next_note_id: int = 1
    catalogue: tuple[ShopItem, ...] = ()
    cart: dict[int, int] = field(default_factory=dict)
    alarms: list[Alarm] = field(default_factory=list)
    stack: list[Screen] = field(default_factory=lambda: [Screen("home", "main")])
    recents: list[str] = field(default_factory=list)
    menu: Menu | None = None
    pointer: tuple[float, float] | None = None
    """Last touched point in design pixels (where a drag without a start begins)."""
    saved_radios: tuple[bool, bool] = (True, False)
    """Wi-Fi and Bluetooth before airplane mode was switched on (restored when it goes off)."""
    answer: str | None = None
    terminated: str | None = None
    turn: int = 0

    @property
    def screen(self) -> Screen:
        return self.stack[-1]

    @property
    def fields(self) -> dict[str, str]:
        return self.screen.fields

    @property
    def focus(self) -> str | None:
        return self.screen.focus

    @property
    def current_app(self) -> str:
        return self.screen.app

    def contact(self, name: str) -> Contact | None:
        wanted = name.casefold()
        return next((c for c in self.contacts if c.name.casefold() == wanted), None)

    def note(self, note_id: int) -> Note | None:
        return next((n for n in self.notes if n.note_id == note_id), None)

    def item(self, item_id: int) -> ShopItem | None:
        return next((i for i in self.catalogue if i.item_id == item_id), None)

    def item_named(self, name: str) -> ShopItem | None:
        wanted = name.casefold()
        return next((i for i in self.catalogue if i.name.casefold() == wanted), None)


def phone_number(rng: random.Random) -> str:
    return f"555-{rng.randrange(100, 1000):03d}-{rng.randrange(0, 10000):04d}"


def make_catalogue(rng: random.Random) -> tuple[ShopItem, ...]:
    names = sorted({f"{a} {n}" for a in _ADJ for n in _NOUN})
    chosen = sorted(rng.sample(names, CATALOGUE_SIZE))
    return tuple(
        ShopItem(i, name, rng.randrange(399, 9999), f"A {name.lower()} from our home collection.")
        for i, name in enumerate(chosen)
    )


def new_state(rng: random.Random) -> PhoneState:
    """A phone with seeded settings and app data, on the home screen."""
    state = PhoneState(
        wifi_on=rng.random() < 0.5,
        bluetooth_on=rng.random() < 0.5,
        dark_mode=False,
        brightness=rng.randrange(20, 81),
        screen_timeout_s=rng.choice((30, 60, 120)),
        battery=rng.randrange(35, 100),
    )
    names = rng.sample([f"{f} {s}" for f in _FIRST for s in _LAST], 12)
    state.contacts = sorted(
        (Contact(n, phone_number(rng), f"{n.split()[0].lower()}@example.com") for n in names),
        key=lambda c: c.name,
    )
    for title, body in rng.sample(_NOTES, 4):
        add_note(state, title, body)
    state.catalogue = make_catalogue(rng)
    state.alarms = [
        Alarm(i, h, m, repeat, rng.random() < 0.5) for i, (h, m, repeat) in enumerate(_ALARMS)
    ]
    return state


def add_note(state: PhoneState, title: str, body: str) -> Note:
    note = Note(state.next_note_id, title, body)
    state.next_note_id += 1
    state.notes.append(note)
    return note


def set_airplane(state: PhoneState, on: bool) -> None:
    """Airplane mode turns the radios off and restores them when it is switched off (Android)."""
    if on == state.airplane_mode_on:
        return
    if on:
        state.saved_radios = (state.wifi_on, state.bluetooth_on)
        state.wifi_on = state.bluetooth_on = False
    else:
        state.wifi_on, state.bluetooth_on = state.saved_radios
    state.airplane_mode_on = on
