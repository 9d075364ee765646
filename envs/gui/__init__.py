"""Mocked mobile GUI environment: a phone with Settings, Contacts, Messages, Clock and Shop apps.

`GuiEnv` is registered as env id ``gui``. Observations are AndroidWorld-style numbered UI element lists with a
screenshot in ``info["image"]``; actions are AndroidWorld JSON or function calls (``tap(3)``, ``back()``).
"""

from .env import GuiEnv

__all__ = ["GuiEnv"]
