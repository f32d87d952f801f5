"""Bad input the selection stage must handle clearly (the issue's list, across methods)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from recsys.train.recipe import Recipe
from selection import LeAP, OutRank, PermutationImportance
from selection.curve import parse_ks
from tests.selection.conftest import tiny_config


@pytest.fixture(scope="module")
def leaky_recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    """The synthetic data plus ``leak`` (= the label) written to a CSV with a schema file."""
    from recsys.data.synthetic import SyntheticConfig, generate

    root = tmp_path_factory.mktemp("leaky")
    raw, _ = generate(SyntheticConfig(n_rows=6000, seed=0, cardinality_scale=0.01, n_noise=1, n_noise_dense=0, embedding_dim=8))
    frame = raw.frame[["item_id", "site_category", "device_type", "noise_c2", "label"]].copy()
    frame["leak"] = frame["label"].astype(str)
    frame.to_csv(root / "leaky.csv", index=False)
    (root / "schema.yaml").write_text(
        "name: leaky\nlabel: label\nfeatures:\n"
        + "".join(f"  - {{name: {n}, kind: categorical, embedding_dim: 8}}\n" for n in ["item_id", "site_category", "device_type", "noise_c2", "leak"])
    )
    cfg = tiny_config()
    cfg["data"]["reader"] = {"class_path": "recsys.data.readers.TabularReader",
                             "init_args": {"path": str(root / "leaky.csv"), "schema": str(root / "schema.yaml")}}
    return Recipe(cfg, workdir=root / "fits", quiet=True)


@pytest.mark.parametrize("method", [OutRank(progress=False), PermutationImportance(repeats=2, tracking=False),
                                    LeAP(tracking=False)], ids=["outrank", "permutation", "leap"])
def test_feature_equal_to_label_is_flagged_not_ranked_first(leaky_recipe: Recipe, method) -> None:  # noqa: ANN001
    report = method.rank(leaky_recipe)
    assert "leak" in report.excluded and report.excluded["leak"].startswith("leakage")
    assert "leak" not in report.ranking and report.ranking[0] != "leak"
    assert sorted(report.ranking) == ["device_type", "item_id", "noise_c2", "site_category"]


def test_k_larger_than_the_number_of_features(leaky_recipe: Recipe) -> None:
    report = OutRank(progress=False).rank(leaky_recipe)
    with pytest.raises(ValueError, match=r"k=9 is out of range: outrank ranked 4 features \(1 more excluded"):
        report.top_k(9)
    with pytest.raises(ValueError, match="the ranking has 4 features"):
        parse_ks("2,9", len(report))


def test_single_class_label_is_refused(tmp_path: Path) -> None:
    from selection.model_free.outrank import rank_raw
    from selection.model_free.rawfiles import read_raw_file

    pd.DataFrame({"a": ["x", "y"] * 50, "label": [1] * 100}).to_csv(tmp_path / "one.csv", index=False)
    raw = read_raw_file(tmp_path / "one.csv")
    with pytest.raises(ValueError, match="single class"):
        rank_raw(raw, OutRank(progress=False))


# -- the command line, tried as a new user would ------------------------------------------------
@pytest.fixture()
def ragged(tmp_path: Path) -> Path:
    """A CSV whose lines 3 and 5 have too few fields."""
    path = tmp_path / "ragged.csv"
    path.write_text("a,b,label\n1,x,0\n3,y\n4,z,1\n6\n7,x,1\n8,y,0\n")
    return path


@pytest.mark.parametrize("command", [["quality"], ["quality", "--in-memory"], ["rank", "--method", "outrank"]])
def test_a_ragged_csv_is_one_line_naming_the_file_and_line(ragged: Path, command: list[str],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The project's reader, not pandas: the wrong field count with its line, as the message alone
    (exit code 2); --skip-bad-rows drops and counts the bad rows."""
    from experiments.cli import main

    assert main([*command, str(ragged), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"salience {command[0]}: error: {ragged}:3: expected 3 comma-separated fields, found 2" in err
    assert "Traceback" not in err and "--traceback" in err
    assert main([*command, str(ragged), "--no-progress", "--skip-bad-rows"]) == 0
    assert "features" in capsys.readouterr().out.lower()


def test_the_raw_reader_keeps_lines_and_counts_skipped_rows(ragged: Path) -> None:
    from selection.model_free.rawfiles import iter_raw_chunks, read_raw_file

    whole = read_raw_file(ragged, skip_bad_rows=True)
    assert list(whole.frame.index) == [2, 4, 6, 7] and whole.report.rows_skipped == 2
    assert whole.frame["label"].tolist() == [0, 1, 1, 0] and whole.frame["b"].tolist() == ["x", "z", "x", "y"]
    chunks = list(iter_raw_chunks(ragged, rows=2, skip_bad_rows=True))
    assert [i for c in chunks for i in c.frame.index] == [2, 4, 6, 7] and chunks[-1].report.rows_skipped == 2


@pytest.mark.parametrize("content, message", [("", "the file is empty"), ("a,label\n", "no data rows"),
                                              ("a,b\n1,2\n", "label column 'label' not found")])
def test_empty_files_and_a_missing_label_are_clear_errors(tmp_path: Path, content: str, message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    path = tmp_path / "data.csv"
    path.write_text(content)
    assert main(["quality", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "EmptyDataError" not in err


def test_a_missing_file_of_ones_own_is_named_without_the_data_folder_hint(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    assert main(["quality", str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err
    assert f"path not found: {tmp_path / 'missing.csv'}" in err and "SALIENCE_DATA_DIR" not in err


def test_a_mistyped_flag_is_an_error_naming_the_closest(ragged: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    for command in (["quality"], ["rank", "--method", "outrank"]):
        with pytest.raises(SystemExit) as stop:
            main([*command, str(ragged), "--lable", "label"])
        assert stop.value.code == 2
        assert "unrecognized argument '--lable'; did you mean --label?" in capsys.readouterr().err


def test_traceback_on_request_and_for_bugs(ragged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--traceback (or SALIENCE_TRACEBACK=1) shows an input error whole; an error that is not
    about the input (a bug) always keeps its traceback."""
    from experiments import cli
    from recsys.data.raw import DataError

    with pytest.raises(DataError, match="expected 3"):
        cli.main(["quality", str(ragged), "--no-progress", "--traceback"])
    monkeypatch.setenv("SALIENCE_TRACEBACK", "1")
    with pytest.raises(DataError):
        cli.main(["quality", str(ragged), "--no-progress"])
    monkeypatch.delenv("SALIENCE_TRACEBACK")

    def bug(argv: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setitem(cli.COMMANDS, "quality", (bug, "broken"))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["quality", str(ragged)])
