"""A ``salience fit`` config as a plain dict: dotted keys, command-line overrides and the
``--key=value`` arguments a trial's fit gets."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["cli_args", "resolved_config", "set_nested", "simple_overrides"]


def set_nested(config: dict[str, Any], dotted: str, value: Any) -> bool:
    """Set ``config[a][b] = value`` for ``dotted = "a.b"`` (missing levels are created); False
    when a level on the way is not a mapping."""
    node = config
    *parents, last = dotted.split(".")
    for key in parents:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            return False
        node = child
    node[last] = value
    return True


def simple_overrides(overrides: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``--a.b=v`` / ``--a.b v`` command-line overrides -> ``{"a.b": v}`` (YAML-parsed), plus
    the ones that are not of that form."""
    import yaml

    out: dict[str, Any] = {}
    other: list[str] = []
    items = list(overrides)
    i = 0
    while i < len(items):
        item = items[i]
        if item.startswith("--") and "=" in item:
            key, value = item[2:].split("=", 1)
        elif item.startswith("--") and i + 1 < len(items) and not items[i + 1].startswith("--"):
            key, value = item[2:], items[i + 1]
            i += 1
        else:
            other.append(item)
            i += 1
            continue
        i += 1
        if key.endswith("+") or key in ("config", "print_config"):
            other.append(f"--{key}={value}")
            continue
        out[key] = yaml.safe_load(value)
    return out, other


def resolved_config(config_path: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """The config file with its simple ``--key=value`` overrides applied."""
    import yaml

    config = yaml.safe_load(config_path.read_text()) or {}
    simple, _ = simple_overrides(overrides)
    for key, value in simple.items():
        set_nested(config, key, value)
    return config


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".12e")  # always a YAML float (``1e-05`` would read as a string)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def cli_args(updates: Mapping[str, Any]) -> list[str]:
    """``{dotted key: value}`` as ``--key=value`` command-line arguments."""
    return [f"--{key}={_cli_value(value)}" for key, value in updates.items()]
