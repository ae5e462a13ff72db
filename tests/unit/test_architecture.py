"""The package's layers, read from its source: imports go one way and never in a circle.

Every module under hpcdp/ is parsed with `ast` (nothing is imported), and each
`import hpcdp...` / `from hpcdp... import` becomes an edge to the module it
names (a `from pkg import name` that names a submodule points at the submodule).
Imports under `if TYPE_CHECKING:` are left out: they never run. docs/architecture.md
draws the layers; the rules below are that picture.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Modules that are entry points whatever their folder: nothing below them imports them.
ENTRY_MODULES = {"hpcdp.cli", "hpcdp.__main__", "hpcdp.doctor", "hpcdp.config_doc", "hpcdp.train",
                 "hpcdp.train.command", "hpcdp.train.__main__"}
#: The shared bottom: every layer may import these, and they import no layer.
BASE_MODULES = {"hpcdp", "hpcdp.config", "hpcdp.config.schema", "hpcdp.config.values",
                "hpcdp.config.checks", "hpcdp.config.load", "hpcdp.cliargs", "hpcdp.files",
                "hpcdp.references", "hpcdp.profile_spec"}

#: Layer -> the layers it must not import (at module level or inside a function).
FORBIDDEN: dict[str, set[str]] = {
    "base": {"runtime", "optim", "data", "models", "tasks", "train", "session", "cluster",
             "bench", "export", "plan", "entry"},
    "runtime": {"optim", "data", "models", "tasks", "train", "session", "cluster", "bench",
                "export", "plan", "entry"},
    # Optimizers and their parameter groups: torch and the config only.
    "optim": {"runtime", "data", "models", "tasks", "train", "session", "cluster", "bench",
              "export", "plan", "entry"},
    "models": {"runtime", "optim", "data", "tasks", "train", "session", "cluster", "bench",
               "export", "plan", "entry"},
    "data": {"models", "optim", "tasks", "train", "session", "cluster", "bench", "export",
             "plan", "entry"},
    "tasks": {"train", "session", "cluster", "bench", "export", "plan", "entry"},
    "train": {"session", "cluster", "bench", "export", "plan", "entry"},
    # A script's own loop (hpcdp.session): the trainer's parts, strung together for a loop
    # the package does not own; the array's override set from cluster.sweep.
    "session": {"bench", "export", "plan", "entry"},
    "cluster": {"data", "models", "optim", "train", "session", "bench", "export", "plan",
                "entry"},
    "bench": {"session", "export", "plan", "entry"},
    # After training: a trained model read back, exported, sampled, scored (hpcdp.export.load
    # itself must stay free of Horovod, MPI and HDF5: tests/unit/test_export_load.py).
    "export": {"session", "cluster", "bench", "plan", "entry"},
    # The scaling planner: measures through the benchmarks' runner, predicts with a pure model.
    "plan": {"session", "export", "entry"},
    "entry": set(),
}
#: Third-party packages that take seconds to import or need a working MPI stack.
HEAVY = ("torch", "horovod", "h5py", "mpi4py")
#: Layers that must import none of HEAVY at module level, directly or through any
#: module they import at module level: `hpcdp slurm` runs on login nodes.
LIGHT_LAYERS = ("cluster",)


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def layer(module: str) -> str:
    if module in ENTRY_MODULES:
        return "entry"
    if module in BASE_MODULES:
        return "base"
    return module.split(".")[1]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of every node under an `if TYPE_CHECKING:` block."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skip


def _in_functions(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(sub) for sub in ast.walk(node) if sub is not node)
    return inside


def imports(source: str) -> Iterator[tuple[str, int, bool]]:
    """(imported name, line, at module level) of every import that runs; for
    `from a.b import c` the name is `a.b.c` (resolved to a module by the caller)."""
    tree = ast.parse(source)
    skip, inside = _type_checking_nodes(tree), _in_functions(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            yield name, node.lineno, id(node) not in inside


def resolve(name: str, modules: set[str]) -> str | None:
    """The module an imported name lives in (`hpcdp.runtime.dist.init` -> hpcdp.runtime.dist)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def graph(root: Path) -> tuple[dict[str, set[tuple[str, int, bool]]], dict[str, set[str]]]:
    """Internal edges (target, line, module level) per module, and each module's
    third-party imports at module level (top names: torch, h5py, ...)."""
    paths = {module_name(p, root): p for p in (root / "hpcdp").rglob("*.py")}
    names = set(paths)
    internal: dict[str, set[tuple[str, int, bool]]] = {m: set() for m in names}
    external: dict[str, set[str]] = {m: set() for m in names}
    for module, path in paths.items():
        for name, line, top in imports(path.read_text()):
            if name.split(".")[0] != "hpcdp":
                if top:
                    external[module].add(name.split(".")[0])
                continue
            target = resolve(name, names)
            if target and target != module:
                internal[module].add((target, line, top))
    return internal, external


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_edges(internal: dict[str, set[tuple[str, int, bool]]],
                  module_level_only: bool) -> dict[str, set[str]]:
    """Module -> modules it imports. A package's own __init__ importing its children
    (and a child importing its parent package) is not a cycle of layers: left out."""
    out: dict[str, set[str]] = {}
    for m, targets in internal.items():
        out[m] = {t for t, _, top in targets
                  if (top or not module_level_only)
                  and not t.startswith(m + ".") and not m.startswith(t + ".")}
    return out


