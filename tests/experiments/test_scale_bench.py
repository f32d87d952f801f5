"""`salience bench scale`: its data generator and a quick run of its measuring steps."""

from __future__ import annotations

import json

import pandas as pd

from experiments.benchmarks import scale
from experiments.benchmarks._criteo_synth import NUM_DENSE, NUM_SPARSE, SIGNAL_FIELDS, write_criteo_tsv
from recsys.data.readers import CriteoReader
from recsys.metrics import binary_auc


def test_generator_is_deterministic_and_criteo_shaped(tmp_path):
    a = write_criteo_tsv(tmp_path / "a.txt", 3000, seed=3, block_rows=1000)
    b = write_criteo_tsv(tmp_path / "b.txt", 3000, seed=3, block_rows=1000)
    c = write_criteo_tsv(tmp_path / "c.txt", 3000, seed=4, block_rows=1000)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    lines = a.read_text().splitlines()
    assert len(lines) == 3000 and {len(line.split("\t")) for line in lines} == {1 + NUM_DENSE + NUM_SPARSE}
    raw = CriteoReader(str(a)).read()  # the project's own reader takes it without a skipped row
    assert len(raw) == 3000 and raw.report.rows_skipped == 0
    ids = [v for v in raw.frame["C26"] if v]
    assert all(len(v) == 8 and int(v, 16) >= 0 for v in ids[:50])


def test_generator_plants_its_signal_in_the_first_fields(tmp_path):
    path = write_criteo_tsv(tmp_path / "d.txt", 40_000, seed=0, max_cardinality=1000)
    frame = pd.read_csv(path, sep="\t", header=None, dtype=str, keep_default_na=False)
    label = frame[0].astype(int).to_numpy()
    assert 0.1 < label.mean() < 0.4

    def target_auc(column: int) -> float:  # in-sample AUC of the per-value click rate
        rate = pd.Series(label).groupby(frame[column]).transform("mean").to_numpy()
        return binary_auc(rate, label)

    signal = target_auc(1 + NUM_DENSE + int(SIGNAL_FIELDS[0][1:]) - 1)  # C1
    noise = target_auc(1 + NUM_DENSE + 10)  # C11: a noise field of similar cardinality
    assert signal > 0.53 and signal > noise + 0.02


def test_quick_run_writes_every_result_file(tmp_path):
    out = tmp_path / "out"
    assert scale.main(["--quick", "--only", "prepare", "--no-engines", "--output-dir", str(out)]) == 0
    result = json.loads((out / "scale_quick.json").read_text())
    step = result["sizes"][0]["steps"]["prepare"]
    assert "error" not in step, step
    assert step["rows"] == scale.QUICK_ROWS[0] and step["peak_rss_mb"] > 0 and step["rows_per_s"] > 0
    assert result["verdicts"]["completes"]["verdict"] == "NOT met"  # 20k rows is not 45M
    assert (out / "scale_quick.md").read_text().count("| prepare |") == 1
    assert (out / "scale_quick.png").stat().st_size > 0


def test_loader_step_times_the_data_path_alone_under_its_own_name(tmp_path):
    out = tmp_path / "out"
    assert scale.main(["--quick", "--only", "loader,train_cuda", "--no-engines", "--name", "scale_probe",
                       "--output-dir", str(out)]) == 0
    result = json.loads((out / "scale_probe_quick.json").read_text())
    steps = result["sizes"][0]["steps"]
    loader = steps["loader"]
    assert "error" not in loader, loader
    # the timed batches are whole training batches: steps x batch size rows (the quick set's
    # 16k training rows hold more than the warm-up plus the timed steps)
    assert loader["rows"] == scale.QUICK_STEPS * 2048 and loader["samples_per_s"] > 0
    import torch

    if not torch.cuda.is_available():  # said, not raised, and not counted against the default steps
        assert "needs a CUDA device" in steps["train_cuda"]["error"]
    md = (out / "scale_probe_quick.md").read_text()
    assert "| loader |" in md and "(scale_probe_quick.png)" in md
    assert not (out / "scale_quick.json").exists()


def test_dask_preparation_step_cuts_the_file_and_prepares_every_row(tmp_path, monkeypatch):
    """``prepare_dask`` reads one file as byte spans on a worker per core: every row, in more
    partitions than files, the workers' peak RSS reported beside the client's."""
    from recsys.data.streaming import dask_cluster

    monkeypatch.setattr(dask_cluster, "SPAN_BYTES", 1 << 20)  # the quick file (4.9 MB) in 5 spans
    path = tmp_path / "criteo.txt"
    write_criteo_tsv(path, 20_000, seed=0)
    args = scale._parse(["_step", "prepare_dask", "--file", str(path), "--work", str(tmp_path / "w")])
    out = scale.measure_step("prepare_dask", path, tmp_path / "w", args)
    assert out["rows"] == 20_000 and out["partitions"] == 5 and out["workers"] >= 1
    assert out["workers_peak_rss_mb"] > 0 and out["rows_per_s"] > 0


