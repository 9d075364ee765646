"""Product search: BM25 (bm25s) over the original's document text, optional dense (faiss) and hybrid retrieval.

Every index is built once, saved under the catalogue's cache folder and opened memory-mapped, so all runners on a
node share the same page-cache pages:

* BM25: bm25s's sparse score matrix, loaded with ``mmap=True``. bm25s keeps its vocabulary as a Python dict (tens
  of MB per process on the full catalogue), so we load it without the vocabulary and look query tokens up in a
  sorted, memory-mapped array of 64-bit token hashes instead. Queries are scored by summing the query terms' posting
  lists into one dense score array per process (`ScoreBuffer`), reused by every env and query, in chunks of
  `CHUNK` postings. bm25s instead allocates an array of one float per document for each query (4.7 MB on 1.18M
  products) plus temporaries the size of the longest posting list ("size" is in 1M documents): glibc then raises
  its mmap threshold and keeps such blocks as heap in every thread's arena, about 5 MB per thread that searched,
  which is most of the private memory a runner pool's threads would add.
* Dense: no encoder weights can be downloaded here, so documents are embedded by a fixed random projection of their
  IDF-weighted bag of words (a Johnson-Lindenstrauss sketch of TF-IDF cosine similarity) and searched exactly with
  a faiss ``IndexFlatIP`` read with ``IO_FLAG_MMAP_IFC``. It finds documents sharing rare words, not synonyms.
* Hybrid: reciprocal-rank fusion (k = 60) of the BM25 and dense rankings.

The original searches with Lucene BM25 (pyserini), with Porter stemming; we tokenize into lowercase alphanumeric
words minus English stopwords, without stemming, so rankings differ slightly (listed in ``DEVIATIONS.md``). Like
Lucene, a query sharing no word with any document returns no results.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN
from tqdm import tqdm

from agentrl.extras import needs_extra

__all__ = ["SEARCH_MODES", "ScoreBuffer", "Searcher", "build_search_index", "dense_libraries", "document_text",
           "tokenize"]

SEARCH_MODES = ("bm25", "dense", "hybrid")
TOP_N = 50
DENSE_DIM = 128
RRF_K = 60
CHUNK = 8192  # postings per numpy operation in BM25 scoring (see `ScoreBuffer`)
_TOKEN = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(STOPWORDS_EN)
_DENSE = "the webshop env's dense and hybrid search"


def document_text(product: Mapping[str, Any]) -> str:
    """The text the original indexes for a product: title, description, first bullet and the options."""
    options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())
    first_bullet = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return f"{product['Title']} {product['Description']} {first_bullet} {options}".lower()


def tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric words of `text`, English stopwords removed."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS]


def _token_hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


def build_search_index(
    products: Iterable[Mapping[str, Any]], out_dir: Path, num_docs: int, bm25: bool = True, dense: bool = False
) -> None:
    """Build the BM25 index and/or the dense index for `products` under `out_dir`.

    Args:
        products: the catalogue, in store order.
        out_dir: the folder to write ``bm25/`` and ``vocab_*.npy`` (BM25) and ``dense*`` (dense) into.
        num_docs: the number of products (for the progress bars).
        bm25: build the BM25 index.
        dense: build the dense index (written last, ``dense.json`` marks it complete).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    corpus_ids: list[list[int]] = []
    for product in tqdm(products, total=num_docs, desc="webshop: tokenizing", unit="doc", mininterval=2.0,
                        disable=num_docs < 50_000):
        corpus_ids.append([vocab.setdefault(t, len(vocab)) for t in tokenize(document_text(product))])
    if bm25:
        retriever = bm25s.BM25()
        retriever.index((corpus_ids, dict(vocab)), show_progress=num_docs >= 50_000)
        retriever.save(str(out_dir / "bm25"))
        hashes = np.fromiter((_token_hash(t) for t in vocab), dtype=np.uint64, count=len(vocab))
        order = np.argsort(hashes, kind="stable")
        np.save(out_dir / "vocab_hash.npy", hashes[order])
        np.save(out_dir / "vocab_ids.npy", np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))[order])
    if dense:
        _build_dense(corpus_ids, len(vocab), out_dir)


def dense_libraries() -> tuple[Any, Any]:
    """The modules ``faiss`` and ``scipy.sparse``, which building the dense index needs (BM25 does not).

    Raises:
        agentrl.extras.MissingExtraError: either is not installed (the message names the webshop extra).
    """
    with needs_extra(_DENSE):
        import faiss
        import scipy.sparse as sp
    return faiss, sp


