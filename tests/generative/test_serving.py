"""TorchScript export of SIDRecommender.recommend: files, parity with eager decoding (in this
process and in a fresh one), edge-case histories, errors.

Tolerance: items must be identical; scores are float32 sums of L log-probs computed by the same
kernels, so they agree to ~1e-6 (PARITY_ATOL = 1e-5).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from generative.model import SIDRecommender, TorchRecTokenEmbedding
from generative.serving import (
    EXPORT_FORMAT,
    PARITY_ATOL,
    ExportError,
    check_parity_in_fresh_process,
    check_recommender_parity,
    export_recommender,
    load_recommender,
    parity_histories,
    read_metadata,
)

NUM_ITEMS, SIZES, K = 60, [5, 4, 4], 7


def make_model(seed: int = 0, history_tokens: str = "token") -> SIDRecommender:
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in SIZES], indexing="ij"), -1).reshape(-1, len(SIZES))
    codes = np.concatenate([np.full((1, 3), -1), grid[rng.choice(len(grid), NUM_ITEMS, replace=False)]])
    torch.manual_seed(seed)
    model = SIDRecommender(
        codes, SIZES, d_model=32, heads=4, encoder_layers=1, decoder_layers=2, ff_dim=64, max_history=8, beam_size=12,
        history_tokens=history_tokens,
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # a few steps: not a random-init model
    for _ in range(5):
        history = torch.randint(0, NUM_ITEMS + 1, (32, 8))
        loss, _ = model.training_loss(history, torch.randint(1, NUM_ITEMS + 1, (32,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def model() -> SIDRecommender:
    return make_model()


@pytest.fixture(scope="module")
def export_dir(model: SIDRecommender, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_recommender(model, tmp_path_factory.mktemp("sid") / "export", k=K, metadata={"run": "r1"})


def test_export_files_and_metadata(model: SIDRecommender, export_dir: Path) -> None:
    assert {p.name for p in export_dir.iterdir()} == {"model.pt", "metadata.json", "codes.npy", "loader.py"}
    meta = read_metadata(export_dir)
    assert meta["format"] == EXPORT_FORMAT and meta["k"] == K and meta["beam_size"] == 12
    assert meta["num_items"] == NUM_ITEMS and meta["num_levels"] == 3 and meta["level_sizes"] == SIZES
    assert meta["max_history"] == 8 and meta["embedding"] == "plain" and meta["trained_embedding"] == "torchrec"
    assert meta["metadata"] == {"run": "r1"} and meta["parity_max_abs_score_diff"] <= PARITY_ATOL
    assert np.array_equal(np.load(export_dir / "codes.npy"), model.codes.numpy())
    files = {"metadata.json": ""}
    torch.jit.load(str(export_dir / "model.pt"), _extra_files=files)
    assert json.loads(files["metadata.json"])["k"] == K
    # the model itself is untouched: still on TorchRec, still in training mode
    assert isinstance(model.transformer.tokens, TorchRecTokenEmbedding) and model.training


def test_loaded_module_matches_eager_on_edge_cases(model: SIDRecommender, export_dir: Path) -> None:
    served = load_recommender(export_dir / "model.pt")
    model.eval()
    try:
        for history in parity_histories(NUM_ITEMS, 8, seed=5) + [torch.randint(-5, 80, (3, 20))]:
            items, scores = served(history)
            ref_items, ref_scores = model.recommend(history, K)
            assert items.shape == (history.size(0), K) and items.dtype == torch.int64
            assert torch.equal(items, ref_items)
            torch.testing.assert_close(scores, ref_scores, rtol=0, atol=PARITY_ATOL)
            assert ((items >= 1) & (items <= NUM_ITEMS)).all()
        all_pad = served(torch.zeros(2, 8, dtype=torch.int64))
        assert torch.isfinite(all_pad[1]).all()
        assert torch.equal(served(torch.tensor([[0, 0, 61, -2, 4]]))[0], served(torch.tensor([[4]]))[0])
        assert check_recommender_parity(model, served, parity_histories(NUM_ITEMS, 8, seed=6), K) <= PARITY_ATOL
    finally:
        model.train()
    with pytest.raises(Exception, match=r"\[B, T\]"):
        served(torch.tensor([1, 2, 3]))


def test_fresh_process_parity(model: SIDRecommender, export_dir: Path) -> None:
    history = parity_histories(NUM_ITEMS, 8, seed=7)[0]
    model.eval()
    try:
        items, scores = model.recommend(history, K)
    finally:
        model.train()
    assert check_parity_in_fresh_process(export_dir, history, items, scores) <= PARITY_ATOL
    with pytest.raises(ExportError, match="items"):
        check_parity_in_fresh_process(export_dir, history, items.flip(1), scores)


def test_export_keeping_torchrec_embedding(model: SIDRecommender, tmp_path: Path) -> None:
    path = export_recommender(model, tmp_path / "tr", k=3, beam_size=4, plain_embedding=False)
    meta = read_metadata(path)
    assert meta["embedding"] == "torchrec" and meta["beam_size"] == 4
    served = load_recommender(path)
    history = torch.randint(0, NUM_ITEMS + 1, (5, 6))
    model.eval()
    try:
        ref_items, ref_scores = model.recommend(history, 3, beam_size=4)
    finally:
        model.train()
    items, scores = served(history)
    assert torch.equal(items, ref_items)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=PARITY_ATOL)


def test_parity_check_catches_a_different_model(model: SIDRecommender, export_dir: Path) -> None:
    other = make_model(seed=1)
    with pytest.raises(ExportError):
        check_recommender_parity(other, load_recommender(export_dir), parity_histories(NUM_ITEMS, 8), K)


def test_export_errors(model: SIDRecommender, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="larger than the catalogue"):
        export_recommender(model, tmp_path / "a", k=NUM_ITEMS + 1)
    with pytest.raises(ValueError, match="k=0"):
        export_recommender(model, tmp_path / "a", k=0)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        export_recommender(model, tmp_path / "busy", k=2, check=False)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "keep me"
    with pytest.raises(FileNotFoundError):
        load_recommender(tmp_path / "busy")
    first = export_recommender(model, tmp_path / "again", k=2, check=False)
    assert export_recommender(model, first, k=5, check=False) == first  # a previous export is replaced
    assert read_metadata(first)["k"] == 5


def test_item_history_model_exports_with_parity(tmp_path: Path) -> None:
    """One encoder position per history item (the CPU-budget layout) scripts and matches eager."""
    item_model = make_model(seed=1, history_tokens="item")
    out = export_recommender(item_model, tmp_path / "export", k=K)  # checks parity on edge cases itself
    served = load_recommender(out)
    assert check_recommender_parity(item_model, served, parity_histories(NUM_ITEMS, 8), K) <= PARITY_ATOL
