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

A config names a strategy by its registered name or the LightningCLI way, by class path (any
subclass, registered or not) with its constructor arguments (:data:`StrategySpec`):

>>> Greeter.from_spec({"class_path": "hello", "init_args": {"who": "config"}}, "greeter").who
'config'
>>> Greeter.from_spec({"class_path": "hello", "init_args": {"whom": "x"}}, "model.greeter")
Traceback (most recent call last):
ValueError: model.greeter.init_args: unknown argument(s) ['whom'] of Hello; it takes ['who']
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, ClassVar, Union

__all__ = ["Plugin", "Registered", "StrategySpec"]


@dataclass(frozen=True)
class Plugin:
    """A strategy as a config names it: ``class_path`` (a registered name or ``module.Class`` of
    any subclass) and its constructor arguments ``init_args``.

    >>> Plugin.parse({"class_path": "multi", "init_args": {"rate": 0.001}})
    Plugin(class_path='multi', init_args={'rate': 0.001})
    >>> Plugin.parse("{class_path: sasrec, init_args: {dim: 32}}", text=True).to_config()
    {'class_path': 'sasrec', 'init_args': {'dim': 32}}
    >>> Plugin.parse("sid").to_config()
    'sid'
    """

    class_path: str
    init_args: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any, text: bool = False) -> Plugin:
        """A name, a ``{class_path, init_args}`` mapping or a Plugin; with ``text``, a string may
        also hold that mapping in YAML (a command-line value). ValueError for anything else."""
        if isinstance(value, Plugin):
            return value
        if isinstance(value, str) and text and value.lstrip().startswith("{"):
            import yaml

            value = yaml.safe_load(value)
        if isinstance(value, str) and value:
            return cls(value)
        if isinstance(value, Mapping) and "class_path" in value and not set(value) - {"class_path", "init_args"}:
            return cls(str(value["class_path"]), dict(value.get("init_args") or {}))
        raise ValueError(f"expected a name or {{class_path: ..., init_args: {{...}}}}, got {value!r}")

    def to_config(self) -> str | dict[str, Any]:
        """The plain config form (the name alone when there are no arguments)."""
        return {"class_path": self.class_path, "init_args": dict(self.init_args)} if self.init_args else self.class_path


#: What a config or a caller may give for a strategy: a :class:`Plugin`, a registered name or the
#: plain ``{"class_path": ..., "init_args": {...}}`` mapping (``Union``: jsonargparse reads it at run time)
StrategySpec = Union[Plugin, str, Mapping[str, Any]]  # noqa: UP007


class Registered:
    """Mixin of strategy base classes with a name registry (see the module docstring)."""

    name: ClassVar[str]
    #: what the registered classes are, for error messages
    kind: ClassVar[str] = "strategy"
    _registry: ClassVar[dict[str, type[Registered]]]
    #: built-in names -> the module that defines (and, imported, registers) each: listed before
    #: they are imported and imported when first looked up, so that a command using one light
    #: strategy does not import the heavy ones (a root base class sets it)
    _builtins: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            cls._registry[name] = cls

    @classmethod
    def registered_names(cls) -> list[str]:
        return sorted({*cls._builtins, *cls._registry})

    @classmethod
    def registered_class(cls, name: str) -> type[Any]:
        """The class registered as ``name`` (for class-level hooks; a built-in one is imported
        here); unknown names list the known ones."""
        if name not in cls._registry and name in cls._builtins:
            importlib.import_module(cls._builtins[name])
        if name not in cls._registry:
            raise ValueError(f"unknown {cls.kind} {name!r}; available: {cls.registered_names()}")
        return cls._registry[name]

    @classmethod
    def create(cls, name: str, **options: Any) -> Any:
        """Instantiate the class registered as ``name``; unknown names list the known ones."""
        return cls.registered_class(name)(**options)

    @classmethod
    def resolve_spec(cls, spec: StrategySpec, key: str, init: str = "__init__") -> tuple[type[Any], dict[str, Any]]:
        """The class and constructor arguments a spec names, checked: the class is a subclass of
        this base, every argument is a parameter of its ``init`` method (unless it takes
        ``**kwargs``). Errors name ``key`` (the config key of the spec)."""
        try:
            plugin = Plugin.parse(spec)
        except ValueError:
            raise ValueError(f"{key}: expected a {cls.kind} name or {{class_path: ..., init_args: {{...}}}}, got {spec!r}") from None
        path = plugin.class_path
        if path in cls._registry or path in cls._builtins:
            klass: Any = cls.registered_class(path)
        elif "." in path:
            from recsys.config import import_path

            klass = import_path(path, key)
        else:
            raise ValueError(f"{key}: unknown {cls.kind} {path!r}; available: {cls.registered_names()} or a class path")
        if not (isinstance(klass, type) and issubclass(klass, cls)):
            raise ValueError(f"{key}: {path!r} is not a {cls.kind} (a subclass of {cls.__name__})")
        args = dict(plugin.init_args)
        params = inspect.signature(getattr(klass, init)).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            names = [p.name for p in params if p.name not in ("self", "cls") and p.kind is not p.VAR_POSITIONAL]
            unknown = sorted(set(args) - set(names))
            if unknown:
                raise ValueError(f"{key}.init_args: unknown argument(s) {unknown} of {klass.__name__}; it takes {names}")
        return klass, args

    @classmethod
    def from_spec(cls, spec: StrategySpec, key: str) -> Any:
        """Instantiate a spec (:meth:`resolve_spec`); a constructor's own error is raised naming ``key``."""
        klass, args = cls.resolve_spec(spec, key)
        try:
            return klass(**args)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{key}: {e}") from e

    def describe(self) -> dict[str, Any]:
        """The settings (enum values as plain values): a dataclass's fields, else public attributes."""
        if is_dataclass(self):
            return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(self).items()}
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
