"""Shared fixtures: the repo root, ../shared, and the tiny real models (loaded once per session)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/data holds sample tasks for the code env, some with their own test files (terminal-bench's test_outputs.py):
# they are data that the env's grader runs inside a sandbox, never tests of this suite.
collect_ignore_glob = ["data/*"]


def pytest_collection_modifyitems(config, items):
    if Path("/usr/bin/chromium").exists() or shutil.which("chromium"):
        return
    skip = pytest.mark.skip(reason="needs Debian chromium at /usr/bin/chromium (apt-get install chromium)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_qwen3():
    from agentrl.models import load_model

    return load_model("tiny-qwen3")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from agentrl.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance (4 CPUs) for a test module's trainer workers, shut down after it if started here."""
    from agentrl.cluster import start_ray

    started = start_ray(num_cpus=4)
    yield
    if started:
        import ray

        ray.shutdown()


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray on 2 CPUs for the module's tests (left alone when one is already running)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    if started:
        ray.shutdown()

