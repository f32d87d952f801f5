"""No untrusted pickles: a source scan of every load call, and a malicious checkpoint refused unrun.

What counts (see ``_violations``):

* ``torch.load`` must pass ``weights_only=True`` (explicitly: ``None`` follows torch's default,
  which ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns off); so must Lightning's
  ``load_from_checkpoint`` and a ``Trainer.fit/validate/test/predict`` call that names a
  ``ckpt_path`` (Lightning passes its ``weights_only`` on to ``torch.load``).
* no ``pickle``/``dill``/``cloudpickle`` ``load``/``loads``/``Unpickler``, ``joblib.load`` or
  ``read_pickle``;
* ``np.load`` only with ``allow_pickle`` left out (numpy's default is False) or False;
* no ``yaml.load``/``load_all``/``full_load``/``unsafe_load``: ``yaml.safe_load`` only.

``torch.jit.load`` is fine: a TorchScript archive holds code for the TorchScript interpreter
and tensors, not pickled Python objects that run on load.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("recsys", "selection", "embeddings", "generative", "experiments")

_PICKLERS = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle"}
_YAML_UNSAFE = {"load", "load_all", "full_load", "full_load_all", "unsafe_load", "unsafe_load_all"}
_TRAINER_METHODS = {"fit", "validate", "test", "predict"}

#: (file, call) pairs known to break a rule, each with the owner's reason; keep this empty
PENDING: dict[tuple[str, str], str] = {}


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of a Name/Attribute chain, None for anything else (calls, subscripts)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> qualified name, from the imports (``np`` -> ``numpy``, ``load`` -> ``torch.load``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_const(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _violations(source: str, filename: str = "<src>") -> list[tuple[int, str, str]]:
    """(line, call, why) of every unsafe load call in ``source``."""
    tree = ast.parse(source, filename)
    aliases = _aliases(tree)
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in _PICKLERS:
            for a in node.names:
                if a.name in {"load", "loads", "Unpickler", "*"}:
                    found.append((node.lineno, f"from {node.module} import {a.name}", "unpickles"))
        if not isinstance(node, ast.Call):
            continue
        dotted = _dotted(node.func)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        qual = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(head, head)
        module, _, attr = qual.rpartition(".")
        hidden = any(k.arg is None for k in node.keywords)  # **kwargs could carry anything
        why = None
        if qual in {"torch.load", "torch.serialization.load"} or attr == "load_from_checkpoint":
            if not _is_const(_kw(node, "weights_only"), True):
                why = "needs weights_only=True"
        elif attr in _TRAINER_METHODS and module and _kw(node, "ckpt_path") is not None:
            if not _is_const(_kw(node, "weights_only"), True):
                why = "loads ckpt_path: needs weights_only=True"
        elif module.split(".")[0] in _PICKLERS and attr in {"load", "loads", "Unpickler"}:
            why = "unpickles"
        elif qual == "joblib.load" or attr == "read_pickle":
            why = "unpickles"
        elif qual == "numpy.load":
            allow = _kw(node, "allow_pickle")
            if (allow is not None and not _is_const(allow, False)) or hidden:
                why = "np.load must not allow pickles"
        elif module == "yaml" and attr in _YAML_UNSAFE:
            why = "use yaml.safe_load"
        if why:
            found.append((node.lineno, dotted, why))
    return found


def _sources() -> list[tuple[str, str]]:
    """(relative path, source) of every Python file under the scanned folders."""
    return [
        (path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
        for top in SCANNED
        for path in sorted((ROOT / top).rglob("*.py"))
    ]


def test_scanner_catches_every_unsafe_form() -> None:
    bad = """
import pickle, yaml, joblib
import numpy as np
import torch
import pandas as pd
from torch import load
from pickle import loads
pickle.load(f)
pickle.loads(b)
pickle.Unpickler(f).load()
torch.load(p)
torch.load(p, weights_only=False)
load(p, map_location="cpu")
np.load(p, allow_pickle=True)
yaml.load(s)
yaml.load(s, Loader=yaml.SafeLoader)
yaml.unsafe_load(s)
yaml.full_load(s)
joblib.load(p)
pd.read_pickle(p)
Task.load_from_checkpoint(p)
trainer.fit(model, ckpt_path=p)
self.trainer.test(model, ckpt_path="best")
torch.load(p, **kw)
"""
    lines = sorted(line for line, _, _ in _violations(bad))
    assert lines == [7, *range(8, 25)], _violations(bad)
    good = """
import numpy as np, torch, yaml
torch.load(p, map_location="cpu", weights_only=True)
np.load(p, allow_pickle=False)
np.load(p)
yaml.safe_load(s)
torch.jit.load(p, map_location="cpu")
Task.load_from_checkpoint(p, weights_only=True)
trainer.fit(model, datamodule=dm)
trainer.test(model, ckpt_path="best", weights_only=True)
json.load(f)
"""
    assert _violations(good) == []


def test_no_unsafe_loads_in_the_code() -> None:
    sources = _sources()
    assert len(sources) > 50  # the scan really reads the project
    found = [
        f"{path}:{line}: {call}: {why}"
        for path, text in sources
        for line, call, why in _violations(text, path)
        if (path, call) not in PENDING
    ]
    assert not found, "unsafe load calls:\n" + "\n".join(found)


def test_pending_exceptions_are_still_needed() -> None:
    """An entry of PENDING that no longer matches anything must be removed."""
    seen = {(path, call) for path, text in _sources() for _, call, _ in _violations(text, path)}
    stale = [key for key in PENDING if key not in seen]
    assert not stale, f"remove these fixed entries from PENDING: {stale}"


# -- a malicious checkpoint is refused before anything runs -----------------------------------------
class _Evil:
    """Unpickling this creates ``marker`` (what an attacker's code would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _malicious(path: Path, marker: Path, fmt: str) -> Path:
    payload = {"state_dict": {}, "hyper_parameters": {"x": _Evil(marker)}, "CTRDataModule": {}}
    if fmt == "torch":  # torch.save's zip archive with a data.pkl inside
        torch.save(payload, path)
    else:  # a bare pickle stream (torch's legacy format)
        path.write_bytes(pickle.dumps(payload, protocol=2))
    assert not marker.exists()
    return path


@pytest.mark.parametrize("fmt", ["torch", "pickle"])
def test_load_checkpoint_refuses_a_malicious_pickle(tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from recsys.train.checkpoint import load_checkpoint

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # an explicit weights_only=True still wins
    marker = tmp_path / "pwned"
    path = _malicious(tmp_path / "evil.ckpt", marker, fmt)
    with pytest.raises(ValueError, match=r"evil\.ckpt: refused to load"):
        load_checkpoint(path)
    assert not marker.exists()


def test_load_checkpoint_damaged_files_are_a_clear_error(tmp_path: Path) -> None:
    from recsys.train.checkpoint import load_checkpoint

    for name, content in {"empty.ckpt": b"", "text.ckpt": b"not a checkpoint", "zip.ckpt": b"PK\x03\x04junk"}.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            load_checkpoint(tmp_path / name)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match=r"other\.ckpt: not a Lightning checkpoint"):
        load_checkpoint(tmp_path / "other.ckpt")


def test_generative_load_task_refuses_a_malicious_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from generative.train import load_task

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "pwned"
    path = _malicious(tmp_path / "evil.ckpt", marker, "torch")
    with pytest.raises(pickle.UnpicklingError):
        load_task(path)
    assert not marker.exists()
