"""Artifacts, results and reports are written atomically (a temporary file, then a rename), so a
crash never leaves a half-written file that a later stage or run would read.

A source scan finds every file write in the packages (``write_text``, ``write_bytes``,
``savefig``, ``torch.save``, ``np.save``, ``open(..., "w")``) and requires it to target a
temporary path (``recsys.io.atomic_path`` / ``atomic_dir`` name theirs ``tmp``) or an in-memory
buffer; the few exceptions are listed with their reason. A behavioural test checks the helpers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from recsys.io import atomic_path, atomic_savefig, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("recsys", "selection", "embeddings", "generative", "experiments")
#: (file, target) -> why a plain write is fine there
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("recsys/export/_loader_template.py", "args.outputs"): "a child process's output, read only after it exits with 0",
    ("generative/serving.py", "args.outputs"): "the same, in the generative loader",
    ("generative/serving.py", "inputs"): "a file in a TemporaryDirectory that only the child process reads",
    ("recsys/runtime.py", "'/proc/self/clear_refs'"): "a kernel control file (resets the peak RSS), not data",
    ("recsys/data/streaming/spill.py", "path"): "preparation's scratch copy of a chunk, in a folder deleted with the "
                                                  "preparation; a crash discards the folder and pass 1 writes it again",
}
_TEMPORARY = ("tmp", "buf")


def _target(call: ast.Call) -> str | None:
    """The written path's source text of a file-writing call, None for other calls."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in ("write_text", "write_bytes") and isinstance(func, ast.Attribute):
        return ast.unparse(func.value)
    if name == "savefig" and call.args:
        return ast.unparse(call.args[0])
    if name == "save" and isinstance(func, ast.Attribute) and ast.unparse(func.value) in ("torch", "np", "numpy"):
        return ast.unparse(call.args[1] if ast.unparse(func.value) == "torch" else call.args[0]) if call.args else None
    if name == "open" and isinstance(func, ast.Name) and call.args:
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax"):
            return ast.unparse(call.args[0])
    return None


def _plain_writes() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "recsys/io.py":  # the atomic helpers themselves
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
                if isinstance(node, ast.Call):
                    target = _target(node)
                    if target is None or any(t in target.lower() for t in _TEMPORARY):
                        continue
                    if (rel, target) not in EXCEPTIONS:
                        found.append(f"{rel}:{node.lineno}: writes {target} in place")
    return found


def test_every_file_write_goes_through_a_temporary_file() -> None:
    found = _plain_writes()
    assert not found, "use recsys.io.atomic_write_text / atomic_savefig / atomic_path:\n" + "\n".join(found)


def test_the_scan_sees_plain_writes(tmp_path: Path) -> None:
    tree = ast.parse("p.write_text('x')\nfig.savefig(out / 'a.png')\nopen(path, 'w')\ntorch.save(obj, path)\n"
                     "open(tmp, 'wb')\nfig.savefig(buf, format='png')\nopen(path)\n")
    targets = [_target(n) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [t for t in targets if t is not None] == ["p", "out / 'a.png'", "path", "path", "tmp", "buf"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half writ")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
    assert oct(target.stat().st_mode & 0o777) != oct(0o600)  # a normal file's mode, not mkstemp's


def test_atomic_savefig(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = atomic_savefig(fig, tmp_path / "plot.png", dpi=50)
    plt.close(fig)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_a_write_is_flushed_to_disk_before_and_after_its_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's bytes are fsynced before the rename, its folder after it: a power cut leaves
    the old file or the whole new one."""
    import os

    from recsys import io

    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(io.os, "fsync", lambda fd: (events.append(f"fsync {os.readlink(f'/proc/self/fd/{fd}')}"), real_fsync(fd))[1])
    monkeypatch.setattr(io.os, "replace", lambda a, b: (events.append(f"replace {b}"), real_replace(a, b))[1])
    target = tmp_path / "out" / "result.json"
    atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    assert [e.split()[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[0].split()[1].startswith(str(target.parent / ".result.json.")) and events[2] == f"fsync {target.parent}"


def test_an_export_folder_is_swapped_in_one_step_and_flushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replacing an export folder: every new file flushed, then one atomic exchange (Linux), so
    the name never points at nothing; the old folder's files are gone afterwards."""
    import os
    import sys

    from recsys import io

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").write_text("a"), (b / "y").write_text("b")
    if sys.platform.startswith("linux"):
        assert io._exchange(a, b)
        assert (a / "y").read_text() == "b" and (b / "x").read_text() == "a"  # swapped, both still there
    out = tmp_path / "export"
    out.mkdir()
    (out / "schema.json").write_text("old")
    (out / "old-only").write_text("old")
    flushed: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(io.os, "fsync", lambda fd: (flushed.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1])
    swaps: list[tuple[Path, Path]] = []
    real_exchange = io._exchange
    monkeypatch.setattr(io, "_exchange", lambda x, y: (swaps.append((x, y)), real_exchange(x, y))[1])
    with io.atomic_dir(out, "schema.json") as tmp:
        (tmp / "schema.json").write_text("new")
        (tmp / "model.pt").write_bytes(b"\0" * 10)
    assert (out / "schema.json").read_text() == "new" and not (out / "old-only").exists()
    assert len(swaps) == 1 and swaps[0][1] == out
    assert any(f.endswith("model.pt") for f in flushed) and str(tmp_path) in flushed  # files, then the parent folder
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".export.")] == []  # nothing left behind


def test_write_config_is_the_one_way_a_training_config_is_written(tmp_path: Path) -> None:
    """Comment lines on top, keys in order, paths and other objects as text; it reads back."""
    import yaml

    from recsys.io import write_config

    config = {"trainer": {"max_epochs": 2}, "data": {"reader": {"init_args": {"path": tmp_path / "x.csv"}}}, "a": [1, 2]}
    path = write_config(tmp_path / "c" / "reduced_config.yaml", config, "Reduced config: top-4\nWritten by: test")
    text = path.read_text()
    assert text.startswith("# Reduced config: top-4\n# Written by: test\ntrainer:")
    assert yaml.safe_load(text) == {"trainer": {"max_epochs": 2}, "a": [1, 2],
                                    "data": {"reader": {"init_args": {"path": str(tmp_path / "x.csv")}}}}
    writers = [p for p in ROOT.rglob("*.py") if p.parts[len(ROOT.parts)] in ("recsys", "selection", "embeddings", "experiments")
               and "yaml.safe_dump(" in p.read_text() and "reduced_config" in p.read_text()]
    assert writers == [ROOT / "recsys" / "io.py"], f"write reduced configs with recsys.io.write_config: {writers}"
