"""Draws a ``Layout`` with Pillow at the phone's real resolution.

One ``Renderer`` per ``SimGym`` (per screen size) caches fonts and icons and is shared by all of
its executions; fonts are cached per thread because FreeType faces are not thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from cua_native.gym.sim import icons
from cua_native.gym.sim.apps import APP_BY_ID
from cua_native.gym.sim.layout import DESIGN_H, DESIGN_W, NAV_TOP, Box, Element, Layout
from cua_native.gym.sim.state import PhoneState

Color = tuple[int, int, int]
Font = ImageFont.FreeTypeFont | ImageFont.ImageFont
_FONT_SCALE = {"Small": 0.88, "Default": 1.0, "Large": 1.18}
TEXT_MASK_CACHE = 4096
"""Text masks kept per thread (a few MB at phone resolution; cleared when full)."""


@dataclass(frozen=True, slots=True)
class Theme:
    bg: Color
    surface: Color
    text: Color
    muted: Color
    accent: Color
    line: Color


LIGHT = Theme(
    (250, 250, 252), (236, 238, 242), (28, 28, 30), (110, 112, 118), (26, 115, 232), (214, 216, 222)
)
DARK = Theme(
    (18, 18, 20), (38, 39, 43), (236, 236, 240), (160, 162, 168), (138, 180, 248), (70, 72, 78)
)


class Renderer:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.sx, self.sy = width / DESIGN_W, height / DESIGN_H
        self.fs = min(self.sx, self.sy)
        self._local = threading.local()
        self._icons: dict[tuple[str, int], Image.Image] = {}

    # -- cached assets -------------------------------------------------------------------------
    def font(self, design_size: float) -> Font:
        size = max(6, round(design_size * self.fs))
        cache: dict[int, Font] = getattr(self._local, "fonts", None) or {}
        self._local.fonts = cache
        if size not in cache:
            cache[size] = ImageFont.load_default(size=size)
        return cache[size]

    def fit(self, font: Font, text: str, limit: float) -> str:
        """``text``, cut and ended with "…" if wider than ``limit`` pixels (cached per thread)."""
        cache: dict[tuple[int, str, float], str] | None = getattr(self._local, "fits", None)
        if cache is None or len(cache) >= TEXT_MASK_CACHE:
            cache = self._local.fits = {}
        key = (id(font), text, limit)
        if key not in cache:
            fitted = text
            if font.getlength(fitted) > limit:
                while fitted and font.getlength(fitted + "…") > limit:
                    fitted = fitted[:-1]
                fitted += "…"
            cache[key] = fitted
        return cache[key]

    def text_mask(self, font: Font, text: str, anchor: str) -> tuple[Image.Image, int, int] | None:
        """``text`` rasterised once as an alpha mask and its offset from the anchor point
        (``None`` if it draws nothing). FreeType rasterisation is most of a frame's cost and the
        same strings (clock, labels, names) recur on every frame, so masks are cached per
        thread, bounded by ``TEXT_MASK_CACHE``."""
        cache: dict[tuple[int, str, str], tuple[Image.Image, int, int] | None] | None = getattr(
            self._local, "masks", None
        )
        if cache is None or len(cache) >= TEXT_MASK_CACHE:
            cache = self._local.masks = {}
        key = (id(font), text, anchor)
        if key not in cache:
            left, top, right, bottom = font.getbbox(text, anchor=anchor)
            if right <= left or bottom <= top:
                cache[key] = None
            else:
                mask = Image.new("L", (int(right - left), int(bottom - top)), 0)
                ImageDraw.Draw(mask).text((-left, -top), text, fill=255, font=font, anchor=anchor)
                cache[key] = (mask, int(left), int(top))
        return cache[key]

    def icon(self, app_id: str, size: int) -> Image.Image:
        key = (app_id, size)
        if key not in self._icons:
            self._icons[key] = icons.app_icon(app_id, APP_BY_ID[app_id].color, size)
        return self._icons[key]

    # -- drawing -------------------------------------------------------------------------------
    def render(self, state: PhoneState, layout: Layout) -> Image.Image:
        theme = DARK if state.dark_mode else LIGHT
        image = Image.new("RGB", (self.width, self.height), theme.bg)
        frame = _Frame(self, image, theme, _FONT_SCALE.get(state.font_size, 1.0), state)
        rows = [e for e in layout.elements if e.visible is not None]
        for element in rows:
            frame.draw(element)
        if layout.viewport is not None:
            frame.d.rectangle(frame.px((0, 0, DESIGN_W, layout.viewport[1])), fill=theme.bg)
            frame.d.rectangle(frame.px((0, NAV_TOP, DESIGN_W, DESIGN_H)), fill=theme.bg)
        for element in layout.elements:
            if element.visible is None:
                frame.draw(element)
        return image


class _Frame:
    """One frame being drawn: design → pixel mapping and per-kind drawing."""

    def __init__(
        self, r: Renderer, image: Image.Image, theme: Theme, text_scale: float, state: PhoneState
    ) -> None:
        self.r, self.image, self.t, self.ts, self.state = r, image, theme, text_scale, state
        self.d = ImageDraw.Draw(image)

    def px(self, box: Box) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = box
        return x0 * self.r.sx, y0 * self.r.sy, x1 * self.r.sx, y1 * self.r.sy

    def text(
        self,
        x: float,
        y: float,
        text: str,
        size: float,
        color: Color,
        *,
        anchor: str = "lm",
        max_w: float | None = None,
    ) -> None:
        font = self.r.font(size * self.ts)
        if max_w is not None:
            text = self.r.fit(font, text, max_w * self.r.sx)
        drawn = self.r.text_mask(font, text, anchor)
        if drawn is not None:
            mask, left, top = drawn
            origin = (round(x * self.r.sx) + left, round(y * self.r.sy) + top)
            self.image.paste(color, origin, mask)

    def draw(self, e: Element) -> None:
        getattr(self, f"_{e.kind}")(e)

    # -- element kinds -------------------------------------------------------------------------
    def _status_bar(self, e: Element) -> None:
        s, t = self.state, self.t
        self.text(60, 45, "12:30", 40, t.text)
        x = 1000.0
        self.text(x - 110, 45, f"{s.battery}%", 34, t.text, anchor="rm")
        icons.battery(self.d, *self._pt(x - 95, 30), 60 * self.r.fs, s.battery, t.text)
        x = 740.0
        if s.airplane_mode_on:
            icons.airplane(self.d, *self._pt(x, 22), 44 * self.r.fs, t.text)
        else:
            icons.signal(self.d, *self._pt(x, 24), 40 * self.r.fs, t.text)
        if s.wifi_on:
            x -= 70
            icons.wifi(self.d, *self._pt(x, 22), 50 * self.r.fs, t.text)
        if s.bluetooth_on:
            x -= 60
            icons.bluetooth(self.d, *self._pt(x, 24), 40 * self.r.fs, t.text)

    def _pt(self, x: float, y: float) -> tuple[float, float]:
        return x * self.r.sx, y * self.r.sy

    def _appbar(self, e: Element) -> None:
        self.d.rectangle(self.px(e.box), fill=self.t.surface)
        self.text(170, (e.box[1] + e.box[3]) / 2, e.label, 60, self.t.text, max_w=600)

    def _up(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        w = max(2, round(8 * self.r.fs))
        self.d.line(self.px((cx - 35, cy, cx + 35, cy)), fill=self.t.text, width=w)
        self.d.line(
            [self._pt(cx - 5, cy - 35), self._pt(cx - 38, cy), self._pt(cx - 5, cy + 35)],
            fill=self.t.text,
            width=w,
        )

    def _icon_button(self, e: Element) -> None:
        self.d.ellipse(self.px(e.box), fill=self.t.accent)
        x0, y0, x1, y1 = e.box
        self.text((x0 + x1) / 2, (y0 + y1) / 2, str(e.value), 80, icons.WHITE, anchor="mm")

    def _text_button(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        self.text((x0 + x1) / 2, (y0 + y1) / 2, e.label, 50, self.t.accent, anchor="mm")

    def _badge(self, e: Element) -> None:
        self.d.rounded_rectangle(
            self.px(e.box),
            radius=40 * self.r.fs,
            outline=self.t.accent,
            width=max(1, round(4 * self.r.fs)),
        )
        x0, y0, x1, y1 = e.box
        self.text((x0 + x1) / 2, (y0 + y1) / 2, e.label, 42, self.t.accent, anchor="mm")

    def _big_text(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        self.text((x0 + x1) / 2, y0 + 90, e.label, 170, self.t.text, anchor="mm")
        self.text((x0 + x1) / 2, y1 - 30, e.detail, 44, self.t.muted, anchor="mm")

    def _app_icon(self, e: Element) -> None:
        x0, y0, x1, _ = e.box
        size = round(180 * self.r.fs)
        cx = (x0 + x1) / 2
        icon = self.r.icon(str(e.value), size)
        self.image.paste(
            icon, (round(cx * self.r.sx - size / 2), round((y0 + 10) * self.r.sy)), icon
        )
        self.text(cx, y0 + 245, e.label, 40, self.t.text, anchor="mm", max_w=250)

    def _card(self, e: Element) -> None:
        self.d.rounded_rectangle(self.px(e.box), radius=40 * self.r.fs, fill=self.t.surface)
        x0, y0, _, _ = e.box
        size = round(110 * self.r.fs)
        icon = self.r.icon(str(e.value), size)
        self.image.paste(icon, (round((x0 + 40) * self.r.sx), round((y0 + 40) * self.r.sy)), icon)
        self.text(x0 + 180, y0 + 95, e.label, 54, self.t.text)

    def _row_text(self, e: Element, x: float = 60, right: float = 860) -> None:
        _x0, y0, x1, y1 = e.box
        cy = (y0 + y1) / 2
        if e.detail:
            self.text(x, cy - 28, e.label, 50, self.t.text, max_w=right - x)
            self.text(x, cy + 32, e.detail, 38, self.t.muted, max_w=right - x)
        else:
            self.text(x, cy, e.label, 50, self.t.text, max_w=right - x)
        self.d.line(
            self.px((x, y1 - 1, x1, y1 - 1)), fill=self.t.line, width=max(1, round(2 * self.r.fs))
        )

    def _toggle_row(self, e: Element) -> None:
        self._row_text(e)
        _, y0, _, y1 = e.box
        cy = (y0 + y1) / 2
        on = bool(e.value)
        track = self.t.accent if on else self.t.line
        self.d.rounded_rectangle(
            self.px((880, cy - 34, 1010, cy + 34)), radius=34 * self.r.fs, fill=track
        )
        kx = 976 if on else 914
        self.d.ellipse(self.px((kx - 28, cy - 28, kx + 28, cy + 28)), fill=icons.WHITE)

    def _nav_row(self, e: Element) -> None:
        self._row_text(e)
        _, y0, _, y1 = e.box
        cy = (y0 + y1) / 2
        w = max(2, round(6 * self.r.fs))
        self.d.line(
            [self._pt(960, cy - 25), self._pt(990, cy), self._pt(960, cy + 25)],
            fill=self.t.muted,
            width=w,
        )

    def _info_row(self, e: Element) -> None:
        self._row_text(e)

    def _radio_row(self, e: Element) -> None:
        self._row_text(e, x=170)
        _, y0, _, y1 = e.box
        cy = (y0 + y1) / 2
        w = max(2, round(6 * self.r.fs))
        self.d.ellipse(self.px((60, cy - 32, 124, cy + 32)), outline=self.t.accent, width=w)
        if e.value:
            self.d.ellipse(self.px((76, cy - 16, 108, cy + 16)), fill=self.t.accent)

    def _text(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        cy = (y0 + y1) / 2
        if x1 - x0 >= DESIGN_W and x0 == 0:
            self.text(DESIGN_W / 2, cy, e.label, 46, self.t.muted, anchor="mm")
            return
        self.text(x0, cy, e.label, 46, self.t.text, max_w=x1 - x0 - 60)
        if e.detail:
            self.text(DESIGN_W - 60, cy, e.detail, 46, self.t.accent, anchor="rm")

    def _slider(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        cy = (y0 + y1) / 2
        kx = x0 + (x1 - x0) * int(e.value) / 100
        w = max(2, round(12 * self.r.fs))
        self.d.line(self.px((x0, cy, x1, cy)), fill=self.t.line, width=w)
        self.d.line(self.px((x0, cy, kx, cy)), fill=self.t.accent, width=w)
        self.d.ellipse(self.px((kx - 30, cy - 30, kx + 30, cy + 30)), fill=self.t.accent)

    def _chip(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        on = bool(e.value)
        self.d.rounded_rectangle(
            self.px(e.box), radius=55 * self.r.fs, fill=self.t.accent if on else self.t.surface
        )
        self.text(
            (x0 + x1) / 2,
            (y0 + y1) / 2,
            e.label,
            44,
            icons.WHITE if on else self.t.text,
            anchor="mm",
        )

    def _avatar_color(self, name: str) -> Color:
        palette = (
            (229, 57, 53),
            (30, 136, 229),
            (67, 160, 71),
            (251, 140, 0),
            (142, 36, 170),
            (0, 137, 123),
        )
        return palette[sum(map(ord, name)) % len(palette)]

    def _avatar_row(self, e: Element) -> None:
        _, y0, _, y1 = e.box
        cy = (y0 + y1) / 2
        self.d.ellipse(self.px((60, cy - 50, 160, cy + 50)), fill=self._avatar_color(e.label))
        self.text(110, cy, e.label[:1].upper(), 50, icons.WHITE, anchor="mm")
        self._row_text(e, x=200)

    def _avatar(self, e: Element) -> None:
        self.d.ellipse(self.px(e.box), fill=self._avatar_color(e.label))
        x0, y0, x1, y1 = e.box
        self.text((x0 + x1) / 2, (y0 + y1) / 2, e.label[:1].upper(), 150, icons.WHITE, anchor="mm")

    def _title(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        self.text(
            (x0 + x1) / 2, (y0 + y1) / 2, e.label, 66, self.t.text, anchor="mm", max_w=x1 - x0 - 120
        )

    def _field(self, e: Element) -> None:
        x0, y0, x1, _y1 = e.box
        focused = bool(e.detail)
        self.d.rounded_rectangle(
            self.px(e.box),
            radius=24 * self.r.fs,
            outline=self.t.accent if focused else self.t.line,
            width=max(1, round((6 if focused else 3) * self.r.fs)),
        )
        value = str(e.value or "")
        self.text(x0 + 30, y0 + 36, e.label, 32, self.t.accent if focused else self.t.muted)
        shown = value + ("|" if focused else "")
        self.text(x0 + 30, y0 + 95, shown, 48, self.t.text, max_w=x1 - x0 - 60)

    def _button(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        self.d.rounded_rectangle(self.px(e.box), radius=60 * self.r.fs, fill=self.t.accent)
        self.text((x0 + x1) / 2, (y0 + y1) / 2, e.label, 48, icons.WHITE, anchor="mm")
        if e.detail:
            self.text((x0 + x1) / 2, y1 + 50, e.detail, 38, self.t.muted, anchor="mm")

    def _note_row(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        self.d.rounded_rectangle(
            self.px((x0 + 40, y0 + 20, x1 - 40, y1 - 20)),
            radius=30 * self.r.fs,
            fill=self.t.surface,
        )
        self.text(90, y0 + 75, e.label, 50, self.t.text, max_w=900)
        self.text(90, y0 + 140, e.detail, 38, self.t.muted, max_w=900)

    def _fab(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        self.d.rounded_rectangle(self.px(e.box), radius=45 * self.r.fs, fill=self.t.accent)
        self.text((x0 + x1) / 2, (y0 + y1) / 2, f"+ {e.label}", 46, icons.WHITE, anchor="mm")

    def _price_row(self, e: Element) -> None:
        self._row_text(_without_detail(e), right=800)
        _, y0, _, y1 = e.box
        self.text(1020, (y0 + y1) / 2, e.detail, 46, self.t.accent, anchor="rm")

    def _picture(self, e: Element) -> None:
        hue = int(e.value) * 37 % 200
        self.d.rounded_rectangle(
            self.px(e.box),
            radius=40 * self.r.fs,
            fill=(55 + hue // 2, 90 + hue // 3, 160 - hue // 4),
        )
        x0, y0, x1, y1 = e.box
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        self.d.ellipse(self.px((cx - 150, cy - 150, cx + 150, cy + 150)), fill=(240, 240, 240))

    def _nav_button(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        w = max(2, round(6 * self.r.fs))
        c = self.t.text
        if e.value == "back":
            self.d.polygon(
                [self._pt(cx + 25, cy - 30), self._pt(cx - 25, cy), self._pt(cx + 25, cy + 30)],
                outline=c,
                width=w,
            )
        elif e.value == "home":
            self.d.ellipse(self.px((cx - 32, cy - 32, cx + 32, cy + 32)), outline=c, width=w)
        else:
            self.d.rectangle(self.px((cx - 28, cy - 28, cx + 28, cy + 28)), outline=c, width=w)

    def _menu(self, e: Element) -> None:
        x0, y0, x1, y1 = e.box
        self.d.rounded_rectangle(
            self.px((x0 + 10, y0 + 14, x1 + 10, y1 + 14)), radius=30 * self.r.fs, fill=self.t.line
        )
        self.d.rounded_rectangle(self.px(e.box), radius=30 * self.r.fs, fill=self.t.surface)
        self.text(x0 + 60, y0 + 70, e.label, 48, self.t.muted, max_w=x1 - x0 - 120)

    def _menu_item(self, e: Element) -> None:
        x0, y0, _x1, y1 = e.box
        self.text(x0 + 60, (y0 + y1) / 2, e.label, 50, self.t.text)


def _without_detail(e: Element) -> Element:
    return Element(e.id, e.kind, e.box, e.label, "", e.value, e.tap, e.long, e.visible)
