"""The gate-based selectors' seams (AdaFS, LPFS++) against their formulas, on plain tensors; the
contract over every registered method trains them on the synthetic recipe
(tests/selection/test_contract.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selection.model_based.adafs import AdaFS, AdaFSSeam
from selection.model_based.lpfs import LPFS, LPFSSeam, lpfs_gate


def _fields(b: int = 32, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(b, 4, generator=g), "b": torch.randn(b, 2, generator=g) * 3}, torch.randn(b, 2, generator=g)


def test_lpfs_gate_matches_its_formula_and_is_odd() -> None:
    x = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.0, 4.0])
    for eps in (0.1, 0.01):
        want = [(v * v / (v * v + eps)) * (1 if v > 0 else -1) + 10 * eps**0.5 * math.atan(v) for v in x.tolist()]
        np.testing.assert_allclose(lpfs_gate(x, eps).numpy(), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(lpfs_gate(-x, eps).numpy(), -lpfs_gate(x, eps).numpy(), atol=1e-7)
    assert float(lpfs_gate(torch.tensor(1.0), 0.1)) == pytest.approx(1 / 1.1 + 10 * math.sqrt(0.1) * math.pi / 4, rel=1e-6)


def test_lpfs_seam_scales_fields_decays_epsilon_and_takes_proximal_steps() -> None:
    seam = LPFSSeam(learning_rate=0.1, epsilon=0.1, decay=0.5, decay_every=2, proximal=0.5)
    seam.bind(["a", "b"], [4, 2], ["d0", "d1"])
    sparse, dense = _fields()
    with torch.no_grad():
        seam.x.copy_(torch.tensor([1.0, -0.5, 0.02, 2.0]))
    seam.train()
    out, dense_out = seam(sparse, dense)
    g = lpfs_gate(seam.x.detach(), 0.1)
    torch.testing.assert_close(out["a"], sparse["a"] * g[0])
    torch.testing.assert_close(out["b"], sparse["b"] * g[1])
    torch.testing.assert_close(dense_out, dense * g[2:])
    seam(sparse, dense)
    assert seam.steps == 2 and seam.epsilon == pytest.approx(0.05)  # one decay after 2 steps
    seam.eval()
    seam(sparse, dense)
    assert seam.steps == 2  # evaluation does not advance epsilon
    seam.after_optimizer_step()  # threshold 0.5 * 0.1 = 0.05
    np.testing.assert_allclose(seam.x.detach().numpy(), [0.95, -0.45, 0.0, 1.95], atol=1e-7)


def test_adafs_seam_weights_rows_by_a_softmax_over_normalised_fields() -> None:
    torch.manual_seed(0)
    seam = AdaFSSeam(hidden=8, dropout=0.0)
    seam.bind(["a", "b"], [4, 2], ["d0", "d1"])
    with torch.no_grad():  # a non-trivial affine part, so a wrong column -> field map shows
        seam.norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
        seam.norm.bias.copy_(torch.linspace(-1.0, 1.0, 8))
    seam.train()
    sparse, dense = _fields()
    normed, w = seam.field_weights(sparse, dense)
    assert w.shape == (32, 4)
    torch.testing.assert_close(w.sum(1), torch.ones(32))
    # plain reference: each field batch-normalised on its own (batch statistics, biased variance)
    fields = [sparse["a"], sparse["b"], dense[:, :1], dense[:, 1:]]
    cuts = [0, 4, 6, 7, 8]
    ref = []
    for i, x in enumerate(fields):
        z = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + seam.norm.eps)
        ref.append(z * seam.norm.weight[cuts[i]:cuts[i + 1]].detach() + seam.norm.bias[cuts[i]:cuts[i + 1]].detach())
    torch.testing.assert_close(normed, torch.cat(ref, dim=1))
    logits = seam.controller(torch.cat(ref, dim=1))
    torch.testing.assert_close(w, torch.softmax(logits, dim=1))
    out, dense_out = seam(sparse, dense)
    w = seam.field_weights(sparse, dense)[1]  # the forward took another batch-norm step: same batch, same stats
    torch.testing.assert_close(out["a"], ref[0] * w[:, :1])
    torch.testing.assert_close(out["b"], ref[1] * w[:, 1:2])
    torch.testing.assert_close(dense_out, torch.cat([ref[2] * w[:, 2:3], ref[3] * w[:, 3:]], dim=1))


def test_field_seams_weigh_a_vector_feature_as_one_field() -> None:
    """A dense vector of width 3 takes 3 columns of the dense block and one gate."""
    seam = LPFSSeam()
    seam.bind(["a", "b"], [4, 2], ["scalar", "vec"], [1, 3])
    assert seam.field_names == ["a", "b", "scalar", "vec"] and seam.offsets == [0, 4, 6, 7, 10]
    with torch.no_grad():
        seam.x.copy_(torch.tensor([1.0, -0.5, 0.3, 2.0]))
    sparse, _ = _fields()
    dense = torch.randn(32, 4)
    seam.eval()
    out, dense_out = seam(sparse, dense)
    g = seam.gates().detach()
    torch.testing.assert_close(out["a"], sparse["a"] * g[0])
    torch.testing.assert_close(dense_out[:, :1], dense[:, :1] * g[2])
    torch.testing.assert_close(dense_out[:, 1:], dense[:, 1:] * g[3])
    adafs = AdaFSSeam(hidden=4, dropout=0.0)
    adafs.bind(["a", "b"], [4, 2], ["scalar", "vec"], [1, 3])
    assert adafs.field_weights(sparse, dense)[1].shape == (32, 4)


def test_adafs_seam_without_dense_columns_and_gradients_reach_the_controller() -> None:
    seam = AdaFSSeam()
    seam.bind(["a", "b"], [4, 2], [])
    seam.train()
    sparse, _ = _fields()
    empty = torch.zeros(32, 0)
    out, dense_out = seam(sparse, empty)
    assert dense_out.shape == (32, 0)
    (out["a"].sum() + out["b"].pow(2).sum()).backward()
    assert all(p.grad is not None for p in seam.controller.parameters())


@pytest.mark.parametrize("bad", [{"hidden": 0}, {"dropout": 1.0}])
def test_adafs_refuses_bad_options(bad: dict) -> None:
    with pytest.raises(ValueError, match="AdaFSSeam needs"):
        AdaFSSeam(**bad)


@pytest.mark.parametrize("bad", [{"epsilon": 0.0}, {"decay": 1.5}, {"decay_every": 0}, {"learning_rate": 0.0}])
def test_lpfs_refuses_bad_options(bad: dict) -> None:
    with pytest.raises(ValueError, match="LPFSSeam needs"):
        LPFSSeam(**bad)


def test_specs_name_the_seams() -> None:
    assert AdaFS().seam_spec()["class_path"] == "selection.model_based.adafs.AdaFSSeam"
    assert LPFS(learning_rate=0.01).seam_spec()["init_args"]["learning_rate"] == 0.01


def test_autofield_seam_decays_temperature_and_is_noise_free_outside_training() -> None:
    from selection.model_based.autofield import AutoFieldSeam

    seam = AutoFieldSeam(temperature=1.0, temperature_step=0.25, min_temperature=0.4)
    seam.bind(["a", "b"], [4, 2], ["d0"])
    sparse, dense = _fields()
    dense = dense[:, :1]
    seam.train()
    for want in (0.75, 0.5, 0.4, 0.4):
        seam(sparse, dense)
        assert seam.temperature == pytest.approx(want)
    seam.eval()
    with torch.no_grad():
        seam.logits.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]]))
    keep = torch.softmax(seam.logits / 0.4, dim=-1)[:, 1]
    out, dense_out = seam(sparse, dense)
    torch.testing.assert_close(out["a"], sparse["a"] * keep[0])
    torch.testing.assert_close(out["b"], sparse["b"] * keep[1])
    torch.testing.assert_close(dense_out, dense * keep[2])
    assert seam.temperature == pytest.approx(0.4)  # evaluation does not anneal


def test_autofield_controller_steps_only_its_logits() -> None:
    from selection.model_based.autofield import AutoFieldSeam

    seam = AutoFieldSeam(learning_rate=0.1)
    seam.bind(["a", "b"], [4, 2], [])
    seam.eval()
    before = seam.logits.detach().clone()
    seam.controller_step(lambda: -torch.softmax(seam.logits, dim=-1)[0, 1])  # reward keeping field a
    after = seam.logits.detach()
    assert after[0, 1] > before[0, 1] and after[0, 0] < before[0, 0]  # Adam: each moves by lr
    assert torch.allclose(after[1], before[1]) and seam.logits.grad is None and seam.controller_steps == 1
    assert seam.controller_parameters() == [seam.logits]


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_controller_batches_never_train_the_tables_or_reach_the_model_optimizer(kernel: str, tmp_path) -> None:  # noqa: ANN001
    from recsys.data.batching import make_batch
    from recsys.train.recipe import Recipe
    from selection.model_based.autofield import AutoFieldSeam
    from tests.selection.conftest import tiny_config

    recipe = Recipe(tiny_config(n_rows=2_000, epochs=1), [f"--model.embedding_kernel={kernel}"], workdir=tmp_path, quiet=True)
    task = recipe.untrained(seed=0)
    task.model.set_seam(AutoFieldSeam(learning_rate=0.1))
    optimizer = task.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert id(task.model.seam.logits) not in in_optimizer
    tables = {k: v.detach().clone() for k, v in task.model.sparse_arch.state_dict().items()}
    data = recipe.datamodule.sample_rows("val", 256, seed=0)
    batch = make_batch(data, np.arange(len(data)))
    before = task.model.seam.logits.detach().clone()
    task.model.seam.controller_step(lambda: task._seam_loss(batch))
    assert not torch.equal(before, task.model.seam.logits.detach())
    for k, v in task.model.sparse_arch.state_dict().items():
        torch.testing.assert_close(v, tables[k], rtol=0, atol=0)
    assert all(p.grad is None for p in task.model.parameters() if p is not task.model.seam.logits)
