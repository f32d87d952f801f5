"""Shared pieces of the ranking models: the sparse arch (plain, FBGEMM-fused or grouped EBC), MLPs and
the :class:`RankingModel` base that routes everything through the seam.

    KJT ──► SparseArch (EBC, one table per feature, own dim) ──► {name: B x D_f} ─┐
                                                                                   ├─► seam ─► interaction ─► logit B
    dense B x D_dense ─────────────────────────────────────────────────────────────┘
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import TYPE_CHECKING, Any, ClassVar, List, Literal, cast, get_args

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.schema import Schema
from recsys.models.blocked import BLOCKS_KEY, Block, BlockRouter, block_key, check_blocks
from recsys.models.grouped import GroupedEmbeddingBags
from recsys.models.rows import ROWS_KEY, RowScheme, check_row_schemes, qr_key
from recsys.models.seam import IdentitySeam, SeamTransform

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.optim.keyed import KeyedOptimizer

__all__ = ["DenseInit", "EmbeddingKernel", "FusedOptimizer", "MLP", "Pooling", "RankingModel", "SparseArch", "SparseArchConfig",
           "init_dense_layers"]

#: how a multi-hot bag is pooled: the sum or the mean of its rows' embeddings
Pooling = Literal["sum", "mean"]


@unique
class EmbeddingKernel(str, Enum):
    """How embedding tables are stored and updated."""

    PLAIN = "plain"  # torchrec EmbeddingBagCollection; embeddings updated by the dense optimizer
    FUSED = "fused"  # FBGEMM FusedEmbeddingBagCollection; optimizer fused into backward
    #: every table of one width in one weight, one torch embedding_bag per width per step, the
    #: looked-up rows updated in the backward (recsys.models.grouped): the fused kernel without FBGEMM
    GROUPED = "grouped"


@unique
class FusedOptimizer(str, Enum):
    """Optimizers FBGEMM runs inside the fused backward on CPU (fused Adam is refused on CPU)."""

    SGD = "sgd"  # plain SGD
    ADAGRAD = "adagrad"  # element-wise Adagrad
    ROWWISE_ADAGRAD = "rowwise_adagrad"  # one Adagrad accumulator per embedding row


@dataclass(frozen=True)
class SparseArchConfig:
    """Embedding storage.

    Args:
        kernel: plain EBC (one lookup per table), FBGEMM-fused EBC, or the grouped lookup on
            torch ops (one lookup per embedding width; :mod:`recsys.models.grouped`).
        fused_optimizer: the optimizer fused into backward (``kernel`` fused or grouped).
        fused_lr: learning rate of the fused optimizer.
        pooling: how multi-hot bags are pooled.
        blocks: frequency blocks, feature -> ``[[start, stop, dim], ...]`` (stop -1 / None = to
            the end of the table): one table per (feature, contiguous id range), see
            :mod:`recsys.models.blocked`. The widest block must be the feature's embedding dim.
        blocks_key: the config key errors about ``blocks`` name.
        rows: row schemes, feature -> ``{scheme: qr, buckets: m, combine: sum|product|concat}``
            or ``{scheme: hash, rows: R}``: fewer rows than ids (see :mod:`recsys.models.rows`).
        rows_key: the config key errors about ``rows`` name.
        init_std: initial tables N(0, ``init_std``) instead of TorchRec's uniform(+-sqrt(1 / rows))
            (which starts the small tables of a CTR model far from zero).
    """

    kernel: EmbeddingKernel = EmbeddingKernel.PLAIN
    fused_optimizer: FusedOptimizer = FusedOptimizer.ADAGRAD
    fused_lr: float = 0.05
    pooling: Pooling = "sum"
    extra: dict[str, Any] = field(default_factory=dict)
    blocks: dict[str, Any] | None = None
    blocks_key: str = BLOCKS_KEY
    rows: dict[str, Any] | None = None
    rows_key: str = ROWS_KEY
    init_std: float | None = None

    def __post_init__(self) -> None:
        if self.pooling not in get_args(Pooling):
            raise ValueError(f"SparseArchConfig.pooling={self.pooling!r} is not one of {list(get_args(Pooling))}")
        if self.init_std is not None and not self.init_std > 0:
            raise ValueError(f"model.embedding_init_std must be > 0 (or null for TorchRec's init), got {self.init_std}")


def table_configs(
    schema: Schema, pooling: Pooling = "sum", blocks: dict[str, tuple[Block, ...]] | None = None,
    rows: Mapping[str, RowScheme] | None = None,
) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per sparse feature (table ``t_<name>``), or per (feature,
    frequency block) for the features in ``blocks`` (table ``t_<name>@<b>``, sum-pooled: the
    blocked lookup divides by the row length itself under mean pooling); a feature with a row
    scheme in ``rows`` gets its quotient and remainder tables (``t_<name>@q``, ``t_<name>@r``)
    or its hashed table (``t_<name>``, fewer rows)."""
    if not schema.is_fitted:
        raise ValueError("the schema must be fitted (num_embeddings known): use Preprocessor.fitted_schema")
    pool = PoolingType.MEAN if pooling == "mean" else PoolingType.SUM
    blocks = blocks or {}
    rows = rows or {}
    out: list[EmbeddingBagConfig] = []
    for f in schema.sparse:
        scheme = rows.get(f.name)
        if scheme is not None:
            n_rows = scheme.table_rows(int(f.num_embeddings or 0))
            names = [qr_key(f.name, "q"), qr_key(f.name, "r")] if scheme.scheme == "qr" else [f.name]
            out.extend(
                EmbeddingBagConfig(name=f"t_{key}", embedding_dim=scheme.table_dim(f.embedding_dim), num_embeddings=n,
                                   feature_names=[key], pooling=pool)
                for key, n in zip(names, n_rows, strict=True)
            )
        elif f.name in blocks:
            out.extend(
                EmbeddingBagConfig(
                    name=SparseArch.table_name(f.name, i),
                    embedding_dim=dim,
                    num_embeddings=stop - start,
                    feature_names=[block_key(f.name, i)],
                    pooling=PoolingType.SUM,
                )
                for i, (start, stop, dim) in enumerate(blocks[f.name])
            )
        else:
            out.append(
                EmbeddingBagConfig(
                    name=SparseArch.table_name(f.name),
                    embedding_dim=f.embedding_dim,
                    num_embeddings=int(f.num_embeddings or 0),
                    feature_names=[f.name],
                    pooling=pool,
                )
            )
    return out