def violations(internal: dict[str, set[tuple[str, int, bool]]]) -> list[str]:
    bad = []
    for m, targets in sorted(internal.items()):
        for t, line, _ in sorted(targets):
            if layer(t) in FORBIDDEN[layer(m)] and not t.startswith(m + "."):
                bad.append(f"{m}:{line} imports {t} ({layer(m)} must not import {layer(t)})")
    return bad


def heavy_at_import(internal: dict[str, set[tuple[str, int, bool]]],
                    external: dict[str, set[str]], start: str) -> list[str]:
    """The chain of module-level imports from `start` to a module importing a HEAVY
    package, for every one reachable; empty when importing `start` stays light."""
    found, seen, todo = [], {start}, [(start, [start])]
    while todo:
        m, chain = todo.pop()
        heavy = sorted(external[m] & set(HEAVY))
        if heavy:
            found.append(" -> ".join(chain) + f" imports {', '.join(heavy)}")
        # Importing a module imports its parent packages first.
        parents = {m.rsplit(".", i)[0] for i in range(1, m.count(".") + 1)}
        for t in sorted({t for t, _, top in internal[m] if top} | parents):
            if t not in seen and t in internal:
                seen.add(t)
                todo.append((t, [*chain, t]))
    return found


@pytest.fixture(scope="module")
def package() -> tuple[dict[str, set[tuple[str, int, bool]]], dict[str, set[str]]]:
    return graph(ROOT)


def test_every_module_has_a_known_layer(package) -> None:
    internal, _ = package
    assert {layer(m) for m in internal} <= set(FORBIDDEN)


def test_no_import_cycle(package) -> None:
    internal, _ = package
    # Module level alone, and with the imports inside functions: a function-level
    # import must not hide a cycle either.
    assert cycles(package_edges(internal, module_level_only=True)) == []
    assert cycles(package_edges(internal, module_level_only=False)) == []


def test_imports_go_one_way(package) -> None:
    internal, _ = package
    assert violations(internal) == []


@pytest.mark.parametrize("light", LIGHT_LAYERS)
def test_the_slurm_side_imports_nothing_heavy(package, light: str) -> None:
    internal, external = package
    found = [line for m in sorted(internal) if layer(m) == light
             for line in heavy_at_import(internal, external, m)]
    assert found == []


def test_preparation_never_imports_the_look_alike_files(package) -> None:
    """hpcdp.data.synth writes files like users' for trials; a recipe reads users' files
    alone, so nothing under prep may lean on the generators."""
    internal, _ = package
    assert [f"{m}:{line} imports {t}" for m, targets in sorted(internal.items())
            if m.startswith("hpcdp.data.prep") for t, line, _ in sorted(targets)
            if t.startswith("hpcdp.data.synth")] == []


def test_the_top_level_holds_at_most_eight_modules() -> None:
    top = [p.name for p in (ROOT / "hpcdp").glob("*.py")
           if p.name not in ("__init__.py", "__main__.py")]
    assert len(top) <= 8, sorted(top)


# ----------------------------------------------------------------- the checks can fail


def test_the_checks_catch_a_cycle_a_wrong_way_import_and_a_heavy_import(tmp_path: Path) -> None:
    """The same functions on a small made-up package with one fault of each kind."""
    files = {
        "hpcdp/__init__.py": "",
        "hpcdp/runtime/__init__.py": "",
        "hpcdp/runtime/a.py": "from hpcdp.runtime import b\n",
        "hpcdp/runtime/b.py": "def f():\n    from hpcdp.runtime import a\n",  # hidden cycle
        "hpcdp/runtime/c.py": "from hpcdp.train import loop\n",  # against the direction
        "hpcdp/train/__init__.py": "",
        "hpcdp/train/loop.py": "import torch\n",
        "hpcdp/cluster/__init__.py": "",
        "hpcdp/cluster/render.py": "from hpcdp.runtime import c\n",  # torch, two steps away
        "hpcdp/cluster/ok.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    import torch\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    internal, external = graph(tmp_path)
    assert cycles(package_edges(internal, module_level_only=True)) == []
    assert cycles(package_edges(internal, module_level_only=False)) == [
        ["hpcdp.runtime.a", "hpcdp.runtime.b"]]
    assert violations(internal) == [
        "hpcdp.runtime.c:1 imports hpcdp.train.loop (runtime must not import train)"]
    assert heavy_at_import(internal, external, "hpcdp.cluster.render") == [
        "hpcdp.cluster.render -> hpcdp.runtime.c -> hpcdp.train.loop imports torch"]
    assert heavy_at_import(internal, external, "hpcdp.cluster.ok") == []
