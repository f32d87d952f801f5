"""The artifact file helper (:mod:`recsys.artifacts`): suffix-chosen JSON/YAML, atomic writes,
errors that name the file, the format-version check and the export header."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from recsys.artifacts import (
    ArtifactError,
    artifact_format,
    check_format_version,
    dump_artifact,
    export_header,
    plain,
    read_artifact,
    write_artifact,
)
from recsys.data.schema import FeatureKind, FeatureSpec, Schema, SchemaError

DATA = {"format_version": 1, "name": "x", "dims": {"user": 8, "item": 12}, "extras": {"curve": [0.5, None]}}


@pytest.mark.parametrize(("name", "fmt"), [("a.json", "json"), ("a.yaml", "yaml"), ("a.YML", "yaml"), ("a.txt", "json")])
def test_round_trip_by_suffix(tmp_path: Path, name: str, fmt: str) -> None:
    path = write_artifact(tmp_path / name, DATA)
    assert artifact_format(path) == fmt and not list(tmp_path.glob(".*.tmp"))  # atomic: no temporary left
    text = path.read_text(encoding="utf-8")
    parsed = yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    assert parsed == DATA and list(parsed) == list(DATA)  # key order kept
    assert read_artifact(path, "thing") == DATA
    assert text.endswith("\n")


def test_default_format_for_other_suffixes(tmp_path: Path) -> None:
    path = write_artifact(tmp_path / "settings.cfg", DATA, default_format="yaml")
    assert yaml.safe_load(path.read_text()) == DATA and path.read_text().startswith("format_version: 1\n")
    assert read_artifact(path, "thing", default_format="yaml") == DATA
    with pytest.raises(ArtifactError, match="invalid JSON"):
        read_artifact(path, "thing")


def test_json_refuses_nan_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_artifact(tmp_path / "a.json", {"x": float("nan")})
    path = write_artifact(tmp_path / "a.json", {"x": float("nan")}, allow_nan=True)
    assert math.isnan(read_artifact(path, "thing")["x"])


@pytest.mark.parametrize("rows", [[[1, 2], [3, 4], [5, 6]], []])
def test_rows_key_writes_one_row_per_line(tmp_path: Path, rows: list[list[int]]) -> None:
    data = {"format": "t", "num": len(rows), "codes": rows}
    text = dump_artifact(data, "json", rows_key="codes")
    assert json.loads(text) == data and text.endswith("}\n")
    lines = [ln.rstrip(",") for ln in text.splitlines()]
    assert all(f"    {json.dumps(r)}" in lines for r in rows)
    assert json.loads(dump_artifact({"codes": rows}, "json", rows_key="codes")) == {"codes": rows}


def test_read_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"widget not found: .*nope\.json"):
        read_artifact(tmp_path / "nope.json", "widget")
    cases = {
        "bad.json": ("{not json", r"bad\.json: not a widget \(invalid JSON at line 1: "),
        "bad.yaml": ("a: [1,\n", r"(?s)bad\.yaml: not a widget \(invalid YAML: .*line 2"),
        "list.json": ("[1, 2]", r"list\.json: not a widget \(expected a mapping at the top level, got list\)"),
        "empty.yaml": ("", r"empty\.yaml: not a widget \(expected a mapping at the top level, got NoneType\)"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SchemaError, match=message):
            read_artifact(tmp_path / name, "widget", SchemaError)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ArtifactError, match=r"binary\.json: not an item \(not UTF-8 text\)"):
        read_artifact(tmp_path / "binary.json", "item")


def test_read_checks_keys_and_marker(tmp_path: Path) -> None:
    path = write_artifact(tmp_path / "a.json", {"format": "other", "method": "m"})
    with pytest.raises(ArtifactError, match=r"needs 'method' and 'features'; missing \['features'\]"):
        read_artifact(path, "report", required=("method", "features"))
    with pytest.raises(ArtifactError, match=r"needs 'dims', 'blocks' or 'clusters'"):
        read_artifact(path, "plan", any_of=("dims", "blocks", "clusters"))
    with pytest.raises(ArtifactError, match=r"expected \"format\": 'salience-codebook'"):
        read_artifact(path, "codebook file", marker=("format", "salience-codebook"))
    assert read_artifact(path, "thing", required=("method",), marker=("format", "other"))["method"] == "m"


def test_check_format_version() -> None:
    assert check_format_version({}, 2, "f.json", "plan") == 2
    assert check_format_version({"format_version": 1}, 2, "f.json", "plan") == 1
    assert check_format_version({"format_version": 1.0}, 2, "f.json", "plan") == 1
    with pytest.raises(ArtifactError, match=r"f\.json: plan format 3 is newer than this Salience reads \(2\)"):
        check_format_version({"format_version": 3}, 2, "f.json", "plan")
    for bad in ("1", True, 0, 1.5):
        with pytest.raises(ValueError, match=r"plan format version .* is not one this Salience reads \(1\.\.2\)"):
            check_format_version({"format_version": bad}, 2, "f.json", "plan", ValueError)
    with pytest.raises(ArtifactError, match="format version None"):
        check_format_version({}, 2, "f.json", "codebook", required=True)


def test_plain_values() -> None:
    got = plain({1: (np.float32(0.5), np.int64(3)), "a": np.array([[1.0, np.nan]]), "t": torch.tensor([2, 3]),
                 "p": Path("x/y"), "inf": float("inf"), "b": np.bool_(True), "s": "text"})
    assert got == {"1": [0.5, 3], "a": [[1.0, None]], "t": [2, 3], "p": "x/y", "inf": None, "b": True, "s": "text"}
    assert type(got["1"][1]) is int and json.loads(json.dumps(got, allow_nan=False)) == got


def test_export_header_fields_and_order() -> None:
    import recsys

    header = export_header("salience-test-export", torch.nn.Linear(1, 1))
    assert list(header) == ["format", "salience_version", "torch_version", "created", "model_class"]
    assert header["format"] == "salience-test-export" and header["model_class"] == "Linear"
    assert header["salience_version"] == recsys.__version__ and header["torch_version"] == torch.__version__


def _schema() -> Schema:
    return Schema(
        (FeatureSpec("u", embedding_dim=4), FeatureSpec("g", FeatureKind.MULTI_CATEGORICAL), FeatureSpec("s", FeatureKind.DENSE)),
        name="rich",
        extras={"note": "héllo", "nested": {"a": [1, 2]}},
    )


def test_schema_files_written_before_the_helper_still_load(tmp_path: Path) -> None:
    """The exact bytes the old ``Schema.save`` wrote (JSON without a final newline)."""
    schema = _schema()
    (tmp_path / "old.json").write_text(json.dumps(schema.to_dict(), indent=2))
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(schema.to_dict(), sort_keys=False))
    assert Schema.load(tmp_path / "old.json") == schema and Schema.load(tmp_path / "old.yaml") == schema
    schema.save(tmp_path / "new.yaml")
    assert (tmp_path / "new.yaml").read_text() == (tmp_path / "old.yaml").read_text()  # YAML unchanged
    schema.save(tmp_path / "new.json")
    assert (tmp_path / "new.json").read_text() == (tmp_path / "old.json").read_text() + "\n"


def test_committed_schema_fixture_loads() -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_tabular_schema.yaml"
    assert Schema.load(fixture).names


def test_schema_load_errors_are_schema_errors(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text("{")
    with pytest.raises(SchemaError, match=r"s\.json: not a schema file \(invalid JSON"):
        Schema.load(tmp_path / "s.json")
    with pytest.raises(FileNotFoundError, match=r"schema file not found: .*gone\.yaml"):
        Schema.load(tmp_path / "gone.yaml")
