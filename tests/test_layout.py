"""The package layout: imports point down the layers, the top level stays small and light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import inactive_heads as ih

SRC = Path(ih.__file__).parent

# Lowest first. A module may import from its own group and from groups before it, never from one after it.
LAYERS = [
    ["errors", "_version", "_compat", "_tensors", "_memory", "kernels", "atomic"],
    ["_model", "scores", "attention", "plugins"],
    ["engine"],
    ["recording", "generation", "tasks"],
    ["evaluation"],
    ["stats"],
    ["runs"],
    ["pruning"],
    ["loading"],
    ["report"],
    ["studies"],
    ["lm_eval_model", "cli"],
    ["__init__", "__main__"],
]
_RANK = {name: i for i, group in enumerate(LAYERS) for name in group}


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every relative import in the package, deferred ones included."""
    found = []
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        module = ".".join(parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
                names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
                found += [(module, name) for name in names]
    return found


def test_every_module_belongs_to_a_layer() -> None:
    groups = {_group(m) for pair in _imports() for m in pair} | {
        p.stem if p.is_file() else p.name for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert groups <= set(_RANK), f"modules without a layer: {sorted(groups - set(_RANK))}"


def test_imports_point_down() -> None:
    upward = [(a, b) for a, b in _imports() if _group(a) != _group(b) and _RANK[_group(a)] < _RANK[_group(b)]]
    assert upward == []


def test_top_level_is_small_and_every_subpackage_says_what_it_holds() -> None:
    entries = [p for p in SRC.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 27
    for package in (p for p in entries if (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
        assert doc and doc.split("\n")[0].endswith("."), package.name


@pytest.mark.parametrize("code", ["import inactive_heads", "import inactive_heads.cli"])
def test_import_is_light(code: str) -> None:
    # The command line's --help and argument errors must not wait seconds for torch and transformers.
    heavy = "torch", "transformers", "matplotlib", "numpy"
    probe = f"{code}; import sys; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_names_resolve() -> None:
    for name in ih.__all__:
        assert getattr(ih, name) is not None, name
    assert ih.analysis.table2 is ih.stats.table2
    with pytest.raises(AttributeError):
        ih.no_such_name  # noqa: B018
