"""Prefix trie (golden tables, errors, memory) and trie-constrained beam search against brute force."""

from __future__ import annotations

import warnings
from typing import Tuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from generative.decoding import ConstrainedBeamSearch, PrefixTrie, check_codes

# items 1..5 over level_sizes [2, 3, 2]
GOLDEN_CODES = np.array([[-1, -1, -1], [0, 0, 0], [0, 0, 1], [0, 2, 0], [1, 1, 1], [1, 2, 0]])
GOLDEN_SIZES = [2, 3, 2]


def random_codes(rng: np.random.Generator, num_items: int, sizes: list[int]) -> np.ndarray:
    """Unique random code tuples, row 0 = -1."""
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij"), -1).reshape(-1, len(sizes))
    rows = grid[rng.choice(len(grid), num_items, replace=False)]
    return np.concatenate([np.full((1, len(sizes)), -1), rows]).astype(np.int64)


class HashScorer(nn.Module):
    """A scriptable stand-in model: log-probs depend on the user (history) and on the whole prefix.

    ``memory = table_user[history].sum(1)`` ``[B, V]``; the level-``l`` logits of a beam are
    ``memory + table_prefix[l, hash(prefix)]``, so beams with different prefixes differ.
    """

    def __init__(self, num_items: int, sizes: list[int], seed: int = 0, scale: float = 3.0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        width = max(sizes)
        self.level_sizes = sizes
        self.register_buffer("user", torch.randn(num_items + 1, width, generator=gen) * scale)
        self.register_buffer("prefix", torch.randn(len(sizes), 97, width, generator=gen) * scale)

    def encode(self, history: Tensor) -> Tuple[Tensor, Tensor]:
        memory = self.user[history.clamp(0, self.user.size(0) - 1)].sum(1)  # [B, V]
        return memory, torch.zeros(history.size(0), 1, dtype=torch.bool)

    def next_log_probs(self, memory: Tensor, memory_pad_mask: Tensor, codes: Tensor, level: int) -> Tensor:
        size = self.level_sizes[level]
        key = torch.zeros(codes.size(0), codes.size(1), dtype=torch.int64)
        for j in range(codes.size(2)):
            key = (key * 31 + codes[:, :, j] + 1) % 97
        logits = memory[:, :size].unsqueeze(1) + self.prefix[level, :, :size][key]
        return torch.log_softmax(logits, dim=-1)


def brute_force(scorer: HashScorer, codes: np.ndarray, history: Tensor) -> Tensor:
    """Score ``[B, N]`` of every item: the sum of its codes' log-probs (items as beams)."""
    items = torch.from_numpy(codes[1:])  # [N, L]
    memory, mask = scorer.encode(history)
    batch, (n, num_levels) = history.size(0), items.shape
    total = torch.zeros(batch, n)
    for level in range(num_levels):
        prefix = items[:, :level].unsqueeze(0).expand(batch, n, level)
        log_probs = scorer.next_log_probs(memory, mask, prefix, level)  # [B, N, V]
        total += log_probs.gather(2, items[:, level].reshape(1, n, 1).expand(batch, n, 1)).squeeze(-1)
    return total


# -- trie ----------------------------------------------------------------------------------------
def test_trie_golden_tables() -> None:
    trie = PrefixTrie(GOLDEN_CODES, GOLDEN_SIZES)
    assert trie.num_nodes == [1, 2, 4] and trie.offsets == [0, 2, 8] and trie.num_items == 5
    # level 0: root -> (0,)=0, (1,)=1; level 1: (0,0)=0 (0,2)=1 (1,1)=2 (1,2)=3; level 2: items
    expected = [0, 1] + [0, -1, 1, -1, 2, 3] + [1, 2, 3, -1, -1, 4, 5, -1]
    assert trie.table.tolist() == expected
    assert trie.table.dtype == torch.int32
    assert trie.child_nodes(1, torch.tensor([[0], [1]])).tolist() == [[[0, -1, 1]], [[-1, 2, 3]]]
    assert trie.child_nodes(2, torch.tensor([2, 3])).tolist() == [[-1, 4], [5, -1]]
    for item in range(1, 6):
        assert trie.item_of(tuple(GOLDEN_CODES[item])) == item
    assert trie.item_of((0, 1, 0)) == 0 and trie.item_of((0, 0)) == 0 and trie.item_of((5, 0, 0)) == 0
    assert trie.next_codes(()) == [0, 1]
    assert trie.next_codes((0,)) == [0, 2] and trie.next_codes((1, 2)) == [0] and trie.next_codes((0, 1)) == []


def test_trie_memory_scales_with_nodes_not_product() -> None:
    sizes = [256, 256, 256]
    codes = random_codes(np.random.default_rng(0), 50, sizes)
    trie = PrefixTrie(codes, sizes)
    assert trie.table.numel() == sum(n * s for n, s in zip(trie.num_nodes, sizes, strict=True))
    assert trie.table.numel() <= (1 + 2 * 50) * 256  # << 256 ** 3
    for item in range(1, 51):
        assert trie.item_of(tuple(codes[item])) == item


def test_trie_errors() -> None:
    dup = GOLDEN_CODES.copy()
    dup[4] = dup[2]
    with pytest.raises(ValueError, match=r"ambiguous codes.*items \[2, 4\] share \(0, 0, 1\)"):
        PrefixTrie(dup, GOLDEN_SIZES)
    bad = GOLDEN_CODES.copy()
    bad[3, 1] = 3
    with pytest.raises(ValueError, match=r"codes\[3, 1\] = 3 is outside \[0, 3\)"):
        PrefixTrie(bad, GOLDEN_SIZES)
    with pytest.raises(ValueError, match="row 0"):
        PrefixTrie(GOLDEN_CODES[1:], GOLDEN_SIZES)
    with pytest.raises(ValueError, match="level_sizes has 2 levels"):
        check_codes(GOLDEN_CODES, [2, 3])
    with pytest.raises(ValueError, match="empty catalogue"):
        check_codes(GOLDEN_CODES[:1], GOLDEN_SIZES)
    with pytest.raises(ValueError, match="integers"):
        check_codes(GOLDEN_CODES.astype(float), GOLDEN_SIZES)


# -- beam search -----------------------------------------------------------------------------------
def test_beam_search_golden_catalogue_exact() -> None:
    """Beam >= N is exhaustive: the result is the brute-force ranking of all 5 items."""
    scorer = HashScorer(5, GOLDEN_SIZES)
    search = ConstrainedBeamSearch(scorer, PrefixTrie(GOLDEN_CODES, GOLDEN_SIZES))
    history = torch.tensor([[0, 1, 2], [0, 0, 0], [5, 4, 3]])
    items, scores = search(history, 5, 5)
    reference = brute_force(scorer, GOLDEN_CODES, history)
    ref_scores, ref_items = reference.sort(dim=1, descending=True)
    assert torch.equal(items, ref_items + 1)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=1e-5)


