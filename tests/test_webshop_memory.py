"""WebShop's shared-memory design: BM25 scoring through one per-process buffer (same scores and rankings as bm25s),
safe from concurrent threads, a resource that pickles as a reference to its cache folder, and envs that share it."""

import pickle
import shutil
import threading

import numpy as np
import pytest

from agentrl.envs.webshop import WebShopEnv, WebShopResource
from agentrl.envs.webshop import search as search_module
from agentrl.envs.webshop.search import TOP_N


@pytest.fixture(scope="module")
def resource(tmp_path_factory):
    return WebShopResource.build(num_products=400, seed=11, cache_dir=str(tmp_path_factory.mktemp("cache")))


def queries(resource, n=60):
    goals = [resource.goals[i] for i in range(n)]
    texts = [g["name"] for g in goals] + [g["instruction_text"] for g in goals]
    return texts + ["shampoo shampoo shampoo", "black large", "zzzqqq", "the and of"]


def reference_ranking(resource, text, k):
    """The ranking from bm25s's own dense scores: best score first, ties by catalogue order."""
    ids = resource.searcher.token_ids(text)
    if not ids:
        return []
    scores = resource.searcher.bm25.get_scores_from_ids(ids)
    hits = np.flatnonzero(scores > 0)
    return [int(d) for d in hits[np.lexsort((hits, -scores[hits]))][:k]]


def test_bm25_scores_equal_bm25s(resource):
    searcher = resource.searcher
    for text in queries(resource):
        ids = searcher.token_ids(text)
        docs, scores = searcher.bm25_scores(ids)
        assert len(np.unique(docs)) == len(docs), text
        dense = np.zeros(len(resource.products), dtype=np.float32)
        dense[docs] = scores
        if ids:
            np.testing.assert_array_equal(dense, searcher.bm25.get_scores_from_ids(ids), err_msg=text)
        else:
            assert len(docs) == 0


@pytest.mark.parametrize("chunk", [7, 64, search_module.CHUNK])
@pytest.mark.parametrize("k", [1, 3, TOP_N, 1000])
def test_rankings_equal_a_full_scan(resource, k, chunk, monkeypatch):
    monkeypatch.setattr(search_module, "CHUNK", chunk)  # small chunks: posting lists span many, pruning runs
    for text in queries(resource):
        assert resource.searcher.search(text, k=k) == reference_ranking(resource, text, k), (text, k, chunk)
    assert not search_module._SCORE_BUFFER._scores.any()


def test_one_buffer_serves_concurrent_threads(resource, tmp_path):
    texts = queries(resource)
    expected = [resource.searcher.search(t) for t in texts]
    buffer_before = search_module._SCORE_BUFFER._scores
    other = WebShopResource.build(num_products=400, seed=11, cache_dir=str(tmp_path))  # a second resource
    results: dict[int, list] = {}

    def worker(n):
        searcher = resource.searcher if n % 2 else other.searcher
        results[n] = [searcher.search(t) for t in texts * 3]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[n] == expected * 3 for n in range(4))
    assert search_module._SCORE_BUFFER._scores is buffer_before  # no per-resource, per-thread or per-query array
    assert not search_module._SCORE_BUFFER._scores.any()  # left clean for the next query


def test_an_interrupted_query_leaves_the_buffer_clean():
    buffer = search_module.ScoreBuffer()
    indices, data = np.array([0, 2, 9], dtype=np.int32), np.ones(3, dtype=np.float32)
    with pytest.raises(IndexError):  # the second posting list names a document past the end, after the first wrote
        buffer.top(indices, data, [(0, 2), (2, 3)], num_docs=4, k=None)
    assert not buffer._scores.any()
    docs, scores = buffer.top(indices, data, [(0, 2), (0, 1)], num_docs=4, k=None)
    assert dict(zip(docs.tolist(), scores.tolist(), strict=True)) == {0: 2.0, 2: 1.0}


def test_resource_pickles_as_a_reference(resource, tmp_path):
    payload = pickle.dumps(resource)
    assert len(payload) < 2000  # a path and kwargs, not the catalogue
    again = pickle.loads(payload)
    assert again.folder == resource.folder and again.search_mode == "bm25"
    assert again.searcher.search("black large") == resource.searcher.search("black large")

    built = WebShopResource.build(num_products=30, seed=2, cache_dir=str(tmp_path))
    payload = pickle.dumps(built)
    shutil.rmtree(built.folder)  # a node without this cache: unpickling builds it there
    rebuilt = pickle.loads(payload)
    assert rebuilt.folder == built.folder and len(rebuilt.products) == 30

    opened = WebShopResource(built.folder)  # opened from a folder: nothing to rebuild from
    payload = pickle.dumps(opened)
    shutil.rmtree(built.folder)
    with pytest.raises(FileNotFoundError, match="cannot reopen"):
        pickle.loads(payload)


def test_envs_share_one_resource(resource):
    envs = [WebShopEnv(shared=resource) for _ in range(8)]
    for env in envs:
        assert env.resource is resource and env.searcher is resource.searcher
        assert np.shares_memory(env.goal_indices, resource.splits["train"])
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
        while True:
            *_, terminated, truncated, info = env.step(env.expert_action())
            if terminated or truncated:
                break
        assert info["success"]
