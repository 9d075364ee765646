"""`agentrl.engine` imports without vLLM; `VLLMEngine` comes from it on first use (a module `__getattr__`)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = """
import sys

import agentrl.engine

assert "agentrl.engine.vllm" not in sys.modules and "vllm" not in sys.modules, "imported eagerly"
from agentrl.engine import VLLMEngine
from agentrl.engine.vllm import VLLMEngine as direct

assert VLLMEngine is direct
assert "vllm" not in sys.modules, "the engine module imports vLLM only when an engine is built"
"""


def test_vllm_engine_is_imported_on_first_use():
    # A fresh interpreter: this test session may already hold vLLM from other tests.
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


def test_unknown_names_still_raise_attribute_error():
    import agentrl.engine

    assert "VLLMEngine" in agentrl.engine.__all__
    with pytest.raises(AttributeError, match="NoSuchEngine"):
        agentrl.engine.NoSuchEngine  # noqa: B018
