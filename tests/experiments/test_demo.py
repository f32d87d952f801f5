"""The demo's feature-selection stage runs end to end (tiny size) and writes what it prints."""

from __future__ import annotations

from pathlib import Path

from experiments.demo import SELECTION_KS, _selection_lines, run_selection_stage


def test_selection_stage(tmp_cwd: Path) -> None:
    s = run_selection_stage(rows=8000, epochs=1, output=str(tmp_cwd / "demo"))
    out = Path(s["output"])
    for name in ("outrank.json", "leap.json", "curve.json", "curve.png", "reduced_config.yaml"):
        assert (out / name).exists(), name
    assert set(s["rankings"]) == {"outrank", "leap"} and all(len(v) == 8 for v in s["rankings"].values())
    assert [k for k, _ in s["curve_points"]] == list(SELECTION_KS)
    text = "\n".join(_selection_lines(s))
    assert "AUKC" in text and "reduced_config.yaml" in text


def test_dims_stage(tmp_cwd: Path) -> None:
    from experiments.demo import _dims_lines, run_dims_stage

    s = run_dims_stage(rows=8000, epochs=1, output=str(tmp_cwd / "demo"))
    names = [m["model"] for m in s["models"]]
    assert names == ["uniform-16", "mde", "dnis"]
    ref = s["models"][0]["parameters"]
    for m in s["models"][1:]:
        assert m["parameters"] <= s["budget"] <= ref // 2 + 1
    assert (Path(s["output"]) / "dnis_plan.json").exists()
    assert "half of uniform-16" in "\n".join(_dims_lines(s))


def test_generative_stage(tmp_cwd: Path) -> None:
    from experiments.demo import _generative_lines, run_generative_stage

    s = run_generative_stage(epochs=1, output=str(tmp_cwd / "demo"))
    assert [m["model"] for m in s["models"]] == ["sid-multi", "sasrec"]
    assert all(m["test_recall_10"] > 0.1 for m in s["models"])  # planted transitions; most-popular ~0.14 at 3 epochs
    assert s["export"]["items_equal"] and s["export"]["max_abs_score_diff"] <= 1e-5
    text = "\n".join(_generative_lines(s))
    assert "sid-multi" in text and "export" in text