def _initial_tables(tables: list[EmbeddingBagConfig], init_std: float | None) -> EmbeddingBagCollection:
    """The tables at their initial weights: TorchRec's (uniform in +-sqrt(1 / rows)), or N(0,
    ``init_std``) (FuxiCTR's default is 1e-4); the out-of-vocabulary row at zero either way."""
    ebc = EmbeddingBagCollection(tables=tables)
    if init_std is not None:
        with torch.no_grad():
            for bag in ebc.embedding_bags.values():
                bag.weight.normal_(0.0, init_std)
    return _zero_oov_rows(ebc)


def _zero_oov_rows(ebc: EmbeddingBagCollection) -> EmbeddingBagCollection:
    """Zero row 0 (the out-of-vocabulary id) of every table (of block 0 for blocked features:
    the row 0 of a later block is an ordinary id).

    With ``min_count=1`` no training row maps to OOV, so the row is never trained; starting it
    at zero makes an unseen category at evaluation or serving time neutral instead of noise.
    """
    with torch.no_grad():
        for name, bag in ebc.embedding_bags.items():
            if "@" not in name or name.endswith("@0"):
                bag.weight[0].zero_()
    return ebc


def table_configs_for(arch: SparseArch) -> list[EmbeddingBagConfig]:
    """The table configs a built :class:`SparseArch` holds."""
    return table_configs(arch.schema, arch.config.pooling, arch.blocks, arch.rows)


