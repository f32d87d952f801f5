"""Ranking models on TorchRec embedding bags, with the seam where importance modules plug in."""

from recsys.models.archs import DLRM, DCNv2, DeepFM
from recsys.models.backbone import Backbone, backbone_class, build_backbone, resolve_backbone
from recsys.models.base import MLP, EmbeddingKernel, FusedOptimizer, RankingModel, SparseArch, SparseArchConfig
from recsys.models.seam import IdentitySeam, SeamTransform

__all__ = [
    "Backbone",
    "backbone_class",
    "build_backbone",
    "resolve_backbone",
    "DCNv2",
    "DLRM",
    "DeepFM",
    "EmbeddingKernel",
    "FusedOptimizer",
    "IdentitySeam",
    "MLP",
    "RankingModel",
    "SeamTransform",
    "SparseArch",
    "SparseArchConfig",
]
