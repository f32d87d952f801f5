"""Sequence data: readers (tiny files and the real sets), leave-one-out, tail items, synthetic data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from generative.data import (
    LeaveOneOut,
    SequenceData,
    leave_one_out,
    load_sequences,
    synthetic_sequences,
    tail_items,
)
from recsys.data.raw import DataError
from tests.conftest import require_dataset


def _data(seqs: list[list[int]], num_items: int | None = None) -> SequenceData:
    catalogue = None if num_items is None else np.arange(1, num_items + 1)
    return SequenceData.from_raw("tiny", seqs, catalogue=catalogue)


def _reference_split(seqs: list[np.ndarray], t_max: int) -> dict[str, list]:
    """Leave-one-out with plain Python loops (the definition, row by row)."""

    def pad(h: list[int]) -> list[int]:
        h = h[-t_max:]
        return [0] * (t_max - len(h)) + h

    out: dict[str, list] = {k: [] for k in ("th", "tt", "vh", "vt", "sh", "st")}
    for s in seqs:
        s = [int(x) for x in s]
        for t in range(1, len(s) - 2):
            out["th"].append(pad(s[:t]))
            out["tt"].append(s[t])
        out["vh"].append(pad(s[:-2]))
        out["vt"].append(s[-2])
        out["sh"].append(pad(s[:-1]))
        out["st"].append(s[-1])
    return out


# ---------------------------------------------------------------------------------------------
# leave-one-out


def test_leave_one_out_golden() -> None:
    data = _data([[1, 2, 3, 4, 5], [3, 1, 2], [1, 2, 3, 4, 5, 6, 7]], num_items=7)
    split = leave_one_out(data, max_history=3)
    np.testing.assert_array_equal(
        split.train_history,
        [[0, 0, 1], [0, 1, 2],  # user 0: s[:1] -> 2, s[:2] -> 3
         [0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]],  # user 2 (user 1 has no training row)
    )  # fmt: skip
    np.testing.assert_array_equal(split.train_target, [2, 3, 2, 3, 4, 5])
    np.testing.assert_array_equal(split.valid_history, [[1, 2, 3], [0, 0, 3], [3, 4, 5]])
    np.testing.assert_array_equal(split.valid_target, [4, 1, 6])
    np.testing.assert_array_equal(split.test_history, [[2, 3, 4], [0, 3, 1], [4, 5, 6]])
    np.testing.assert_array_equal(split.test_target, [5, 2, 7])
    # training part items[:-2]: [1,2,3], [3], [1,2,3,4,5]
    np.testing.assert_array_equal(split.item_counts, [0, 2, 2, 3, 1, 1, 0, 0])
    assert split.num_items == 7 and split.max_history == 3


def test_leave_one_out_matches_reference_loop() -> None:
    data = synthetic_sequences(num_users=150, num_items=80, num_clusters=4, seed=3)
    for t_max in (1, 4, 20):
        split = leave_one_out(data, max_history=t_max)
        ref = _reference_split(data.sequences, t_max)
        for got, key in (
            (split.train_history, "th"),
            (split.train_target, "tt"),
            (split.valid_history, "vh"),
            (split.valid_target, "vt"),
            (split.test_history, "sh"),
            (split.test_target, "st"),
        ):
            np.testing.assert_array_equal(got, np.array(ref[key], dtype=np.int64).reshape(got.shape))
            assert got.dtype == np.int64
        train = np.concatenate([s[:-2] for s in data.sequences])
        np.testing.assert_array_equal(split.item_counts, np.bincount(train, minlength=data.num_items + 1))


def test_split_as_tensors() -> None:
    split = leave_one_out(_data([[1, 2, 3, 4], [2, 3, 4]]), max_history=5)
    history, target = split.as_tensors("train")
    assert history.dtype == torch.int64 and history.shape == (1, 5) and target.tolist() == [2]
    history, target = split.as_tensors("test")
    assert history.tolist() == [[0, 0, 1, 2, 3], [0, 0, 0, 2, 3]] and target.tolist() == [4, 4]
    with pytest.raises(ValueError, match="unknown split part 'dev'"):
        split.as_tensors("dev")


def test_leave_one_out_rejects_short_users() -> None:
    data = SequenceData.from_raw("tiny", [[1, 2, 3], [1, 2]], min_length=1)
    with pytest.raises(ValueError, match="user 1 has 2 items"):
        leave_one_out(data)
    with pytest.raises(ValueError, match="max_history"):
        leave_one_out(_data([[1, 2, 3]]), max_history=0)


# ---------------------------------------------------------------------------------------------
# tail items


def test_tail_items_golden() -> None:
    counts = np.array([0, 5, 1, 1, 3])  # total 10; ascending: items 2 (1), 3 (1), 4 (3), 1 (5)
    np.testing.assert_array_equal(tail_items(counts, 0.2), [False, False, True, True, False])
    np.testing.assert_array_equal(tail_items(counts, 0.5), [False, False, True, True, True])
    np.testing.assert_array_equal(tail_items(counts, 1.0), [False, True, True, True, True])
    np.testing.assert_array_equal(tail_items(np.array([0, 4, 0, 6]), 0.0), [False, False, True, False])
    with pytest.raises(ValueError, match="share"):
        tail_items(counts, 1.5)
    with pytest.raises(ValueError, match="non-negative"):
        tail_items(np.array([0, -1, 2]))


# ---------------------------------------------------------------------------------------------
# building from raw ids, bad input


def test_from_raw_remaps_and_counts() -> None:
    data = SequenceData.from_raw(
        "raw",
        [[30, 10, 20, 99], [20, 99], [10, 20, 30, 10]],
        catalogue=[30, 20, 10, 40],
        labels={10: "ten"},
        attributes={10: [7, 8], 20: [7], 555: [1]},
        titles={30: "thirty"},
    )
    assert data.num_items == 4
    assert data.item_labels == ["<pad>", "ten", "20", "30", "40"]  # index = rank of the raw id
    assert [s.tolist() for s in data.sequences] == [[3, 1, 2], [1, 2, 3, 1]]
    assert [a.tolist() for a in data.item_attributes] == [[], [7, 8], [7], [], []]
    assert data.item_titles == ["", "ten", "20", "thirty", "40"]
    assert data.report["unknown_items_dropped"] == 2  # the two 99s
    assert data.report["users_dropped_short"] == 1  # [20] after dropping 99
    assert data.report["items_without_interactions"] == 1  # 40
    assert data.report["attribute_items_unknown"] == 1  # 555
    assert data.report["items_without_attributes"] == 2
    assert (data.report["users"], data.report["interactions"]) == (2, 7)
    assert data.num_users == 2 and data.num_interactions == 7


def test_from_raw_bad_input() -> None:
    with pytest.raises(ValueError, match="catalogue is empty"):
        SequenceData.from_raw("x", [[1, 2, 3]], catalogue=[])
    with pytest.raises(ValueError, match="catalogue is empty"):
        SequenceData.from_raw("x", [])
    with pytest.raises(ValueError, match="no user has at least min_length=3"):
        SequenceData.from_raw("x", [[1, 2], [3]])
    with pytest.raises(ValueError, match="min_length"):
        SequenceData.from_raw("x", [[1, 2, 3]], min_length=0)
    with pytest.raises(ValueError, match="item_labels has 2 entries"):
        SequenceData("x", [np.array([1, 2, 3])], 3, ["<pad>", "a"])


# ---------------------------------------------------------------------------------------------
# Amazon reader on tiny files


def _amazon(
    root: Path, lines: list[str], attributes: dict | str | None = None, asin: list[str] | None = None, gz: bool = False
) -> Path:
    folder = root / "amazon-5core-s3rec"
    folder.mkdir(exist_ok=True)
    text = "".join(line + "\n" for line in lines).encode()
    if gz:
        (folder / "Beauty.txt.gz").write_bytes(gzip.compress(text))
    else:
        (folder / "Beauty.txt").write_bytes(text)
    if attributes is not None:
        raw = attributes if isinstance(attributes, str) else json.dumps(attributes)
        (folder / "Beauty_item2attributes.json").write_text(raw)
    if asin is not None:
        (folder / "Beauty_user_sequence_asin.txt").write_text("".join(line + "\n" for line in asin))
    return folder


def test_amazon_tiny(tmp_path: Path) -> None:
    folder = _amazon(
        tmp_path,
        ["1 1 2 3 4", "2 2 3 5", "3 4 1"],
        attributes={"1": [1, 2], "2": [2], "3": [3], "4": [1], "5": [4]},
        asin=["U1 A1 A2 A3 A4", "U2 A2 A3 A5", "U3 A4 A1"],
        gz=True,
    )
    data = load_sequences("beauty", data_dir=folder)
    assert data.item_labels == ["<pad>", "A1", "A2", "A3", "A4", "A5"]
    assert data.report["asin_labels"] == 1
    assert [s.tolist() for s in data.sequences] == [[1, 2, 3, 4], [2, 3, 5]]
    assert data.report["users_dropped_short"] == 1
    assert data.item_attributes is not None and data.item_attributes[1].tolist() == [1, 2]
    assert data.item_titles is None
    # the folder that holds amazon-5core-s3rec works too
    assert load_sequences("beauty", data_dir=tmp_path).num_items == 5


def test_amazon_asin_mismatch_falls_back_to_ids(tmp_path: Path) -> None:
    lines = ["1 1 2 3", "2 2 3 1"]
    folder = _amazon(tmp_path, lines, asin=["U2 A2 A3 A1", "U1 A1 A2 A3"])  # same lengths, other order
    data = load_sequences("beauty", data_dir=folder)
    assert data.item_labels == ["<pad>", "1", "2", "3"] and data.report["asin_labels"] == 0
    assert data.item_attributes is None
    folder = _amazon(tmp_path, lines, asin=["U1 A1 A2 A3", "U2 A2 A3"])  # different length
    assert load_sequences("beauty", data_dir=folder).report["asin_labels"] == 0


def test_amazon_bad_input(tmp_path: Path) -> None:
    folder = _amazon(tmp_path, ["1 1 2 3", "2 2 x 1"])
    with pytest.raises(DataError, match=r"Beauty\.txt:2: item id 'x' is not an integer"):
        load_sequences("beauty", data_dir=folder)
    folder = _amazon(tmp_path, ["1 1 2 3"], attributes={"one": [1]})
    with pytest.raises(DataError, match=r"item2attributes\.json: key 'one' is not an integer"):
        load_sequences("beauty", data_dir=folder)
    folder = _amazon(tmp_path, ["1 1 2 3"], attributes={"1": ["a"]})
    with pytest.raises(DataError, match="attributes must be a list of integers"):
        load_sequences("beauty", data_dir=folder)
    folder = _amazon(tmp_path, ["1 1 2 3"], attributes="{not json")
    with pytest.raises(DataError, match=r"item2attributes\.json:1: not valid JSON"):
        load_sequences("beauty", data_dir=folder)
    folder = _amazon(tmp_path, ["1 1 2 3"], attributes={"1": [1], "9": [2]})
    assert load_sequences("beauty", data_dir=folder).report["attribute_items_unknown"] == 1
    folder = _amazon(tmp_path, ["1", "2"])
    with pytest.raises(ValueError, match="catalogue is empty"):
        load_sequences("beauty", data_dir=folder)
    with pytest.raises(FileNotFoundError, match="Sports_and_Outdoors.txt"):
        load_sequences("sports", data_dir=folder)
    with pytest.raises(ValueError, match="unknown sequence dataset 'amazon'"):
        load_sequences("amazon", data_dir=folder)


# ---------------------------------------------------------------------------------------------
# MovieLens reader on tiny files


def _ml(root: Path, ratings: list[str], items: list[str] | None = None) -> Path:
    folder = root / "ml-100k"
    folder.mkdir(exist_ok=True)
    flags = {1: "0|0|0|1|1|1" + "|0" * 13, 2: "0|1" + "|0" * 17, 3: "0" * 1 + "|0" * 7 + "|1" + "|0" * 10}
    items = items or [f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|{flags[i]}" for i in (1, 2, 3)]
    (folder / "u.item").write_bytes("".join(line + "\n" for line in items).encode("latin-1"))
    (folder / "u.data").write_text("".join(line + "\n" for line in ratings))
    return folder


def test_ml100k_tiny(tmp_path: Path) -> None:
    folder = _ml(
        tmp_path,
        [
            "7\t3\t5\t100",
            "7\t2\t1\t50",
            "7\t1\t4\t100",
            "8\t1\t3\t10",
            "8\t2\t3\t20",
            "8\t3\t3\t30",
            "8\t9\t3\t40",
            "9\t1\t3\t1",
        ],
    )
    data = load_sequences("ml-100k", data_dir=folder)
    # user 7: ts 50 (item 2), then ts 100 twice -> item id order 1, 3
    assert [s.tolist() for s in data.sequences] == [[2, 1, 3], [1, 2, 3]]
    assert data.report["unknown_items_dropped"] == 1 and data.report["users_dropped_short"] == 1
    assert data.item_titles is not None
    assert data.item_titles[1] == "Movie 1 (1995) | Animation, Children's, Comedy"
    assert data.item_titles[3] == "Movie 3 (1995) | Drama"
    assert data.item_attributes is not None and data.item_attributes[2].tolist() == [1]


def test_ml100k_bad_input(tmp_path: Path) -> None:
    folder = _ml(tmp_path, ["7\t3\t5\t100", "7\t2\t1"])
    with pytest.raises(DataError, match=r"u\.data:2: expected 4 fields"):
        load_sequences("ml-100k", data_dir=folder)
    folder = _ml(tmp_path, ["7\t3\t5\t100", "7\tabc\t1\t5"])
    with pytest.raises(DataError, match=r"u\.data:2: field 'abc' is not an integer"):
        load_sequences("ml-100k", data_dir=folder)
    folder = _ml(tmp_path, ["7\t1\t5\t100"], items=["1|A|x||u|" + "|".join(["0"] * 19), "2|B|x||u|0|1"])
    with pytest.raises(DataError, match=r"u\.item:2: expected 24"):
        load_sequences("ml-100k", data_dir=folder)


# ---------------------------------------------------------------------------------------------
# synthetic data


def test_synthetic_is_deterministic_and_sized() -> None:
    a, b = synthetic_sequences(seed=5), synthetic_sequences(seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a.sequences, b.sequences))
    assert all(np.array_equal(x, y) for x, y in zip(a.item_attributes or [], b.item_attributes or []))
    c = synthetic_sequences(seed=6)
    assert not all(np.array_equal(x, y) for x, y in zip(a.sequences, c.sequences))
    assert (a.num_users, a.num_items) == (2000, 500)
    assert min(len(s) for s in a.sequences) >= 5
    assert load_sequences("synthetic").num_items == 500


def test_synthetic_planted_structure() -> None:
    data = synthetic_sequences()
    split = leave_one_out(data)
    cluster = np.array([-1] + [int(a[0]) for a in data.item_attributes[1:]])  # attribute c + 1 = cluster c
    assert set(cluster[1:]) == set(range(1, 11))
    prev = np.concatenate([s[:-1] for s in data.sequences])
    nxt = np.concatenate([s[1:] for s in data.sequences])
    assert (cluster[prev] == cluster[nxt]).mean() > 0.85  # users stay in a cluster
    # the next item is predictable: a bigram table (last item -> next) from training rows
    last = split.train_history[:, -1]
    table = np.zeros((data.num_items + 1, data.num_items + 1))
    np.add.at(table, (last, split.train_target), 1)
    top = np.argsort(-table, axis=1, kind="stable")[:, :10]
    bigram = (top[split.test_history[:, -1]] == split.test_target[:, None]).any(1).mean()
    popular = np.isin(split.test_target, np.argsort(-split.item_counts, kind="stable")[:10]).mean()
    assert bigram > 0.5 and bigram > 3 * popular
    # popularity skew: the tail (20% of interactions) holds many items
    assert tail_items(split.item_counts).sum() > 0.4 * data.num_items


def test_synthetic_bad_args() -> None:
    with pytest.raises(ValueError, match="num_items >= num_clusters"):
        synthetic_sequences(num_items=10, num_clusters=5, sub_clusters=4)


# ---------------------------------------------------------------------------------------------
# real data (counts from each folder's PROVENANCE.md)


@pytest.mark.data
@pytest.mark.parametrize(
    ("name", "users", "items", "interactions", "asin"),
    [("beauty", 22363, 12101, 198502, 1), ("sports", 35598, 18357, 296337, 1), ("toys", 19412, 11924, 167597, 0)],
)
def test_amazon_counts(data_dir: Path, name: str, users: int, items: int, interactions: int, asin: int) -> None:
    require_dataset(data_dir, "amazon-5core-s3rec")
    data = load_sequences(name, data_dir=data_dir)
    assert (data.num_users, data.num_items, data.num_interactions) == (users, items, interactions)
    assert data.report["users_dropped_short"] == 0 and data.report["unknown_items_dropped"] == 0
    assert data.report["items_without_attributes"] == 0 and data.report["asin_labels"] == asin
    assert min(len(s) for s in data.sequences) == 5
    split = leave_one_out(data)
    assert len(split.train_target) == interactions - 3 * users and len(split.test_target) == users
    if name == "beauty":
        assert data.item_labels[1] == "B004756YJA"  # first item of the first line (PROVENANCE: ids align)


@pytest.mark.data
def test_ml100k_counts(data_dir: Path) -> None:
    folder = require_dataset(data_dir, "ml-100k")
    data = load_sequences("ml-100k", data_dir=data_dir)
    assert (data.num_users, data.num_items, data.num_interactions) == (943, 1682, 100000)
    assert data.item_titles is not None and data.item_titles[1] == "Toy Story (1995) | Animation, Children's, Comedy"
    # user 1's sequence: u.data ratings of user 1 ordered by (timestamp, item)
    rows = np.loadtxt(folder / "u.data", dtype=np.int64)
    mine = rows[rows[:, 0] == 1]
    expected = mine[np.lexsort((mine[:, 1], mine[:, 3])), 1]
    np.testing.assert_array_equal(data.sequences[0], expected)  # raw movie ids are 1..1682 in order
    assert isinstance(leave_one_out(data), LeaveOneOut)