class SparseArch(nn.Module):
    """Embedding lookup for every sparse feature.

    Args:
        schema: fitted schema (its sparse features give the tables).
        config: plain or fused kernel.

    Call:
        kjt: KeyedJaggedTensor with the schema's sparse keys.

    Returns:
        ``Dict[str, Tensor]``: feature -> pooled embedding B x D_f.
    """

    def __init__(self, schema: Schema, config: SparseArchConfig | None = None) -> None:
        super().__init__()
        config = config or SparseArchConfig()
        self.kernel = EmbeddingKernel(config.kernel)
        #: the settings it was built with (rebuild on the other kernel: ``replace(config, kernel=...)``)
        self.config = config
        fused = self.kernel is EmbeddingKernel.FUSED
        blocks = check_blocks(config.blocks, schema, key=config.blocks_key, align=4 if fused else 1)
        #: row schemes, feature -> RowScheme (quotient-remainder or hashed tables)
        self.rows: dict[str, RowScheme] = check_row_schemes(
            config.rows, schema, key=config.rows_key, align=4 if fused else 1, blocked=tuple(blocks))
        tables = table_configs(schema, config.pooling, blocks, self.rows)
        self.schema = schema
        self.feature_names: list[str] = schema.sparse_names
        #: resolved frequency blocks, feature -> ((start, stop, dim), ...) (empty: one table each)
        self.blocks: dict[str, tuple[Block, ...]] = blocks
        self.router = BlockRouter(
            self.feature_names, blocks, {f.name: f.embedding_dim for f in schema.sparse}, mean=config.pooling == "mean",
            rows=self.rows,
        )
        self.embedding_bag_collection: nn.Module
        if fused:
            misaligned = [f"{f.name}={f.embedding_dim}" for f in schema.sparse if f.embedding_dim % 4]
            if misaligned:
                raise ValueError(f"the fused FBGEMM kernel needs embedding dims that are multiples of 4; got {misaligned}")
            # build a plain EBC first so that both kernels start from the same initial weights,
            # and the fused one under a forked RNG so the layers built after it draw the same
            # numbers as with the plain kernel
            plain = _initial_tables(tables, config.init_std)
            if next(plain.parameters()).is_meta:
                # a shape-only model built under ``torch.device("meta")`` (Recipe.datamodule: a
                # model nobody runs); FBGEMM builds no meta kernels, so the tables stay plain
                self.embedding_bag_collection = plain
                return
            self.embedding_bag_collection = self._fused_collection(plain.state_dict(), torch.device("cpu"))
            del plain
            from recsys.runtime import release_freed_memory

            release_freed_memory()  # the plain copy's pages; otherwise the heap keeps them (every table's size)
        elif self.kernel is EmbeddingKernel.GROUPED:
            # the plain kernel's initial weights (the same numbers as the other kernels), stacked
            plain = _initial_tables(tables, config.init_std)
            self.embedding_bag_collection = GroupedEmbeddingBags(
                tables, plain.state_dict(), optimizer=FusedOptimizer(config.fused_optimizer).value, lr=config.fused_lr)
            del plain
        else:
            self.embedding_bag_collection = _initial_tables(tables, config.init_std)

    def _fused_collection(self, state: dict[str, torch.Tensor], device: torch.device) -> nn.Module:
        """FBGEMM's ``FusedEmbeddingBagCollection`` of this arch's tables on ``device``, holding ``state``."""
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        opt = FusedOptimizer(self.config.fused_optimizer)
        if opt is FusedOptimizer.ROWWISE_ADAGRAD:
            from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

            opt_cls: type = RowWiseAdagrad
        else:
            opt_cls = torch.optim.SGD if opt is FusedOptimizer.SGD else torch.optim.Adagrad
        with torch.random.fork_rng():
            fused = FusedEmbeddingBagCollection(
                tables=table_configs_for(self), optimizer_type=opt_cls, optimizer_kwargs={"lr": self.config.fused_lr}, device=device
            )
        fused.load_state_dict(state)
        return fused

    def place_fused_tables(self, device: torch.device) -> None:
        """Rebuild the fused tables on ``device``: FBGEMM builds its kernels for one device, so
        ``.to()`` cannot move them (Lightning's move to CUDA calls this first). On CUDA this
        needs the CUDA build of fbgemm-gpu (``requirements/gpu.txt``)."""
        if not self.is_fused or device.type == "cpu":
            return
        from recsys.devices import fbgemm_cuda_available

        if device.type == "cuda" and not fbgemm_cuda_available():
            raise RuntimeError(
                "model.embedding_kernel: fused on CUDA needs the CUDA build of fbgemm-gpu "
                "(pip install -r requirements/gpu.txt); with only fbgemm-gpu-cpu, use model.embedding_kernel: grouped "
                "(the same in-backward table updates on torch's own CUDA kernels) or plain"
            )
        state = {k: v.detach().cpu() for k, v in self.embedding_bag_collection.state_dict().items()}
        self.embedding_bag_collection = self._fused_collection(state, device)

    def forward(self, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        if not torch.jit.is_scripting():
            if self.kernel is EmbeddingKernel.FUSED and torch.is_inference_mode_enabled():
                return self._lookup_outside_inference_mode(kjt)
        tables, totals = self.router.split(kjt)
        if not torch.jit.is_scripting() and self.kernel is EmbeddingKernel.GROUPED:
            return self.router.merge(self.embedding_bag_collection(tables), totals)
        pooled = self.embedding_bag_collection(tables).to_dict()
        # rebuild in feature order (a sharded EBC returns its keys in another order), merging
        # the frequency blocks of blocked features
        return self.router.merge(pooled, totals)

    @torch.jit.unused
    def _lookup_outside_inference_mode(self, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        """FBGEMM's fused CPU lookup dispatches through autograd, which inference mode bypasses
        (Lightning evaluates in inference mode by default): look up under no_grad instead."""
        with torch.inference_mode(False), torch.no_grad():
            tables, totals = self.router.split(kjt)
            pooled = self.embedding_bag_collection(tables).to_dict()
            return self.router.merge(pooled, totals)

    @property
    def is_fused(self) -> bool:
        return self.kernel is EmbeddingKernel.FUSED

    @property
    def updates_in_backward(self) -> bool:
        """The tables are updated inside the backward (fused or grouped kernel), not by the dense optimizer."""
        return not self.is_plain

    @property
    def is_plain(self) -> bool:
        """The plain kernel: scriptable per-table modules (export, quantization and
        :meth:`table` need it; :func:`recsys.export.to_plain_kernel` converts the others)."""
        return self.kernel is EmbeddingKernel.PLAIN

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.embedding_bag_collection.parameters())

    @staticmethod
    def table_name(feature: str, block: int | None = None) -> str:
        """Name of ``feature``'s embedding table, ``t_<feature>``; with ``block``, of that
        frequency block's table, ``t_<feature>@<block>`` (the key in the EBC and its state dict)."""
        return f"t_{feature}" if block is None else f"t_{block_key(feature, block)}"

    @torch.jit.unused
    def table(self, feature: str, block: int | None = None) -> nn.EmbeddingBag:
        """``feature``'s table module (plain kernel), or that of its frequency block ``block``.

        Its ``weight`` is the ``num_embeddings x D_f`` table (``stop - start`` rows x the block's
        dim for a block).

        Raises:
            ValueError: the fused kernel (FBGEMM keeps the tables inside the kernel), a feature
                this arch has no table for, or a block that does not match the feature's blocks.
        """
        if not self.is_plain:
            inside = "the FBGEMM-fused kernel" if self.is_fused else "the grouped kernel's stacked weights"
            raise ValueError(
                f"the table of {feature!r} lives inside {inside}: build the model with "
                "SparseArchConfig(kernel=EmbeddingKernel.PLAIN) (model.embedding_kernel: plain) to reach it, "
                "or convert it with recsys.export.to_plain_kernel"
            )
        if feature not in self.feature_names:
            raise ValueError(f"no embedding table for {feature!r}; the sparse features are {self.feature_names}")
        if feature in self.rows and self.rows[feature].scheme == "qr":
            raise ValueError(f"{feature!r} is stored as quotient and remainder tables (t_{feature}@q, t_{feature}@r), "
                             "not one table")
        n_blocks = len(self.blocks.get(feature, ()))
        if block is None and n_blocks:
            raise ValueError(f"{feature!r} is split into {n_blocks} frequency blocks: pass block=0..{n_blocks - 1}")
        if block is not None and not 0 <= block < n_blocks:
            held = f"blocks 0..{n_blocks - 1}" if n_blocks else "no frequency blocks"
            raise ValueError(f"{feature!r} has {held}, not block {block}")
        bags = self.embedding_bag_collection.embedding_bags
        assert isinstance(bags, nn.ModuleDict)
        table = bags[self.table_name(feature, block)]
        assert isinstance(table, nn.EmbeddingBag)
        return table

    @torch.jit.unused
    def fused_optimizer(self) -> KeyedOptimizer:
        """The optimizer FBGEMM runs inside the backward of the fused kernel (its state travels
        with checkpoints).

        Raises:
            ValueError: the plain kernel (its tables are updated by the dense optimizer).
        """
        if not self.is_fused:
            raise ValueError("the plain embedding kernel has no fused optimizer (model.embedding_kernel: fused)")
        return cast("FusedEmbeddingBagCollection", self.embedding_bag_collection).fused_optimizer()


class EmptySparseArch(nn.Module):
    """The sparse arch of a dense-only model (e.g. a selected subset with no sparse feature):
    no tables, an empty seam dict."""

    __annotations__ = {"feature_names": List[str]}  # noqa: RUF012, UP006 - see RankingModel

    def __init__(self) -> None:
        super().__init__()
        self.kernel = EmbeddingKernel.PLAIN
        self.feature_names: list[str] = []

    def forward(self, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        return torch.jit.annotate(dict[str, torch.Tensor], {})

    @property
    def is_fused(self) -> bool:
        return False

    @property
    def is_plain(self) -> bool:
        return True

    @property
    def updates_in_backward(self) -> bool:
        return False

    def num_parameters(self) -> int:
        return 0


#: how the dense layers start: torch's default (Kaiming-uniform) or Xavier-normal weights with zero biases
DenseInit = Literal["default", "xavier_normal"]


def init_dense_layers(model: nn.Module, scheme: DenseInit) -> None:
    """Re-initialise every ``nn.Linear`` of ``model`` outside its sparse arch by ``scheme``
    (``xavier_normal``: FuxiCTR's and BARS' default; ``default`` leaves torch's)."""
    if scheme not in get_args(DenseInit):
        raise ValueError(f"model.dense_init must be one of {list(get_args(DenseInit))}, got {scheme!r}")
    if scheme == "default":
        return
    tables = {id(m) for m in getattr(model, "sparse_arch", nn.Module()).modules()}
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear) and id(m) not in tables:
                nn.init.xavier_normal_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)


