"""The renderer interface: what both renderers do, so `GuiEnv` never knows which one it drives.

A renderer turns input gestures at pixel positions into events on the `Phone` and draws the current screen.
`FastRenderer` (Pillow, in-process) hit-tests the element tree itself; `BrowserRenderer` lets headless Chromium
do it, from the same element tree served as HTML. Either way the `Phone` receives the same events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from PIL import Image

from .phone import Phone

__all__ = ["Renderer"]


class Renderer(ABC):
    """Delivers gestures to a `Phone` and takes screenshots of it."""

    phone: Phone | None = None

    def attach(self, phone: Phone) -> None:
        """Drive `phone` from now on (called on every reset with the episode's phone)."""
        self.phone = phone

    @abstractmethod
    def tap(self, x: int, y: int) -> None:
        """A finger tap at pixel (x, y)."""

    @abstractmethod
    def long_press(self, x: int, y: int) -> None:
        """A press held for about half a second at pixel (x, y)."""

    @abstractmethod
    def type_text(self, text: str, clear: bool) -> None:
        """Type `text` into the focused text field (after clearing it when `clear`); nothing when none is focused."""

    @abstractmethod
    def enter(self) -> None:
        """The keyboard's Enter key."""

    @abstractmethod
    def scroll(self, x: int, y: int, direction: str) -> None:
        """Scroll the list under pixel (x, y): ``"down"`` reveals what is below."""

    def refresh(self) -> None:  # noqa: B027 - a no-op is right for renderers that draw on demand
        """Show the phone's current state (after a change made outside the renderer, such as launching an app)."""

    @abstractmethod
    def screenshot(self) -> Image.Image:
        """An RGB image of the screen, `ui.WIDTH` x `ui.HEIGHT` pixels."""

    def close(self) -> None:  # noqa: B027 - a no-op is right for renderers that hold nothing
        """Release what the renderer holds (a browser page); the renderer cannot be used afterwards."""
