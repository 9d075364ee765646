"""`Phone`: the one mutable object of an episode, a lock-guarded holder of the current `PhoneState`.

Renderers deliver input events here: the fast renderer calls it directly after its own hit test, the browser
renderer from the local HTTP server's thread when the page reports a click, a keystroke or a wheel event. Both go
through the same methods, so the same events give the same state whichever renderer produced them.
"""

from __future__ import annotations

import threading

from . import apps
from .state import PhoneState
from .ui import Screen

__all__ = ["Phone"]


class Phone:
    """Holds the current `PhoneState` and applies input events to it.

    Attributes:
        version: incremented on every event that changed the state (the browser reloads its page when it moves).
    """

    def __init__(self, state: PhoneState):
        self._state = state
        self._screen: Screen | None = None
        self._lock = threading.Lock()
        self.version = 0

    @property
    def state(self) -> PhoneState:
        """The current state."""
        return self._state

    def screen(self) -> Screen:
        """The element tree on display (cached until the state changes)."""
        with self._lock:
            if self._screen is None:
                self._screen = apps.layout(self._state)
            return self._screen

    def _apply(self, new: PhoneState | None) -> bool:
        """Install `new` if it differs; True when the state changed."""
        with self._lock:
            if new is None or new == self._state:
                return False
            self._state = new
            self._screen = None
            self.version += 1
            return True

    def reset(self, state: PhoneState) -> None:
        """Start over from `state`."""
        self._apply(state)

    def _on_screen(self, key: str) -> bool:
        # Events name elements of the page they were raised on; a stale name (the screen moved on) is dropped.
        element = self.screen().element(key)
        return element is not None and element.interactive

    def tap(self, key: str) -> bool:
        """A tap on the element named `key` (ignored unless it is an interactive element on screen)."""
        return self._on_screen(key) and self._apply(apps.tap(self._state, key))

    def tap_at(self, x: int, y: int) -> bool:
        """A tap at pixel (x, y): the topmost interactive element there receives it."""
        element = self.screen().hit(x, y)
        return element is not None and self.tap(element.key)

    def long_press(self, key: str) -> bool:
        """A long press on the element named `key` (ignored unless it is on screen)."""
        return self._on_screen(key) and self._apply(apps.long_press(self._state, key))

    def long_press_at(self, x: int, y: int) -> bool:
        """A long press at pixel (x, y)."""
        element = self.screen().hit(x, y)
        return element is not None and self.long_press(element.key)

    def set_field(self, key: str, value: str) -> bool:
        """Text field `key` now holds `value` (ignored unless it is on screen)."""
        return self._on_screen(key) and self._apply(apps.set_field(self._state, key, value))

    def submit(self) -> bool:
        """The keyboard's Enter key."""
        return self._apply(apps.submit(self._state))

    def scroll_at(self, x: int, y: int, direction: str) -> bool:
        """Scroll the list under pixel (x, y) (a wheel or swipe over it)."""
        if self.screen().scrollable_at(x, y) is None:
            return False
        return self._apply(apps.scroll(self._state, direction))

    def back(self) -> bool:
        """System back."""
        return self._apply(apps.back(self._state))

    def home(self) -> bool:
        """System home."""
        return self._apply(apps.home(self._state))

    def open_app(self, name: str) -> bool | None:
        """Launch app `name`; None when no such app is installed."""
        new = apps.open_app(self._state, name)
        return None if new is None else self._apply(new)
