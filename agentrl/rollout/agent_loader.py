"""`load_agent`: the ``--agent`` function from ``package.module:function`` or ``path/to/file.py:function``.

Kept apart from `agentrl.rollout.agents` (which imports the engines, hence torch), so the command line can refuse a
wrong ``--agent`` at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError

__all__ = ["AgentLoadError", "load_agent"]


class AgentLoadError(ConfigError):
    """An ``--agent`` that cannot be imported or is not a function of (task, base_url)."""


def load_agent(source: str) -> Callable[..., Any]:
    """The function named by ``package.module:function`` or ``path/to/file.py:function``.

    Raises:
        AgentLoadError: naming what is missing.
    """
    module_name, _, attr = source.rpartition(":")
    if not module_name or not attr.isidentifier():
        raise AgentLoadError(f"--agent {source!r}: expected 'package.module:function' or 'path/to/file.py:function'")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise AgentLoadError(f"--agent {source!r}: no file {module_name!r} (a relative path starts from the "
                                 f"current folder, {os.getcwd()})")
        name = f"agentrl_agent_{path.stem}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # before executing, as import does
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[name]
                raise AgentLoadError(f"--agent {source!r}: importing {path.name} failed: {type(e).__name__}: {e}") \
                    from None
    else:
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise AgentLoadError(f"--agent {source!r}: cannot import {module_name!r} ({type(e).__name__}: {e}); "
                                 f"install it, run from its folder, or name a file: path/to/file.py:function") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AgentLoadError(f"--agent {source!r}: {module_name} has no function {attr!r}")
    try:
        inspect.signature(fn).bind(None, "")
    except TypeError:
        raise AgentLoadError(f"--agent {source!r}: {attr} must take (task, base_url)") from None
    return fn
