"""Old module names (before the sub-packages) still import, as the moved module itself, with a warning."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from recsys.moved import MOVED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_the_new_module_and_its_file_is_gone(old: str) -> None:
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()  # moved, not copied
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        assert importlib.import_module(old) is new
