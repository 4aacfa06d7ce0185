"""The package layout: one folder per job, imports you can see (module level, every one counted, no
cycle of modules nor of folders), the core apart from its satellites, benchmarks outside the library."""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil
import re

import kljax

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"api", "boundary", "cli", "config", "kernels", "models", "parallel", "policies", "rl", "sampling",
           "studies", "tasks", "train", "util", "verdicts"}
LAZY_OK = {"kljax", "kljax.cli.main"}  # the package's lazy attributes and the command table
MAX_DEFERRED = 25
SATELLITES = ("kljax.studies", "benchmarks")  # import the core; only the command line and each other import them
BOUNDARY_USERS = ("kljax.cli", "kljax.api", "kljax.studies.sweep")  # the sweep runs its runs as the API does


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for top in ("kljax", "benchmarks"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _target(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(modules: dict[str, pathlib.Path]) -> list[tuple[str, str, bool]]:
    """(importer, imported module, inside a function) for every kljax / benchmarks import statement,
    function-level ones included (`from pkg import submodule` counts as the submodule)."""
    out = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            q, in_function = node, False
            while q in parents:
                q = parents[q]
                in_function |= isinstance(q, (ast.FunctionDef, ast.AsyncFunctionDef))
            for t in targets:
                if t.split(".")[0] in ("kljax", "benchmarks") and (found := _target(t, modules)) and found != name:
                    out.append((name, found, in_function))
    return out


def _graph(edges: list[tuple[str, str, bool]], key=lambda m: m) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges:
        if not b.startswith(a + ".") and key(a) != key(b):  # a package importing its own module is no edge
            graph.setdefault(key(a), set()).add(key(b))
            graph.setdefault(key(b), set())
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path of nodes, or None."""
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


def _folder(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or parts[0] == "benchmarks" else module


EDGES = _imports(_modules())


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_cycle_of_modules_counting_every_import():
    assert _cycle(_graph(EDGES)) is None


def test_no_cycle_of_folders():
    assert _cycle(_graph([e for e in EDGES if e[0].startswith("kljax.")], key=_folder)) is None


def test_imports_are_at_module_level():
    deferred = [(a, b) for a, b, inside in EDGES if inside and a not in LAZY_OK and a.startswith("kljax")]
    assert len(deferred) <= MAX_DEFERRED, deferred


def test_the_core_does_not_import_its_satellites_nor_the_boundary():
    for a, b, _ in EDGES:
        if b.startswith(SATELLITES) and not a.startswith((*SATELLITES, "kljax.cli")):
            raise AssertionError(f"{a} imports the satellite {b}")
        if b.startswith("kljax.boundary") and not a.startswith(("kljax.boundary", *BOUNDARY_USERS)):
            raise AssertionError(f"{a} imports the fault boundary {b}: only the command line and the API do")
        if b.startswith("kljax.kernels.cpu") and not a.startswith(("kljax.kernels", "benchmarks", "kljax.models.layers",
                                                                    "kljax.models.vocab_logprobs", "kljax.train.step",
                                                                    "kljax.sampling.step")):
            raise AssertionError(f"{a} imports the CPU kernels {b}: reach them through model.kernels")


def test_no_raw_config_and_no_config_dict_past_the_edge():
    for path in (ROOT / "kljax").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"\.raw\b", text), path
        if "ml_collections" in text:
            assert path.name in ("load.py", "bias_study.py", "study.py", "sweep.py"), path


def test_top_level_is_one_folder_per_job():
    entries = {p.name for p in (ROOT / "kljax").iterdir() if not p.name.startswith(("_", "."))}
    folders = {e for e in entries if (ROOT / "kljax" / e).is_dir()}
    files = entries - folders
    assert folders == FOLDERS
    assert files == {"errors.py"}, f"flat modules at the top of kljax/: {sorted(files - {'errors.py'})}"
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
