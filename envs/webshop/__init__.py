"""WebShop (Yao et al., 2022): search a product catalogue and buy what an instruction describes.

`WebShopEnv` is the env (registered as ``webshop``); `score` is the original's reward as a pure function;
`WebShopResource` is the catalogue and search index shared by every env on a node; `generate_catalogue` and
`iter_original_products` produce catalogues (generated, or from the original files); `server.serve` shows the same
pages as HTML for humans. Facts about the original: ``shared/docs/envs.md``, section WebShop; every remaining
deviation from it: ``DEVIATIONS.md`` in this folder.
"""

from agentrl.envs.webshop.catalog import iter_original_products
from agentrl.envs.webshop.env import WebShopEnv
from agentrl.envs.webshop.generator import generate_catalogue
from agentrl.envs.webshop.reward import ScoreBreakdown, normalize_color, score, score_breakdown, title_nouns
from agentrl.envs.webshop.shared import WebShopResource

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
