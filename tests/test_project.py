"""Project-level contracts: import direction, set-up files, no machine-specific paths."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("recsys", "selection", "embeddings", "generative", "experiments")
#: package -> packages it may import (design.md: imports flow one way)
ALLOWED = {
    "recsys": set(),
    "selection": {"recsys"},
    "embeddings": {"recsys"},
    "generative": {"recsys"},
    "experiments": {"recsys", "selection", "embeddings", "generative"},
}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names & set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_flow_one_way(package: str) -> None:
    bad = {}
    for path in (ROOT / package).rglob("*.py"):
        wrong = _imported_top_levels(path) - ALLOWED[package] - {package}
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bad, f"{package} imports packages it must not: {bad}"


def test_every_package_imports() -> None:
    import importlib

    for package in PACKAGES:
        module = importlib.import_module(package)
        assert module.__name__ == package and module.__file__ is not None
        assert Path(module.__file__).resolve().is_relative_to(ROOT), f"{package} imported from {module.__file__}, not this tree"


def test_console_script_and_packages_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "salience"
    assert project["scripts"]["salience"] == "experiments.cli:main"


def test_make_targets_and_ci() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo:", "test:", "ui:"):
        assert re.search(rf"^{target}", makefile, re.M), target
    ui = makefile.split("\nui:")[1].split("\n\n")[0]
    assert "--host 127.0.0.1" in ui  # never bind the UI to all interfaces by default
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "SALIENCE_DATA_DIR" in ci


def test_make_clean_keeps_runs_and_a_named_target_removes_them(tmp_path: Path) -> None:
    """``make clean`` removes caches and build outputs only; runs go with ``make clean-runs``."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.fail("make is not installed: the README's set-up needs it")
    for name in ("runs/frappe/checkpoints", "mlruns", ".cache/salience", ".mypy_cache", "pkg/__pycache__"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "mlflow.db").write_text("store")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True)
    assert (tmp_path / "runs/frappe/checkpoints").is_dir() and (tmp_path / "mlflow.db").is_file() and (tmp_path / "mlruns").is_dir()
    assert not any((tmp_path / n).exists() for n in (".cache", ".mypy_cache", "pkg/__pycache__"))
    subprocess.run(["make", "-s", "clean-runs"], cwd=tmp_path, check=True)
    assert not any((tmp_path / n).exists() for n in ("runs", "mlflow.db", "mlruns"))


def test_cpu_requirements_pin_the_stack_and_avoid_the_cuda_fbgemm() -> None:
    req = (ROOT / "requirements" / "cpu.txt").read_text()
    for pin in ("torch==2.13.0", "fbgemm-gpu-cpu==1.8.0", "torchrec==1.8.0", "lightning==2.6.6", "mlflow==3.17.2", "optuna==5.0.0"):
        assert pin in req
    lines = [ln.strip() for ln in req.splitlines()]
    assert lines.index("./requirements/fbgemm-gpu-shim") < lines.index("torchrec==1.8.0")


