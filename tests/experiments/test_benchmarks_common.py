"""The benchmarks' shared pieces: the verdict rule (a difference within the seed spread is a tie)
and the isolated working folder."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.benchmarks._common import (
    BETTER,
    TIE,
    WORSE,
    hardware_text,
    isolated_workdir,
    majority_verdict,
    spread_of_difference,
    verdict,
)


def test_spread_of_difference_from_se_or_std_and_n() -> None:
    assert spread_of_difference({"se": 3.0}, {"se": 4.0}) == pytest.approx(5.0)
    assert spread_of_difference({"std": 2.0, "n": 4}, {"std": 0.0, "n": 4}) == pytest.approx(1.0)
    assert spread_of_difference({"std": 2.0, "n": 1}, {"se": 0.0}) == pytest.approx(2.0)
    assert spread_of_difference({"mean": 1.0}, {"mean": 2.0}) == 0.0  # no spread known


def test_verdict_needs_the_difference_to_exceed_the_spread() -> None:
    assert verdict(1.0, 0.5, spread=0.2) == BETTER  # 2.5 s.e. ahead: the 95% interval excludes zero
    assert verdict(0.5, 1.0, spread=0.2) == WORSE
    assert verdict(1.0, 0.9, spread=0.2) == TIE  # ahead, but within the interval
    assert verdict(0.9, 1.0, spread=0.2) == TIE
    assert verdict(1.0, 0.7, spread=0.2) == TIE  # 1.5 s.e.: beyond one s.e., not beyond 1.96
    assert verdict(1.0, 1.0, spread=0.0) == TIE
    # lower is better (regret, loss)
    assert verdict(0.1, 1.0, spread=0.2, lower_is_better=True) == BETTER
    assert verdict(1.0, 0.1, spread=0.2, lower_is_better=True) == WORSE
    assert verdict(1.0, 0.7, spread=0.2, z=1.0) == BETTER  # the old one-s.e. rule, on request
    # what cannot be compared is no win
    assert verdict(math.nan, 0.0, spread=0.1) == TIE
    assert verdict(1.0, 0.0, spread=math.nan) == TIE
    with pytest.raises(ValueError, match="spread"):
        verdict(1.0, 0.0, spread=-1.0)


def test_majority_verdict_needs_most_tasks_beyond_their_spread() -> None:
    assert majority_verdict([WORSE, WORSE, TIE]) == WORSE
    assert majority_verdict([WORSE, TIE, TIE, BETTER]) == TIE  # worse on fewer than most tasks
    assert majority_verdict([WORSE, WORSE, BETTER, BETTER]) == TIE  # half is not most
    assert majority_verdict([BETTER, BETTER, BETTER]) == BETTER
    assert majority_verdict([]) == TIE


def test_isolated_workdir_pins_a_relative_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SALIENCE_DATA_DIR", "data")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with isolated_workdir("salience-test-") as work:
        assert Path.cwd() == work.resolve() or Path.cwd() == work
        assert Path(os.environ["SALIENCE_DATA_DIR"]) == tmp_path / "data"
        assert os.environ["MLFLOW_TRACKING_URI"].startswith("sqlite:///")
    assert Path.cwd() == tmp_path
    assert os.environ["SALIENCE_DATA_DIR"] == "data" and "MLFLOW_TRACKING_URI" not in os.environ


# -- every benchmark's verdicts go through the rule ---------------------------------------------
def _task(dim: int, **methods: tuple[float, float]) -> dict:
    return {"function": "sphere", "dim": dim,
            "methods": {m: {"final": {"mean": mean, "se": se}} for m, (mean, se) in methods.items()}}


def test_hpo_ablation_is_worse_only_beyond_the_spread_on_most_tasks() -> None:
    from experiments.benchmarks.hpo import analytic_checks

    tasks = {
        "a-d30": _task(30, gif=(1.0, 0.1), tpe=(1.05, 0.1), **{"gif-no-hia": (1.1, 0.1), "gif-proportional": (3.0, 0.1)}),
        "b-d30": _task(30, gif=(1.0, 0.1), tpe=(2.0, 0.1), **{"gif-no-hia": (1.1, 0.1), "gif-proportional": (3.0, 0.1)}),
        "c-d50": _task(50, gif=(1.0, 0.1), tpe=(2.0, 0.1), **{"gif-no-hia": (5.0, 0.1), "gif-proportional": (0.9, 0.1)}),
        "d-d5": _task(5, gif=(1.1, 0.1), tpe=(1.0, 0.1)),
        "e-d5": _task(5, gif=(2.0, 0.1), tpe=(1.0, 0.1)),
    }
    checks = analytic_checks({"tasks": tasks})
    # higher regret on every task, but beyond the spread on one of three: a tie, not "worse"
    no_hia = checks["ablations_worse_than_gif"]["per_ablation"]["gif-no-hia"]
    assert no_hia["verdict"] == "tie" and no_hia["worse_on"] == 1 and no_hia["met"] is False
    proportional = checks["ablations_worse_than_gif"]["per_ablation"]["gif-proportional"]
    assert proportional["verdict"] == "worse" and proportional["worse_on"] == 2 and proportional["met"] is True
    assert checks["ablations_worse_than_gif"]["met"] is False
    # GIF lower than TPE on a-d30 but within the spread: a tie, not a win
    beats = checks["gif_beats_tpe_high_d"]
    assert beats["per_task"] == {"a-d30": "tie", "b-d30": "better", "c-d50": "better"}
    assert (beats["wins"], beats["ties"], beats["losses"], beats["met"]) == (2, 1, 0, False)
    # competitive at d = 5: a tie is within one s.e.; worse beyond it is not
    low = checks["gif_competitive_low_d"]["per_task"]
    assert (low["d-d5"]["verdict"], low["d-d5"]["ok"]) == ("tie", True)
    assert (low["e-d5"]["verdict"], low["e-d5"]["ok"]) == ("worse", False)


def test_hpo_bayesmark_competitive_names_the_verdict() -> None:
    from experiments.benchmarks.hpo import bayesmark_checks

    tie = bayesmark_checks({"gif": {"mean": 10.0, "se": 3.0}, "tpe": {"mean": 12.0, "se": 4.0}})
    assert tie["gif_competitive_with_tpe"]["verdict"] == "tie" and tie["gif_competitive_with_tpe"]["met"]
    worse = bayesmark_checks({"gif": {"mean": 0.0, "se": 3.0}, "tpe": {"mean": 12.0, "se": 4.0}})
    assert worse["gif_competitive_with_tpe"]["verdict"] == "worse" and not worse["gif_competitive_with_tpe"]["met"]


def _arm(mean: float, std: float, seeds: int = 3) -> dict:
    return {"seeds": seeds, **{m: {"mean": mean, "std": std} for m in ("recall@10", "ndcg@10", "recall@10_tail")}}


def test_generative_beats_needs_more_than_the_seed_spread() -> None:
    from experiments.benchmarks.generative import _verdicts

    summary = {"sid-plain": _arm(0.040, 0.002), "sid-multi": _arm(0.041, 0.002), "sid-front": _arm(0.050, 0.001)}
    v = _verdicts({"d": {"summary": summary}})["d"]
    assert v["multi_beats_plain"] == {"recall@10": "tie", "ndcg@10": "tie"} and v["multi_beats_plain_met"] is False
    assert v["tail_recall@10_improved_by"] == ["sid-front"] and v["tail_target_met"] is True
    summary["sid-multi"] = _arm(0.050, 0.001)
    v = _verdicts({"d": {"summary": summary}})["d"]
    assert v["multi_beats_plain"] == {"recall@10": "better", "ndcg@10": "better"} and v["multi_beats_plain_met"]


def _dims_points(aucs: dict[str, list[float]], params: dict[str, int]) -> list[dict]:
    return [{"method": m, "seed": seed, "test_auc": auc, "test_logloss": 0.4, "embedding_parameters": params[m],
             "seconds": 1.0, "dims": {}} for m, values in aucs.items() for seed, auc in enumerate(values)]


def test_dims_verdicts_read_the_paired_interval() -> None:
    from experiments.benchmarks.dims import _summarise, _verdicts

    params = {"uniform-4": 25, "uniform-8": 50, "uniform-16": 100, "mde": 50, "dnis": 50, "ihas": 50}
    # DNIS's mean is 0.0003 above uniform-16 but its seeds disagree: the interval reaches far below -0.001
    aucs = {"uniform-16": [0.800, 0.800, 0.800], "dnis": [0.8009, 0.7950, 0.8050], "ihas": [0.801, 0.796, 0.806]}
    points = _dims_points(aucs, params)
    summary = _summarise(points, 100)
    assert summary["dnis"]["test_auc_std"] == pytest.approx(np.std(aucs["dnis"], ddof=1))  # the sample std
    v = _verdicts(summary, points)
    assert v["dnis_vs_uniform16"] == "tie" and not v["dnis_matches_uniform16_at_half"]  # the mean alone would pass
    assert v["dnis_vs_uniform16_interval"]["method"] == "paired_t" and v["ihas_vs_dnis"] == "tie" and v["ihas_matches_dnis"]
    # consistent seeds 0.0004-0.0006 below: the interval stays inside the tolerance
    aucs["dnis"] = [0.7995, 0.7996, 0.7994]
    points = _dims_points(aucs, params)
    v = _verdicts(_summarise(points, 100), points)
    assert v["dnis_matches_uniform16_at_half"] and v["dnis_vs_uniform16"] == "worse"
    aucs["ihas"] = [0.70, 0.71, 0.705]
    points = _dims_points(aucs, params)
    v = _verdicts(_summarise(points, 100), points)
    assert v["ihas_vs_dnis"] == "worse" and not v["ihas_matches_dnis"]
    # with per-seed DeLong intervals on the test rows, those are combined with the seeds' spread
    for p in points:
        if p["method"] == "dnis":
            p["test_vs_uniform16"] = {"estimate": -0.0005, "low": -0.0045, "high": 0.0035, "level": 0.95, "se": 0.002,
                                      "method": "delong", "n": 1000}
    v = _verdicts(_summarise(points, 100), points)
    assert v["dnis_vs_uniform16_interval"]["method"] == "seeds" and not v["dnis_matches_uniform16_at_half"]


def test_selection_above_random_needs_more_than_the_random_spread() -> None:
    from experiments.benchmarks.selection import above_random

    assert above_random({"aukc": 0.75, "random_aukc_mean": 0.70, "random_aukc_std": 0.01}) == "yes"
    assert above_random({"aukc": 0.705, "random_aukc_mean": 0.70, "random_aukc_std": 0.01}) == "tie"
    assert above_random({"aukc": 0.60, "random_aukc_mean": 0.70, "random_aukc_std": 0.01}) == "NO"


def test_selection_curve_verdicts_read_the_paired_interval_over_seeds() -> None:
    from experiments.benchmarks.selection import above_random, leap_verdict

    def iv(estimate: float, se: float) -> dict[str, Any]:
        return {"estimate": estimate, "low": estimate - 1.96 * se, "high": estimate + 1.96 * se, "level": 0.95,
                "se": se, "method": "delong", "n": 1000}

    # a 0.005 gain whose seeds agree and whose rows are precise: "yes", even with a wide random spread
    m = {"aukc": 0.705, "random_aukc_mean": 0.70, "random_aukc_std": 0.01, "test_aukc_vs_random": [iv(0.005, 0.001)] * 2}
    assert above_random(m).startswith("yes +0.0050 [")
    m["test_aukc_vs_random"] = [iv(0.005, 0.004), iv(0.004, 0.004)]  # the rows' variance covers 0
    assert above_random(m).startswith("tie ")

    def curve(best_minus_leap: list[dict[str, Any]]) -> dict[str, Any]:
        return {"methods": {"leap": {"test_aukc": {"mean": 0.80, "std": 0.0, "n": 2}},
                            "lasso": {"test_aukc": {"mean": 0.79, "std": 0.0, "n": 2}},
                            "outrank": {"test_aukc": {"mean": 0.81, "std": 0.0, "n": 2},
                                        "test_aukc_vs_leap": best_minus_leap}}}

    v = leap_verdict({"a": curve([iv(0.010, 0.002), iv(0.011, 0.002)]), "b": curve([iv(0.010, 0.008)] * 2),
                      "c": curve([iv(-0.01, 0.002)] * 2)})
    assert v["a"]["verdict"] == "LeAP behind" and v["a"]["best_other"] == "outrank"
    assert v["a"]["difference"]["estimate"] == pytest.approx(-0.0105) and v["a"]["difference"]["high"] < 0
    assert v["b"]["verdict"].startswith("tie")
    assert v["c"]["verdict"] == "LeAP strictly best"  # the best by mean, yet behind LeAP on the same rows


def test_hardware_names_a_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from experiments.benchmarks._common import hardware as _hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    hardware = _hardware()
    assert hardware["gpu"] == "NVIDIA H200"
    assert hardware_text(hardware).endswith("cores), GPU NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _hardware()["gpu"] is None
    assert hardware_text({"cpu": "AMD EPYC", "cores": 2, "gpu": None}) == "AMD EPYC (2 cores), no GPU"


def test_leap_cost_verdict_reads_the_interval_of_alternating_pairs() -> None:
    from experiments.benchmarks._selection_cost import cost_verdict, ratio_interval

    plain = [2.0, 2.1, 1.9, 2.0, 2.05]
    steady = ratio_interval([2.8, 2.9, 2.7, 2.8, 2.85], plain)  # 1.40x in every pair
    assert steady is not None and steady["estimate"] == pytest.approx(1.40, abs=0.01) and steady["high"] < 1.5
    assert cost_verdict({"leap_vs_plain_run": 1.4, "leap_vs_plain_interval": steady}, 1.5) == "met"
    noisy = ratio_interval([2.0, 4.0, 2.2, 3.9, 2.1], plain)  # 1.0x-2.0x: the interval straddles 1.5
    assert noisy is not None and noisy["low"] < 1.5 < noisy["high"]
    assert cost_verdict({"leap_vs_plain_run": 1.1, "leap_vs_plain_interval": noisy}, 1.5) == "inconclusive"
    assert cost_verdict({"leap_vs_plain_run": 1.41}, 1.5) == "met (one pair)"  # an older result without pairs
    assert ratio_interval([2.8], [2.0]) is None


def test_dims_ihas_retrains_as_the_runs_other_fits_train() -> None:
    from experiments.benchmarks.dims import ihas_retrain_options

    config = {"trainer": {"max_epochs": 60}, "model": {"early_stopping_patience": 4}}
    assert ihas_retrain_options(config, ["--data.batch_size=2048"]) == {"retrain_epochs": 60, "retrain_patience": 4}
    assert ihas_retrain_options(config, ["--trainer.max_epochs=3"]) == {}  # an epoch budget: IHAS_OPTIONS' epochs
    assert ihas_retrain_options({"trainer": {"max_epochs": 60}, "model": {}}, []) == {}  # no early stopping to follow


def test_dims_merge_keeps_the_runs_it_does_not_measure_with_their_command(tmp_path: Path) -> None:
    from experiments.benchmarks.dims import _earlier_runs

    path = tmp_path / "dims.json"
    assert _earlier_runs(path, ["a"]) == {}
    path.write_text(json.dumps({"command": "old", "date": "2026-01-01", "runs": {"a": {"x": 1}, "b": {"x": 2},
                                                                                 "c": {"x": 3, "command": "older", "date": "2025"}}}))
    assert _earlier_runs(path, ["a"]) == {"b": {"x": 2, "command": "old", "date": "2026-01-01"},
                                          "c": {"x": 3, "command": "older", "date": "2025"}}
