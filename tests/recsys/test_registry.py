"""Registries list their built-in strategies before importing them, and import one when it is looked up."""

from __future__ import annotations

import importlib
import sys
from abc import ABC
from pathlib import Path
from typing import Any, ClassVar

import pytest

from embeddings.dims.base import DimensionSearch
from recsys.registry import Registered
from selection.base import ImportanceMethod


def test_a_built_in_is_listed_before_its_import_and_imported_when_looked_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "toy_builtin_greeter.py").write_text(
        "from tests.recsys.test_registry import Greeter\n\n"
        "class Hello(Greeter):\n    name = 'hello'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_builtin_greeter", raising=False)

    assert Greeter.registered_names() == ["hello"] and "toy_builtin_greeter" not in sys.modules
    hello = Greeter.create("hello")
    assert type(hello).__module__ == "toy_builtin_greeter" and "toy_builtin_greeter" in sys.modules
    assert Greeter.from_spec({"class_path": "hello"}, "greeter").__class__ is type(hello)
    with pytest.raises(ValueError, match=r"unknown greeter 'bye'; available: \['hello'\]"):
        Greeter.create("bye")


class Greeter(Registered, ABC):
    kind: ClassVar[str] = "greeter"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    _builtins: ClassVar[dict[str, str]] = {"hello": "toy_builtin_greeter"}


@pytest.mark.parametrize("root", [ImportanceMethod, DimensionSearch], ids=lambda r: r.__name__)
def test_every_built_in_name_is_registered_by_its_module(root: Any) -> None:
    for name, module in root._builtins.items():
        registered = root.registered_class(name)
        assert getattr(importlib.import_module(module), registered.__name__) is registered, name
        assert registered.name == name
