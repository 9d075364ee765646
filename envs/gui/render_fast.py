"""The fast renderer: Pillow draws the element tree in-process; gestures are hit-tested against the same tree.

No browser, no fonts from the system (Pillow's bundled default font), a few milliseconds per frame: the renderer
for many cheap runners. Its pixels are not the browser's, but every element sits at the same bbox in both.
"""

from __future__ import annotations

from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from .renderer import Renderer
from .ui import HEIGHT, WIDTH, Screen, UIElement

__all__ = ["FastRenderer", "draw_screen"]

_BLUE = (26, 115, 232)
_INK = (32, 33, 36)
_GREY = (95, 99, 104)
_LINE = (218, 220, 224)
_APP_COLOURS = {
    "Settings": (95, 99, 104),
    "Contacts": (26, 115, 232),
    "Messages": (30, 142, 62),
    "Clock": (249, 171, 0),
    "Shop": (217, 48, 37),
}


@lru_cache(maxsize=16)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _fit(text: str, size: int, width: int) -> str:
    """`text` cut with an ellipsis to fit `width` pixels."""
    font = _font(size)
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


def _text(draw: ImageDraw.ImageDraw, box, text: str, size: int, fill, *, pad: int = 16, align: str = "left") -> None:
    x0, y0, x1, y1 = box
    text = _fit(text, size, x1 - x0 - 2 * pad)
    font = _font(size)
    width = font.getlength(text)
    x = x0 + pad if align == "left" else (x0 + x1 - width) / 2
    draw.text((x, (y0 + y1) / 2), text, font=font, fill=fill, anchor="lm")


def _icon(draw: ImageDraw.ImageDraw, e: UIElement, colour) -> None:
    cx, cy = e.center
    kind = e.style.partition(":")[2]
    if kind == "plus":
        draw.line((cx - 10, cy, cx + 10, cy), fill=colour, width=3)
        draw.line((cx, cy - 10, cx, cy + 10), fill=colour, width=3)
    elif kind == "back":
        draw.polygon([(cx + 8, cy - 10), (cx + 8, cy + 10), (cx - 9, cy)], outline=colour, width=2)
    elif kind == "home":
        draw.ellipse((cx - 10, cy - 10, cx + 10, cy + 10), outline=colour, width=2)
    elif kind == "send":
        draw.rounded_rectangle(e.bbox, radius=24, fill=_BLUE)
        draw.polygon([(cx - 9, cy - 10), (cx - 9, cy + 10), (cx + 11, cy)], fill=(255, 255, 255))


def _switch(draw: ImageDraw.ImageDraw, e: UIElement) -> None:
    x1, cy = e.bbox[2], e.center[1]
    track = (x1 - 60, cy - 12, x1 - 16, cy + 12)
    draw.rounded_rectangle(track, radius=12, fill=_BLUE if e.is_checked else (189, 193, 198))
    knob_x = x1 - 28 if e.is_checked else x1 - 48
    draw.ellipse((knob_x - 10, cy - 10, knob_x + 10, cy + 10), fill=(255, 255, 255))


