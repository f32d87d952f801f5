"""MethodComparison's paired AUKC differences: computed once per pair of curves."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from recsys.stats import Interval
from selection.compare import MethodComparison


class _CountingCache:
    """Stands for a FitCache: each contrast answers a fresh interval and is counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def aukc_difference(self, plus: Any, minus: Any, level: float = 0.95) -> Interval:
        self.calls.append((plus, minus))
        return Interval(float(len(self.calls)), 0.0, 1.0, level, 0.1, "delong", 10)


def _curve(tag: str) -> Any:
    return SimpleNamespace(points=[tag], random={0: [f"{tag}-random"]})


def test_aukc_difference_is_kept_until_a_curve_changes() -> None:
    cache = _CountingCache()
    comparison = MethodComparison("d", curves={"a": _curve("a"), "b": _curve("b")}, cache=cache)  # type: ignore[arg-type]
    first = comparison.aukc_difference("a")
    assert comparison.aukc_difference("a") is first and len(cache.calls) == 1
    assert cache.calls[0] == ([["a"]], [["a-random"]])  # against that curve's random rankings
    versus_b = comparison.aukc_difference("a", "b")
    assert versus_b is not first and cache.calls[1] == ([["a"]], [["b"]])
    assert comparison.aukc_difference("a", "b", level=0.9) is not versus_b  # another level: another interval
    assert len(cache.calls) == 3
    comparison.curves["b"] = _curve("b2")  # a replaced curve is contrasted again
    assert comparison.aukc_difference("a", "b") is not versus_b and cache.calls[-1] == ([["a"]], [["b2"]])
    assert comparison.aukc_difference("a") is first  # a's own curve did not change
    assert comparison.aukc_difference("c") is None and comparison.aukc_difference("a", "c") is None
    assert MethodComparison("d", curves={"a": _curve("a")}).aukc_difference("a") is None  # no fits kept