class MLP(nn.Sequential):
    """Linear (-> BatchNorm) -> ReLU (-> Dropout) stack; ``last_activation=False`` leaves the
    last layer linear."""

    def __init__(
        self, in_features: int, sizes: list[int], dropout: float = 0.0, last_activation: bool = True, batch_norm: bool = False
    ) -> None:
        layers: list[nn.Module] = []
        for i, size in enumerate(sizes):
            layers.append(nn.Linear(in_features, size))
            if last_activation or i < len(sizes) - 1:
                if batch_norm:
                    layers.append(nn.BatchNorm1d(size))
                layers.append(nn.ReLU())
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
            in_features = size
        super().__init__(*layers)
        self.out_features = in_features


class RankingModel(nn.Module):
    """Base of DLRM / DCNv2 / DeepFM.

    Subclasses implement :meth:`interact` on the (possibly transformed) seam output.

    Args:
        schema: fitted schema.
        sparse_arch: embedding kernel settings.
        seam: transform at the seam (identity by default).

    Call:
        dense: B x D_dense float (the dense features' columns: one per scalar, D per vector).
        sparse: KJT with the schema's sparse keys.

    Returns:
        logits, B.
    """

    # TorchScript cannot infer the element type of an empty list (a dense-only model); these
    # annotations are real type objects because `from __future__ import annotations` would
    # make them strings TorchScript cannot read
    __annotations__ = {"sparse_names": List[str], "embedding_dims": List[int]}  # noqa: RUF012, UP006

    #: the constructor argument that holds the deep MLP's sizes, which tuning shapes from
    #: ``mlp_layers``, ``mlp_width`` and ``mlp_shape`` (None: the backbone has none to tune)
    tuned_mlp: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # a subclass that annotates anything gets its own annotation table, which would hide
        # the real types above from TorchScript (an empty sparse_names list cannot be typed)
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__")
        if own is not None:
            for name, kind in RankingModel.__annotations__.items():
                own.setdefault(name, kind)

    def __init__(self, schema: Schema, sparse_arch: SparseArchConfig | None = None, seam: SeamTransform | None = None) -> None:
        super().__init__()
        self.schema = schema
        self.sparse_names: list[str] = schema.sparse_names
        self.embedding_dims: list[int] = [f.embedding_dim for f in schema.sparse]
        self.num_dense: int = schema.dense_width  # columns of the dense tensor (a vector feature takes D)
        self.sparse_arch: SparseArch | EmptySparseArch = (
            SparseArch(schema, sparse_arch) if schema.sparse else EmptySparseArch()
        )
        self.seam: SeamTransform = IdentitySeam()
        if seam is not None:
            self.set_seam(seam)

    # -- what ``salience tune`` may change ------------------------------------------------------
    @classmethod
    def search_space(cls) -> dict[str, BaseDistribution]:
        """The backbone's tunable hyperparameters (name -> Optuna distribution), in sampling order.

        The base offers ``dropout``, ``batch_norm`` and, when :attr:`tuned_mlp` is set, the MLP's
        depth, first-layer width and shape; a backbone extends it with its own arguments and
        maps them in :meth:`tuned_args`.
        """
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        space: dict[str, BaseDistribution] = {
            "dropout": FloatDistribution(0.0, 0.5),
            "batch_norm": CategoricalDistribution((False, True)),
        }
        if cls.tuned_mlp is not None:
            space["mlp_layers"] = IntDistribution(1, 4)
            space["mlp_width"] = CategoricalDistribution((64, 128, 256, 512))
            space["mlp_shape"] = CategoricalDistribution(("constant", "funnel"))
        return space

    @classmethod
    def tuned_args(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor arguments for a sampled point of :meth:`search_space`.

        ``mlp_shape: funnel`` halves the width per layer (never below 16).
        """
        args: dict[str, Any] = {"dropout": float(params["dropout"]), "batch_norm": bool(params["batch_norm"])}
        if cls.tuned_mlp is not None:
            width, depth = int(params["mlp_width"]), int(params["mlp_layers"])
            funnel = params["mlp_shape"] == "funnel"
            args[cls.tuned_mlp] = [max(16, width >> i) if funnel else width for i in range(depth)]
        return args

    def embed(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The seam output: (per-feature pooled embeddings, dense), after the seam transform."""
        pooled = self.seam.transform_values(self.sparse_arch(sparse), sparse)
        return self.seam(pooled, dense)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        emb, dense = self.embed(dense, sparse)
        return self.interact(emb, dense)

    def interact(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def set_seam(self, seam: SeamTransform) -> None:
        """Install a seam transform (it is bound to this model's features first)."""
        dense = list(self.schema.dense_names)
        if self.schema.vectors:  # a transform written before vector features existed takes three arguments
            seam.bind(list(self.sparse_names), list(self.embedding_dims), dense, list(self.schema.dense_widths))
        else:
            seam.bind(list(self.sparse_names), list(self.embedding_dims), dense)
        rows = {f.name: f.num_embeddings for f in self.schema.sparse}
        seam.bind_values([int(rows[name] or 0) for name in self.sparse_names])
        self.seam = seam

    def stacked(self, sparse: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Seam embeddings as a list in feature order (never rely on dict/KeyedTensor order)."""
        return [sparse[name] for name in self.sparse_names]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Parameters the dense optimizer updates (all but tables updated in the backward: fused, grouped)."""
        if self.sparse_arch.updates_in_backward:
            fused = {id(p) for p in self.sparse_arch.parameters()}
            return [p for p in self.parameters() if id(p) not in fused]
        return list(self.parameters())

    def embedding_parameters(self) -> int:
        return self.sparse_arch.num_parameters()
