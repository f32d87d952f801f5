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
from tests.selection.conftest import tiny_config


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
