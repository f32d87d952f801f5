"""The catalogue's semantic IDs as a prefix trie of tensors, and trie-constrained beam search.

The trie holds one dense transition table per level. Level ``l`` has ``n_l`` nodes (the distinct
code prefixes of length ``l``; node 0 of level 0 is the root) and a table ``[n_l, level_sizes[l]]``
whose entry ``[node, code]`` is the node of the extended prefix at level ``l + 1``, or, at the
last level, the item index ``1..N``; ``-1`` marks a code that leads to no catalogue item::

    codes (items 1..3, L = 2, level_sizes [2, 3])    level 0 (root)      level 1
      item 1: (0, 2)                                  [[ 0,  1]]          [[-1, -1,  1],   node 0 = prefix (0,)
      item 2: (1, 0)                                                       [ 2,  3, -1]]   node 1 = prefix (1,)
      item 3: (1, 1)

The tables are concatenated into one flat buffer, so memory is ``Σ_l n_l · level_sizes[l]``
(``n_l <= N``), never ``Π level_sizes``. :class:`ConstrainedBeamSearch` walks the trie level
by level: invalid codes score ``-inf``, so every returned item is a catalogue item (§5.2).

Both modules are TorchScript-able (``torch.jit.script``); the beam search calls a *scorer*
submodule by duck typing (:class:`StepScorer`), which is how the generative model plugs in.
"""

from __future__ import annotations

from typing import List, Protocol, Tuple, cast

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["ConstrainedBeamSearch", "PrefixTrie", "StepScorer", "check_codes"]


