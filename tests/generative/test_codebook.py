"""Semantic-ID codebooks: collisions, disambiguation, lookups, files, RQ-KMeans and RQ-VAE."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import generative.codebook.rqvae as rqvae_module
import recsys.kmeans as kmeans_module
from generative.codebook import (
    Codebook,
    CodebookBuilder,
    CodebookError,
    builder_names,
    code_perplexity,
    collision_groups,
    kmeans,
    min_codebook_size,
)
from generative.codebook.artifact import collision_stats


def with_pad(x: np.ndarray) -> np.ndarray:
    """Prepend the padding row 0."""
    return np.vstack([np.zeros((1, x.shape[1]), dtype=x.dtype), x])


def blobs(n_per: int, k: int, dim: int, spread: float = 0.3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``k`` well separated gaussian blobs: vectors ``[k*n_per + 1, dim]`` (row 0 pad), labels ``[k*n_per]``."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)) * 10.0
    labels = np.repeat(np.arange(k), n_per)
    x = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    return with_pad(x.astype(np.float32)), labels


def random_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return with_pad(np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32))


SMALL_VAE = {"hidden": [32, 16], "latent": 8, "batch_size": 64}


# -- collisions: hand-computed goldens ---------------------------------------------------------


def test_collision_groups_golden() -> None:
    # items 1..6; (0,1) held by items 1, 2, 4; (1,0) by 3, 6; (2,2) by 5 alone
    raw = np.array([[0, 1], [0, 1], [1, 0], [0, 1], [2, 2], [1, 0]])
    group, sizes, rank = collision_groups(raw)
    assert sorted(sizes.tolist()) == [1, 2, 3]
    assert rank.tolist() == [0, 1, 0, 2, 0, 1]
    assert group[0] == group[1] == group[3] and group[2] == group[5] and len({group[0], group[2], group[4]}) == 3
    stats = collision_stats(raw)
    assert stats["collision_rate_before"] == pytest.approx(5 / 6)
    assert stats["num_collision_groups"] == 2
    assert stats["max_group_size"] == 3
    assert stats["distinct_prefixes"] == [3, 3]


def test_code_perplexity_golden() -> None:
    usage, ppl = code_perplexity(np.array([0, 0, 1, 1]), 4)
    assert usage == 0.5 and ppl == pytest.approx(2.0)
    usage, ppl = code_perplexity(np.array([3, 3, 3]), 4)
    assert usage == 0.25 and ppl == pytest.approx(1.0)


def test_builder_collisions_and_disambiguation_golden() -> None:
    # three distinct points a, b, c; items 1..6 are a, a, b, a, c, b -> one level of 3 codes
    a, b, c = [0.0, 0.0], [10.0, 0.0], [0.0, 10.0]
    vectors = with_pad(np.array([a, a, b, a, c, b], dtype=np.float32))
    book = CodebookBuilder.create("rq-kmeans", levels=1, codebook_size=3).fit(vectors, seed=0)
    assert book.stats["collision_rate_before"] == pytest.approx(5 / 6)
    assert book.stats["num_collision_groups"] == 2 and book.stats["max_group_size"] == 3
    assert book.level_sizes == [3, 3] and book.disambiguated
    first = book.codes[1:, 0]
    assert first[0] == first[1] == first[3] and first[2] == first[5] and len(set(first.tolist())) == 3
    assert book.codes[1:, 1].tolist() == [0, 1, 0, 2, 0, 1]  # index within the group, item order
    assert (book.codes[0] == -1).all()
    assert book.stats["usage"] == [1.0, 1.0]


# -- disambiguation and lookups ----------------------------------------------------------------


def test_disambiguation_makes_ids_unique_and_lookup_inverts() -> None:
    vectors = random_vectors(400, 8, seed=3)
    book = CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=4, max_group_size=64).fit(vectors, seed=0)
    assert book.stats["collision_rate_before"] > 0  # 400 items in 16 tuples: collisions guaranteed
    assert book.is_unique and book.num_levels == 3 and book.num_items == 400
    assert book.level_sizes[-1] == book.stats["max_group_size"]
    assert len({tuple(r) for r in book.codes[1:].tolist()}) == 400
    for i in range(1, 401):
        assert book.item_of(book.tokens_of(i)) == i
    assert book.items_of(book.codes[1:]).tolist() == list(range(1, 401))
    assert book.items_of(torch.tensor(book.codes[1:5])).tolist() == [1, 2, 3, 4]
    # not a catalogue tuple: out of range, negative (padding), or an unused combination
    bad = np.array([[4, 0, 0], [-1, -1, -1], [0, 0, book.level_sizes[-1]]])
    assert book.items_of(bad).tolist() == [0, 0, 0]
    used = {tuple(r) for r in book.codes[1:].tolist()}
    free = next(
        (a, b, c) for a in range(4) for b in range(4) for c in range(book.level_sizes[-1]) if (a, b, c) not in used
    )
    assert book.item_of(free) == 0
    with pytest.raises(CodebookError, match=r"\[n, 3\]"):
        book.items_of(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(CodebookError, match="1..400"):
        book.tokens_of(0)


def test_lookup_with_huge_level_sizes_falls_back_to_a_table() -> None:
    codes = np.array([[-1, -1, -1], [0, 5, 1], [2**31 - 1, 0, 3], [7, 7, 0]])
    book = Codebook(codes, [2**31, 2**31, 4])  # key space 2**64 does not fit int64 keys
    assert book.items_of(codes[1:]).tolist() == [1, 2, 3]
    assert book.item_of((7, 7, 1)) == 0 and book.item_of((2**31, 0, 0)) == 0


def test_without_disambiguation_collisions_are_kept_and_lookup_refuses() -> None:
    vectors = random_vectors(60, 4)
    book = CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=8, disambiguate=False).fit(vectors)
    assert book.num_levels == 2 and not book.disambiguated
    if book.stats["collision_rate_before"] > 0:
        assert not book.is_unique
        with pytest.raises(CodebookError, match="disambiguate=True"):
            book.item_of(book.tokens_of(1))
    # a guaranteed collision: two identical items
    same = with_pad(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 5.0]], dtype=np.float32))
    book = CodebookBuilder.create("rq-kmeans", levels=1, codebook_size=4, disambiguate=False).fit(same)
    assert book.stats["collision_rate_before"] == pytest.approx(2 / 3) and not book.is_unique
    with pytest.raises(CodebookError, match="disambiguate=True"):
        book.items_of(book.codes[1:])


def test_unique_codes_get_a_constant_collision_token() -> None:
    vectors, _ = blobs(1, 6, 4)  # 6 items, 6 distinct far points, 6 codes: no collisions
    book = CodebookBuilder.create("rq-kmeans", levels=1, codebook_size=6).fit(vectors)
    assert book.stats["collision_rate_before"] == 0.0 and book.stats["max_group_size"] == 1
    assert book.level_sizes == [6, 1] and (book.codes[1:, 1] == 0).all()


# -- RQ-KMeans ---------------------------------------------------------------------------------


def test_rq_kmeans_is_deterministic_per_seed() -> None:
    vectors = random_vectors(300, 8, seed=1)
    builder = CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=16, max_group_size=32)
    one, two = builder.fit(vectors, seed=5), builder.fit(vectors, seed=5)
    assert one == two
    other = builder.fit(vectors, seed=6)
    assert not np.array_equal(one.codes, other.codes)
    assert one.config["seed"] == 5 and one.config["name"] == "rq-kmeans" and one.config["input_dim"] == 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rq_kmeans_recovers_planted_clusters_at_level_one(seed: int) -> None:
    vectors, labels = blobs(50, 8, 16, seed=seed)
    book = CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=8, max_group_size=50).fit(vectors, seed=seed)
    first = book.codes[1:, 0]
    joint = np.zeros((8, 8), dtype=int)
    np.add.at(joint, (first, labels), 1)
    purity = joint.max(axis=1).sum() / len(labels)  # each code holds one blob
    inverse = joint.max(axis=0).sum() / len(labels)  # each blob sits in one code
    assert purity >= 0.98 and inverse >= 0.98
    # level 1 explains almost all the variance of well separated blobs
    mse = book.stats["quantization_mse"]
    assert mse[0] < 0.05 * book.stats["input_variance"] and mse[1] <= mse[0]


def test_kmeans_reseeds_an_empty_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(np.vstack([rng.normal(size=(10, 2)), 20 + rng.normal(size=(10, 2))]).astype(np.float32))
    seeds = torch.tensor([[0.0, 0.0], [1000.0, 1000.0], [20.0, 20.0]])  # the middle one attracts nothing
    monkeypatch.setattr(kmeans_module, "kmeans_plus_plus", lambda x, k, gen, *args, **kwargs: seeds.clone())
    gen = torch.Generator().manual_seed(0)
    centroids, assign, inertia, _ = kmeans(x, 3, gen)
    assert torch.bincount(assign, minlength=3).min() >= 1
    assert (centroids.abs() < 100).all()
    assert inertia > 0


def test_k_is_capped_at_distinct_points() -> None:
    # 5 items, 16 codes: k-means uses at most 5 clusters; identical items collide and are disambiguated
    vectors = with_pad(np.array([[0, 0], [0, 0], [3, 0], [0, 3], [3, 3]], dtype=np.float32))
    book = CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=16).fit(vectors)
    assert book.level_sizes[:2] == [16, 16]
    assert book.stats["usage"][0] == pytest.approx(4 / 16)
    assert book.stats["collision_rate_before"] == pytest.approx(2 / 5)
    assert book.is_unique
    alike = with_pad(np.ones((5, 3), dtype=np.float32))
    book = CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=16).fit(alike)
    assert book.level_sizes == [16, 16, 5] and book.codes[1:, 2].tolist() == [0, 1, 2, 3, 4]


# -- RQ-VAE ------------------------------------------------------------------------------------


def test_rq_vae_trains_and_reports_usage_and_perplexity() -> None:
    vectors, _ = blobs(40, 8, 16, spread=1.0)
    # an RQ-VAE this small collides a lot on blobs: max_group_size only keeps the build from refusing
    options = {"levels": 2, "codebook_size": 8, "epochs": 25, "lr": 3e-3, "max_group_size": 320}
    builder = CodebookBuilder.create("rq-vae", **options, **SMALL_VAE)
    book = builder.fit(vectors)
    s = book.stats
    assert s["reconstruction_loss"] < 0.5 * s["reconstruction_loss_initial"]
    curves = s["training"]
    assert curves["epoch"] == list(range(1, 26))
    assert len(curves["usage"]) == 25 and all(len(u) == 2 and all(0 < v <= 1 for v in u) for u in curves["usage"])
    assert all(all(1 <= p <= 8 + 1e-9 for p in row) for row in curves["perplexity"])
    assert curves["reconstruction_loss"][-1] < curves["reconstruction_loss"][0]
    assert 1 <= s["checkpoint_epoch"] <= 25
    assert book.is_unique and book.method == "rq-vae"
    assert 0.0 <= s["collision_rate_before"] <= 1.0
    for i in range(1, book.num_items + 1):
        assert book.item_of(book.tokens_of(i)) == i


def test_rq_vae_is_deterministic_per_seed() -> None:
    vectors = random_vectors(120, 8, seed=2)
    builder = CodebookBuilder.create("rq-vae", levels=2, codebook_size=8, epochs=3, max_group_size=32, **SMALL_VAE)
    state = torch.random.get_rng_state()
    one, two = builder.fit(vectors, seed=1), builder.fit(vectors, seed=1)
    assert one == two
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone


@pytest.mark.parametrize("reset", [False, True])
def test_rq_vae_collapse_is_visible_and_dead_codes_are_reset(reset: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # initialise the codebook collapsed: code 0 near every latent, the other 15 far away
    def collapsed(z: torch.Tensor, sizes: list[int], gen: torch.Generator, **_: object) -> tuple:
        book = torch.full((sizes[0], z.shape[1]), 1e6)
        book[0] = z.mean(0)
        return np.zeros((len(z), 1), dtype=np.int64), [book], [0.0], [0]

    monkeypatch.setattr(rqvae_module, "residual_kmeans", collapsed)
    builder = CodebookBuilder.create(
        "rq-vae", levels=1, codebook_size=16, epochs=2, lr=0.0, dead_code_reset=reset, max_group_size=50,
        checkpoint="last", **SMALL_VAE,
    )  # fmt: skip
    book = builder.fit(random_vectors(50, 4))
    curves = book.stats["training"]
    assert curves["usage"][0] == [1 / 16] and curves["perplexity"][0] == [pytest.approx(1.0)]
    if reset:
        assert curves["dead_codes_reset"][0] == 15
        assert curves["usage"][1][0] > 1 / 16 and curves["perplexity"][1][0] > 1.0
    else:
        assert curves["dead_codes_reset"] == [0, 0] and curves["usage"][1] == [1 / 16]
        assert book.stats["collision_rate_before"] == 1.0 and book.level_sizes == [16, 50]
    assert book.stats["checkpoint_epoch"] == 2


# -- capacity and bad input --------------------------------------------------------------------


def test_min_codebook_size_golden() -> None:
    assert min_codebook_size(12101, 3) == 23  # 22**3 = 10648 < 12101 <= 12167 = 23**3
    assert min_codebook_size(100, 2, slots=2) == 8  # 7*7*2 = 98 < 100 <= 128
    assert min_codebook_size(1, 3) == 1
    assert min_codebook_size(256**3, 3) == 256


def test_codebook_too_small_names_the_minimum_size() -> None:
    vectors = random_vectors(100, 4)
    with pytest.raises(ValueError, match="minimum codebook_size for 2 levels is 10"):
        CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=3, disambiguate=False).fit(vectors)
    with pytest.raises(ValueError, match=r"minimum codebook_size for 2 levels is 8 \(with max_group_size=2\)"):
        CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=3, max_group_size=2).fit(vectors)
    with pytest.raises(ValueError, match="codebook too small"):
        CodebookBuilder.create("rq-vae", levels=1, codebook_size=[4], disambiguate=False).fit(vectors)
    # passes the capacity check, but one collision group outgrows max_group_size
    clumped = with_pad(np.zeros((10, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="largest collision group holds 10 items"):
        CodebookBuilder.create("rq-kmeans", levels=1, codebook_size=4, max_group_size=3).fit(clumped)


def test_empty_catalogue_and_bad_vectors() -> None:
    builder = CodebookBuilder.create("rq-kmeans")
    with pytest.raises(ValueError, match="empty catalogue"):
        builder.fit(np.zeros((1, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="empty catalogue"):
        builder.check_capacity(0)
    with pytest.raises(CodebookError, match="empty catalogue"):
        Codebook(np.full((1, 3), -1), [4, 4, 1])
    bad = random_vectors(5, 3)
    bad[4, 1] = np.nan
    with pytest.raises(ValueError, match="item 4"):
        builder.fit(bad)
    with pytest.raises(ValueError, match=r"\[num_items \+ 1, d\]"):
        builder.fit(np.zeros(5))
    with pytest.raises(ValueError, match="unknown codebook builder 'nope'"):
        CodebookBuilder.create("nope")
    with pytest.raises(ValueError, match="codebook_size lists 2 sizes for 3 levels"):
        CodebookBuilder.create("rq-kmeans", codebook_size=[4, 4])
    with pytest.raises(ValueError, match="checkpoint"):
        CodebookBuilder.create("rq-vae", checkpoint="best")
    assert {"rq-kmeans", "rq-vae"} <= set(builder_names())


def test_codebook_validates_codes() -> None:
    with pytest.raises(CodebookError, match="row 0"):
        Codebook(np.array([[0, 0], [1, 0]]), [2, 1])
    with pytest.raises(CodebookError, match=r"item 2: level 0 code 5 is outside \[0, 2\)"):
        Codebook(np.array([[-1, -1], [1, 0], [5, 0]]), [2, 1])
    with pytest.raises(CodebookError, match="level_sizes has 1 entries"):
        Codebook(np.array([[-1, -1], [1, 0]]), [2])


# -- files -------------------------------------------------------------------------------------


def test_save_load_round_trip_exactly(tmp_path: Path) -> None:
    vectors = random_vectors(150, 6, seed=4)
    for builder in (
        CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=8, max_group_size=32),
        CodebookBuilder.create("rq-vae", levels=2, codebook_size=8, epochs=2, max_group_size=64, **SMALL_VAE),
    ):
        book = builder.fit(vectors, seed=3)
        path = book.save(tmp_path / f"{book.method}.json")
        loaded = Codebook.load(path, num_items=150)
        assert loaded == book
        assert loaded.codes.dtype == np.int64 and np.array_equal(loaded.codes, book.codes)
        assert loaded.stats == book.stats and loaded.config == book.config
        assert [loaded.item_of(book.tokens_of(i)) for i in range(1, 151)] == list(range(1, 151))
        assert loaded.save(tmp_path / "again.json").read_text() == path.read_text()
        data = json.loads(path.read_text())
        assert data["format"] == "salience-codebook" and len(data["codes"]) == 150


def test_load_rejects_corrupt_or_mismatching_files(tmp_path: Path) -> None:
    book = CodebookBuilder.create("rq-kmeans", levels=2, codebook_size=4, max_group_size=16).fit(random_vectors(30, 3))
    path = book.save(tmp_path / "sid.json")
    text = path.read_text()
    with pytest.raises(CodebookError, match="covers 30 items but the catalogue has 31"):
        Codebook.load(path, num_items=31)
    cases = {
        "truncated.json": (text[: len(text) // 2], "invalid JSON"),
        "other.json": (json.dumps({"dims": {}}), "not a codebook file"),
        "rows.json": (text.replace('"num_items": 30', '"num_items": 29'), "num_items is 29 but the file has 30 code"),
        "range.json": (text.replace('"level_sizes": [\n    4,', '"level_sizes": [\n    1,'), "outside"),
        "newer.json": (text.replace('"format_version": 1', '"format_version": 9'), "format version 9"),
    }
    for name, (content, message) in cases.items():
        bad = tmp_path / name
        bad.write_text(content)
        with pytest.raises(CodebookError, match=message) as err:
            Codebook.load(bad)
        assert name in str(err.value)
    dup = json.loads(text)
    dup["codes"][1] = dup["codes"][0]
    (tmp_path / "dup.json").write_text(json.dumps(dup))
    with pytest.raises(CodebookError, match="dup.json: marked disambiguated but 1 items share"):
        Codebook.load(tmp_path / "dup.json")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        Codebook.load(tmp_path / "missing.json")


# -- reports -----------------------------------------------------------------------------------


def test_summary_plot_and_csv() -> None:
    book = CodebookBuilder.create("rq-vae", levels=2, codebook_size=4, epochs=2, max_group_size=32, **SMALL_VAE).fit(
        random_vectors(40, 4)
    )
    text = book.summary()
    assert "rq-vae: 40 items" in text and "collisions before disambiguation" in text and "reconstruction_loss" in text
    fig = book.plot()
    assert len(fig.axes) == 3 + 3  # one usage panel per level, then loss / usage / perplexity curves
    csv = book.codes_csv(["<pad>"] + [f"item,{i}" for i in range(1, 41)])
    lines = csv.splitlines()
    assert lines[0] == "item,label,level_0,level_1,level_2" and len(lines) == 41
    assert lines[1].startswith('1,"item,1",') and lines[1].split(",")[-3:] == [str(c) for c in book.codes[1]]


def test_to_mlflow_logs_table_stats_and_plot(tmp_cwd: Path) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import RunTracker

    book = CodebookBuilder.create("rq-vae", levels=2, codebook_size=4, epochs=2, max_group_size=32, **SMALL_VAE).fit(
        random_vectors(40, 4)
    )
    tracker = RunTracker("toy", "sid-toy")
    book.to_mlflow(tracker)
    tracker.finish()
    client = MlflowClient(tracker.uri)
    names = {a.path for a in client.list_artifacts(tracker.run_id, "sid")}
    assert names == {"sid/codebook.json", "sid/codes.csv", "sid/stats.json", "sid/summary.txt", "sid/usage.png"}
    metrics = client.get_run(tracker.run_id).data.metrics
    assert metrics["sid.collision_rate_before"] == pytest.approx(book.stats["collision_rate_before"])
    assert metrics["sid.usage.level_0"] == pytest.approx(book.stats["usage"][0])
    history = client.get_metric_history(tracker.run_id, "sid.train.perplexity.level_1")
    assert [m.step for m in history] == [1, 2]
    local = client.download_artifacts(tracker.run_id, "sid/codebook.json", str(tmp_cwd))
    assert Codebook.load(local) == book
