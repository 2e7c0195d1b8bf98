"""App and status icons drawn as shapes (no image assets)."""

from __future__ import annotations

from PIL import Image, ImageDraw

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)


def app_icon(app_id: str, color: Color, size: int) -> Image.Image:
    """A rounded square in the app's colour with a white glyph, as an RGBA image."""
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    d = ImageDraw.Draw(image)
    d.rounded_rectangle((0, 0, size - 1, size - 1), radius=size // 4, fill=color)
    u = size / 10
    w = max(2, round(u * 0.6))
    if app_id == "settings":
        d.ellipse((3 * u, 3 * u, 7 * u, 7 * u), outline=WHITE, width=w)
        for dx, dy in ((0, -1), (0, 1), (-1, 0), (1, 0)):
            cx, cy = 5 * u + dx * 2.6 * u, 5 * u + dy * 2.6 * u
            d.rectangle((cx - 0.6 * u, cy - 0.6 * u, cx + 0.6 * u, cy + 0.6 * u), fill=WHITE)
    elif app_id == "contacts":
        d.ellipse((3.5 * u, 2 * u, 6.5 * u, 5 * u), fill=WHITE)
        d.pieslice((2 * u, 5.5 * u, 8 * u, 11 * u), 180, 360, fill=WHITE)
    elif app_id == "notes":
        d.rounded_rectangle((2.5 * u, 2 * u, 7.5 * u, 8 * u), radius=u / 2, fill=WHITE)
        for i in range(3):
            y = 3.5 * u + i * 1.3 * u
            d.line((3.3 * u, y, 6.7 * u, y), fill=color, width=w)
    elif app_id == "shop":
        d.rectangle((2.5 * u, 4 * u, 7.5 * u, 8 * u), fill=WHITE)
        d.arc((3.7 * u, 2.2 * u, 6.3 * u, 5.5 * u), 180, 360, fill=WHITE, width=w)
    elif app_id == "clock":
        d.ellipse((2 * u, 2 * u, 8 * u, 8 * u), outline=WHITE, width=w)
        d.line((5 * u, 5 * u, 5 * u, 3 * u), fill=WHITE, width=w)
        d.line((5 * u, 5 * u, 6.5 * u, 5.8 * u), fill=WHITE, width=w)
    return image


def wifi(d: ImageDraw.ImageDraw, x: float, y: float, s: float, color: Color) -> None:
    """A Wi-Fi fan whose top-left corner is (x, y), ``s`` pixels wide."""
    d.pieslice((x, y, x + s, y + s * 1.6), 225, 315, fill=color)


def bluetooth(d: ImageDraw.ImageDraw, x: float, y: float, s: float, color: Color) -> None:
    w = max(1, round(s / 10))
    top, bottom, mid = (x + s / 2, y), (x + s / 2, y + s), y + s / 2
    d.line((top, bottom), fill=color, width=w)
    d.line((top, (x + s * 0.85, y + s * 0.28), (x + s * 0.15, y + s * 0.72)), fill=color, width=w)
    d.line(
        (bottom, (x + s * 0.85, y + s * 0.72), (x + s * 0.15, y + s * 0.28)), fill=color, width=w
    )
    del mid


def airplane(d: ImageDraw.ImageDraw, x: float, y: float, s: float, color: Color) -> None:
    w = max(1, round(s / 8))
    cx = x + s / 2
    d.line((cx, y, cx, y + s), fill=color, width=w)
    d.polygon(((cx, y + s * 0.3), (x, y + s * 0.6), (x + s, y + s * 0.6)), fill=color)
    d.line((cx - s * 0.25, y + s, cx + s * 0.25, y + s), fill=color, width=w)


def signal(d: ImageDraw.ImageDraw, x: float, y: float, s: float, color: Color) -> None:
    d.polygon(((x, y + s), (x + s, y + s), (x + s, y)), fill=color)


def battery(d: ImageDraw.ImageDraw, x: float, y: float, s: float, level: int, color: Color) -> None:
    """A battery ``s`` wide, filled to ``level`` percent."""
    h = s * 0.5
    w = max(1, round(s / 14))
    d.rectangle((x, y, x + s, y + h), outline=color, width=w)
    d.rectangle((x + s, y + h * 0.3, x + s * 1.08, y + h * 0.7), fill=color)
    inner = (s - 4 * w) * max(0, min(100, level)) / 100
    if inner > 0 and h > 4 * w:  # tiny screens: only the outline
        d.rectangle((x + 2 * w, y + 2 * w, x + 2 * w + inner, y + h - 2 * w), fill=color)
