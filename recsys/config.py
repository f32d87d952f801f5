"""Plug-ins in their config form: ``{"class_path": ..., "init_args": {...}}``.

LightningCLI resolves ``class_path``/``init_args`` into objects (a backbone factory, an optimizer
callable, a seam transform) and records the config form as the task's hyperparameters. A task
built in Python gets the objects themselves; :func:`as_spec` turns them back into the config
form, so hyperparameters (and checkpoints) hold plain containers only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["as_spec", "class_path", "from_spec", "import_path", "optimizer_lr"]

_PLAIN = (str, int, float, bool, type(None))


def class_path(cls: type) -> str:
    """``module.QualName`` of a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def as_spec(value: Any) -> Any:
    """The config form of a plug-in value (plain values and mappings are returned unchanged).

    * a class -> ``{"class_path": ...}``;
    * a partial of a class (what jsonargparse makes of a ``Callable`` type with ``init_args``,
      or ``functools.partial(torch.optim.Adam, lr=...)``) -> class path plus its keywords;
    * an instance -> its class path plus the constructor arguments it keeps as attributes of
      the same name.

    Raises:
        TypeError: a value that has no config form (a lambda, a plain function).
    """
    if isinstance(value, _PLAIN) or isinstance(value, Mapping) or isinstance(value, (list, tuple)):
        return value
    if isinstance(value, type):
        return {"class_path": class_path(value)}
    if isinstance(value, functools.partial):
        cls = next((a for a in (value.func, *value.args) if isinstance(a, type)), None)
        if cls is None:
            raise TypeError(f"{value!r} is not a partial of a class: it has no config form")
        return {"class_path": class_path(cls), "init_args": dict(value.keywords)}
    if callable(value) and not hasattr(value, "__dict__"):
        raise TypeError(f"{value!r} has no config form")
    if inspect.isfunction(value) or inspect.ismethod(value):
        raise TypeError(f"{value!r} is a function, not a class: it has no config form")
    cls = type(value)
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    init_args = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or not hasattr(value, p.name):
            continue
        attr = getattr(value, p.name)
        init_args[p.name] = attr.value if hasattr(attr, "value") and not isinstance(attr, _PLAIN) else attr
    return {"class_path": class_path(cls), "init_args": init_args}


def import_path(path: str, key: str) -> Any:
    """The object ``module.Name`` names; a ValueError naming ``key`` when it cannot be imported."""
    import importlib

    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{key}: cannot import {path!r} ({e})") from e


def from_spec(value: Any, key: str) -> Any:
    """The inverse of :func:`as_spec` for a callable plug-in (an optimizer): a ``{"class_path": ...,
    "init_args": {...}}`` becomes ``functools.partial(cls, **init_args)``; a callable is returned
    unchanged. Errors name ``key``.

    >>> from_spec({"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.01}}, "model.optimizer").keywords
    {'lr': 0.01}
    """
    if callable(value):
        return value
    if not isinstance(value, Mapping) or "class_path" not in value:
        raise ValueError(f"{key}: expected a class or {{class_path: ..., init_args: {{...}}}}, got {value!r}")
    cls = import_path(str(value["class_path"]), key)
    return functools.partial(cls, **dict(value.get("init_args") or {}))


def optimizer_lr(model_config: Mapping[str, Any], default: float = 1e-3) -> float:
    """The learning rate a ``model:`` config section gives its optimizer (``optimizer.init_args.lr``)."""
    optimizer = model_config.get("optimizer")
    args = optimizer.get("init_args") if isinstance(optimizer, Mapping) else None
    return float((args or {}).get("lr", default))