def test_beam_search_never_follows_an_invalid_argmax() -> None:
    """The unconstrained best path (0, 1, 0) is no item; only catalogue items come out."""
    scorer = HashScorer(5, GOLDEN_SIZES, scale=0.0)
    with torch.no_grad():
        scorer.prefix[1, :, 1] = 50.0  # level 1 strongly prefers code 1, which exists only under (1,)
        scorer.prefix[0, :, 0] = 50.0  # level 0 strongly prefers code 0
    search = ConstrainedBeamSearch(scorer, PrefixTrie(GOLDEN_CODES, GOLDEN_SIZES))
    items, scores = search(torch.tensor([[1]]), 2, 1)  # beam raised to k = 2
    assert set(items[0].tolist()) <= {1, 2, 3, 4, 5} and len(set(items[0].tolist())) == 2
    assert torch.isfinite(scores).all()
    items, _ = search(torch.tensor([[1]]), 1, 1)  # greedy: (0, ·) then the best valid child
    assert items.tolist()[0][0] in (1, 2, 3)


def test_beam_search_scripts_and_matches_eager() -> None:
    rng = np.random.default_rng(3)
    sizes = [4, 3, 5]
    codes = random_codes(rng, 30, sizes)
    search = ConstrainedBeamSearch(HashScorer(30, sizes, seed=3), PrefixTrie(codes, sizes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(search)
    history = torch.from_numpy(rng.integers(0, 31, (7, 4)))
    for k, beam in [(1, 1), (5, 8), (30, 30), (3, 100)]:
        items, scores = search(history, k, beam)
        got_items, got_scores = scripted(history, k, beam)
        assert items.shape == (7, k) and torch.equal(items, got_items)
        torch.testing.assert_close(scores, got_scores, rtol=0, atol=1e-6)
    empty_items, empty_scores = scripted(history[:0], 3, 5)
    assert empty_items.shape == (0, 3) and empty_scores.shape == (0, 3)


def test_k_is_clamped_inside_the_search() -> None:
    search = ConstrainedBeamSearch(HashScorer(5, GOLDEN_SIZES), PrefixTrie(GOLDEN_CODES, GOLDEN_SIZES))
    items, _ = search(torch.tensor([[1, 2]]), 50, 2)  # Python callers get ValueError from the model
    assert sorted(items[0].tolist()) == [1, 2, 3, 4, 5]


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    fill=st.floats(0.05, 1.0),
    batch=st.integers(1, 5),
    beam=st.integers(1, 12),
    k_frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
)
def test_beam_search_validity_property(
    sizes: list[int], fill: float, batch: int, beam: int, k_frac: float, seed: int
) -> None:
    """Every returned item is a catalogue item, distinct per row, scored by its true log-likelihood;
    with beam >= N the search is exact."""
    rng = np.random.default_rng(seed)
    total = int(np.prod(sizes))
    n = max(1, int(round(fill * total)))
    codes = random_codes(rng, n, sizes)
    k = 1 + int(k_frac * (n - 1))
    scorer = HashScorer(n, sizes, seed=seed)
    search = ConstrainedBeamSearch(scorer, PrefixTrie(codes, sizes))
    history = torch.from_numpy(rng.integers(-2, n + 3, (batch, int(rng.integers(1, 6)))))
    items, scores = search(history, k, beam)
    assert items.shape == (batch, k) and scores.shape == (batch, k)
    assert ((items >= 1) & (items <= n)).all()
    for row in items.tolist():
        assert len(set(row)) == k
    assert torch.isfinite(scores).all() and (scores[:, :-1] >= scores[:, 1:]).all()
    reference = brute_force(scorer, codes, history)  # [B, N]
    torch.testing.assert_close(scores, reference.gather(1, items - 1), rtol=0, atol=1e-5)
    if max(beam, k) >= n:
        torch.testing.assert_close(scores, reference.sort(dim=1, descending=True).values[:, :k], rtol=0, atol=1e-5)
