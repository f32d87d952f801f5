"""Registered strategy classes: ``salience rank --method leap`` and friends look classes up by name.

A root base class derives from :class:`Registered` and declares its own ``_registry``; every
subclass that sets a class attribute ``name`` is registered in it::

    class ImportanceMethod(Registered, ABC):
        kind = "importance method"
        _registry = {}

    class LeAP(ImportanceMethod):
        name = "leap"

    ImportanceMethod.create("leap", penalty=1e-3)

>>> from abc import ABC
>>> class Greeter(Registered, ABC):
...     kind = "greeter"
...     _registry = {}
>>> class Hello(Greeter):
...     name = "hello"
...     def __init__(self, who: str = "world") -> None:
...         self.who = who
>>> Greeter.registered_names(), Greeter.create("hello", who="you").who
(['hello'], 'you')
>>> Greeter.create("bye")
Traceback (most recent call last):
ValueError: unknown greeter 'bye'; available: ['hello']
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any, ClassVar

__all__ = ["Registered"]


class Registered:
    """Mixin of strategy base classes with a name registry (see the module docstring)."""

    name: ClassVar[str]
    #: what the registered classes are, for error messages
    kind: ClassVar[str] = "strategy"
    _registry: ClassVar[dict[str, type[Registered]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            cls._registry[name] = cls

    @classmethod
    def registered_names(cls) -> list[str]:
        return sorted(cls._registry)

    @classmethod
    def registered_class(cls, name: str) -> type[Any]:
        """The class registered as ``name`` (for class-level hooks); unknown names list the known ones."""
        if name not in cls._registry:
            raise ValueError(f"unknown {cls.kind} {name!r}; available: {cls.registered_names()}")
        return cls._registry[name]

    @classmethod
    def create(cls, name: str, **options: Any) -> Any:
        """Instantiate the class registered as ``name``; unknown names list the known ones."""
        return cls.registered_class(name)(**options)

    def describe(self) -> dict[str, Any]:
        """The settings (enum values as plain values): a dataclass's fields, else public attributes."""
        if is_dataclass(self):
            return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(self).items()}
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
