"""Grouped embedding lookup on torch ops: every table of one width in one weight, one lookup per
step, and the optimizer applied to the touched rows inside the backward (FBGEMM's TBE, without FBGEMM).

TorchRec's plain ``EmbeddingBagCollection`` holds one ``nn.EmbeddingBag`` per table and calls
each in turn: at 300 tables that is 300 lookups and 300 backward kernels per step, and the dense
optimizer then updates every row of every table (at F = 1,000, 42M parameters: Adam's update
over them was most of the plain kernel's step). FBGEMM's fused TBE runs one lookup and updates
only the rows the batch touched. Without FBGEMM (a GPU with only the CPU build of fbgemm-gpu),
:class:`GroupedEmbeddingBags` does the same on torch's own kernels: the tables of one width and
pooling are stacked row-wise into one weight, table ``i``'s id ``v`` reads row ``offset_i + v``,
and the whole group is one ``embedding_bag`` call::

    KJT (K keys, key-major values, lengths K x B)
      ──► ids + offset[key of each value]                     one add
      ──► per group g: embedding_bag(ids_g, W_g, bag offsets)  (m_g B) x D_g, one op
      ──► view m_g x B x D_g, unbind                           {key: B x D_g} (views, no copy)

    backward: the gradient of each looked-up row, summed per distinct row (unique + index_add),
    then the update of those rows only: SGD, Adagrad or row-wise Adagrad, FBGEMM's rules
    (w -= lr g / (sqrt(G) + eps), G the summed squares per element or per row's mean, eps 1e-8).

The weights get no ``.grad`` and are not in the dense optimizer (as with the fused kernel). The
state dict keeps TorchRec's per-table keys (``embedding_bags.t_<name>.weight``, views of the group
weight), so a grouped model's checkpoint loads into the plain or the fused kernel and back, and
:func:`recsys.export.to_plain_kernel` converts it for export like a fused one; the optimizer's
state travels through :meth:`GroupedEmbeddingBags.optimizer_state_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Dict, List, Literal, get_args

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

__all__ = ["GroupedEmbeddingBags", "TableOptimizer"]

#: the in-backward update of the looked-up rows: the values of :class:`~recsys.models.base.FusedOptimizer`
#: (a Literal for the config parser, kept equal to the Enum by tests/test_project.py)
TableOptimizer = Literal["sgd", "adagrad", "rowwise_adagrad"]
#: FBGEMM's default epsilon of its Adagrad updates
EPS = 1e-8


def _weight_key(table: str) -> str:
    return f"embedding_bags.{table}.weight"


class GroupedEmbeddingBags(nn.Module):
    """The tables of ``tables`` grouped by (width, pooling), one ``embedding_bag`` per group per step.

    Args:
        tables: one config per table, each with exactly one feature name (its KJT key).
        state: the tables' weights by TorchRec key (``embedding_bags.<table>.weight``, n_i x D_i);
            the grouped weights start as their concatenation (``None``: zeros, e.g. to load later).
        optimizer: the update of the looked-up rows inside the backward.
        lr: its learning rate.

    Call:
        kjt: KeyedJaggedTensor with the tables' keys in ``tables`` order (values int, lengths K*B).

    Returns:
        ``Dict[str, Tensor]``: key -> pooled embedding B x D_key.
    """

    def __init__(
        self, tables: Sequence[EmbeddingBagConfig], state: Mapping[str, torch.Tensor] | None = None,
        optimizer: TableOptimizer = "adagrad", lr: float = 0.05,
    ) -> None:
        super().__init__()
        if optimizer not in get_args(TableOptimizer):
            raise ValueError(f"grouped kernel: optimizer {optimizer!r} is not one of {list(get_args(TableOptimizer))}")
        self.optimizer = optimizer
        self.lr = float(lr)
        several = [t.name for t in tables if len(t.feature_names) != 1]
        if several:
            raise ValueError(f"grouped lookup needs one feature per table; tables {several} have several")
        self.keys: List[str] = [t.feature_names[0] for t in tables]  # noqa: UP006
        self.table_names: List[str] = [t.name for t in tables]  # noqa: UP006
        group_of: dict[tuple[int, PoolingType], int] = {}
        members: list[list[int]] = []
        group_of_key = []
        for i, t in enumerate(tables):
            g = group_of.setdefault((t.embedding_dim, t.pooling), len(group_of))
            if g == len(members):
                members.append([])
            members[g].append(i)
            group_of_key.append(g)
        #: group -> indices (into ``tables``) of its tables, in order
        self.members: List[List[int]] = members  # noqa: UP006
        self.modes: List[str] = [  # noqa: UP006
            "mean" if tables[m[0]].pooling == PoolingType.MEAN else "sum" for m in members
        ]
        offsets = [0] * len(tables)
        self.weights = nn.ParameterList()
        for m in members:
            rows = 0
            for i in m:
                offsets[i] = rows
                rows += tables[i].num_embeddings
            dim = tables[m[0]].embedding_dim
            if state is None:
                weight = torch.zeros(rows, dim)
            else:
                weight = torch.cat([state[_weight_key(self.table_names[i])].detach() for i in m]).clone()
            self.weights.append(nn.Parameter(weight))
            # the optimizer's accumulated squares (not in the state dict: the tables' keys stay TorchRec's)
            shape = (0,) if optimizer == "sgd" else (rows,) if optimizer == "rowwise_adagrad" else (rows, dim)
            self.register_buffer(f"accumulator_{len(self.weights) - 1}", torch.zeros(shape), persistent=False)
        #: K: the first row of each table in its group's weight
        self.row_offset: torch.Tensor
        self.register_buffer("row_offset", torch.tensor(offsets, dtype=torch.long), persistent=False)
        #: K: the group of each key
        self.group_of_key: torch.Tensor
        self.register_buffer("group_of_key", torch.tensor(group_of_key, dtype=torch.long), persistent=False)
        self._offsets = offsets
        self._rows = [t.num_embeddings for t in tables]
        self.register_state_dict_post_hook(_per_table_state)
        self.register_load_state_dict_pre_hook(_grouped_state)

    @property
    def num_groups(self) -> int:
        return len(self.members)

    def forward(self, kjt: KeyedJaggedTensor) -> Dict[str, torch.Tensor]:  # noqa: UP006
        if kjt.keys() != self.keys:
            raise ValueError(f"grouped lookup expects the keys {self.keys[:8]}... in table order, got {kjt.keys()[:8]}...")
        n_keys = len(self.keys)
        batch = kjt.stride()
        lengths = kjt.lengths().view(n_keys, batch)
        values = kjt.values()
        key_of_value = torch.repeat_interleave(
            torch.arange(n_keys, device=values.device), lengths.sum(1), output_size=values.numel()
        )
        ids = values.long() + self.row_offset[key_of_value]
        several = len(self.members) > 1
        group_of_value = self.group_of_key[key_of_value] if several else key_of_value
        out: Dict[str, torch.Tensor] = {}  # noqa: UP006
        for g, weight in enumerate(self.weights):
            member = self.members[g]
            if several:
                group_ids = ids[group_of_value == g]
                group_lengths = lengths[self.group_of_key == g]
            else:
                group_ids, group_lengths = ids, lengths
            bag_offsets = torch.zeros(len(member) * batch + 1, dtype=torch.long, device=values.device)
            torch.cumsum(group_lengths.reshape(-1), 0, out=bag_offsets[1:])
            pooled = _LookupAndUpdate.apply(weight, group_ids, bag_offsets, self.modes[g] == "mean", self, g)
            for i, p in zip(member, pooled.view(len(member), batch, -1).unbind(0), strict=True):
                out[self.keys[i]] = p
        return out

    def accumulator(self, group: int) -> torch.Tensor:
        out = getattr(self, f"accumulator_{group}")
        assert isinstance(out, torch.Tensor)
        return out

    @torch.no_grad()
    def update_rows(self, group: int, rows: torch.Tensor, grad: torch.Tensor) -> None:
        """Apply the optimizer to ``rows`` (distinct, R) of group ``group``'s weight, ``grad`` R x D."""
        weight = self.weights[group]
        if self.optimizer == "sgd":
            weight.index_add_(0, rows, grad, alpha=-self.lr)
            return
        acc = self.accumulator(group)
        if self.optimizer == "rowwise_adagrad":
            acc.index_add_(0, rows, grad.pow(2).mean(1))
            scale = (acc[rows].sqrt() + EPS).unsqueeze(1)
        else:
            acc.index_add_(0, rows, grad.pow(2))
            scale = acc[rows].sqrt() + EPS
        weight.index_add_(0, rows, grad / scale, alpha=-self.lr)

    def optimizer_state_dict(self) -> dict[str, Any]:
        """The in-backward optimizer's settings and accumulators (for checkpoints)."""
        return {"optimizer": self.optimizer, "lr": self.lr,
                "accumulators": [self.accumulator(g).detach().clone() for g in range(self.num_groups)]}

    def load_optimizer_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`optimizer_state_dict`'s accumulators (same optimizer and tables)."""
        if state.get("optimizer") != self.optimizer:
            raise ValueError(f"grouped kernel: the checkpoint's table optimizer is {state.get('optimizer')!r}, "
                             f"this model's {self.optimizer!r} (model.fused_optimizer)")
        saved = list(state["accumulators"])
        accumulators = [self.accumulator(g) for g in range(self.num_groups)]
        if len(saved) != len(accumulators) or any(tuple(v.shape) != tuple(a.shape) for v, a in zip(saved, accumulators)):
            raise ValueError("grouped kernel: the checkpoint's optimizer state is for other tables")
        for value, acc in zip(saved, accumulators, strict=True):
            acc.copy_(value)

    def table_weights(self) -> dict[str, torch.Tensor]:
        """Table name -> its rows of the group weight (n_i x D_i views, sharing memory)."""
        out = {}
        for g, member in enumerate(self.members):
            weight = self.weights[g]
            for i in member:
                out[self.table_names[i]] = weight[self._offsets[i]: self._offsets[i] + self._rows[i]]
        return out


