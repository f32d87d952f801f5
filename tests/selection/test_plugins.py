"""Adding an importance method is one class: a toy one, registered here, runs through ``salience rank``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from experiments.cli import main
from recsys.train.recipe import Recipe
from selection import ImportanceMethod, ImportanceReport, get_method
from tests.conftest import registered as registered_plugin
from tests.conftest import toy_plugin
from tests.selection.conftest import tiny_config


@toy_plugin
@dataclass
class LongestNameFirst(ImportanceMethod):
    """Ranks features by the length of their names (ties by name): a planted, checkable order."""

    name: ClassVar[str] = "toy-longest-name"
    bonus: float = 0.0

    def rank(self, recipe: Recipe) -> ImportanceReport:
        names = recipe.schema.names
        scores = {n: len(n) + self.bonus - i * 1e-6 for i, n in enumerate(sorted(names))}
        return ImportanceReport.from_scores(self.name, scores, config=self.describe(), dataset=recipe.dataset_name)


@pytest.fixture()
def registered() -> Iterator[None]:
    with registered_plugin(LongestNameFirst):
        yield


def test_a_new_method_is_one_class_and_runs_by_name(registered: None, tmp_cwd: Path) -> None:
    cfg = tmp_cwd / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(n_rows=3000, epochs=1)))
    assert isinstance(get_method("toy-longest-name", bonus=1.0), LongestNameFirst)
    assert main(["rank", "--config", str(cfg), "--method", "toy-longest-name", "--option", "bonus=2",
                 "--no-tracking", "--output", "toy.json"]) == 0
    report = ImportanceReport.load(tmp_cwd / "toy.json")
    assert report.method == "toy-longest-name" and report.config["bonus"] == 2
    ranked = report.ranking
    lengths = [len(n) for n in ranked]
    assert lengths == sorted(lengths, reverse=True) and len(ranked) > 10


def test_unregistered_method_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown importance method 'toy-longest-name'; available: \[.*'leap'"):
        get_method("toy-longest-name")


def test_no_built_in_method_is_a_baseline() -> None:
    """``selector_names`` lists the built-in methods without importing them: none is a baseline."""
    from selection.base import BUILTIN_METHODS, method_names

    assert not any(ImportanceMethod.registered_class(name).baseline for name in BUILTIN_METHODS)
    assert set(ImportanceMethod.selector_names()) >= set(BUILTIN_METHODS)
    assert "random" in method_names() and "random" not in ImportanceMethod.selector_names()


def test_ranking_a_file_with_outrank_imports_neither_torch_nor_lightning(tmp_path: Path) -> None:
    """``salience rank FILE --method outrank``, ``salience quality FILE`` and the usage (which lists
    every registry) are model-free: a fresh process runs them without importing torch or Lightning
    (seconds of start-up, hundreds of MB)."""
    import subprocess
    import sys

    data = tmp_path / "d.csv"
    data.write_text("label,a,b\n" + "".join(f"{i % 2},{i % 3},{i % 5}\n" for i in range(300)))
    code = (
        "import sys\nfrom experiments.cli import main\n"
        f"assert main(['rank', {str(data)!r}, '--method', 'outrank', '--no-progress', '--output', {str(tmp_path / 'r.json')!r}]) == 0\n"
        f"assert main(['quality', {str(data)!r}, '--no-progress', '--output', {str(tmp_path / 'q.json')!r}]) == 0\n"
        "from experiments.cli import _usage\nassert 'outrank' in _usage() and 'dnis' in _usage()\n"
        "heavy = sorted(m for m in ('torch', 'lightning', 'torchrec', 'mlflow') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
