"""Smoke test: the quality benchmark runs end to end (on synthetic data) so it cannot rot."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.benchmarks.quality import main


def test_quality_quick(tmp_cwd: Path) -> None:
    assert main(["--quick", "--output-dir", str(tmp_cwd)]) == 0
    result = json.loads((tmp_cwd / "quality_quick.json").read_text())
    (run,) = result["runs"]
    assert run["dataset"] == "synthetic" and run["arch"] == "dcnv2"
    assert 0.0 <= run["test_auc"] <= 1.0 and run["test_logloss"] > 0
    assert result["command"].startswith("python -m experiments.benchmarks.quality")
    assert "| synthetic | dcnv2 |" in (tmp_cwd / "quality_quick.md").read_text()
