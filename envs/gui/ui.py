"""The element tree of one phone screen: `UIElement` records on a fixed 360x800 canvas, and `Screen`.

Both renderers draw exactly these records, so an element's `bbox` in the text observation is where its pixels are
in the screenshot. The fields follow AndroidWorld's `ui_elements` (text, content_description, class_name, bbox,
hint_text, is_clickable / editable / scrollable / checked / ...), plus two of our own that the agent never sees:
`key`, the element's stable name for the state machine, and `style`, a drawing hint for the renderers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "WIDTH",
    "HEIGHT",
    "STATUS_BAR",
    "APP_BAR",
    "CONTENT_TOP",
    "NAV_TOP",
    "ROW_HEIGHT",
    "VISIBLE_ROWS",
    "BBox",
    "UIElement",
    "Screen",
]

WIDTH, HEIGHT = 360, 800
"""Canvas size in pixels: a phone in portrait at 1x (dp). Screenshots have exactly this size."""
STATUS_BAR = 24
APP_BAR = 56
CONTENT_TOP = STATUS_BAR + APP_BAR
NAV_TOP = HEIGHT - 48
ROW_HEIGHT = 72
VISIBLE_ROWS = (NAV_TOP - CONTENT_TOP) // ROW_HEIGHT
"""How many list rows fit between the app bar and the navigation bar: longer lists need scrolling."""

BBox = tuple[int, int, int, int]
"""(x_min, y_min, x_max, y_max) in canvas pixels, max exclusive."""


@dataclass(frozen=True)
class UIElement:
    """One element of the accessibility tree, as AndroidWorld reports it.

    Attributes:
        key: stable name the state machine dispatches on (also shown as `resource_name`).
        class_name: Android widget class, e.g. ``"android.widget.Switch"``.
        bbox: pixel box on the 360x800 canvas.
        text: visible text.
        content_description: accessibility label (icons have one instead of text).
        hint_text: placeholder of an empty text field.
        is_clickable: a tap on it does something.
        is_long_clickable: a long press on it does something.
        is_editable: a text field.
        is_scrollable: a list that moves with `scroll`.
        is_checkable: a switch or checkbox.
        is_checked: its state, when checkable.
        is_focused: the text field that receives typing.
        package_name: the app it belongs to.
        style: drawing hint for the renderers (not part of the observation).
    """

    key: str
    class_name: str
    bbox: BBox
    text: str = ""
    content_description: str = ""
    hint_text: str = ""
    is_clickable: bool = False
    is_long_clickable: bool = False
    is_editable: bool = False
    is_scrollable: bool = False
    is_checkable: bool = False
    is_checked: bool = False
    is_focused: bool = False
    package_name: str = ""
    style: str = ""

    @property
    def center(self) -> tuple[int, int]:
        """Pixel at the middle of the box: where a tap on this element lands."""
        x0, y0, x1, y1 = self.bbox
        return (x0 + x1) // 2, (y0 + y1) // 2

    @property
    def interactive(self) -> bool:
        """True when a pointer event on it reaches the state machine (the browser gives the others no events)."""
        return self.is_clickable or self.is_long_clickable or self.is_editable

    def contains(self, x: int, y: int) -> bool:
        """True when pixel (x, y) lies inside the box."""
        x0, y0, x1, y1 = self.bbox
        return x0 <= x < x1 and y0 <= y < y1

    def describe(self, index: int) -> str:
        """One line of the numbered element list the text agent reads (AndroidWorld's fields, pixel box included)."""
        short_class = self.class_name.rsplit(".", 1)[-1]
        parts = [f"{index}: {short_class}"]
        if self.text:
            parts.append(f'text="{self.text}"')
        if self.content_description:
            parts.append(f'desc="{self.content_description}"')
        if self.hint_text and not self.text:
            parts.append(f'hint="{self.hint_text}"')
        flags = self._flags()
        if flags:
            parts.append("[" + ", ".join(flags) + "]")
        parts.append("bbox=({}, {}, {}, {})".format(*self.bbox))
        return " ".join(parts)

    def describe_compact(self, index: int) -> str | None:
        """The element in a few tokens (no pixel box, one label), or None when it has nothing to read or act on.

        A layout frame with no text and no flags tells a text agent nothing; dropping it keeps the other elements'
        indices, so ``tap(i)`` means the same element in both descriptions.
        """
        label = self.text or self.content_description or self.hint_text
        flags = self._flags()
        if not label and not flags:
            return None
        parts = [f"{index}: {self.class_name.rsplit('.', 1)[-1]}"]
        if label:
            parts.append(f'"{label}"')
        if self.hint_text and not self.text and label != self.hint_text:
            parts.append(f'hint "{self.hint_text}"')
        if flags:
            parts.append("[" + ", ".join(flags) + "]")
        return " ".join(parts)

    def _flags(self) -> list[str]:
        flags = [
            name
            for name, on in (
                ("clickable", self.is_clickable),
                ("long-clickable", self.is_long_clickable),
                ("editable", self.is_editable),
                ("scrollable", self.is_scrollable),
                ("focused", self.is_focused),
            )
            if on
        ]
        if self.is_checkable:
            flags.append("checked" if self.is_checked else "unchecked")
        return flags

    def as_dict(self, index: int) -> dict[str, object]:
        """AndroidWorld-style field names, for agents that want the structured tree."""
        return {
            "index": index,
            "text": self.text or None,
            "content_description": self.content_description or None,
            "class_name": self.class_name,
            "bbox_pixels": {"x_min": self.bbox[0], "y_min": self.bbox[1], "x_max": self.bbox[2], "y_max": self.bbox[3]},
            "hint_text": self.hint_text or None,
            "is_checked": self.is_checked,
            "is_checkable": self.is_checkable,
            "is_clickable": self.is_clickable,
            "is_editable": self.is_editable,
            "is_focused": self.is_focused,
            "is_long_clickable": self.is_long_clickable,
            "is_scrollable": self.is_scrollable,
            "is_enabled": True,
            "is_visible": True,
            "package_name": self.package_name,
            "resource_name": self.key,
        }


@dataclass(frozen=True)
class Screen:
    """What the phone shows: a title for the observation and the elements in paint order (later on top).

    Attributes:
        title: e.g. ``"Settings > Display"``; shown to the agent above the element list.
        elements: the tree flattened in paint order.
        list_keys: keys of every row of the scrollable list, on screen or not, in order (used by the expert).
        scroll: index of the first visible row of the scrollable list.
        max_scroll: the largest useful `scroll`; 0 when the list fits.
    """

    title: str
    elements: tuple[UIElement, ...]
    list_keys: tuple[str, ...] = field(default=())
    scroll: int = 0
    max_scroll: int = 0

    def index_of(self, key: str) -> int | None:
        """Position of the element named `key` in the numbered list, or None when it is not on screen."""
        for i, element in enumerate(self.elements):
            if element.key == key:
                return i
        return None

    def element(self, key: str) -> UIElement | None:
        """The element named `key`, or None when it is not on screen."""
        i = self.index_of(key)
        return None if i is None else self.elements[i]

    def hit(self, x: int, y: int) -> UIElement | None:
        """The topmost interactive element under pixel (x, y), the one a finger (or the browser) would hit."""
        for element in reversed(self.elements):
            if element.interactive and element.contains(x, y):
                return element
        return None

    def scrollable_at(self, x: int, y: int) -> UIElement | None:
        """The scrollable list under pixel (x, y), if any."""
        for element in reversed(self.elements):
            if element.is_scrollable and element.contains(x, y):
                return element
        return None

    def describe(self) -> str:
        """The numbered element list, AndroidWorld style, one element per line."""
        return "\n".join(element.describe(i) for i, element in enumerate(self.elements))

    def describe_compact(self) -> str:
        """The numbered list without pixel boxes or empty layout frames (indices unchanged)."""
        lines = (element.describe_compact(i) for i, element in enumerate(self.elements))
        return "\n".join(line for line in lines if line is not None)
