"""The package layout shows the flow: no module imports a folder that imports it back, templates/ is data."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import agentrl

ROOT = Path(agentrl.__file__).resolve().parent
REPO = ROOT.parent


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name (agentrl/, templates/ as agentrl.templates)."""
    found = {}
    for base, prefix in ((ROOT, "agentrl"), (REPO / "templates", "agentrl.templates")):
        for path in base.rglob("*.py"):
            parts = [prefix, *path.relative_to(base).with_suffix("").parts]
            found[".".join(parts).removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The agentrl modules each module imports, at any depth of its code (lazy imports count: they are still edges)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def _folder(path: Path) -> Path:
    return path.parent


def test_no_module_imports_a_folder_that_imports_it_back():
    modules = _modules()
    edges = _imports(modules)
    by_folder: dict[Path, set[str]] = defaultdict(set)
    for name, path in modules.items():
        by_folder[_folder(path)].add(name)
    cycles = []
    for name, targets in edges.items():
        here = _folder(modules[name])
        for folder in {_folder(modules[t]) for t in targets} - {here}:
            back = sorted(m for m in by_folder[folder] if name in edges.get(m, set()))
            if back:
                cycles.append(f"{name} imports {folder.relative_to(REPO)}/, and {', '.join(back)} imports it back")
    assert cycles == []


def test_the_template_folder_is_data_and_the_env_contract_has_its_own_module():
    templates = [p for p in (REPO / "templates").glob("*.py")]
    assert [p.name for p in templates] == ["__init__.py"]
    assert "import" not in (REPO / "templates" / "__init__.py").read_text()
    assert (REPO / "templates" / "families.yaml").is_file()
    from agentrl.env import TextEnv

    assert agentrl.TextEnv is TextEnv


def test_the_recipe_reads_top_to_bottom():
    """train.py holds set-up, the loop and clean-up: no function of it over ~80 lines (a screen and a bit)."""
    tree = ast.parse((ROOT / "recipes" / "train.py").read_text())
    lengths = {n.name: n.end_lineno - n.lineno + 1 for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert max(lengths.values()) <= 80, lengths
