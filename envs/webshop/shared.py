"""`WebShopResource`: the catalogue, goals and search indexes, built once per node and shared by every env.

On first use the catalogue (generated, or loaded from the original files) is written to a cache folder with its
goals, goal splits and search indexes; afterwards every process opens those files memory-mapped, so 32 runners on
a node share one copy in the page cache instead of holding 32 (other frameworks report over 100 GB for 128 envs).
The resource pickles as a reference to its folder (and the kwargs to rebuild it), never as data: a runner pool puts it
in Ray's object store once and every actor reopens the same files. ``bench/micro/webshop_scale.py`` measures the memory.

Cache folder: ``<root>/<catalogue-key>/`` where ``root`` is the `cache_dir` argument, else ``$AGENTRL_CACHE/webshop``,
else ``~/.cache/agentrl/webshop``; the key hashes what defines the catalogue (generator version, size and seed, or
the original files' paths, sizes and modification times). A folder is built under a temporary name and renamed into
place, so concurrent builders never see half-written files.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.envs.core import SharedResource
from agentrl.envs.webshop.catalog import SPLITS, find_data_files, goal_splits, iter_original_products
from agentrl.envs.webshop.generator import generate_catalogue
from agentrl.envs.webshop.reward import resolve_tagger, tag_names
from agentrl.envs.webshop.search import SEARCH_MODES, Searcher, build_search_index, dense_libraries
from agentrl.envs.webshop.store import RecordStore, write_records

__all__ = ["DEFAULT_NUM_PRODUCTS", "WebShopResource", "cache_root", "catalogue_key"]

DEFAULT_NUM_PRODUCTS = 1000
GENERATOR_VERSION = 2  # bump when generator.py changes what it produces, so old caches are not reused
CACHE_LAYOUT = 2  # bump when the stored records change (2: title nouns stored with every product and goal)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding one sub-folder per catalogue (see the module docstring)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("AGENTRL_CACHE"):
        return Path(os.environ["AGENTRL_CACHE"]).expanduser() / "webshop"
    return Path.home() / ".cache" / "agentrl" / "webshop"


def catalogue_key(num_products: int | None, seed: int, data_dir: str | os.PathLike | None, goals: str = "auto") -> str:
    """A short hash naming the catalogue defined by these arguments."""
    if data_dir is None:
        spec: dict[str, Any] = {"generated": GENERATOR_VERSION, "num_products": num_products or DEFAULT_NUM_PRODUCTS,
                                "seed": seed}
    else:
        files = find_data_files(data_dir, num_products)
        spec = {"num_products": num_products, "files": {
            k: [str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for k, p in files.items() if p is not None
        }}
    spec["layout"] = CACHE_LAYOUT
    if goals != "auto":
        spec["goals"] = goals
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


Pairs = Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]


def _with_nouns(pairs: Pairs, batch_size: int = 512) -> Pairs:
    """Add ``name_nouns`` to every product and goal: the reward's title nouns, tagged once here, not per runner."""
    tagger = resolve_tagger("auto")
    while batch := list(itertools.islice(pairs, batch_size)):
        names = [p["name"] for p, _ in batch]
        names += [g["name"] for p, goals in batch for g in goals if g["name"] != p["name"]]
        nouns = dict(zip(names, tag_names(names, tagger), strict=True))
        for product, goals in batch:
            for record in (product, *goals):
                record["name_nouns"], record["name_nouns_tagger"] = list(nouns[record["name"]]), tagger
        yield from batch


def _write_catalogue(folder: Path, pairs: Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]) -> None:
    goals_path = folder / "goals.tmp.jsonl"
    with open(goals_path, "w", encoding="utf-8") as goals_file:
        def products() -> Iterator[dict[str, Any]]:
            for product, goals in pairs:
                for goal in goals:
                    goals_file.write(json.dumps(goal, ensure_ascii=False) + "\n")
                yield product

        num_products = write_records(products(), folder / "products.jsonl", folder / "products_offsets.npy")
    with open(goals_path, encoding="utf-8") as f:
        num_goals = write_records((json.loads(line) for line in f), folder / "goals.jsonl",
                                  folder / "goals_offsets.npy")
    goals_path.unlink()
    if num_goals == 0:
        raise ValueError("webshop: the catalogue has no goals (no product has instruction attributes)")
    for split, indices in goal_splits(num_goals).items():
        np.save(folder / f"split_{split}.npy", indices)
    (folder / "catalogue.json").write_text(json.dumps({"num_products": num_products, "num_goals": num_goals}))


