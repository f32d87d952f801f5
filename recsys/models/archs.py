"""DLRM, DCNv2 and DeepFM over the seam, with per-feature embedding dims.

Mixed dims: DCNv2 concatenates embeddings, so any dims work. DLRM's dot interaction and the
FM term need one common width: a feature whose dim differs from ``interaction_dim`` gets its
own bias-free linear projection to that width (identity when equal), applied after the seam.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

from recsys.data.schema import Schema
from recsys.models.base import MLP, RankingModel, SparseArchConfig
from recsys.models.seam import SeamTransform

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = ["CrossNetwork", "DCNv2", "DLRM", "DeepFM"]


def _projections(dims: list[int], names: list[str], width: int) -> nn.ModuleDict:
    """Per-feature bias-free projections to ``width``; identity where the dim already matches."""
    return nn.ModuleDict({n: (nn.Identity() if d == width else nn.Linear(d, width, bias=False)) for n, d in zip(names, dims)})


class _Projected(RankingModel):
    """A model whose interaction needs one common width (see the module docstring).

    Subclasses set ``self.projections`` (from :func:`_projections`) in ``__init__``.
    """

    if TYPE_CHECKING:  # for type checkers only: a class annotation at run time would hide RankingModel's from TorchScript
        projections: nn.ModuleDict

    def project(self, sparse: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Seam embeddings projected to the common width, in feature order (B x D each)."""
        out: list[torch.Tensor] = []
        for name, projection in self.projections.items():  # insertion order = feature order
            out.append(projection(sparse[name]))
        return out