def check_codes(codes: np.ndarray | Tensor, level_sizes: list[int] | tuple[int, ...]) -> np.ndarray:
    """``codes`` as int64 ``[N + 1, L]`` after checking it against the conventions of :mod:`generative.base`.

    Raises:
        ValueError: wrong shape, empty catalogue, row 0 not ``-1``, a code outside
            ``[0, level_sizes[l])``, or ``len(level_sizes) != L``.
    """
    arr = codes.detach().cpu().numpy() if isinstance(codes, Tensor) else np.asarray(codes)
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ValueError(f"codes must be [num_items + 1, L] with L >= 1, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"codes must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.shape[0] < 2:
        raise ValueError("empty catalogue: codes has no item rows (row 0 is padding, items are 1..N)")
    sizes = [int(s) for s in level_sizes]
    if len(sizes) != arr.shape[1]:
        raise ValueError(f"level_sizes has {len(sizes)} levels, codes has {arr.shape[1]} columns")
    if any(s < 1 for s in sizes):
        raise ValueError(f"level_sizes must be positive, got {sizes}")
    if not (arr[0] == -1).all():
        raise ValueError(f"codes row 0 (padding) must be -1, got {arr[0].tolist()}: is the padding row missing?")
    for level, size in enumerate(sizes):
        col = arr[1:, level]
        bad = np.flatnonzero((col < 0) | (col >= size))
        if len(bad):
            item = int(bad[0]) + 1
            raise ValueError(
                f"codes[{item}, {level}] = {int(col[bad[0]])} is outside [0, {size}) (level_sizes[{level}]); "
                f"{len(bad)} item(s) at this level are out of range"
            )
    return arr


class PrefixTrie(nn.Module):
    """All catalogue items' code tuples as per-level transition tables (one flat int32 buffer).

    Args:
        codes: int ``[N + 1, L]``, row 0 = -1, item ``i``'s code per level in row ``i``.
        level_sizes: codes per level, ``L`` entries.

    Raises:
        ValueError: bad ``codes`` (see :func:`check_codes`) or two items with the same tuple
            (ambiguous codes: disambiguate the codebook with an extra level first).

    Example::

        trie = PrefixTrie(np.array([[-1, -1], [0, 2], [1, 0], [1, 1]]), [2, 3])
        trie.child_nodes(1, torch.tensor([1]))  # tensor([[ 2,  3, -1]]): items 2 and 3 under prefix (1,)
    """

    def __init__(self, codes: np.ndarray | Tensor, level_sizes: list[int] | tuple[int, ...]) -> None:
        super().__init__()
        arr = check_codes(codes, level_sizes)
        items = arr[1:]
        n, num_levels = items.shape
        _check_unique(items)
        sizes = [int(s) for s in level_sizes]
        node = np.zeros(n, dtype=np.int64)  # each item's node at the current level (root: 0)
        num_nodes = 1
        tables: list[np.ndarray] = []
        counts: list[int] = []
        for level, size in enumerate(sizes):
            table = np.full((num_nodes, size), -1, dtype=np.int64)
            key = node * size + items[:, level]
            if level + 1 < num_levels:
                uniq, child = np.unique(key, return_inverse=True)
                table.reshape(-1)[uniq] = np.arange(len(uniq))
                node, next_nodes = child.reshape(-1), len(uniq)
            else:
                table.reshape(-1)[key] = np.arange(1, n + 1)  # leaves: item indices
                next_nodes = n
            tables.append(table)
            counts.append(num_nodes)
            num_nodes = next_nodes
        offsets = np.cumsum([0] + [t.size for t in tables])
        flat = np.concatenate([t.reshape(-1) for t in tables]).astype(np.int32)
        self.table: Tensor
        self.register_buffer("table", torch.from_numpy(flat))  # [Σ_l n_l · level_sizes[l]]
        self.level_sizes: List[int] = sizes  # codes per level
        self.offsets: List[int] = [int(o) for o in offsets[:-1]]  # start of level l's table in `table`
        self.num_nodes: List[int] = counts  # n_l: distinct prefixes of length l (n_0 = 1)
        self.num_levels: int = num_levels
        self.num_items: int = n

    def child_nodes(self, level: int, nodes: Tensor) -> Tensor:
        """Child of every code under ``nodes`` (level-``level`` node ids, any shape ``[...]``).

        Returns:
            int64 ``[..., level_sizes[level]]``: next-level node ids (item indices at the last
            level), ``-1`` where the code leads to no item.
        """
        size = self.level_sizes[level]
        index = self.offsets[level] + nodes.unsqueeze(-1) * size + torch.arange(size, device=nodes.device)
        return self.table[index].to(torch.int64)

    # -- Python helpers (not scripted) ---------------------------------------------------------
    def next_codes(self, prefix: tuple[int, ...] | list[int]) -> list[int]:
        """Valid codes after ``prefix`` (``[]`` when the prefix leads to no item)."""
        node = self._node(prefix)
        if node < 0 or len(prefix) >= self.num_levels:
            return []
        row = self.child_nodes(len(prefix), torch.tensor([node]))[0]
        return [int(c) for c in torch.nonzero(row >= 0).flatten()]

    def item_of(self, codes: tuple[int, ...] | list[int]) -> int:
        """The item whose code tuple is ``codes``; 0 when no item has it (or it is not L long)."""
        if len(codes) != self.num_levels:
            return 0
        node = self._node(list(codes)[:-1])
        last = int(codes[-1])
        if node < 0 or not 0 <= last < self.level_sizes[-1]:
            return 0
        return max(int(self.child_nodes(self.num_levels - 1, torch.tensor([node]))[0, last]), 0)

    def _node(self, prefix: tuple[int, ...] | list[int]) -> int:
        node = 0
        for level, code in enumerate(prefix[: self.num_levels - 1]):
            if not 0 <= int(code) < self.level_sizes[level]:
                return -1
            node = int(self.child_nodes(level, torch.tensor([node]))[0, int(code)])
            if node < 0:
                return -1
        return node

    def extra_repr(self) -> str:
        return f"num_items={self.num_items}, level_sizes={self.level_sizes}, num_nodes={self.num_nodes}"


def _check_unique(items: np.ndarray) -> None:
    """Raise ``ValueError`` naming the items when two rows of ``items`` ``[N, L]`` are equal."""
    _, inverse, counts = np.unique(items, axis=0, return_inverse=True, return_counts=True)
    if (counts > 1).any():
        inverse = inverse.reshape(-1)
        groups = [np.flatnonzero(inverse == g) + 1 for g in np.flatnonzero(counts > 1)[:5]]
        shown = "; ".join(f"items {g.tolist()} share {tuple(items[g[0] - 1].tolist())}" for g in groups)
        raise ValueError(
            f"ambiguous codes: {int((counts > 1).sum())} code tuple(s) are shared by several items ({shown}); "
            "disambiguate the codebook (extra last level) before building the trie"
        )


class StepScorer(Protocol):
    """What :class:`ConstrainedBeamSearch` needs from a model (duck-typed, so TorchScript compiles it).

    ``encode(history [B, T]) -> (memory [B, ...], memory_pad_mask [B, S] bool)``: read the
    history once per user (``memory`` is whatever per-user tensor the model reuses at every
    step, e.g. its cross-attention keys and values). ``next_log_probs(memory, memory_pad_mask,
    codes [B, W, l], level) -> [B, W, level_sizes[level]]``: log-probabilities of the
    level-``level`` code for each of the ``W`` beams of a row, after the ``l = level`` codes
    already chosen. Beams of a row share that row's memory (no per-beam copies).
    """

    def encode(self, history: Tensor) -> Tuple[Tensor, Tensor]: ...

    def next_log_probs(self, memory: Tensor, memory_pad_mask: Tensor, codes: Tensor, level: int) -> Tensor: ...


class ConstrainedBeamSearch(nn.Module):
    """Batched beam search over the trie: only catalogue items come out, best first.

    A beam's score is the sum of its codes' log-probabilities under the model (the model's own
    softmax over each level, not renormalised over the valid codes: the reference's HF
    ``prefix_allowed_tokens_fn`` masking, §5.2). Codes that leave the trie get ``-inf``; beams
    left with ``-inf`` are dropped (they sort last and never reach the top ``k``). With
    ``beam_size >= k`` and ``k <= N`` at least ``k`` beams survive every level, all distinct
    prefixes, so the ``k`` items of a row are distinct.

    Args:
        scorer: the model, see :class:`StepScorer`.
        trie: the catalogue's :class:`PrefixTrie`.

    Call:
        history (Tensor): ``[B, T]`` int64, passed to ``scorer.encode``.
        k (int): items per row; clamped to ``[1, N]`` (check it in Python for a clear error).
        beam_size (int): beams kept per row; raised to ``k`` when smaller.

    Returns:
        (items ``[B, k]`` int64 in ``1..N``, scores ``[B, k]`` float, descending).
    """

    def __init__(self, scorer: nn.Module, trie: PrefixTrie) -> None:
        super().__init__()
        self.scorer: StepScorer = cast(StepScorer, scorer)  # the module, seen through what the search calls
        self.trie = trie
        self.num_levels: int = trie.num_levels
        self.num_items: int = trie.num_items

    def forward(self, history: Tensor, k: int, beam_size: int) -> Tuple[Tensor, Tensor]:
        k = max(1, min(k, self.num_items))
        beam = max(beam_size, k)
        memory, pad_mask = self.scorer.encode(history)
        batch = history.size(0)
        device = memory.device
        scores = torch.zeros(batch, 1, dtype=torch.float32, device=device)  # [B, W] sum of log-probs
        nodes = torch.zeros(batch, 1, dtype=torch.int64, device=device)  # [B, W] trie node per beam
        codes = torch.zeros(batch, 1, 0, dtype=torch.int64, device=device)  # [B, W, level]
        for level in range(self.num_levels):
            log_probs = self.scorer.next_log_probs(memory, pad_mask, codes, level)  # [B, W, V]
            size = log_probs.size(-1)
            child = self.trie.child_nodes(level, nodes)  # [B, W, V]
            candidates = (scores.unsqueeze(-1) + log_probs).masked_fill(child < 0, float("-inf"))
            width = codes.size(1)
            width_next = min(beam, width * size)
            scores, flat = candidates.reshape(batch, width * size).topk(width_next, dim=1)  # sorted
            parent = torch.div(flat, size, rounding_mode="floor")
            nodes = child.reshape(batch, width * size).gather(1, flat)
            alive = scores > float("-inf")
            nodes = torch.where(alive, nodes, torch.zeros_like(nodes))  # dead beams park on node 0
            prefix = codes.gather(1, parent.unsqueeze(-1).expand(batch, width_next, level))
            codes = torch.cat([prefix, (flat % size).unsqueeze(-1)], dim=2)
        items = nodes[:, :k]
        scores = scores[:, :k]
        items = torch.where(scores > float("-inf"), items, torch.zeros_like(items))  # unreachable when k <= N
        return items, scores
