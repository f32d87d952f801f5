"""Sharded training on TorchRec's own engine: ``DistributedModelParallel`` + its planner.

A ranking model's embedding tables (``sparse_arch.embedding_bag_collection``) are sharded over
the processes of a ``torchrun`` job (gloo on CPU, nccl on CUDA); the dense part is
data-parallel (DDP, inside DMP). The embedding optimizer is fused into the backward
(``apply_optimizer_in_backward``), as in TorchRec's DLRM example: the task's
``fused_optimizer`` / ``fused_lr`` (``model.embedding_kernel: fused``).

    torchrun --nproc_per_node 2 -m experiments.cli fit --config experiments/configs/frappe_dcnv2_sharded.yaml

Checkpoints hold full (unsharded) tensors under the single-process names, gathered on save
and sliced into the local shards on load: a checkpoint of a sharded run loads into a
single-process model (``recsys.train.checkpoint.load_checkpoint``) and into a run on another
plan or process count. Gathering whole tables on rank 0 bounds this to tables that fit in one
host's memory (see docs/sharded-training.md).

Sharding types (``ShardingConfig.sharding`` for every table, ``tables`` per feature):

==================  =================================================  ========================
type                what each process holds                            CPU
==================  =================================================  ========================
``table_wise``      whole tables, placed by the planner                planner
``column_wise``     a slice of every table's columns                   planner
``row_wise``        a slice of every table's rows                      hand-written plan
``data_parallel``   full replicas (gradients all-reduced, then the     planner
                    embedding optimizer steps: the task does it)
``auto``            the planner's choice under the memory constraint   planner
==================  =================================================  ========================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from recsys.models.base import EmbeddingKernel, FusedOptimizer, RankingModel, SparseArch, table_configs_for
from recsys.trainer_attrs import trainer_callbacks

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from recsys.train.module import RankingTask

__all__ = [
    "SHARDING_TYPES",
    "ShardedStrategy",
    "ShardingConfig",
    "ShardingError",
    "ShardingType",
    "build_plan",
    "collective_device",
    "full_fused_optimizer_state",
    "full_state_dict",
    "fused_optimizer_class",
    "is_sharded",
    "load_full_fused_optimizer_state",
    "load_full_state_dict",
    "replica_optimizer",
    "replica_parameters",
    "shard_model",
    "unwrap",
]

log = logging.getLogger(__name__)

#: how a table is split over the processes (``auto``: TorchRec's planner chooses)
ShardingType = Literal["auto", "table_wise", "row_wise", "column_wise", "data_parallel"]
SHARDING_TYPES: tuple[ShardingType, ...] = get_args(ShardingType)
#: the types TorchRec's planner proposes on a CPU topology (the others need a hand-written plan)
PLANNER_CPU_TYPES = ("table_wise", "column_wise", "table_column_wise", "data_parallel")
EBC_PATH = "sparse_arch.embedding_bag_collection"
#: TorchRec's compute kernel with the optimizer fused into the backward
FUSED = "fused"


class ShardingError(ValueError):
    """A sharding request that cannot be met (names the config key and the numbers)."""


@dataclass(frozen=True)
class ShardingConfig:
    """How the embedding tables are sharded.

    Args:
        sharding: the type of every table (``auto``: the planner chooses).
        tables: per-feature overrides, feature (or table ``t_<feature>``) -> type; a blocked
            (mixed-dimension) feature applies it to each of its frequency-block tables.
        memory_per_process_gib: the planner's per-process memory cap (HBM on CUDA, DDR on CPU);
            ``None`` keeps TorchRec's default topology.
        key: the config prefix errors name.
    """

    sharding: ShardingType = "auto"
    tables: dict[str, ShardingType] = field(default_factory=dict)
    memory_per_process_gib: float | None = None
    key: str = "trainer.strategy.init_args"

    def __post_init__(self) -> None:
        if self.sharding not in SHARDING_TYPES:
            raise ShardingError(f"{self.key}.sharding={self.sharding!r} is not one of {list(SHARDING_TYPES)}")
        for name, kind in self.tables.items():
            if kind not in SHARDING_TYPES:
                raise ShardingError(f"{self.key}.tables.{name}={kind!r} is not one of {list(SHARDING_TYPES)}")

    def type_of(self, table: str, feature: str) -> ShardingType:
        return self.tables.get(feature, self.tables.get(table, self.sharding))


# -- models --------------------------------------------------------------------------------
def is_sharded(module: nn.Module) -> bool:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    return isinstance(module, DistributedModelParallel)


def unwrap(module: nn.Module) -> nn.Module:
    """The model inside a ``DistributedModelParallel`` (the module itself otherwise)."""
    return cast(nn.Module, module.module) if is_sharded(module) else module


def _tables_arch(model: RankingModel) -> SparseArch:
    """``model``'s sparse arch, which must hold embedding tables to shard."""
    arch = model.sparse_arch
    if not isinstance(arch, SparseArch) or not arch.feature_names:
        raise ShardingError(
            "the model has no embedding tables to shard (a dense-only model): train it without the sharded strategy"
        )
    return arch