def _build_folder(final: Path, num_products: int | None, seed: int, data_dir: Any, dense: bool, goals: str) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=final.parent))
    try:
        started = time.perf_counter()
        if data_dir is None:
            pairs = generate_catalogue(num_products or DEFAULT_NUM_PRODUCTS, seed, goals=goals)
        else:
            pairs = iter_original_products(data_dir, num_products, goals=goals)
        _write_catalogue(tmp, _with_nouns(pairs))
        store = RecordStore(tmp / "products.jsonl", tmp / "products_offsets.npy")
        build_search_index(iter(store), tmp, len(store), bm25=True, dense=dense)
        meta = json.loads((tmp / "catalogue.json").read_text())
        meta["build_seconds"] = time.perf_counter() - started
        (tmp / "catalogue.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _ensure_dense(folder: Path) -> None:
    if (folder / "dense.json").exists():
        return
    tmp = Path(tempfile.mkdtemp(prefix="dense.tmp-", dir=folder))
    try:
        store = RecordStore(folder / "products.jsonl", folder / "products_offsets.npy")
        build_search_index(iter(store), tmp, len(store), bm25=False, dense=True)
        for name in ("dense_idf.npy", "dense_projection.npy", "dense.faiss", "dense.json"):  # marker last
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class WebShopResource(SharedResource):
    """The read-only state every WebShop env on a node shares: products, goals, splits and search.

    Attributes:
        folder: the cache folder it was opened from.
        key: the catalogue key (part of the folder name).
        products: the products, loaded schema, one decoded per access.
        goals: all goals; `splits` index into it.
        splits: goal indices for "train", "eval" and "test".
        search_mode: the mode of `searcher`.
        searcher: the search engine for `search_mode`.
    """

    def __init__(self, folder: Path, search_mode: str = "bm25", build_kwargs: dict[str, Any] | None = None):
        self.folder = Path(folder)
        self._build_kwargs = dict(build_kwargs or {})
        self.key = self.folder.name
        self.products = RecordStore(self.folder / "products.jsonl", self.folder / "products_offsets.npy")
        self.goals = RecordStore(self.folder / "goals.jsonl", self.folder / "goals_offsets.npy")
        self.splits = {s: np.load(self.folder / f"split_{s}.npy", mmap_mode="r") for s in SPLITS}
        self.search_mode = search_mode
        self._searchers = {search_mode: Searcher(self.folder, search_mode)}

    @property
    def searcher(self) -> Searcher:
        """The search engine for `search_mode`."""
        return self._searchers[self.search_mode]

    def searcher_for(self, mode: str) -> Searcher:
        """A search engine for `mode`, opened (and for dense modes built) on first request."""
        if mode not in self._searchers:
            if mode not in SEARCH_MODES:
                raise ValueError(f"webshop: search_mode must be one of {SEARCH_MODES}, got {mode!r}")
            if mode != "bm25":
                _ensure_dense(self.folder)
            self._searchers[mode] = Searcher(self.folder, mode)
        return self._searchers[mode]

    @classmethod
    def build(
        cls,
        num_products: int | None = None,
        seed: int = 0,
        data_dir: str | os.PathLike | None = None,
        search_mode: str = "bm25",
        cache_dir: str | os.PathLike | None = None,
        goals: str = "auto",
        **_: Any,
    ) -> WebShopResource:
        """Open the cached catalogue for these env kwargs, building it first if needed.

        Args:
            num_products: generated catalogue size (default 1000), or how many original products to load (default
                all of them).
            seed: the generated catalogue's seed.
            data_dir: a folder with the original files; when given they are loaded instead of generating.
            search_mode: "bm25", "dense" or "hybrid".
            cache_dir: the cache root (see `cache_root`).
            goals: "auto", "human" or "synthetic" (see `WebShopEnv`).
            **_: the env's other kwargs, ignored.
        """
        if search_mode not in SEARCH_MODES:
            raise ValueError(f"webshop: search_mode must be one of {SEARCH_MODES}, got {search_mode!r}")
        if num_products is not None and num_products < 1:
            raise ValueError(f"webshop: num_products must be >= 1, got {num_products}")
        if search_mode != "bm25":
            dense_libraries()  # a missing faiss fails now, not after minutes of building the catalogue and BM25
        folder = cache_root(cache_dir) / catalogue_key(num_products, seed, data_dir, goals)
        if not (folder / "catalogue.json").exists():
            _build_folder(folder, num_products, seed, data_dir, dense=search_mode != "bm25", goals=goals)
        if search_mode != "bm25":
            _ensure_dense(folder)
        build_kwargs = {"num_products": num_products, "seed": seed, "data_dir": data_dir, "cache_dir": cache_dir,
                        "goals": goals}
        return cls(folder, search_mode, build_kwargs)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickle as "where to open it", never as data: the memory maps cannot be pickled, and a copy of the arrays in
        # every runner process is exactly what the on-disk cache avoids. Runner pools put the resource in Ray's
        # object store once; each actor that receives it reopens the same files (their pages are already in the
        # page cache), or builds the catalogue where this node has no cache yet.
        return _reopen, (str(self.folder), self.search_mode, self._build_kwargs)

    def metadata(self) -> dict[str, Any]:
        """Counts and build time recorded when the catalogue was built."""
        return json.loads((self.folder / "catalogue.json").read_text())


def _reopen(folder: str, search_mode: str, build_kwargs: dict[str, Any]) -> WebShopResource:
    """Unpickle a `WebShopResource`: open its cache folder, or build it where this machine lacks one."""
    if (Path(folder) / "catalogue.json").exists():
        if search_mode != "bm25":
            _ensure_dense(Path(folder))
        return WebShopResource(Path(folder), search_mode, build_kwargs)
    if not build_kwargs:
        raise FileNotFoundError(f"webshop: cannot reopen the shared catalogue: {folder} does not exist here, and the "
                                "resource was opened from a folder, not built from env kwargs")
    return WebShopResource.build(search_mode=search_mode, **build_kwargs)
