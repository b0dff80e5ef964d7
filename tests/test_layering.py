"""Imports point one way, and the simulator side never imports torch or triton.

The layers, top to bottom, are cli (cli.py and the commands package) -> calibration -> executor -> cdbsim ->
traces: a module may import its own layer and anything below it, never above. ``cdbsim`` and ``traces`` install
and run without the ``gpu`` extra, so neither may import torch or triton in any form (module level, inside a
function, behind ``TYPE_CHECKING``, or through ``importlib.import_module`` / ``__import__`` with a literal name).

Nor may imports form a cycle, counting imports deferred into function bodies (only ``TYPE_CHECKING``
blocks, which never run, are left out): a cycle hidden by a deferred import is still a tangle.

The checks read the source with :mod:`ast` and import nothing, so they need neither torch nor a GPU. Each
is also fed a tree with planted faults, so a checker that silently finds nothing fails too.
"""

from __future__ import annotations

import ast
import enum
import graphlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, ...], ...] = (("traces",), ("cdbsim",), ("executor",), ("calibration",), ("cli", "commands"))
"""Bottom to top, each layer's top-level modules: a module may import its own layer and any layer earlier here."""
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
TORCH_FREE = frozenset({"cdbsim", "traces"})
GPU_MODULES = frozenset({"torch", "triton"})
DYNAMIC_IMPORTERS = frozenset({"import_module", "__import__"})


class Kind(enum.Enum):
    UPWARD = "upward import"
    GPU = "torch/triton import in a torch-free package"


@dataclass(frozen=True)
class Violation:
    path: str  # relative to the tree's root
    line: int
    kind: Kind
    imported: str  # the top-level module name imported

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind.value}: {self.imported}"


def layer_files(root: Path) -> Iterator[tuple[Path, str]]:
    """Every .py file of the layered tree with the top-level module it belongs to (``cli`` is one file)."""
    cli = root / "cli.py"
    if cli.is_file():
        yield cli, "cli"
    for package in RANK:
        if package == "cli":
            continue
        for path in sorted((root / package).rglob("*.py")):
            yield path, package