def _draw_element(image: Image.Image, draw: ImageDraw.ImageDraw, e: UIElement) -> None:
    x0, y0, x1, y1 = e.bbox
    style = e.style
    if style == "status":
        draw.rectangle(e.bbox, fill=(232, 234, 237))
        _text(draw, e.bbox, e.text, 13, _INK, pad=12)
    elif style == "appbar":
        draw.rectangle(e.bbox, fill=_BLUE)
        _text(draw, (x0, y0, x1 - 56, y1), e.text, 20, (255, 255, 255))
    elif style == "wallpaper":
        draw.rectangle(e.bbox, fill=(207, 232, 230))
    elif style == "bigclock":
        _text(draw, e.bbox, e.text, 56, _INK, align="center")
    elif style == "appicon":
        cx = (x0 + x1) // 2
        draw.ellipse((cx - 28, y0 + 8, cx + 28, y0 + 64), fill=_APP_COLOURS.get(e.text, _GREY))
        _text(draw, (cx - 28, y0 + 8, cx + 28, y0 + 64), e.text[:1], 26, (255, 255, 255), pad=0, align="center")
        _text(draw, (x0, y0 + 68, x1, y1), e.text, 13, _INK, pad=0, align="center")
    elif style == "list":
        draw.rectangle(e.bbox, fill=(255, 255, 255))
    elif style in ("row", "row_caption"):
        draw.line((x0 + 16, y1 - 1, x1 - 16, y1 - 1), fill=_LINE)
        right = x1 - (64 if e.is_checkable else 0)  # leave room for the switch
        _text(draw, (x0, y0, right, y0 + 40) if style == "row_caption" else (x0, y0, right, y1), e.text, 16, _INK)
        if e.is_checkable:
            _switch(draw, e)
    elif style == "caption":
        _text(draw, e.bbox, e.text, 13, _GREY, pad=0)
    elif style == "navbar":
        draw.rectangle(e.bbox, fill=(241, 243, 244))
    elif style.startswith("icon:"):
        _icon(draw, e, (255, 255, 255) if e.package_name.startswith("com.mock") else _GREY)
    elif style == "field":
        draw.rounded_rectangle(e.bbox, radius=8, fill=(255, 255, 255), outline=_BLUE if e.is_focused else (154, 160,
                               166), width=2 if e.is_focused else 1)  # fmt: skip
        shown = e.text or e.hint_text
        _text(draw, e.bbox, shown, 16, _INK if e.text else (128, 134, 139), pad=12)
        if e.is_focused:
            end = x0 + 12 + _font(16).getlength(_fit(e.text, 16, x1 - x0 - 24)) + 1
            draw.line((end, y0 + 14, end, y1 - 14), fill=_BLUE, width=2)
    elif style == "button":
        draw.rounded_rectangle(e.bbox, radius=20, fill=_BLUE)
        _text(draw, e.bbox, e.text, 15, (255, 255, 255), pad=8, align="center")
    elif style == "dialog":
        scrim = Image.new("RGBA", image.size, (0, 0, 0, 100))
        image.paste(scrim, (0, 0), scrim)
        draw.rounded_rectangle(e.bbox, radius=16, fill=(255, 255, 255))
    elif style == "title":
        _text(draw, e.bbox, e.text, 22, _INK, pad=0)
    elif style in ("bubble_out", "bubble_in"):
        out = style == "bubble_out"
        draw.rounded_rectangle(e.bbox, radius=16, fill=_BLUE if out else (232, 234, 237))
        _text(draw, e.bbox, e.text, 14, (255, 255, 255) if out else _INK, pad=12)
    elif style == "error":
        _text(draw, e.bbox, e.text, 14, (217, 48, 37), pad=0)
    elif e.text:
        _text(draw, e.bbox, e.text, 16, _INK, pad=0)


def draw_screen(screen: Screen) -> Image.Image:
    """Draw every element of `screen`, in paint order, on a white `WIDTH` x `HEIGHT` RGB canvas."""
    image = Image.new("RGB", (WIDTH, HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for element in screen.elements:
        _draw_element(image, draw, element)
    return image


class FastRenderer(Renderer):
    """Pillow renderer: hit tests and drawing in-process, no browser."""

    def tap(self, x: int, y: int) -> None:  # noqa: D102
        self.phone.tap_at(x, y)

    def long_press(self, x: int, y: int) -> None:  # noqa: D102
        self.phone.long_press_at(x, y)

    def type_text(self, text: str, clear: bool) -> None:  # noqa: D102
        focused = self.phone.state.route.focused
        if focused:
            old = "" if clear else self.phone.state.route.field(focused)
            self.phone.set_field(focused, old + text)

    def enter(self) -> None:  # noqa: D102
        self.phone.submit()

    def scroll(self, x: int, y: int, direction: str) -> None:  # noqa: D102
        self.phone.scroll_at(x, y, direction)

    def screenshot(self) -> Image.Image:  # noqa: D102
        return draw_screen(self.phone.screen())
