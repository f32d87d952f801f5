"""The benchmarks' shared pieces: the verdict rule (a difference within the seed spread is a tie)
and the isolated working folder."""

from __future__ import annotations

import math
import os
from pathlib import Path

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
    assert verdict(1.0, 0.5, spread=0.2) == BETTER
    assert verdict(0.5, 1.0, spread=0.2) == WORSE
    assert verdict(1.0, 0.9, spread=0.2) == TIE  # ahead, but within the spread
    assert verdict(0.9, 1.0, spread=0.2) == TIE
    assert verdict(1.0, 0.8, spread=0.2) == TIE  # exactly the spread is not more than it
    assert verdict(1.0, 1.0, spread=0.0) == TIE
    # lower is better (regret, loss)
    assert verdict(0.1, 1.0, spread=0.2, lower_is_better=True) == BETTER
    assert verdict(1.0, 0.1, spread=0.2, lower_is_better=True) == WORSE
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


def _dims_row(auc: float, std: float, params: float, delta: float = 0.0, delta_std: float = 0.0) -> dict:
    return {"test_auc_mean": auc, "test_auc_std": std, "embedding_parameters_mean": params,
            "parameter_ratio": params / 100.0, "auc_delta_vs_uniform16_mean": delta,
            "auc_delta_vs_uniform16_std": delta_std, "seeds": 3}


def test_dims_comparisons_name_ties() -> None:
    from experiments.benchmarks.dims import _verdicts

    summary = {"uniform-16": _dims_row(0.80, 0.01, 100), "dnis": _dims_row(0.801, 0.01, 50, 0.001, 0.01),
               "ihas": _dims_row(0.805, 0.01, 50)}
    v = _verdicts(summary)
    assert v["ihas_vs_dnis"] == "tie" and v["dnis_vs_uniform16"] == "tie"
    summary["ihas"] = _dims_row(0.70, 0.01, 50)
    assert _verdicts(summary)["ihas_vs_dnis"] == "worse" and not _verdicts(summary)["ihas_matches_dnis"]


def test_selection_above_random_needs_more_than_the_random_spread() -> None:
    from experiments.benchmarks.selection import above_random

    assert above_random({"aukc": 0.75, "random_aukc_mean": 0.70, "random_aukc_std": 0.01}) == "yes"
    assert above_random({"aukc": 0.705, "random_aukc_mean": 0.70, "random_aukc_std": 0.01}) == "tie"
    assert above_random({"aukc": 0.60, "random_aukc_mean": 0.70, "random_aukc_std": 0.01}) == "NO"


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
