"""Backbones as config: a :class:`~recsys.models.base.RankingModel` subclass plus its arguments.

A config names the backbone the LightningCLI way, by class path (or the class's short name once it
is imported) and the constructor arguments after ``schema`` and ``sparse_arch``::

    model:
      backbone:
        class_path: recsys.models.DCNv2
        init_args: {cross_layers: 3, deep_mlp: [400, 400, 400]}

jsonargparse resolves that into a :data:`Backbone`: a factory that takes the fitted schema and the
embedding settings, which only the data module and the task know. A new backbone is one
``RankingModel`` subclass whose constructor starts with ``(schema, sparse_arch=None, ...)``;
nothing else lists backbones. :func:`resolve_backbone` does the same resolution for code that
reads a config outside the CLI (the dimension searches, the tuner).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Optional

from recsys.data.schema import Schema
from recsys.models.base import RankingModel, SparseArchConfig

__all__ = ["Backbone", "BackboneSpec", "backbone_class", "build_backbone", "resolve_backbone"]

#: What ``model.backbone`` resolves to: ``factory(schema, sparse_arch) -> RankingModel``.
#: (``Optional`` rather than ``| None``: jsonargparse evaluates this alias at run time.)
Backbone = Callable[[Schema, Optional[SparseArchConfig]], RankingModel]  # noqa: UP007, UP045

#: A backbone as a config holds it: ``{"class_path": ..., "init_args": {...}}``, a class path or
#: short class name, a ``RankingModel`` subclass, or an already resolved factory.
BackboneSpec = Mapping[str, Any] | str | type[RankingModel] | Backbone

#: the default backbone of ``model.backbone``
DEFAULT_BACKBONE = "recsys.models.DCNv2"


def resolve_backbone(spec: BackboneSpec | None, key: str = "model.backbone") -> Backbone:
    """The factory a backbone spec stands for, resolved and checked by jsonargparse.

    Raises:
        ValueError: an unknown class, a class that is not a ``RankingModel``, or an unknown or
            ill-typed argument; the message names ``key``.
    """
    from jsonargparse import ArgumentParser

    if spec is None:
        spec = {"class_path": DEFAULT_BACKBONE}
    if isinstance(spec, type):
        spec = {"class_path": f"{spec.__module__}.{spec.__qualname__}"}
    elif callable(spec):
        return spec
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--backbone", type=Backbone)
    try:
        parsed = parser.parse_object({"backbone": _plain(spec)})
        factory = parser.instantiate(parsed).backbone
    except Exception as e:  # jsonargparse raises ArgumentError / ValueError / TypeError
        raise ValueError(f"{key}: {_first_lines(str(e))}") from e
    return factory


def build_backbone(spec: BackboneSpec | None, schema: Schema, sparse_arch: SparseArchConfig | None = None) -> RankingModel:
    """Instantiate a backbone spec on a fitted schema (see :func:`resolve_backbone`)."""
    return resolve_backbone(spec)(schema, sparse_arch)


def backbone_class(spec: BackboneSpec | None) -> type[RankingModel]:
    """The ``RankingModel`` subclass a spec names (for its :meth:`~RankingModel.search_space`)."""
    factory = resolve_backbone(spec)
    if isinstance(factory, type):
        return factory
    # jsonargparse's factory is functools.partial(<instantiator>, <instantiator>, cls, **init_args)
    for arg in getattr(factory, "args", ()):
        if isinstance(arg, type) and issubclass(arg, RankingModel):
            return arg
    raise ValueError(f"cannot tell the backbone class of {factory!r}")


def _plain(spec: Any) -> Any:
    """A spec as plain containers (a Namespace from a parsed config is turned into dicts)."""
    if hasattr(spec, "as_dict"):
        return spec.as_dict()
    if isinstance(spec, Mapping):
        return {k: _plain(v) for k, v in spec.items()}
    return spec


def _first_lines(message: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return " ".join(lines[:n])
