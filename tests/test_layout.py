"""The package layout: one folder per job, no import cycles, benchmarks outside the library."""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil

import kljax

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"cli", "kernels", "models", "parallel", "rl", "sampling", "studies", "tasks", "train"}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for top in ("kljax", "benchmarks"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports when it is imported (module-level statements only;
    `from pkg import submodule` is an edge to the submodule, not to the package)."""
    graph = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            inner = list(ast.walk(node)) if isinstance(node, (ast.If, ast.Try)) else [node]
            for n in inner:
                if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                    subs = {f"{n.module}.{a.name}" for a in n.names} & modules.keys()
                    deps |= subs
                    if n.module in modules and len(subs) < len(n.names):
                        deps.add(n.module)
                elif isinstance(n, ast.Import):
                    deps |= {a.name for a in n.names} & modules.keys()
        graph[name] = deps - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path of module names, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    assert _cycle(_import_graph(_modules())) is None


def test_top_level_is_one_folder_per_job():
    entries = {p.name for p in (ROOT / "kljax").iterdir() if not p.name.startswith(("_", "."))}
    folders = {e for e in entries if (ROOT / "kljax" / e).is_dir()}
    files = entries - folders
    assert folders == FOLDERS
    top = {"errors.py", "api.py"}  # user errors, and the Python API (kljax.RLTrainer)
    assert files == top, f"flat modules at the top of kljax/: {sorted(files - top)}"
    assert not (ROOT / "kljax" / "bench").exists(), "benchmarks live in benchmarks/, outside the library"


def test_every_command_module_is_in_cli_and_imports():
    from kljax.cli.main import COMMANDS

    for name, (module, _) in COMMANDS.items():
        assert module.startswith("kljax.cli.") or module == "benchmarks.cli", (name, module)
        assert hasattr(importlib.import_module(module), "run"), module


def test_every_module_imports():
    for info in pkgutil.walk_packages(kljax.__path__, "kljax."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