class _LookupAndUpdate(torch.autograd.Function):
    """``embedding_bag`` forward; backward updates the looked-up rows in place (no weight gradient)."""

    @staticmethod
    def forward(
        ctx: Any, weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, mean: bool,
        owner: GroupedEmbeddingBags, group: int,
    ) -> torch.Tensor:
        ctx.save_for_backward(ids, offsets)
        ctx.mean, ctx.owner, ctx.group = mean, owner, group
        return nn.functional.embedding_bag(ids, weight, offsets, mode="mean" if mean else "sum", include_last_offset=True)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[None, ...]:
        ids, offsets = ctx.saved_tensors
        lengths = offsets[1:] - offsets[:-1]
        bag_of_id = torch.repeat_interleave(torch.arange(lengths.numel(), device=ids.device), lengths, output_size=ids.numel())
        per_id = grad_out[bag_of_id]
        if ctx.mean:
            per_id = per_id / lengths[bag_of_id].unsqueeze(1).to(per_id.dtype)
        rows, inverse = torch.unique(ids, return_inverse=True)
        grad = torch.zeros(rows.numel(), grad_out.size(1), dtype=grad_out.dtype, device=grad_out.device)
        grad.index_add_(0, inverse, per_id)
        ctx.owner.update_rows(ctx.group, rows, grad)
        return None, None, None, None, None, None


def _per_table_state(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """State-dict post hook: the group weights leave as TorchRec's per-table keys (views)."""
    assert isinstance(module, GroupedEmbeddingBags)
    for g in range(module.num_groups):
        state.pop(f"{prefix}weights.{g}", None)
    for name, rows in module.table_weights().items():
        state[prefix + _weight_key(name)] = rows.detach()


def _grouped_state(
    module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
    missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
) -> None:
    """Load-state-dict pre hook: TorchRec's per-table keys are stacked into the group weights."""
    assert isinstance(module, GroupedEmbeddingBags)
    for g, member in enumerate(module.members):
        keys = [prefix + _weight_key(module.table_names[i]) for i in member]
        if all(k in state for k in keys):
            state[f"{prefix}weights.{g}"] = torch.cat([state.pop(k) for k in keys])
