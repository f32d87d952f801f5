"""CTRDataModule and checkpoints: a checkpoint whose encoders differ from the ones rebuilt from the
data (the data changed since it was written) is refused, naming the checkpoint and what changed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recsys.data.readers import TabularReader
from recsys.train.cli import SalienceCLI
from recsys.train.datamodule import CTRDataModule
from tests.recsys.train.test_cli import fit_args

SCHEMA = (
    "name: shop\nlabel: clicked\nfeatures:\n  - {name: user, embedding_dim: 8}\n  - {name: item, embedding_dim: 8}\n"
    "  - {name: price, kind: dense, transform: log1p}\n"
)


def _write(folder: Path, flip_users: bool = False, price_scale: float = 10.0, users: int = 20) -> tuple[Path, Path]:
    """400 rows; ``flip_users`` renames user k to user 19-k: the same vocabulary in another id order."""
    g = np.random.default_rng(0)
    lines = ["user,item,price,clicked"]
    for _ in range(400):
        user, item = int(g.integers(0, users) ** 2 // users), int(g.integers(0, 30))  # skewed: frequency order matters
        shown = users - 1 - user if flip_users else user
        lines.append(f"u{shown},i{item},{g.random() * price_scale:.2f},{int((user + item) % 3 == 0)}")
    folder.mkdir(parents=True, exist_ok=True)
    csv, schema = folder / "clicks.csv", folder / "schema.yaml"
    csv.write_text("\n".join(lines) + "\n")
    schema.write_text(SCHEMA)
    return csv, schema


def _csv_fit_args(root: Path, csv: Path, schema: Path, epochs: int, *extra: str) -> list[str]:
    """``salience fit`` arguments for the CSV of :func:`_write` (no export, no tracking)."""
    reader = f"{{class_path: recsys.data.readers.TabularReader, init_args: {{path: '{csv}', schema: '{schema}'}}}}"
    out = fit_args(root, "--data.reader", reader, "--after_fit.export", "false", "--tracking.enabled", "false",
                   "--model.early_stopping_patience", "0", *extra, epochs=epochs)
    i = out.index("--data.reader.init_args.n_rows")
    del out[i : i + 4]  # drop the synthetic reader's options
    return out


def _datamodule(csv: Path, schema: Path) -> CTRDataModule:
    return CTRDataModule(TabularReader(str(csv), str(schema)), batch_size=64, cache_dir=None)


def test_same_data_loads_and_changed_data_is_refused(tmp_path: Path) -> None:
    saved = _datamodule(*_write(tmp_path / "a")).state_dict()
    _datamodule(*_write(tmp_path / "same")).load_state_dict(saved)  # rebuilt identically: accepted
    flipped = _datamodule(*_write(tmp_path / "flipped", flip_users=True))
    with pytest.raises(ValueError, match=r"data changed since the checkpoint.*vocabulary of 'user'") as err:
        flipped.load_state_dict(saved)
    assert "item" not in str(err.value).split("data changed since the checkpoint")[1].split("Resume")[0]
    rescaled = _datamodule(*_write(tmp_path / "rescaled", price_scale=100.0))
    with pytest.raises(ValueError, match=r"statistics of the dense feature 'price'"):
        rescaled.load_state_dict(saved)
    _datamodule(*_write(tmp_path / "old")).load_state_dict({})  # a checkpoint without encoders: nothing to check


def test_checkpoint_holds_the_encoders_as_arrow_bytes_and_still_reads_the_older_forms(tmp_path: Path) -> None:
    import json

    from recsys.train.datamodule import saved_preprocessor, saved_preprocessor_state

    dm = _datamodule(*_write(tmp_path / "a"))
    state = dm.state_dict()
    assert isinstance(state["preprocessor_arrow"], bytes) and "preprocessor" not in state  # one object to pickle
    expected = json.loads(json.dumps(dm.preprocessor.state_dict()))
    assert saved_preprocessor_state(state) == expected
    back = saved_preprocessor(state)
    assert back is not None and back.state_dict() == dm.preprocessor.state_dict()
    assert back.fitted_schema == dm.preprocessor.fitted_schema
    as_json = {"preprocessor_json": json.dumps(dm.preprocessor.state_dict()), "summary": state["summary"]}
    older = {"preprocessor": dm.preprocessor.state_dict(), "summary": state["summary"]}  # checkpoints written before
    for form in (as_json, older):
        assert saved_preprocessor_state(form) == expected
    _datamodule(*_write(tmp_path / "same")).load_state_dict(older)
    _datamodule(*_write(tmp_path / "same2")).load_state_dict(state)
    with pytest.raises(ValueError, match=r"vocabulary of 'user'"):
        _datamodule(*_write(tmp_path / "flipped", flip_users=True)).load_state_dict(older)
    with pytest.raises(ValueError, match=r"vocabulary of 'user'"):
        _datamodule(*_write(tmp_path / "flipped2", flip_users=True)).load_state_dict(state)
    assert saved_preprocessor_state({"summary": {}}) is None


def test_resume_on_changed_data_is_refused_naming_the_checkpoint(tmp_cwd: Path) -> None:
    csv, schema = _write(tmp_cwd / "data")
    SalienceCLI(args=_csv_fit_args(tmp_cwd, csv, schema, 1))
    last = tmp_cwd / "run" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    _write(tmp_cwd / "data", flip_users=True)  # the same file, now with the users renamed
    with pytest.raises(ValueError, match=r"data changed since the checkpoint") as err:
        SalienceCLI(args=_csv_fit_args(tmp_cwd, csv, schema, 2, "--ckpt_path", str(last)))
    assert str(last) in str(err.value) and "vocabulary of 'user'" in str(err.value)


def test_resume_on_a_grown_vocabulary_is_the_clear_error_not_a_size_mismatch(tmp_cwd: Path) -> None:
    """Lightning loads the weights before the data module's state: the task checks the encoders first."""
    csv, schema = _write(tmp_cwd / "data")
    SalienceCLI(args=_csv_fit_args(tmp_cwd, csv, schema, 1))
    last = tmp_cwd / "run" / "checkpoints" / "last.ckpt"
    _write(tmp_cwd / "data", users=60)  # more users: the user table would have another size
    with pytest.raises(ValueError, match=r"data changed since the checkpoint.*vocabulary of 'user' \(\d+ tokens in the checkpoint"):
        SalienceCLI(args=_csv_fit_args(tmp_cwd, csv, schema, 2, "--ckpt_path", str(last)))
