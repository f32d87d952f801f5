"""SIDTransformer / SIDRecommender: shapes, padding rules, errors, learning a planted rule, validity."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from generative.model import MASKED_LOGIT, PlainTokenEmbedding, SIDRecommender, TorchRecTokenEmbedding

SMALL = {"d_model": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ff_dim": 64}


def random_codes(rng: np.random.Generator, num_items: int, sizes: list[int]) -> np.ndarray:
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij"), -1).reshape(-1, len(sizes))
    rows = grid[rng.choice(len(grid), num_items, replace=False)]
    return np.concatenate([np.full((1, len(sizes)), -1), rows]).astype(np.int64)


def small_model(
    num_items: int = 40, sizes: list[int] | None = None, seed: int = 0, **kwargs: object
) -> SIDRecommender:
    sizes = sizes or [4, 4, 3]
    torch.manual_seed(seed)
    args = {**SMALL, "max_history": 6, **kwargs}
    return SIDRecommender(random_codes(np.random.default_rng(seed), num_items, sizes), sizes, **args)


def test_shapes_masks_and_logs() -> None:
    model = small_model(sizes=[5, 3, 4])
    history = torch.randint(0, 41, (6, 5))
    target = torch.randint(1, 41, (6,))
    logits = model.transformer(history, model.codes[target])
    assert logits.shape == (6, 3, 5) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert (logits[:, 1, 3:] == MASKED_LOGIT).all() and (logits[:, 2, 4:] == MASKED_LOGIT).all()
    assert (logits[:, 0] > MASKED_LOGIT).all()
    loss, logs = model.training_loss(history, target)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert set(logs) == {"loss", "acc_l0", "acc_l1", "acc_l2", "acc_item"}
    model.eval()
    items, scores = model.recommend(history, 7)
    assert items.shape == (6, 7) and items.dtype == torch.int64 and scores.shape == (6, 7)
    assert model.trie.num_items == 40 and model.codes.shape == (41, 3)


def test_all_padding_history_has_no_nan() -> None:
    model = small_model().eval()
    history = torch.zeros(3, 6, dtype=torch.int64)
    loss, _ = model.training_loss(history, torch.tensor([1, 2, 3]))
    assert torch.isfinite(loss)
    items, scores = model.recommend(history, 5)
    assert torch.isfinite(scores).all() and ((items >= 1) & (items <= 40)).all()
    assert torch.equal(items[0], items[1])  # nothing to tell the rows apart


def test_unknown_ids_padding_and_truncation_rules() -> None:
    """Unknown ids read as padding; extra left padding changes nothing; only the last
    ``max_history`` items are read."""
    model = small_model().eval()
    known = torch.tensor([[0, 0, 3, 9, 17, 4], [5, 6, 7, 8, 9, 10]])
    ref_items, ref_scores = model.recommend(known, 5)
    unknown = known.clone()
    unknown[0, :2] = torch.tensor([41, -3])
    items, scores = model.recommend(unknown, 5)
    assert torch.equal(items, ref_items) and torch.allclose(scores, ref_scores, atol=1e-6)
    wider = torch.cat([torch.zeros(2, 2, dtype=torch.int64), known[:, 2:]], dim=1)
    narrower = known[:, 2:]
    a, sa = model.recommend(wider, 5)
    b, sb = model.recommend(narrower, 5)
    assert torch.equal(a, b) and torch.allclose(sa, sb, atol=1e-5)
    longer = torch.cat([torch.tensor([[11, 12], [13, 14]]), known], dim=1)  # 8 > max_history 6
    c, sc = model.recommend(longer, 5)
    assert torch.equal(c, ref_items) and torch.allclose(sc, ref_scores, atol=1e-6)


def test_errors() -> None:
    model = small_model()
    history = torch.randint(0, 41, (2, 4))
    with pytest.raises(ValueError, match="larger than the catalogue"):
        model.recommend(history, 41)
    with pytest.raises(ValueError, match="k=0"):
        model.recommend(history, 0)
    with pytest.raises(ValueError, match="beam_size"):
        model.recommend(history, 3, beam_size=0)
    with pytest.raises(ValueError, match=r"target must be item indices in 1\.\.40"):
        model.training_loss(history, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        model.recommend(history[0], 3)
    with pytest.raises(ValueError, match="integer"):
        model.recommend(history.float(), 3)
    codes = model.codes.numpy().copy()
    codes[2] = codes[1]
    with pytest.raises(ValueError, match="ambiguous codes"):
        SIDRecommender(codes, [4, 4, 3], **SMALL)
    with pytest.raises(ValueError, match="multiple of heads"):
        SIDRecommender(model.codes, [4, 4, 3], d_model=30, heads=4)
    with pytest.raises(ValueError, match="embedding="):
        SIDRecommender(model.codes, [4, 4, 3], embedding="fused")


def test_log_likelihood_matches_beam_scores_and_training_logits() -> None:
    model = small_model(sizes=[3, 5, 4]).eval()
    history = torch.randint(0, 41, (4, 6))
    items, scores = model.recommend(history, 6)
    torch.testing.assert_close(model.log_likelihood(history, items), scores, rtol=0, atol=1e-5)
    # the same quantity from the training logits (teacher forcing through forward)
    logits = model.transformer(history, model.codes[items[:, 0]])
    labels = model.codes[items[:, 0]]
    direct = torch.log_softmax(logits, -1).gather(2, labels.unsqueeze(-1)).sum((1, 2))
    torch.testing.assert_close(direct, scores[:, 0], rtol=0, atol=1e-5)


def test_torchrec_embedding_equals_its_plain_copy_and_scripts() -> None:
    model = small_model().eval()
    assert isinstance(model.transformer.tokens, TorchRecTokenEmbedding)
    tokens = torch.tensor([[0, 0, 3, 7], [1, 2, 0, 5]])
    plain = model.transformer.tokens.to_plain()
    assert isinstance(plain, PlainTokenEmbedding)
    out = model.transformer.tokens(tokens)
    torch.testing.assert_close(out, plain(tokens), rtol=0, atol=0)
    assert (out[0, :2] == 0).all() and (out[1, 2] == 0).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(model.beam_search())  # TorchRec EC + KJT inside, scripted as is
    history = torch.randint(0, 41, (5, 6))
    items, scores = model.recommend(history, 4)
    got_items, got_scores = scripted(history, 4, model.beam_size)
    assert torch.equal(items, got_items)
    torch.testing.assert_close(got_scores, scores, rtol=0, atol=1e-5)


def test_custom_loss_module_receives_logits_and_code_labels() -> None:
    class Recording(nn.Module):
        def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
            self.shapes = (tuple(logits.shape), tuple(labels.shape))
            self.labels = labels.clone()
            return logits.logsumexp(-1).mean()

    loss_fn = Recording()
    model = small_model(loss=loss_fn)
    target = torch.tensor([3, 7])
    model.training_loss(torch.randint(0, 41, (2, 4)), target)
    assert loss_fn.shapes == ((2, 3, 4), (2, 3))
    assert torch.equal(loss_fn.labels, model.codes[target])
    assert "loss_fn" in dict(model.named_children())


def test_state_dict_round_trip() -> None:
    model = small_model(seed=1).eval()
    other = small_model(seed=1, num_items=40)
    torch.manual_seed(9)
    for p in other.parameters():
        nn.init.normal_(p)
    other.load_state_dict(model.state_dict())
    other.eval()
    history = torch.randint(0, 41, (4, 6))
    a, sa = model.recommend(history, 5)
    b, sb = other.recommend(history, 5)
    assert torch.equal(a, b) and torch.equal(sa, sb)
    assert "codes" in model.state_dict() and "trie.table" in model.state_dict()


@pytest.mark.parametrize("history_tokens", ["token", "item"])
def test_learns_planted_next_item_rule(history_tokens: str) -> None:
    """next item = perm(last item): after a few hundred steps the top-1 recommendation is right,
    with one encoder position per SID token (TIGER) or per history item."""
    num_items, sizes = 30, [4, 4, 3]
    model = small_model(
        num_items=num_items, sizes=sizes, seed=2, dropout=0.0, embedding="torchrec", history_tokens=history_tokens
    )
    perm = torch.from_numpy(np.random.default_rng(5).permutation(num_items) + 1)
    gen = torch.Generator().manual_seed(0)

    def batch(n: int) -> tuple[Tensor, Tensor]:
        history = torch.randint(1, num_items + 1, (n, 4), generator=gen)
        history[torch.rand(n, 4, generator=gen) < 0.2] = 0
        history[:, -1] = torch.randint(1, num_items + 1, (n,), generator=gen)
        return history, perm[history[:, -1] - 1]

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(250):
        history, target = batch(64)
        loss, logs = model.training_loss(history, target)
        first = logs["loss"] if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert logs["loss"] < 0.25 * first
    history, target = batch(200)
    items, _ = model.eval().recommend(history, 5)
    assert (items[:, 0] == target).float().mean() > 0.9


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    fill=st.floats(0.05, 1.0),
    beam=st.integers(1, 25),
    k_frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
)
def test_recommend_validity_property(sizes: list[int], fill: float, beam: int, k_frac: float, seed: int) -> None:
    """The real model over random codebooks, histories (with unknown ids) and beam sizes returns
    catalogue items only, distinct per row, sorted, with finite scores."""
    rng = np.random.default_rng(seed)
    n = max(1, int(round(fill * int(np.prod(sizes)))))
    k = 1 + int(k_frac * (n - 1))
    torch.manual_seed(seed)
    model = SIDRecommender(random_codes(rng, n, sizes), sizes, **SMALL, max_history=5, embedding="plain").eval()
    history = torch.from_numpy(rng.integers(-3, n + 4, (int(rng.integers(1, 6)), int(rng.integers(1, 8)))))
    history[0] = 0
    items, scores = model.recommend(history, k, beam)
    assert items.shape == (history.size(0), k)
    assert ((items >= 1) & (items <= n)).all()
    assert all(len(set(row)) == k for row in items.tolist())
    assert torch.isfinite(scores).all() and (scores[:, :-1] >= scores[:, 1:]).all()
