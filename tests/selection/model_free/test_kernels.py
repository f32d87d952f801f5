"""The compiled OutRank kernels against their NumPy reference: integers to the bit, sums to 1e-12."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import recsys.jit
from recsys.data.schema import FeatureKind, FeatureSpec
from selection.model_free import kernels
from selection.model_free.column_codes import arrow_text, bin_codes, code_values, missing_mask, text_codes
from selection.model_free.mutual_info import distinct_count, factorize, first_appearance, outrank_score
from selection.model_free.outrank_scoring import OutRankConfig, score_raw
from selection.model_free.outrank_stream import score_stream
from tests.selection.model_free.test_streaming import _assert_same, _chunks, _synthetic

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba is a dependency; this checks its kernels")

codes = st.integers(1, 400).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 60), min_size=n, max_size=n), st.lists(st.integers(0, 3), min_size=n, max_size=n)))


@settings(max_examples=60, deadline=None)
@given(codes, st.sampled_from(["package", "rotation"]), st.integers(1, 6))
def test_score_equals_the_numpy_reference(xy: tuple[list[int], list[int]], null: str, rotations: int) -> None:
    x, y = (np.asarray(v, dtype=np.int64) for v in xy)
    with kernels.use("numpy"):
        want = outrank_score(x, y, null, rotations)
    with kernels.use("numba"):
        got = outrank_score(x, y, null, rotations)
    assert abs(got - want) <= 1e-12


def test_a_planted_dependence_scores_as_the_reference_and_noise_near_zero() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 16_384)
    signal = np.where(rng.random(len(y)) < 0.3, y, rng.integers(0, 50, len(y)))
    noise = rng.zipf(1.4, len(y)) % 5_000
    for x in (signal, noise):
        for null in ("package", "rotation"):
            with kernels.use("numpy"):
                want = outrank_score(x, y, null)
            with kernels.use("numba"):
                got = outrank_score(x, y, null)
            assert got == pytest.approx(want, abs=1e-12)
    with kernels.use("numba"):
        assert outrank_score(signal, y) > 0.01 > abs(outrank_score(noise, y))


def test_a_key_space_past_the_kernel_cap_takes_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 5_000, 3_000), rng.integers(0, 5_000, 3_000)  # a feature-feature pair: 25M keys
    with kernels.use("numpy"):
        want = outrank_score(x, y)
    monkeypatch.setattr(kernels, "KERNEL_KEYS", 1 << 10)
    called: list[int] = []
    monkeypatch.setattr(kernels, "cond_xlogx", lambda *a: called.append(1))
    with kernels.use("numba"):
        assert outrank_score(x, y) == want and not called


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=300))
def test_distinct_count_and_first_appearance_are_exact(values: list[int]) -> None:
    x = np.asarray(values, dtype=np.int64)
    with kernels.use("numba"):
        assert distinct_count(x) == len(np.unique(x))
        got = first_appearance(x)
    np.testing.assert_array_equal(got, factorize(x))
    assert got.dtype == np.int64


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.integers(-5, 5).map(float)),
                min_size=1, max_size=200),
       st.lists(st.integers(-6, 6).map(float), min_size=1, max_size=100))
def test_bin_codes_equal_searchsorted(values: list[float], edge_list: list[float]) -> None:
    x = np.asarray(values, dtype=np.float64)
    for edges in (np.unique(edge_list), np.linspace(-5, 5, 90)):  # few edges (counted), many (searched)
        with kernels.use("numpy"):
            want = bin_codes(x, edges)
        with kernels.use("numba"):
            got = bin_codes(x, edges)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int64


@pytest.mark.parametrize("dtype", [pd.StringDtype("pyarrow", na_value=np.nan), pd.StringDtype("pyarrow"),
                                   pd.ArrowDtype(pa.large_string())])
def test_text_codes_are_the_pandas_codes_and_missing_mask(dtype: object) -> None:
    cells = ["a", None, "", "b", "a", "NA", None, "", "c", "b"]
    values = pd.Series(cells, dtype=dtype)
    spec = FeatureSpec("c", FeatureKind.CATEGORICAL, missing_value="NA")
    arr = arrow_text(values)
    assert arr is not None and arrow_text(pd.Series([1, 2])) is None and arrow_text(values.astype(object)) is None
    got, missing, uniques = text_codes(arr, spec)
    np.testing.assert_array_equal(got, factorize(code_values(values, spec)))
    np.testing.assert_array_equal(missing, missing_mask(values, spec))
    assert uniques.to_pylist() == ["a", "", "b", "NA", "c"]  # null and "" one value, coded as ""
    assert isinstance(uniques, pa.Array)


@pytest.mark.parametrize("config", [
    OutRankConfig(progress=False, minibatch_size=4096),
    OutRankConfig(progress=False, ranking="relevance", null="package", minibatch_size=2500, target_bins=4),
])
@pytest.mark.parametrize("arrow", [False, True])
def test_streamed_scores_are_the_same_on_both_paths(config: OutRankConfig, arrow: bool) -> None:
    raw = _synthetic(n=9_000)
    if arrow:  # text as the readers give it: the survey votes on Arrow buffers (constant, near-constant columns too)
        text = [s.name for s in raw.schema.features if s.kind is not FeatureKind.DENSE]
        raw = type(raw)(raw.frame.astype({c: "string[pyarrow]" for c in text}), raw.schema, raw.report)
    with kernels.use("numpy"):
        reference = score_raw(raw, config)
        streamed_numpy = score_stream(_chunks(raw, 1_500), config, progress=False)
    with kernels.use("numba"):
        streamed = score_stream(_chunks(raw, 1_500), config, progress=False)
        in_memory = score_raw(raw, config)
    for other in (streamed_numpy, streamed, in_memory):
        _assert_same(reference, other)


def test_the_path_is_chosen_by_use_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SALIENCE_KERNELS", raising=False)
    assert kernels.active() == "numba"
    monkeypatch.setenv("SALIENCE_KERNELS", "numpy")
    assert kernels.active() == "numpy" and not kernels.compiled(10, 10)
    with kernels.use("numba"):
        assert kernels.active() == "numba" and kernels.compiled(10, 10)
    monkeypatch.setenv("SALIENCE_KERNELS", "cython")
    with pytest.raises(ValueError, match="SALIENCE_KERNELS='cython'"):
        kernels.active()
    with pytest.raises(ValueError, match="kernels='c'"), kernels.use("c"):  # type: ignore[arg-type]
        pass
    monkeypatch.setattr(recsys.jit, "numba", None)
    with pytest.raises(RuntimeError, match="pip install numba"), kernels.use("numba"):
        pass


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "", "ab", "\u00e9", None]), max_size=60), st.booleans(), st.integers(0, 5))
def test_majority_vote_finds_a_majority_and_pairs_off_the_rest(cells: list[str | None], large: bool, cut: int) -> None:
    arr = pa.array(["x"] * cut + cells, type=pa.large_string() if large else pa.string()).slice(cut)  # a sliced array
    value, net = kernels.majority_vote(arr)
    read = ["" if c is None else c for c in cells]
    if not read:
        assert (value, net) == (None, 0)
        return
    assert 0 <= net <= read.count(value) and (len(read) - net) % 2 == 0  # the rest: pairs of two values
    top = max(set(read), key=read.count)
    if read.count(top) * 2 > len(read):
        assert value == top


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5, float("nan"), -3.0]), max_size=60))
def test_number_vote_finds_a_majority_and_pairs_off_the_rest(values: list[float]) -> None:
    """The float64 vote: NaN one value and -0.0 equal to 0.0, as ``value_counts(dropna=False)``
    counts them."""
    x = np.array(values, dtype=np.float64)
    value, net = kernels.majority_vote_numbers(x)
    if not values:
        assert (value, net) == (None, 0)
        return
    counts = pd.Series(x).value_counts(dropna=False)
    held = int(np.isnan(x).sum()) if np.isnan(value) else int((x == value).sum())
    assert 0 <= net <= held and (len(x) - net) % 2 == 0
    if counts.iloc[0] * 2 > len(x):
        top = counts.index[0]
        assert (np.isnan(top) and np.isnan(value)) or value == top
