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
        importlib.import_module(package)


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
    commands = set(re.findall(r"\bsalience ([a-z]+)\b", readme))
    assert commands >= {"pipeline", "fit", "tune", "dims", "rank", "select", "quality"}
    unknown = sorted(commands - set(COMMANDS) - set(LIGHTNING_SUBCOMMANDS) - {"finds"})
    assert not unknown, unknown
    paths = set(re.findall(r"\b((?:experiments|docs)/[\w./-]+\.(?:yaml|md))\b", readme))
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing, missing
    for doc in ("known-limitations.md", "reproducibility.md", "bad-input.md"):
        assert f"docs/{doc}" in readme
