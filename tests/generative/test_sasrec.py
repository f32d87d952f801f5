"""SASRec baseline (:mod:`generative.sasrec`).

* forward against a plain-PyTorch reference (explicit pre-norm blocks, causal attention over the
  real items only, right-aligned positions, tied output), which also pins the padding semantics;
* padding: prepending pads changes nothing, all-padding rows give finite logits, loss and grads;
  long histories are cut to the last ``max_history`` items;
* loss = ``F.cross_entropy`` over items 1..N; recommend = top-k of log-softmax, never padding;
* TorchScript parity; bad input; a planted next-item rule (the target is a function of the
  *previous* item, so attention must work) learnt to Recall@1 near 1 in a few hundred steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from generative.ranking_metrics import evaluate_model
from generative.sasrec import SASRec

N, T = 30, 8


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread avoids barrier waits on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_model(seed: int = 0, **kwargs: object) -> SASRec:
    torch.manual_seed(seed)
    defaults: dict = {"num_items": N, "dim": 16, "layers": 2, "heads": 2, "max_history": T, "dropout": 0.1}
    defaults.update(kwargs)
    return SASRec(**defaults).eval()


def random_histories(n: int, seed: int = 0, min_len: int = 0) -> Tensor:
    """``[n, T]`` left-padded histories with lengths ``min_len..T``."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, T + 1, (n,), generator=g)
    h = torch.randint(1, N + 1, (n, T), generator=g)
    h[torch.arange(T).unsqueeze(0) < (T - lens).unsqueeze(1)] = 0
    return h


def reference_logits(m: SASRec, items: list[int]) -> Tensor:
    """Logits ``[N + 1]`` for one history given as its real items (oldest first), step by step."""
    table = m.item_embedding.weight
    length = len(items)
    pos = torch.arange(m.max_history - length, m.max_history)
    x = table[torch.tensor(items)] * math.sqrt(m.dim) + m.position_embedding.weight[pos]
    heads, dh = m.heads, m.dim // m.heads
    causal = torch.triu(torch.full((length, length), float("-inf")), diagonal=1)
    for blk in m.blocks:
        y = blk.norm1(x)
        q, k, v = (y @ blk.self_attn.in_proj_weight.t() + blk.self_attn.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(length, heads, dh).transpose(0, 1) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(dh) + causal, dim=-1)
        out = (att @ v).transpose(0, 1).reshape(length, m.dim)
        x = x + blk.self_attn.out_proj(out)
        x = x + blk.linear2(torch.relu(blk.linear1(blk.norm2(x))))
    logits = m.final_norm(x[-1]) @ table.t()
    logits[0] = float("-inf")
    return logits


def test_forward_matches_reference() -> None:
    m = make_model()
    history = random_histories(12, min_len=1)
    with torch.no_grad():
        got = m(history)  # eval + no_grad: the fused fast path of TransformerEncoderLayer
        for row, h in zip(got, history):
            ref = reference_logits(m, [int(i) for i in h if i > 0])
            assert torch.isneginf(row[0])
            torch.testing.assert_close(row[1:], ref[1:], rtol=1e-4, atol=1e-4)
    # the autograd path agrees with the fast path
    torch.testing.assert_close(m(history)[:, 1:], got[:, 1:], rtol=1e-5, atol=1e-5)


def test_shapes_and_padding_invariance() -> None:
    m = make_model()
    history = random_histories(16)
    history[0] = 0  # an all-padding row
    logits = m(history)
    assert logits.shape == (16, N + 1)
    assert torch.isfinite(logits[:, 1:]).all() and torch.isneginf(logits[:, 0]).all()
    shorter = history[:, 3:]
    keep = (history[:, :3] == 0).all(dim=1)  # rows whose dropped columns were pads
    torch.testing.assert_close(m(shorter)[keep], logits[keep])
    # the model reads at most max_history items: a longer history is cut to its last T items
    longer = torch.cat([torch.randint(1, N + 1, (16, 5)), history], dim=1)
    torch.testing.assert_close(m(longer), logits)


def test_all_padding_rows_train_without_nan() -> None:
    m = make_model().train()
    history = torch.zeros(4, T, dtype=torch.long)
    history[1, -1] = 3
    loss, logs = m.training_loss(history, torch.tensor([1, 2, 3, 4]))
    loss.backward()
    assert math.isfinite(logs["loss"])
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    assert m.item_embedding.weight.grad[0].abs().sum() == 0  # padding row never learns