def test_no_machine_specific_paths() -> None:
    pattern = re.compile(r"/(work|root|home)/[A-Za-z]|/tmp/scr")
    offenders = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if not path.is_file() or any(p.startswith(".") or p in ("__pycache__", "runs") for p in rel.parts[:-1]):
            continue
        if path.suffix not in (".py", ".yaml", ".yml", ".md", ".toml", ".txt", ".ipynb", "") or path.stat().st_size > 2_000_000:
            continue
        if path.resolve() == Path(__file__).resolve():
            continue
        text = path.read_text(errors="ignore")
        if pattern.search(text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_readme_names_real_commands_configs_and_docs() -> None:
    """Every ``salience <command>``, config path and docs link in the README exists."""
    from experiments.cli import COMMANDS, LIGHTNING_SUBCOMMANDS

    readme = (ROOT / "README.md").read_text()
    commands = set(re.findall(r"\bsalience ([a-z][a-z-]*[a-z])\b", readme))
    assert commands >= {"pipeline", "fit", "tune", "dims", "rank", "select", "quality"}
    unknown = sorted(commands - set(COMMANDS) - set(LIGHTNING_SUBCOMMANDS) - {"finds"})
    assert not unknown, unknown
    paths = set(re.findall(r"\b((?:experiments|docs)/[\w./-]+\.(?:yaml|md))\b", readme))
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing, missing
    for doc in ("known-limitations.md", "reproducibility.md", "bad-input.md"):
        assert f"docs/{doc}" in readme


# ---------------------------------------------------------------------------------------------
# module graph: no import cycles, no oversized modules
# ---------------------------------------------------------------------------------------------
#: longest module of the five packages (style: one module per method or concern)
MAX_MODULE_LINES = 800


def _package_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the five packages (a package is its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement: at module level and inside functions and classes alike; only the
    body of ``if TYPE_CHECKING:`` is skipped (it never runs, so it cannot close a cycle)."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the five packages it imports (``from pkg import sub`` names the
    submodule ``pkg.sub``; ``import a.b.c`` names ``a.b.c``, not the packages above it)."""
    modules = _package_modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges.update(t for t in map(known, targets) if t is not None and t != module)
        graph[module] = edges
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One shortest cycle through the first module of a strongly connected component."""
    start = component[0]
    members = set(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def test_strongly_connected_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(c for c in _strongly_connected(graph) if len(c) > 1) == [["a", "b", "c"]]
    assert _cycle_in(["a", "b", "c"], graph) == ["a", "b", "c", "a"]


def test_no_import_cycles() -> None:
    """No module of the five packages imports itself back through others (design.md: a cycle is
    a design bug), counting imports inside functions too."""
    graph = _import_graph()
    assert "experiments.cli" in graph and "recsys.registry" in graph["selection.base"]
    cycles = [" -> ".join(_cycle_in(c, graph)) for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_module_over_the_size_limit() -> None:
    """One module per method or concern: none of the packages' modules is over the limit."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in _package_modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"


#: an absolute path on a developer's or CI machine (not inside a base64 blob or a relative path)
_MACHINE_PATH = re.compile(
    r"(?<![A-Za-z0-9+/._~-])(/(?:tmp|work|root|home|Users|private|mnt|var/folders)/|[A-Za-z]:\\{1,2}(?=[A-Za-z]))"
)


def test_committed_results_hold_no_machine_paths() -> None:
    """Result files name paths relative to the repository or to the run's output folder."""
    found = {}
    for path in sorted((ROOT / "experiments" / "results").rglob("*")):
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file (plot)
            continue
        hits = sorted({m.group(0) for m in _MACHINE_PATH.finditer(text)})
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert not found, f"absolute machine paths in committed results: {found}"


def test_every_benchmark_is_in_the_one_table_of_names() -> None:
    """``salience bench NAME`` runs the module NAME of :data:`experiments.benchmarks.BENCHMARKS` (a
    benchmark's name is its module's), and every benchmark module (not ``_shared`` ones) is there,
    with ``main(argv)``."""
    from experiments.benchmarks import BENCHMARKS

    folder = ROOT / "experiments" / "benchmarks"
    assert set(BENCHMARKS) == {p.stem for p in folder.glob("[!_]*.py")} and len(set(BENCHMARKS)) == len(BENCHMARKS)
    for module in BENCHMARKS:
        tree = ast.parse((folder / f"{module}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), module


def test_packages_type_check_clean() -> None:
    """mypy, with the ``[tool.mypy]`` settings of ``pyproject.toml``, reports no error in the five
    packages (a cold run takes minutes; the ``.mypy_cache`` it leaves makes the next ones fast)."""
    import subprocess
    import sys

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert tuple(config["packages"]) == PACKAGES, "[tool.mypy] packages must list the five packages"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *PACKAGES],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )
    assert result.returncode == 0, f"mypy found type errors (exit {result.returncode}):\n{result.stdout}{result.stderr}"


def test_ruff_clean() -> None:
    """ruff, with the ``[tool.ruff.lint]`` rules of ``pyproject.toml``, finds nothing in the tree
    (packages, tests, benchmarks and notebooks)."""
    import subprocess
    import sys

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"F", "I", "B"} <= set(config["select"]), "the lint rules must include pyflakes, import order and bugbear"
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"ruff found problems:\n{result.stdout}{result.stderr}"


def test_no_private_name_crosses_a_module() -> None:
    """A name one module takes from another is public in the module that owns it; a private
    (underscore) module is imported only from inside its own package (the benchmark helpers
    ``experiments/benchmarks/_*.py``, which the registry of benchmarks does not list, and the
    export's loader template)."""
    import ast

    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            here = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES):
                    continue
                private_names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                parts = node.module.split(".")
                private_module = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
                outside = private_module is not None and ".".join(parts[:private_module]) != here
                if private_names or outside:
                    found.append(f"{path.relative_to(ROOT)}: from {node.module} import {[a.name for a in node.names]}")
    assert not found, "\n".join(found)


def test_config_literals_hold_their_enums_values() -> None:
    """Where a config key is a Literal (jsonargparse reads an Enum by member name, the configs
    hold the values), its choices are exactly the values of the Enum the code uses."""
    import inspect
    import typing

    from recsys.data.splits import SplitConfig, SplitMode
    from recsys.models.base import EmbeddingKernel, FusedOptimizer
    from recsys.models.grouped import TableOptimizer
    from recsys.train.module import RankingTask

    def choices(annotation: object) -> set[str]:
        return {a for a in typing.get_args(annotation) if isinstance(a, str)} | {
            c for arg in typing.get_args(annotation) for c in typing.get_args(arg) if isinstance(c, str)}

    task = inspect.signature(RankingTask.__init__).parameters
    hints = typing.get_type_hints(RankingTask.__init__)
    assert choices(hints["embedding_kernel"]) == {k.value for k in EmbeddingKernel}, task["embedding_kernel"]
    assert choices(hints["fused_optimizer"]) == {o.value for o in FusedOptimizer}
    assert choices(TableOptimizer) == {o.value for o in FusedOptimizer}
    assert choices(typing.get_type_hints(SplitConfig)["mode"]) == {m.value for m in SplitMode}
    from generative.data import DATASETS, SequenceDataset
    from recsys.models.rows import RowMapping, RowScheme

    assert choices(typing.get_type_hints(RowScheme)["scheme"]) == {m.value for m in RowMapping}
    assert choices(SequenceDataset) == set(DATASETS)


def test_closed_choices_given_as_text_become_their_enum() -> None:
    """A strategy's closed choice given as its value (a CLI ``--option``) is held as the Enum."""
    from embeddings import IHAS
    from embeddings.compression.layouts import row_schemes
    from embeddings.dims.ihas import GateSampling
    from recsys.data.schema import FeatureKind, FeatureSpec, Schema

    assert IHAS(sampling="relaxed").sampling is GateSampling.RELAXED
    assert IHAS(sampling="relaxed").describe()["sampling"] == "relaxed"
    schema = Schema([FeatureSpec("a", FeatureKind.CATEGORICAL, num_embeddings=100)])
    assert row_schemes(schema, "hash", min_ids=10) == {"a": {"scheme": "hash", "rows": 20}}
    with pytest.raises(ValueError, match="row scheme must be 'qr' or 'hash', got 'pq'"):
        row_schemes(schema, "pq")


def _modules_with_examples() -> list[str]:
    """Every module of the packages whose docstrings hold a ``>>>`` example."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                names.append(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    return names


@pytest.mark.parametrize("module", _modules_with_examples())
def test_docstring_examples_run(module: str) -> None:
    """The ``>>>`` examples of the public entry points run as written (doctest)."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, f"{module}: {result.failed} of {result.attempted} examples failed"


def test_the_core_entry_points_have_examples() -> None:
    assert {"recsys.stats", "recsys.io", "recsys.registry", "recsys.metrics", "generative.ranking_metrics"} <= set(_modules_with_examples())


def test_readme_layout_lists_every_package() -> None:
    """The README's layout block names every package and sub-package (a folder with ``__init__.py``)
    under its parent, indented two spaces per level, and nothing that is not one."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed, parents = set(), []
    for line in block.splitlines():
        name = line.strip().split(" ", 1)[0]
        if not name.endswith("/"):
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        parents = parents[:depth] + [name.rstrip("/")]
        listed.add("/".join(parents))
    packages = {str(p.parent.relative_to(ROOT)) for top in ("recsys", "selection", "embeddings", "generative", "experiments")
                for p in (ROOT / top).rglob("__init__.py")}
    assert packages <= listed, f"packages missing from the README's layout: {sorted(packages - listed)}"
    assert listed - packages <= {"tests", "notebooks"}, f"not packages: {sorted(listed - packages - {'tests', 'notebooks'})}"