def _build_dense(corpus_ids: list[list[int]], vocab_size: int, out_dir: Path) -> None:
    faiss, sp = dense_libraries()

    rows = np.repeat(np.arange(len(corpus_ids)), [len(set(d)) for d in corpus_ids])
    cols = np.fromiter((t for d in corpus_ids for t in sorted(set(d))), dtype=np.int64, count=len(rows))
    doc_term = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)),
                             shape=(len(corpus_ids), vocab_size))
    df = np.asarray(doc_term.sum(axis=0)).ravel()
    idf = np.log1p(len(corpus_ids) / np.maximum(df, 1)).astype(np.float32)
    projection = np.random.default_rng(0).standard_normal((vocab_size, DENSE_DIM)).astype(np.float32)
    np.save(out_dir / "dense_idf.npy", idf)
    np.save(out_dir / "dense_projection.npy", projection)
    index = faiss.IndexFlatIP(DENSE_DIM)
    step = 100_000
    for start in tqdm(range(0, len(corpus_ids), step), desc="webshop: dense embeddings", mininterval=2.0,
                      disable=len(corpus_ids) < 50_000):
        block = np.asarray(doc_term[start:start + step].multiply(idf[None, :]).tocsr() @ projection, np.float32)
        faiss.normalize_L2(block)
        index.add(block)
    # The vocabulary ids must agree with the BM25 build: both come from the same first-seen order of tokens.
    faiss.write_index(index, str(out_dir / "dense.faiss"))
    (out_dir / "dense.json").write_text(json.dumps({"dim": DENSE_DIM, "num_docs": len(corpus_ids)}))


class ScoreBuffer:
    """A dense per-document score array shared by every BM25 query of a process, guarded by a lock.

    Runner pools host many envs per process, stepped from several threads; one array per process keeps BM25's only
    per-document allocation from multiplying with envs, threads or queries. Postings are processed `CHUNK` at a
    time and candidates pruned to the best `k` as they come, so with `k` set no numpy temporary exceeds about
    ``2 * (k + CHUNK)`` elements (66 KB for k = 50), below glibc's default mmap threshold (128 KB): no query raises
    the threshold or grows a thread's heap. The array is all zeros between queries.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scores = np.zeros(0, dtype=np.float32)

    def top(
        self, indices: np.ndarray, data: np.ndarray, spans: list[tuple[int, int]], num_docs: int, k: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sum the term scores of the posting lists `spans` per document and keep the best.

        Args:
            indices: the index's document ids, posting list after posting list (distinct within one list).
            data: each posting's term score, all strictly positive.
            spans: ``(start, end)`` of each query term's posting list; a repeated term counts twice, as in bm25s.
            num_docs: the number of documents in the index.
            k: keep the `k` best documents and every document tied with the k-th; None keeps all.

        Returns:
            ``(docs, scores)``, unordered, each document once.
        """
        chunks = [(c, min(c + CHUNK, end)) for start, end in spans for c in range(start, end, CHUNK)]
        best_docs, best_scores = np.zeros(0, dtype=indices.dtype), np.zeros(0, dtype=np.float32)
        with self._lock:
            if len(self._scores) < num_docs:
                self._scores = np.zeros(num_docs, dtype=np.float32)
            scores = self._scores
            try:
                for a, b in chunks:
                    docs = indices[a:b]
                    scores[docs] += data[a:b]  # docs are distinct within one posting list, so += is exact
                for a, b in chunks:
                    docs = indices[a:b]
                    found = scores[docs]
                    # Reset after reading: a document in several posting lists then reads 0 on its later visits, so
                    # it is collected once, and the buffer is clean for the next query (every entry written is read).
                    scores[docs] = 0.0
                    hit = found > 0
                    best_docs = np.concatenate((best_docs, docs[hit]))
                    best_scores = np.concatenate((best_scores, found[hit]))
                    if k is not None and len(best_docs) > 2 * k + CHUNK:
                        best_docs, best_scores = _at_least_kth(best_docs, best_scores, k)
            except BaseException:
                scores[:] = 0.0  # interrupted half-way (KeyboardInterrupt, a bad id): never leak into later queries
                raise
        if k is not None and len(best_docs) > k:
            best_docs, best_scores = _at_least_kth(best_docs, best_scores, k)
        return best_docs, best_scores


