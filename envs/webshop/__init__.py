"""WebShop (Yao et al., 2022): search a product catalogue and buy what an instruction describes.

`WebShopEnv` is the env (registered as ``webshop``); `score` is the original's reward as a pure function;
`WebShopResource` is the catalogue and search index shared by every env on a node; `generate_catalogue` and
`iter_original_products` produce catalogues (generated, or from the original files); `server.serve` shows the same
pages as HTML for humans. Facts about the original: ``shared/docs/envs.md``, section WebShop; every remaining
deviation from it: ``DEVIATIONS.md`` in this folder.

The names load on first use (PEP 562): a reward worker process (`agentrl.budget`) imports only
``agentrl.envs.webshop.reward``, and importing it must not drag in the env, the search index and its libraries
(bm25s, scipy: ~85 MB per worker).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.envs.webshop.catalog import iter_original_products
    from agentrl.envs.webshop.env import WebShopEnv
    from agentrl.envs.webshop.generator import generate_catalogue
    from agentrl.envs.webshop.reward import ScoreBreakdown, normalize_color, score, score_breakdown, title_nouns
    from agentrl.envs.webshop.shared import WebShopResource

_WHERE = {
    "ScoreBreakdown": "reward",
    "WebShopEnv": "env",
    "WebShopResource": "shared",
    "generate_catalogue": "generator",
    "iter_original_products": "catalog",
    "normalize_color": "reward",
    "score": "reward",
    "score_breakdown": "reward",
    "title_nouns": "reward",
}

__all__ = [
    "ScoreBreakdown",
    "WebShopEnv",
    "WebShopResource",
    "generate_catalogue",
    "iter_original_products",
    "normalize_color",
    "score",
    "score_breakdown",
    "title_nouns",
]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines `name` on first use (see the module docstring)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted(set(globals()) | set(__all__))