def test_cores_axis_reruns_the_data_steps_pinned_to_fewer_cores(tmp_path):
    out = tmp_path / "out"
    assert scale.main(["--quick", "--only", "outrank", "--no-engines", "--cores", "1,all,1", "--name", "scale_cores",
                       "--output-dir", str(out)]) == 0
    size = json.loads((out / "scale_cores_quick.json").read_text())["sizes"][0]
    counts = sorted(size["cores"], key=int)
    assert counts[0] == "1" and len(counts) == len(set(counts))  # `1` twice runs once
    one = size["cores"]["1"]["outrank"]
    assert "error" not in one and one["rows_per_s"] > 0 and set(size["cores"]["1"]) == {"outrank"}
    assert "By cores" in (out / "scale_cores_quick.md").read_text()
    import pytest

    with pytest.raises(SystemExit, match="--cores: 'none'"):
        scale._core_counts("2,none")
    assert scale._core_counts("99999") == []  # more than this machine has: skipped with a warning


def test_package_rows_render_and_judge_the_ratio(tmp_path):
    import sys

    import numpy as np

    from experiments.benchmarks._outrank_package import PACKAGE, encode_batches, time_kernels, write_csv

    tsv = write_criteo_tsv(tmp_path / "d.txt", 2_000, seed=1, block_rows=1000)
    csv = write_csv(tsv, tmp_path / "pkg")  # the package's csv-raw format: commas and a header
    header, first = csv.read_text().splitlines()[:2]
    assert header.split(",")[:3] == ["label", "I1", "I2"] and first.count(",") == 39 and "\t" not in first
    codes = encode_batches(tsv, tmp_path / "codes.npz")
    with np.load(codes) as z:
        assert len(z.files) == 40 and len(z["C1"]) == 2_000 and set(np.unique(z["label"])) == {0, 1}
    timed = time_kernels(codes, package_python=sys.executable, batch=500)  # this venv has no `outrank`
    assert "outrank" in timed["package (per-group shift null)"]["error"]
    for name in ("ours (per-group shift null)", "ours (rotation null, the default)"):
        assert timed[name]["rows"] == 2_000 and timed[name]["features"] == 39 and timed[name]["rows_per_s"] > 0
    ours = {"rows": 1_000_000, "seconds": 2.0, "rows_per_s": 500_000.0, "peak_rss_mb": 900.0}
    size = {"rows": 1_000_000, "file_mb": 245.0, "steps": {"outrank": ours},
            "package": {"version": PACKAGE, "kernels": timed,
                        "cli": {"rows": 1_000_000, "seconds": 12.5, "rows_per_s": 80_000.0, "threads": 2, "peak_rss_mb": 700.0}},
            "cores": {"2": {"outrank": {**ours, "rows_per_s": 100_000.0}}, "16": {"outrank": ours}}}
    v = scale.verdicts([size])
    assert v["package_ratio"] == {"ours": 500_000.0, "package": 80_000.0, "ratio": 6.25, "verdict": "met"}
    assert v["cores_ratio"]["outrank (1,000,000 rows)"]["ratio"] == 5.0
    assert v["cores_ratio"]["outrank (1,000,000 rows)"]["verdict"] == "NOT met"  # 5x < 6x
    md = scale.to_markdown({"command": "x", "date": "d", "hardware": {"cpu": "c", "cores": 16}, "sizes": [size],
                            "verdicts": v})
    assert "`outrank==0.97.5` package beside ours" in md and "| ours (rotation null, the default) |" in md
    assert "x6.25, one run each) | met |" in md and "| 1,000,000 | 16 | outrank |" in md


def test_package_rows_measure_on_a_csv_copy_and_clean_up(tmp_path, monkeypatch):
    from experiments.benchmarks import _outrank_package as package

    tsv = write_criteo_tsv(tmp_path / "d.txt", 1_500, seed=2, block_rows=500)
    seen = {}
    monkeypatch.setattr(package, "ensure_venv", lambda: tmp_path / "python")
    monkeypatch.setattr(package, "run_cli", lambda folder, out, threads, rows: seen.update(
        lines=len((folder / "data.csv").read_text().splitlines()), rows=rows) or {"rows": rows, "rows_per_s": 1.0})
    monkeypatch.setattr(package, "time_kernels", lambda codes: {"codes": codes.exists()})
    work = tmp_path / "work"
    out = package.package_rows(tsv, work, 1_500)
    assert seen == {"lines": 1_501, "rows": 1_500}  # the header and every row, then removed
    assert out["version"] == package.PACKAGE and out["kernels"] == {"codes": True}
    assert not (work / "outrank-package" / "data.csv").exists() and not (work / "codes.npz").exists()