def _at_least_kth(docs: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents scoring at least the k-th highest score (ties with it kept)."""
    kth = np.partition(scores, len(scores) - k)[len(scores) - k]
    keep = scores >= kth
    return docs[keep], scores[keep]


_SCORE_BUFFER = ScoreBuffer()


class Searcher:
    """Query the indexes built by `build_search_index`, all memory-mapped.

    Args:
        index_dir: the folder `build_search_index` wrote.
        mode: "bm25", "dense" or "hybrid".
    """

    def __init__(self, index_dir: Path, mode: str = "bm25"):
        if mode not in SEARCH_MODES:
            raise ValueError(f"webshop: search_mode must be one of {SEARCH_MODES}, got {mode!r}")
        self.mode = mode
        self.bm25 = bm25s.BM25.load(str(index_dir / "bm25"), mmap=True, load_vocab=False, show_progress=False)
        if self.bm25.nonoccurrence_array is not None:
            raise ValueError(f"webshop: the BM25 index in {index_dir} uses method {self.bm25.method!r}, which scores "
                             "absent terms; delete the folder to rebuild it with the default (lucene)")
        self.vocab_hash = np.load(index_dir / "vocab_hash.npy", mmap_mode="r")
        self.vocab_ids = np.load(index_dir / "vocab_ids.npy", mmap_mode="r")
        self.dense = None
        if mode != "bm25":
            with needs_extra(_DENSE):
                import faiss

            if not (index_dir / "dense.json").exists():
                raise FileNotFoundError(f"webshop: no dense index in {index_dir}; build it with search_mode={mode!r}")
            self.dense = faiss.read_index(str(index_dir / "dense.faiss"), faiss.IO_FLAG_MMAP_IFC)
            self.idf = np.load(index_dir / "dense_idf.npy", mmap_mode="r")
            self.projection = np.load(index_dir / "dense_projection.npy", mmap_mode="r")

    def token_ids(self, query: str) -> list[int]:
        """Vocabulary ids of the query's tokens that occur in the catalogue (unknown tokens dropped)."""
        ids = []
        for token in tokenize(query):
            h = np.uint64(_token_hash(token))
            pos = int(np.searchsorted(self.vocab_hash, h))
            if pos < len(self.vocab_hash) and self.vocab_hash[pos] == h:
                ids.append(int(self.vocab_ids[pos]))
        return ids

    def search(self, query: str, k: int = TOP_N) -> list[int]:
        """Indices of the top `k` products for `query`, best first (ties broken by catalogue order)."""
        ids = self.token_ids(query)
        if not ids:
            return []
        if self.mode == "bm25":
            return self._bm25(ids, k)
        if self.mode == "dense":
            return self._dense(ids, k)
        fused: dict[int, float] = {}
        for ranking in (self._bm25(ids, k), self._dense(ids, k)):
            for rank, doc in enumerate(ranking):
                fused[doc] = fused.get(doc, 0.0) + 1.0 / (RRF_K + rank + 1)
        return sorted(fused, key=lambda d: (-fused[d], d))[:k]

    def bm25_scores(self, ids: list[int], k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Documents containing any of the token `ids` and their BM25 scores (equal to bm25s's).

        Args:
            ids: vocabulary ids, as `token_ids` returns them; a repeated id counts twice, as in bm25s.
            k: return only the `k` best and those tied with the k-th; None returns every matching document.

        Returns:
            ``(docs, scores)`` in no particular order.
        """
        index = self.bm25.scores
        indptr = index["indptr"]
        spans = [(int(indptr[t]), int(indptr[t + 1])) for t in ids]
        return _SCORE_BUFFER.top(index["indices"], index["data"], spans, int(index["num_docs"]), k)

    def _bm25(self, ids: list[int], k: int) -> list[int]:
        docs, scores = self.bm25_scores(ids, k)
        order = np.lexsort((docs, -scores))  # best first, ties by catalogue order
        return [int(d) for d in docs[order][:k]]

    def _dense(self, ids: list[int], k: int) -> list[int]:
        import faiss

        unique = np.unique(np.asarray(ids, dtype=np.int64))
        query = (self.projection[unique] * self.idf[unique][:, None]).sum(axis=0, keepdims=True).astype(np.float32)
        faiss.normalize_L2(query)
        _, found = self.dense.search(query, k)
        return [int(d) for d in found[0] if d >= 0]
