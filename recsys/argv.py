"""Command-line helpers shared by the ``salience`` subcommands built on training recipes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["parse_options", "split_passthrough"]


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``[own..., "--", passthrough...]`` -> (own, passthrough): what follows ``--`` goes to
    every ``salience fit`` the command runs."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` (``--option`` flags) -> dict, values parsed as YAML (numbers, lists, ...)."""
    import yaml

    options: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--option expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        options[key.strip()] = yaml.safe_load(value)
    return options