def fused_optimizer_class(opt: FusedOptimizer) -> type:
    """The torch optimizer class TorchRec fuses into the backward for ``opt``."""
    if opt is FusedOptimizer.ROWWISE_ADAGRAD:
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        return RowWiseAdagrad
    return torch.optim.SGD if opt is FusedOptimizer.SGD else torch.optim.Adagrad


def _check_plan_fits(
    tables: list[Any], kinds: Mapping[str, str], features: dict[str, str], config: ShardingConfig, world_size: int
) -> None:
    """Clear errors for plans the process count cannot meet (``kinds``: table -> type)."""
    tw = [n for n, k in kinds.items() if k == "table_wise"]
    if tw and len(tw) == len(kinds) and world_size > len(tw):
        raise ShardingError(
            f"{config.key}.sharding=table_wise with {world_size} processes but only {len(tw)} table(s): "
            f"{world_size - len(tw)} process(es) would hold no table; use row_wise or column_wise, or fewer processes"
        )
    for c in tables:
        kind = kinds[c.name]
        if kind == "column_wise" and (c.embedding_dim % world_size or (c.embedding_dim // world_size) % 4):
            raise ShardingError(
                f"{config.key}: column_wise splits table {c.name} (dim {c.embedding_dim}) over {world_size} processes, "
                f"which needs a dim that is a multiple of 4 x {world_size} = {4 * world_size}; use table_wise or "
                f"row_wise for it ({config.key}.tables.{features[c.name]}) or fewer processes"
            )
        if kind == "row_wise" and c.num_embeddings < world_size:
            raise ShardingError(
                f"{config.key}: row_wise splits table {c.name} ({c.num_embeddings} rows) over {world_size} processes; "
                f"it needs at least one row per process"
            )


def _topology(world_size: int, local_world_size: int, device_type: str, memory_gib: float | None) -> Any:
    from torchrec.distributed.planner import Topology

    cap = None if memory_gib is None else int(memory_gib * 1024**3)
    kwargs: dict[str, Any] = {}
    if cap is not None:
        kwargs["hbm_cap" if device_type == "cuda" else "ddr_cap"] = cap
    return Topology(world_size=world_size, local_world_size=local_world_size, compute_device=device_type, **kwargs)


def build_plan(
    model: RankingModel, config: ShardingConfig, world_size: int, local_world_size: int, device_type: str, pg: Any = None
) -> Any:
    """A ``ShardingPlan`` for ``model``'s embedding tables.

    Uses TorchRec's ``EmbeddingShardingPlanner`` (topology + per-table constraints) when it
    offers every requested type on ``device_type``; otherwise (row-wise on CPU) a hand-written
    plan: row/column/data-parallel tables as asked, table-wise tables placed largest first on
    the least-loaded process.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    tables = table_configs_for(_tables_arch(model))
    configs = {c.name: c for c in tables}
    features = {name: c.feature_names[0].split("@")[0] for name, c in configs.items()}  # t_<f>@<b> -> f
    kinds = {name: config.type_of(name, features[name]) for name in configs}
    _check_plan_fits(tables, kinds, features, config, world_size)
    # plan on a weightless stand-in at the model's EBC path (the model may hold the fused kernel)
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    holder = nn.Module()
    holder.sparse_arch = nn.Module()
    holder.sparse_arch.embedding_bag_collection = ebc
    planner_types = PLANNER_CPU_TYPES if device_type == "cpu" else SHARDING_TYPES
    sharder = EmbeddingBagCollectionSharder()
    if all(k == "auto" or k in planner_types for k in kinds.values()):
        constraints = {
            name: ParameterConstraints(sharding_types=[kind], compute_kernels=["dense" if kind == "data_parallel" else FUSED])
            for name, kind in kinds.items()
            if kind != "auto"
        }
        planner = EmbeddingShardingPlanner(
            topology=_topology(world_size, local_world_size, device_type, config.memory_per_process_gib),
            constraints=constraints,
            debug=False,
        )
        if pg is not None:
            return planner.collective_plan(holder, [sharder], pg)
        return planner.plan(holder, [sharder])
    load = [0] * world_size
    per_param = {}
    for name in sorted(configs, key=lambda n: -configs[n].num_embeddings * configs[n].embedding_dim):
        kind, cfg = kinds[name], configs[name]
        if kind in ("table_wise", "auto"):
            rank = min(range(world_size), key=lambda r: (load[r], r))
            load[rank] += cfg.num_embeddings * cfg.embedding_dim
            per_param[name] = table_wise(rank=rank, compute_kernel=FUSED)
        elif kind == "row_wise":
            per_param[name] = row_wise(compute_kernel=FUSED)
        elif kind == "column_wise":
            per_param[name] = column_wise(size_per_rank=[cfg.embedding_dim // world_size] * world_size, compute_kernel=FUSED)
        else:
            per_param[name] = data_parallel()
    module_plan = construct_module_sharding_plan(
        ebc,
        per_param_sharding=per_param,
        local_size=local_world_size,
        world_size=world_size,
        device_type=device_type,
        sharder=sharder,
    )
    return ShardingPlan({EBC_PATH: module_plan})


def describe_plan(plan: Any) -> dict[str, dict[str, Any]]:
    """Table -> {type, ranks, kernel} of a ``ShardingPlan`` (what the run logs)."""
    out: dict[str, dict[str, Any]] = {}
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():
            out[table] = {"type": ps.sharding_type, "ranks": list(ps.ranks or []), "kernel": ps.compute_kernel}
    return out


def _to_plain_ebc(model: RankingModel) -> None:
    """Give the model a weightless plain torchrec EBC (what DMP shards) of the same tables, and
    fuse the task's embedding optimizer into its backward."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    arch = _tables_arch(model)
    cfg = arch.config
    tables = table_configs_for(arch)
    # weightless, as in TorchRec's DLRM example: TorchRec keeps the unsharded parameters it
    # shards from, so real ones would keep a full copy of every table alive in each process;
    # shard_model loads the weights into the shards afterwards
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    apply_optimizer_in_backward(fused_optimizer_class(FusedOptimizer(cfg.fused_optimizer)), ebc.parameters(), {"lr": cfg.fused_lr})
    arch.embedding_bag_collection = ebc
    # the sharded tables update themselves in backward, like the fused kernel
    arch.kernel = EmbeddingKernel.FUSED


def collective_device(pg: Any = None) -> torch.device:
    """Where tensors for a collective must live: the current CUDA device under nccl (which
    cannot reduce CPU tensors), the CPU otherwise."""
    if dist.get_backend(pg) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_same_initial_weights(state: Mapping[str, torch.Tensor], pg: Any) -> None:
    """Every process must start from the same tables (same seed); a cheap checksum check."""
    sums = torch.tensor([float(v.double().sum()) for v in state.values()], dtype=torch.float64, device=collective_device(pg))
    gathered = [torch.zeros_like(sums) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(gathered, sums, group=pg)
    if any(not torch.allclose(g, sums) for g in gathered):
        raise ShardingError("the processes built different initial embedding tables: set seed_everything to one seed")


def shard_model(
    model: RankingModel, config: ShardingConfig, device: torch.device, pg: Any = None, find_unused_parameters: bool = False
) -> nn.Module:
    """Shard ``model``'s embedding tables over the process group (the default group when
    ``pg`` is None) and wrap the rest in DDP: returns a ``DistributedModelParallel``.

    The unsharded weights (identical on every process: same seed) are copied into the shards.
    """
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    if not isinstance(getattr(model, "sparse_arch", None), nn.Module) or not getattr(model.sparse_arch, "feature_names", []):
        raise ShardingError("the model has no embedding tables to shard (a dense-only model): train it without the sharded strategy")
    if model.sparse_arch.kernel is not EmbeddingKernel.FUSED:
        raise ShardingError(
            "sharded tables train with the optimizer TorchRec fuses into the backward: set model.embedding_kernel: fused "
            "(with model.fused_optimizer and model.fused_lr); the plain kernel's dense-optimizer updates "
            "(Adam, model.embedding_weight_decay) do not apply to sharded tables"
        )
    if not dist.is_initialized():
        raise ShardingError("sharded training needs torch.distributed: launch with torchrun --nproc_per_node N")
    pg = pg or dist.group.WORLD
    world_size = dist.get_world_size(pg)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    full = {k: v.detach() for k, v in model.state_dict().items()}  # loaded into the shards below
    _check_same_initial_weights({k: v for k, v in full.items() if k.startswith(EBC_PATH)}, pg)
    _to_plain_ebc(model)
    plan = build_plan(model, config, world_size, local_world_size, device.type, pg)
    sharded = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        data_parallel_wrapper=DefaultDataParallelWrapper(find_unused_parameters=find_unused_parameters),
    )
    load_full_state_dict(sharded, full)
    if dist.get_rank(pg) == 0:
        log.info("sharding plan over %d processes: %s", world_size, describe_plan(plan))
    sharded.sharding_description = describe_plan(plan)
    return sharded


# -- full <-> sharded tensors -----------------------------------------------------------------
def _is_sharded_tensor(value: Any) -> bool:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    return isinstance(value, ShardedTensor)


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _slices(offsets: list[int], sizes: list[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes))


def _local_pieces(value: Any) -> list[tuple[list[int], torch.Tensor]]:
    # cloned: a shard can be a view into FBGEMM's one flat buffer of all tables, which pickling
    # for gather_object would otherwise send whole, once per table
    return [(list(s.metadata.shard_offsets), s.tensor.detach().cpu().clone()) for s in value.local_shards()]


def _gather_entries(entries: dict[str, Any], dst: int = 0) -> dict[str, torch.Tensor] | None:
    """Full tensors of a (possibly rank-dependent) dict of ShardedTensor / DTensor / Tensor.

    Collective over the default group; the full dict is returned on ``dst`` (None elsewhere).
    """
    local: dict[str, Any] = {}
    for key, value in entries.items():
        if _is_sharded_tensor(value):
            local[key] = ("shards", list(value.size()), _local_pieces(value))
        elif _is_dtensor(value):
            local[key] = ("full", value.full_tensor().detach().cpu().clone())
        else:
            local[key] = ("full", value.detach().cpu().clone())
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world if dist.get_rank() == dst else []
    dist.gather_object(local, gathered if dist.get_rank() == dst else None, dst=dst)
    if dist.get_rank() != dst:
        return None
    out: dict[str, torch.Tensor] = {}
    for part in gathered:
        for key, item in part.items():
            if item[0] == "full":
                out.setdefault(key, item[1])
                continue
            _, size, pieces = item
            if key not in out:
                out[key] = torch.zeros(size, dtype=pieces[0][1].dtype if pieces else torch.float32)
            for offsets, tensor in pieces:
                out[key][_slices(offsets, list(tensor.shape))] = tensor
    return out


def _load_entry(target: Any, full: torch.Tensor, key: str) -> None:
    """Copy the slice of ``full`` that ``target`` (a ShardedTensor, DTensor or Tensor) holds."""
    if _is_sharded_tensor(target):
        if list(target.size()) != list(full.shape):
            raise ShardingError(f"checkpoint entry {key}: shape {list(full.shape)}, the model has {list(target.size())}")
        for shard in target.local_shards():
            piece = full[_slices(list(shard.metadata.shard_offsets), list(shard.tensor.shape))]
            with torch.no_grad():
                shard.tensor.copy_(piece.to(shard.tensor))
    elif _is_dtensor(target):
        from torch.distributed.tensor import distribute_tensor

        with torch.no_grad():
            target.to_local().copy_(distribute_tensor(full.to(target.device), target.device_mesh, target.placements).to_local())
    else:
        if target.shape != full.shape:
            raise ShardingError(f"checkpoint entry {key}: shape {list(full.shape)}, the model has {list(target.shape)}")
        with torch.no_grad():
            target.copy_(full.to(target))


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with every sharded entry gathered into a full tensor, under the
    names of the unsharded model. Collective: call it on every process; rank 0 gets the full
    dict, the others their local state dict (it is not written)."""
    state = module.state_dict()
    if not any(_is_sharded_tensor(v) or _is_dtensor(v) for v in state.values()):
        return state
    sharded = {k: v for k, v in state.items() if _is_sharded_tensor(v) or _is_dtensor(v)}
    full = _gather_entries(sharded)
    if full is None:
        return state
    return {k: full.get(k, v) for k, v in state.items()}


def load_full_state_dict(module: nn.Module, full: Mapping[str, torch.Tensor], strict: bool = True) -> None:
    """Load full tensors (a single-process or gathered state dict) into a sharded module."""
    state = module.state_dict()
    missing = sorted(set(state) - set(full))
    unexpected = sorted(set(full) - set(state))
    if strict and (missing or unexpected):
        raise ShardingError(
            f"the checkpoint does not fit this model: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''} (a checkpoint of another model or schema?)"
        )
    for key, target in state.items():
        if key in full:
            _load_entry(target, full[key], key)


#: FBGEMM's epsilon of its fused Adagrad kernels (torch's own default is 1e-10)
FBGEMM_EPS = 1e-8


def replica_optimizer(module: nn.Module, optimizer: FusedOptimizer, lr: float) -> torch.optim.Optimizer | None:
    """The optimizer of a sharded model's data-parallel tables (None when it has none): the
    fused optimizer's algorithm and FBGEMM's epsilon, stepped after the backward's all-reduce."""
    replicas = replica_parameters(module)
    if not replicas:
        return None
    kwargs = {} if optimizer is FusedOptimizer.SGD else {"eps": FBGEMM_EPS}
    return fused_optimizer_class(optimizer)(replicas, lr=lr, **kwargs)


def replica_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The embedding parameters of a sharded model's data-parallel tables: replicas that DDP
    all-reduces after the backward, so no optimizer is fused into it; step them with
    :func:`fused_optimizer_class` after the backward (``RankingTask`` does)."""
    if not is_sharded(module):
        return []
    arch = cast(RankingModel, unwrap(module)).sparse_arch
    return [p for p in arch.parameters() if p.requires_grad and not hasattr(p, "_in_backward_optimizers")]


def _fused_state_entries(module: nn.Module) -> dict[str, Any]:
    """The fused embedding optimizer state as table/state-name -> tensor, e.g.
    ``t_user/momentum1`` (the names TorchRec's sharded tables use)."""
    out: dict[str, Any] = {}
    sharded = cast("DistributedModelParallel", module)
    for state in sharded.fused_optimizer.state_dict()["state"].values():
        for name, value in state.items():
            table, _, kind = name.rpartition(".")
            out[f"{table}/{kind}"] = value
    return out


def full_fused_optimizer_state(module: nn.Module) -> dict[str, torch.Tensor] | None:
    """The sharded fused optimizer state gathered to full tensors on rank 0 (collective)."""
    return _gather_entries(_fused_state_entries(module))


def load_full_fused_optimizer_state(module: nn.Module, full: Mapping[str, torch.Tensor]) -> None:
    """Slice a gathered fused optimizer state into this process's shards."""
    for key, target in _fused_state_entries(module).items():
        if key in full:
            _load_entry(target, full[key], key)
        else:
            log.warning("no fused optimizer state for %s in the checkpoint; it restarts from zero", key)


# -- Lightning -----------------------------------------------------------------------------


class ShardedStrategy(DDPStrategy):
    """Lightning strategy that shards the task's embedding tables with TorchRec.

    ``trainer.strategy: {class_path: recsys.train.sharded.ShardedStrategy, init_args:
    {sharding: row_wise}}``; launched by ``torchrun --nproc_per_node N`` (``trainer.devices``
    follows the launcher) or by Lightning itself with ``trainer.devices: N``. The task's
    ``model`` becomes a ``DistributedModelParallel`` in every stage (fit, validate, test,
    predict); ``data.batch_size`` stays the global batch, split evenly over the processes.

    Args:
        sharding: sharding type of every table (see the module docstring).
        tables: per-feature overrides, feature -> type.
        memory_per_process_gib: the planner's memory cap per process.
        find_unused_parameters: passed to the DDP wrapper of the dense part.
        process_group_backend: ``gloo`` (CPU default) or ``nccl`` (CUDA default).
    """

    strategy_name = "torchrec_sharded"

    def __init__(
        self,
        sharding: ShardingType = "auto",
        tables: dict[str, ShardingType] | None = None,
        memory_per_process_gib: float | None = None,
        find_unused_parameters: bool = False,
        process_group_backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(process_group_backend=process_group_backend, **kwargs)
        self.sharding_config = ShardingConfig(sharding, dict(tables or {}), memory_per_process_gib)
        self.find_unused_parameters = find_unused_parameters

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        # checkpoints are loaded into the sharded model (full tensors sliced into the shards)
        return True

    def _shard(self) -> None:
        task = cast("RankingTask", self.lightning_module)
        if is_sharded(task.model):
            return
        sharded = shard_model(task.model, self.sharding_config, self.root_device, find_unused_parameters=self.find_unused_parameters)
        task.model = sharded  # type: ignore[assignment]  # the task's model becomes the DMP (ranking_model unwraps it)
        self._log_plan(cast("dict[str, dict[str, Any]]", sharded.sharding_description))

    def _log_plan(self, plan: dict[str, dict[str, Any]]) -> None:
        """The plan and the process count go to the run's MLflow run (rank 0 holds it)."""
        from recsys.tracking import MlflowTracking

        assert self.lightning_module is not None
        trainer = self.lightning_module.trainer
        tracking = next((c for c in trainer_callbacks(trainer) if isinstance(c, MlflowTracking)), None)
        if tracking is None or tracking.tracker is None:
            return
        tracking.tracker.log_dict(plan, "sharding_plan.json")
        types = sorted({p["type"] for p in plan.values()})
        tracking.tracker.log_params({"sharding.world_size": self.world_size, "sharding.types": ",".join(types)})

    def setup(self, trainer: Any) -> None:
        from lightning.fabric.utilities.optimizer import _optimizers_to_device
        from lightning.pytorch.trainer.states import TrainerFn

        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        # every stage, not only fit (DDP's own setup wraps for fit only); DMP wraps the dense
        # part in DDP itself, and the task's model stays sharded for the test after fit
        self._shard()
        assert self.model is not None
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        assert self.lightning_module is not None
        return full_state_dict(self.lightning_module)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        assert self.lightning_module is not None
        load_full_state_dict(self.lightning_module, checkpoint["state_dict"], strict=strict)
