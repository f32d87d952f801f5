"""The wide synthetic generator: its planted truth holds in the rows, and its files read back as the
in-memory reader's rows (Parquet with list columns, CSV with prefix columns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recsys.data.readers import TabularReader
from recsys.data.synthetic.wide import (
    WideConfig,
    WideReader,
    WideTruth,
    _generate,
    _logit,
    wide_chunks,
    wide_plan,
    write_wide,
)
from recsys.metrics import binary_auc


@pytest.fixture(scope="module")
def small() -> tuple[WideReader, WideTruth]:
    reader = WideReader(n_features=120, n_rows=6000, seed=3)
    return reader, reader.ground_truth()


def test_layout_and_roles(small: tuple[WideReader, WideTruth]) -> None:
    _, truth = small
    roles = list(truth.roles.values())
    assert len(roles) == 120 and roles.count("signal") == 12 and roles.count("interaction") == 2
    assert roles.count("copy") == 3 and roles.count("near_copy") == 1
    assert {truth.kinds[f] for f in truth.names("signal")} == {"categorical", "dense", "vector"}
    assert all(truth.roles[s] == "signal" for s in truth.sources.values())
    assert set(truth.kinds.values()) == {"categorical", "dense", "vector"}
    assert all(truth.widths[f] in (8, 16, 32, 64) for f, k in truth.kinds.items() if k == "vector")
    names = list(truth.roles)
    assert names == sorted(names, key=lambda n: int(n.lstrip("sidv")))  # numbered in file order, never by role


def test_planted_logit_carries_the_signal_and_copies_copy() -> None:
    plan = wide_plan(WideConfig(n_features=120, n_rows=6000, seed=3))
    values = _generate(plan, 0, 20_000)
    logit = _logit(plan, values)
    assert logit.std() == pytest.approx(plan.config.logit_std, rel=0.15)
    for f in plan.features:
        if f.role == "copy" and f.kind == "vector":
            np.testing.assert_array_equal(values[f.name], 2 * values[f.source])
        elif f.role == "copy" and f.kind == "scalar":
            np.testing.assert_allclose(values[f.name], 100 * values[f.source], rtol=1e-6)
        elif f.role == "copy":  # a bijective relabelling
            pairs = set(zip(values[f.source].tolist(), values[f.name].tolist()))
            assert len(pairs) == len(set(values[f.source].tolist())) == len({b for _, b in pairs})
        elif f.role == "near_copy":
            assert 0.05 < (values[f.name] != values[f.source]).mean() < 0.1
    a, b = (f.name for f in plan.features if f.role == "interaction")
    # the Latin square: the pair's contribution averages to 0 over either member's values
    term = plan[a].strength * plan.latin[(values[a] + values[b]) % 6]
    for v in range(6):
        assert abs(term[values[a] == v].mean()) < 0.05 and abs(term[values[b] == v].mean()) < 0.05
    rare = [f for f in plan.features if f.rare]
    assert rare and all(0.005 < (values[f.name] != 0).mean() < 0.015 for f in rare)


def test_labels_follow_the_planted_probability(small: tuple[WideReader, WideTruth]) -> None:
    reader, _ = small
    raw = reader.read()
    assert len(raw) == 6000 and 0.15 < raw.labels.mean() < 0.25
    plan = wide_plan(reader.config)
    assert binary_auc(np.concatenate([_logit(plan, v) for v, _ in wide_chunks(plan)]), raw.labels) > 0.8


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_files_read_back_as_the_reader(tmp_path: Path, small: tuple[WideReader, WideTruth], suffix: str) -> None:
    reader, truth = small
    path = tmp_path / f"wide{suffix}"
    written = write_wide(reader.config, path)
    assert written.to_dict() == truth.to_dict() == WideTruth.load(tmp_path / "wide.truth.json").to_dict()
    raw = TabularReader(str(path), str(tmp_path / "wide.schema.yaml")).read()
    want = reader.read()
    assert raw.schema == want.schema and len(raw) == len(want)
    for spec in want.schema.features:
        got, ref = raw.column(spec.name), want.column(spec.name)
        if spec.is_sparse:
            assert (got.to_numpy() == ref.to_numpy()).all(), spec.name
        else:
            np.testing.assert_allclose(got.to_numpy(dtype=float), ref.to_numpy(dtype=float), rtol=1e-6, err_msg=spec.name)
    np.testing.assert_array_equal(raw.labels, want.labels)
