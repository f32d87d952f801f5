"""Tests of :mod:`recsys.train.manual`: the Lightning fit of manually optimised phases (the
dimension searches' training path): batch order per epoch and offset, the batch cap counted in
batches (not optimizer steps), ordinary training equal to a hand-written loop, and the global
RNG left to the model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from recsys.data.batching import BatchDataset
from recsys.data.encoders import EncodedData
from recsys.train.manual import ManualTask, bce_loss, fit_split


def make_data(n: int = 10) -> EncodedData:
    """``n`` rows whose one dense feature is the row index (so a batch names its rows)."""
    rng = np.random.default_rng(0)
    return EncodedData(
        sparse_names=["f"],
        dense_names=["row"],
        values={"f": rng.integers(0, 5, n).astype(np.int64)},
        lengths={"f": np.ones(n, dtype=np.int32)},
        dense=np.arange(n, dtype=np.float32)[:, None],
        labels=(np.arange(n) % 2).astype(np.float32),
    )


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
        return self.layer(dense).squeeze(1)


class TwoStepRecorder(ManualTask):
    """Two optimizer steps per batch (as DNIS's bi-level phase); records each batch's rows."""

    def __init__(self) -> None:
        model = Linear()
        super().__init__(model, [torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)])
        self.seen: list[list[int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.seen.append(batch.dense_features[:, 0].long().tolist())
        for opt in self.step_optimizers():
            self.take_step(opt, bce_loss(self.model, batch))


def order(data: EncodedData, epoch: int, seed: int, batch_size: int) -> list[list[int]]:
    ds = BatchDataset(data, batch_size, shuffle=True, seed=seed)
    ds.set_epoch(epoch)
    return [b.dense_features[:, 0].long().tolist() for b in ds]


def test_batches_follow_the_seeded_order_from_the_offset_and_the_cap_counts_batches() -> None:
    data = make_data(10)  # 3 batches of 4, 4, 2 rows per epoch
    task = TwoStepRecorder()
    ran = fit_split(task, data, batch_size=4, epochs=3, seed=7, epoch_offset=2, max_batches=5)
    assert ran == 5 and len(task.seen) == 5  # 10 optimizer steps, 5 batches
    assert task.seen == order(data, 2, 7, 4) + order(data, 3, 7, 4)[:2]
    assert order(data, 2, 7, 4) != order(data, 3, 7, 4)

    uncapped = TwoStepRecorder()
    assert fit_split(uncapped, data, batch_size=4, epochs=2, seed=7) == 6
    assert uncapped.seen == order(data, 0, 7, 4) + order(data, 1, 7, 4)


def test_ordinary_training_equals_a_hand_written_loop_and_leaves_the_global_rng() -> None:
    data = make_data(10)
    torch.manual_seed(0)
    model = Linear()
    reference = Linear()
    reference.load_state_dict(model.state_dict())
    task = ManualTask(model, [torch.optim.Adam(model.parameters(), lr=0.05)])
    rng = torch.get_rng_state()
    assert fit_split(task, data, batch_size=3, epochs=2, seed=1, max_batches=7) == 7
    assert torch.equal(torch.get_rng_state(), rng), "the loader must not draw from the global torch RNG"

    opt = torch.optim.Adam(reference.parameters(), lr=0.05)
    steps = 0
    for epoch in range(2):
        ds = BatchDataset(data, 3, shuffle=True, seed=1)
        ds.set_epoch(epoch)
        for batch in ds:
            if steps >= 7:
                break
            opt.zero_grad(set_to_none=True)
            bce_loss(reference, batch).backward()
            opt.step()
            steps += 1
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options", [{"epochs": 0}, {"epochs": 2, "max_batches": 0}])
def test_no_epoch_or_no_batch_trains_nothing(options: dict[str, Any]) -> None:
    task = TwoStepRecorder()
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    assert fit_split(task, make_data(10), batch_size=4, seed=0, **options) == 0
    assert task.seen == [] and all(torch.equal(before[k], v) for k, v in task.model.state_dict().items())


def test_a_task_needs_an_optimizer_and_epochs_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one optimizer"):
        ManualTask(Linear(), [])
    with pytest.raises(ValueError, match="epochs must be >= 0"):
        fit_split(TwoStepRecorder(), make_data(4), batch_size=2, epochs=-1, seed=0)