def test_loss_is_full_softmax_cross_entropy() -> None:
    m = make_model(dropout=0.0).train()
    history, target = random_histories(10, seed=1), torch.randint(1, N + 1, (10,))
    loss, logs = m.training_loss(history, target)
    logits = m(history)
    torch.testing.assert_close(loss, F.cross_entropy(logits[:, 1:], target - 1))
    manual = -torch.log_softmax(logits, dim=-1).gather(1, target[:, None]).mean()  # -inf column drops out
    torch.testing.assert_close(loss, manual)
    assert logs["loss"] == pytest.approx(loss.item())


def test_recommend_top_k() -> None:
    m = make_model()
    history = random_histories(6, seed=2)
    items, scores = m.recommend(history, 5)
    assert items.shape == scores.shape == (6, 5) and items.dtype == torch.long
    logp = torch.log_softmax(m(history), dim=-1)
    expect_scores, expect_items = logp[:, 1:].topk(5)
    torch.testing.assert_close(scores, expect_scores)
    assert torch.equal(items, expect_items + 1)
    full, _ = m.recommend(history, N)  # every item once, padding never
    assert torch.equal(full.sort(dim=1).values, torch.arange(1, N + 1).expand(6, N))
    assert not scores.requires_grad


def test_recommend_exclude_history() -> None:
    m = make_model()
    history = random_histories(6, seed=3, min_len=3)
    items, scores = m.recommend(history, N, exclude_history=True)
    for row_items, row_scores, h in zip(items, scores, history):
        seen = {int(i) for i in h if i > 0}
        kept = row_items[: N - len(seen)].tolist()
        assert not seen & set(kept)  # unseen items come first
        assert torch.isneginf(row_scores[N - len(seen) :]).all()
    default, _ = m.recommend(history, 3)
    assert torch.equal(default, m(history)[:, 1:].topk(3).indices + 1)


def test_torchscript_parity() -> None:
    m = make_model()
    scripted = torch.jit.script(m)
    history = random_histories(8, seed=4)
    torch.testing.assert_close(scripted(history)[:, 1:], m(history)[:, 1:])
    for exclude in (False, True):
        eager, scripted_out = m.recommend(history, 4, exclude), scripted.recommend(history, 4, exclude)
        assert torch.equal(eager[0], scripted_out[0])
        torch.testing.assert_close(eager[1], scripted_out[1])


def test_bad_input() -> None:
    m = make_model()
    history = random_histories(3)
    with pytest.raises(ValueError, match=r"k must be in 1..num_items \(30\)"):
        m.recommend(history, N + 1)
    with pytest.raises(ValueError, match="k must be"):
        m.recommend(history, 0)
    with pytest.raises(ValueError, match=r"outside 0..30"):
        m(torch.tensor([[0, 31]]))
    with pytest.raises(ValueError, match=r"outside 0..30"):
        m(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="int64"):
        m(history.float())
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        m(history[0])
    with pytest.raises(ValueError, match="padding 0 is not a valid target"):
        m.training_loss(history, torch.tensor([1, 0, 2]))
    with pytest.raises(ValueError, match="outside 1..30"):
        m.training_loss(history, torch.tensor([1, 31, 2]))
    with pytest.raises(ValueError, match="target must be"):
        m.training_loss(history, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="empty catalogue"):
        SASRec(0)
    with pytest.raises(ValueError, match="multiple of heads"):
        SASRec(10, dim=10, heads=3)


def test_learns_planted_rule() -> None:
    """target = (previous item mod N) + 1: needs attention to the second-to-last position."""
    m = make_model(dim=32, layers=1, dropout=0.1).train()
    opt = torch.optim.Adam(m.parameters(), lr=5e-3)

    def rule(h: Tensor) -> Tensor:
        return h[:, -2] % N + 1

    for step in range(300):
        history = random_histories(128, seed=100 + step, min_len=2)
        loss, _ = m.training_loss(history, rule(history))
        opt.zero_grad()
        loss.backward()
        opt.step()
    test = random_histories(1000, seed=7, min_len=2)
    metrics = evaluate_model(m, test, rule(test), ks=(1, 5))
    assert metrics["recall@1"] > 0.95
    assert m.training  # recommend_batched restores the mode