class DLRM(_Projected):
    """DLRM (Naumov et al. 2019): bottom MLP on dense, pairwise dot products, top MLP.

    Args:
        schema: fitted schema.
        sparse_arch: embedding kernel settings.
        bottom_mlp: bottom MLP sizes; its last size is the interaction width unless
            ``interaction_dim`` is set. Ignored without dense features.
        top_mlp: top MLP hidden sizes (a final 1-unit layer is added).
        interaction_dim: common width of the dot interaction (default: the bottom MLP's last
            size, or the largest embedding dim without dense features).
        dropout: dropout in the top MLP.
        batch_norm: batch norm in the bottom and top MLPs.
        seam: transform at the seam.
    """

    tuned_mlp: ClassVar[str | None] = "top_mlp"

    def __init__(
        self,
        schema: Schema,
        sparse_arch: SparseArchConfig | None = None,
        bottom_mlp: list[int] = [64, 16],  # noqa: B006 - jsonargparse needs literal defaults
        top_mlp: list[int] = [128, 64],  # noqa: B006
        interaction_dim: int | None = None,
        dropout: float = 0.0,
        batch_norm: bool = False,
        seam: SeamTransform | None = None,
    ) -> None:
        super().__init__(schema, sparse_arch, seam)
        width = interaction_dim or (bottom_mlp[-1] if self.num_dense else max(self.embedding_dims))
        self.interaction_dim = width
        self.dense_arch = MLP(self.num_dense, [*bottom_mlp[:-1], width], batch_norm=batch_norm) if self.num_dense else nn.Identity()
        self.projections = _projections(self.embedding_dims, self.sparse_names, width)
        n = len(self.sparse_names) + (1 if self.num_dense else 0)
        self.num_vectors = n
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.tri_rows: torch.Tensor
        self.tri_cols: torch.Tensor
        self.register_buffer("tri_rows", rows, persistent=False)
        self.register_buffer("tri_cols", cols, persistent=False)
        over_in = n * (n - 1) // 2 + (width if self.num_dense else 0)
        self.over_arch = nn.Sequential(MLP(over_in, top_mlp, dropout, batch_norm=batch_norm), nn.Linear(top_mlp[-1] if top_mlp else over_in, 1))

    def interact(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        vectors = self.project(sparse)
        dense_emb = self.dense_arch(dense)
        if self.num_dense > 0:
            vectors = [dense_emb] + vectors
        stacked = torch.stack(vectors, dim=1)  # B x N x D
        gram = torch.bmm(stacked, stacked.transpose(1, 2))  # B x N x N
        pairs = gram[:, self.tri_rows, self.tri_cols]
        if self.num_dense > 0:
            pairs = torch.cat([dense_emb, pairs], dim=1)
        return self.over_arch(pairs).squeeze(-1)


class CrossNetwork(nn.Module):
    """DCN-V2 cross layers: ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``.

    Full-rank ``W_l`` (D x D) or, with ``low_rank=r``, ``W_l = U_l V_l`` (D x r, r x D). Same
    maths as ``torchrec.modules.crossnet.CrossNet``/``LowRankCrossNet``, written with a
    ``ModuleList`` so that the model scripts without FX tracing.

    Args:
        in_features: D.
        num_layers: number of cross layers.
        low_rank: rank r, or None for full rank.

    Call: x0 B x D -> B x D.
    """

    def __init__(self, in_features: int, num_layers: int, low_rank: int | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(in_features, in_features)
            if low_rank is None
            else nn.Sequential(nn.Linear(in_features, low_rank, bias=False), nn.Linear(low_rank, in_features))
            for _ in range(num_layers)
        )

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in self.layers:
            x = x0 * layer(x) + x
        return x


class DCNv2(RankingModel):
    """DCN-V2 (Wang et al. 2021): cross network on the concatenated input plus a deep MLP.

    Args:
        schema: fitted schema.
        sparse_arch: embedding kernel settings.
        cross_layers: number of cross layers.
        low_rank: rank of the cross weights (``None`` = full rank).
        deep_mlp: deep network sizes.
        structure: ``"stacked"`` (cross then deep) or ``"parallel"`` (cross || deep).
        dropout: dropout in the deep network.
        batch_norm: batch norm in the deep network.
        seam: transform at the seam.
    """

    tuned_mlp: ClassVar[str | None] = "deep_mlp"

    @classmethod
    def search_space(cls) -> dict[str, BaseDistribution]:
        from optuna.distributions import CategoricalDistribution, IntDistribution

        return {
            **super().search_space(),
            "cross_layers": IntDistribution(1, 5),
            "structure": CategoricalDistribution(("parallel", "stacked")),
        }

    @classmethod
    def tuned_args(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().tuned_args(params), "cross_layers": int(params["cross_layers"]), "structure": str(params["structure"])}

    def __init__(
        self,
        schema: Schema,
        sparse_arch: SparseArchConfig | None = None,
        cross_layers: int = 3,
        low_rank: int | None = None,
        deep_mlp: list[int] = [256, 128],  # noqa: B006
        structure: Literal["parallel", "stacked"] = "parallel",
        dropout: float = 0.0,
        batch_norm: bool = False,
        seam: SeamTransform | None = None,
    ) -> None:
        super().__init__(schema, sparse_arch, seam)
        if structure not in ("stacked", "parallel"):
            raise ValueError(f"structure must be 'stacked' or 'parallel', got {structure!r}")
        in_features = sum(self.embedding_dims) + self.num_dense
        self.in_features = in_features
        self.parallel = structure == "parallel"
        self.cross = CrossNetwork(in_features, cross_layers, low_rank)
        self.deep = MLP(in_features, deep_mlp, dropout, batch_norm=batch_norm)
        head_in = in_features + self.deep.out_features if self.parallel else self.deep.out_features
        self.head = nn.Linear(head_in, 1)

    def interact(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat(self.stacked(sparse) + [dense], dim=1)
        if self.parallel:
            out = torch.cat([self.cross(x0), self.deep(x0)], dim=1)
        else:
            out = self.deep(self.cross(x0))
        return self.head(out).squeeze(-1)


class DeepFM(_Projected):
    """DeepFM (Guo et al. 2017): first-order + FM second-order + deep MLP, summed.

    Each field's first-order weight is a linear read-out of its seam embedding (so a seam
    transform also acts on the first-order term); each dense feature j contributes
    ``x_j * v_j`` to the FM with a learned vector ``v_j``.

    Args:
        schema: fitted schema.
        sparse_arch: embedding kernel settings.
        deep_mlp: deep network sizes.
        fm_dim: common FM width (default: the largest embedding dim).
        dropout: dropout in the deep network.
        batch_norm: batch norm in the deep network.
        seam: transform at the seam.
    """

    tuned_mlp: ClassVar[str | None] = "deep_mlp"

    def __init__(
        self,
        schema: Schema,
        sparse_arch: SparseArchConfig | None = None,
        deep_mlp: list[int] = [256, 128],  # noqa: B006
        fm_dim: int | None = None,
        dropout: float = 0.0,
        batch_norm: bool = False,
        seam: SeamTransform | None = None,
    ) -> None:
        super().__init__(schema, sparse_arch, seam)
        width = fm_dim or max(self.embedding_dims, default=8)
        self.fm_dim = width
        self.projections = _projections(self.embedding_dims, self.sparse_names, width)
        self.first_order = nn.ModuleDict({n: nn.Linear(d, 1, bias=False) for n, d in zip(self.sparse_names, self.embedding_dims)})
        self.dense_linear = nn.Linear(self.num_dense, 1)  # also the global bias
        self.dense_vectors = nn.Parameter(torch.randn(self.num_dense, width) * 0.01)
        self.deep = nn.Sequential(
            MLP(sum(self.embedding_dims) + self.num_dense, deep_mlp, dropout, batch_norm=batch_norm),
            nn.Linear(deep_mlp[-1] if deep_mlp else sum(self.embedding_dims) + self.num_dense, 1),
        )

    def interact(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        first = self.dense_linear(dense)
        for name, linear in self.first_order.items():
            first = first + linear(sparse[name])
        vectors = self.project(sparse)
        parts: list[torch.Tensor] = []
        if len(vectors) > 0:
            parts.append(torch.stack(vectors, dim=1))  # B x F x D
        if self.num_dense > 0:
            parts.append(dense.unsqueeze(-1) * self.dense_vectors.unsqueeze(0))  # B x D_dense x D
        fm_in = torch.cat(parts, dim=1)
        square_of_sum = fm_in.sum(dim=1).pow(2)
        sum_of_square = fm_in.pow(2).sum(dim=1)
        second = 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)
        deep = self.deep(torch.cat(self.stacked(sparse) + [dense], dim=1))
        return (first + second + deep).squeeze(-1)