def module_parts(path: Path, root: Path) -> list[str]:
    """Dotted-name parts of the module at ``path`` (``cdbsim/x.py`` -> [cdbsim, x]; a package's __init__
    is the package itself)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def relative_base(path: Path, root: Path, level: int) -> list[str]:
    """The package a ``from .{level} import`` in ``path`` starts from ([] for the top of the tree)."""
    parts = module_parts(path, root)
    package = parts if path.name == "__init__.py" else parts[:-1]
    return package[: max(len(package) - (level - 1), 0)]


def imported_top_levels(tree: ast.AST, path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module name) of every import in the tree, wherever it sits."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.lineno, (node.module or "").split(".")[0]
                continue
            base = relative_base(path, root, node.level)
            if base:
                yield node.lineno, base[0]
            elif node.module:
                yield node.lineno, node.module.split(".")[0]
            else:  # `from .. import executor` at the top of the tree: each name is a module
                for alias in node.names:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in DYNAMIC_IMPORTERS and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value.split(".")[0]


def layering_violations(root: Path) -> list[Violation]:
    """Every upward import and every torch/triton import of a torch-free package under ``root``."""
    found: list[Violation] = []
    for path, layer in layer_files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(root).as_posix()
        for line, top in imported_top_levels(tree, path, root):
            if top in RANK and RANK[top] > RANK[layer]:
                found.append(Violation(rel, line, Kind.UPWARD, top))
            if layer in TORCH_FREE and top in GPU_MODULES:
                found.append(Violation(rel, line, Kind.GPU, top))
    return found


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the layered tree by dotted name."""
    return {".".join(module_parts(path, root)): path for path, _ in layer_files(root)}


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks (imports that never run)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            inside.update(id(n) for n in ast.walk(node))
    return inside


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports when run, at module level or inside functions."""
    modules = module_names(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = type_checking_nodes(tree)
        targets: list[str] = []
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(relative_base(path, root, node.level)) if node.level else ""
                base = ".".join(part for part in (base, node.module or "") if part)
                targets += [f"{base}.{alias.name}" for alias in node.names]  # a name or a submodule
        graph[name] = {found for found in map(resolve, targets) if found and found != name}
    return graph


def import_cycles(root: Path) -> list[tuple[str, ...]]:
    """One cycle of the import graph, if any (graphlib finds one at a time); empty when imports form none."""
    try:
        tuple(graphlib.TopologicalSorter(import_graph(root)).static_order())
    except graphlib.CycleError as error:
        return [tuple(error.args[1])]
    return []


def test_the_tree_imports_one_way_and_keeps_torch_out_of_the_simulator() -> None:
    assert any(True for _ in layer_files(ROOT)), "no layered .py files found: wrong root?"
    violations = layering_violations(ROOT)
    assert not violations, "\n".join(map(str, violations))


SYNTHETIC_TREE = {
    "cli.py": "import calibration\nimport traces\n",
    "calibration/__init__.py": "from executor import engine\nfrom . import fit\n",
    "calibration/fit.py": "import torch\nfrom cdbsim.latency.model import x\n",
    "executor/engine.py": "import triton.language as tl\nfrom calibration.fit import refit\n",
    "cdbsim/__init__.py": "",
    "cdbsim/simulator/sim.py": "from traces import presets\n\ndef run():\n    import torch.nn.functional as F\n",
    "cdbsim/sub/__init__.py": "from ... import executor\nfrom .. import latency\n",
    "cdbsim/latency/model.py": (
        "import importlib\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from triton import jit\n"
        "def gpu():\n    return importlib.import_module('torch.cuda')\n"
    ),
    "traces/presets.py": "import numpy\nfrom cli import app\n",
    "traces/io.py": "tr = __import__('triton')\n",
}


@pytest.fixture
def synthetic_root(tmp_path: Path) -> Path:
    for name, text in SYNTHETIC_TREE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_the_checker_reports_every_planted_violation_and_nothing_else(synthetic_root: Path) -> None:
    found = {(v.path, v.line, v.kind, v.imported) for v in layering_violations(synthetic_root)}
    assert found == {
        ("executor/engine.py", 2, Kind.UPWARD, "calibration"),
        ("cdbsim/simulator/sim.py", 4, Kind.GPU, "torch"),
        ("cdbsim/sub/__init__.py", 1, Kind.UPWARD, "executor"),
        ("cdbsim/latency/model.py", 4, Kind.GPU, "triton"),
        ("cdbsim/latency/model.py", 6, Kind.GPU, "torch"),
        ("traces/presets.py", 2, Kind.UPWARD, "cli"),
        ("traces/io.py", 1, Kind.GPU, "triton"),
    }
    # torch in calibration and triton in executor are allowed; so are downward and own-package imports


def test_a_clean_tree_passes_and_one_upward_import_fails_it(tmp_path: Path) -> None:
    (tmp_path / "cdbsim").mkdir()
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "io.py").write_text("import numpy\n", encoding="utf-8")
    module = tmp_path / "cdbsim" / "report.py"
    module.write_text("from traces.io import read\n", encoding="utf-8")
    assert layering_violations(tmp_path) == []
    module.write_text("from traces.io import read\nfrom executor.engine import Engine\n", encoding="utf-8")
    assert layering_violations(tmp_path) == [Violation("cdbsim/report.py", 2, Kind.UPWARD, "executor")]


def test_the_tree_has_no_import_cycle_not_even_through_a_deferred_import() -> None:
    assert len(import_graph(ROOT)) > 50, "too few modules found: wrong root?"
    assert import_cycles(ROOT) == []


def test_the_cycle_checker_finds_a_cycle_behind_a_function_level_import(tmp_path: Path) -> None:
    files = {"cdbsim/__init__.py": "", "cdbsim/a.py": "from cdbsim.b import f\n",
             "cdbsim/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cdbsim.a import g\n"
                            "def f():\n    return 1\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert import_cycles(tmp_path) == []  # a TYPE_CHECKING import never runs
    (tmp_path / "cdbsim/b.py").write_text("def f():\n    from cdbsim.a import g\n    return g\n", encoding="utf-8")
    (cycle,) = import_cycles(tmp_path)
    assert set(cycle) == {"cdbsim.a", "cdbsim.b"}
