"""Layers that only look down: every import inside edulib (at the top of a module or inside a
function) goes to a layer below the importer's, or to its own; no parallelism imports another; and
nothing private (one leading underscore) crosses from one module to another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "edulib"

# Bottom to top. Within a layer a module may import its neighbours, except the parallelisms: each
# axis stands alone on what is below it. `base` holds what every module uses (argument checks,
# tables, progress bars, weak hooks, the comparison with one process); `footprint` and
# `utilization` are the sizing arithmetic. `launch` starts ranks: the launcher, its fork server and
# what runs in each rank. `models` holds the small blocks that every part builds on
# (attention, the transformer block, the lessons' MLPs) with the two ways to reshape their
# backward pass (split in two, recomputed): below the axes, since tensor and pipeline parallelism
# use them. The one language model and its loss (`edulib.train.gpt`) sit above the axes, with the
# trainer that composes them. `cli` is the `edulib` command and its tour.
LAYERS: list[tuple[str, ...]] = [
    ("edulib", "base", "footprint", "utilization"),
    ("launch",),
    ("comm",),
    ("models",),
    ("dp", "tp", "pp", "cp", "ep"),
    ("train", "energy"),
    ("hybrid", "planner", "serving"),
    ("lessons",),
    ("viz", "widgets", "bench", "grading"),
    ("cli", "__main__"),
]
AXES = set(LAYERS[4])
LEVEL = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str:
    """The layer-holding part of a dotted edulib module: its subpackage or top-level module."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "edulib"


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every edulib module a file imports, wherever the import statement is."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("edulib")]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("edulib"):
            if node.module == "edulib":  # `from edulib import comm`: the module is what is named
                found += [(node.lineno, f"edulib.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def wrong_imports(root: Path) -> list[str]:
    """Every import that looks up a layer, or from one parallelism into another, and every edulib
    part that the layers leave out."""
    wrong = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(("edulib", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        mine = part_of(module)
        if mine not in LEVEL:
            wrong.append(f"{module}: its part {mine!r} is in no layer")
            continue
        for line, target in imports(path):
            theirs = part_of(target)
            if theirs not in LEVEL:
                wrong.append(f"{module}:{line} imports {target}, whose part {theirs!r} is in no layer")
            elif LEVEL[theirs] > LEVEL[mine]:
                wrong.append(f"{module}:{line} imports {target}, a layer up ({mine} -> {theirs})")
            elif mine in AXES and theirs in AXES and mine != theirs:
                wrong.append(f"{module}:{line} imports {target}, another parallelism ({mine} -> {theirs})")
    return wrong


def private(name: str) -> bool:
    """One leading underscore: the module's own (a dunder is Python's)."""
    return name.startswith("_") and not name.startswith("__")


def private_crossings(root: Path) -> list[str]:
    """Every private name one edulib module takes from another: imported by name, or read off an
    imported module."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("edulib"):
                found += [f"{path.name}:{node.lineno} imports {node.module}.{alias.name}"
                          for alias in node.names if private(alias.name)]
                modules |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                modules |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                            if alias.name.startswith("edulib")}
        found += [f"{path.name}:{node.lineno} reads {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in modules and private(node.attr)]
    return found


def test_nothing_private_crosses_a_module(tmp_path):
    assert private_crossings(ROOT) == []
    (tmp_path / "a.py").write_text("from edulib.tp.ops import _F\nfrom edulib.tp import ops\nops._G\nops.f\n")
    assert private_crossings(tmp_path) == ["a.py:1 imports edulib.tp.ops._F", "a.py:3 reads ops._G"]


def test_every_import_looks_down_and_no_parallelism_imports_another():
    assert wrong_imports(ROOT) == []


@pytest.mark.parametrize("planted, expected", [
    ("from edulib.train.trainer import train\n", "a layer up (tp -> train)"),
    ("def f():\n    from edulib.pp.executor import execute\n", "another parallelism (tp -> pp)"),
    ("from edulib import lessons\n", "a layer up (tp -> lessons)"),
    ("import edulib.nowhere\n", "in no layer"),
])
def test_an_upward_import_is_found_wherever_it_is_written(tmp_path, planted, expected):
    (tmp_path / "tp").mkdir()
    (tmp_path / "tp" / "planted.py").write_text(planted)
    (tmp_path / "comm.py").write_text("from edulib.base.arguments import check_choice\n")  # looks down: fine
    found = wrong_imports(tmp_path)
    assert len(found) == 1 and expected in found[0], found


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of a module but those under `if TYPE_CHECKING:` (imports for annotations only)."""
    nodes, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack += node.orelse
            continue
        nodes.append(node)
        stack += ast.iter_child_nodes(node)
    return nodes


def module_edges(root: Path) -> dict[str, set[str]]:
    """Which edulib modules each module imports when it runs (anywhere in it): `from package import
    module` names the module, `from module import name` the module."""
    names = {".".join((root.name, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"):
             path for path in root.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for module, path in names.items():
        found = set()
        for node in _run_time_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module in names:
                found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in names
                          else node.module for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in names}
        edges[module] = found - {module}
    return edges


def import_cycles(root: Path) -> list[list[str]]:
    """Every set of modules that import each other, directly or through others."""
    edges = module_edges(root)
    reach: dict[str, set[str]] = {module: set() for module in edges}
    for start in edges:  # (a few hundred modules: a walk from each is instant)
        stack = list(edges[start])
        while stack:
            module = stack.pop()
            if module not in reach[start]:
                reach[start].add(module)
                stack += edges[module]
    cycles = {tuple(sorted(m for m in reach[start] if start in reach[m]))
              for start in edges if start in reach[start]}
    return sorted(map(list, cycles))


def test_no_two_modules_import_each_other(tmp_path):
    assert import_cycles(ROOT) == []
    package = tmp_path / "edulib"
    package.mkdir()
    (package / "launch.py").write_text("def f():\n    from edulib.rank import serve\n")
    (package / "rank.py").write_text("def g():\n    from edulib.launch import START\n")
    (package / "comm.py").write_text("import edulib.rank\nimport edulib.train\n")  # no cycle of its own:
    (package / "train.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from edulib.comm import x\n")  # train's is for annotations only
    assert import_cycles(package) == [["edulib.launch", "edulib.rank"]]
