"""LeAP: the seam transform and the importance method.

* the mixing step against a per-row plain-PyTorch loop (given permutations and gates);
* evaluation is the identity, the hard eval gate replaces removed fields by their training
  mean; both script, and the scripted model matches eager;
* the tensor hook sees exactly the task gradient of s (autograd on a tiny head as the
  reference), penalty scaling uses its bias-corrected EMA, gradient normalisation divides by
  ``d_f^α · max(ρ̂_f, ε)``;
* DLRM, DCNv2 and DeepFM train with the seam unchanged (multi-hot and dense fields), and a
  trained model exports and predicts identically in a fresh process;
* planted truth through a recipe on the synthetic generator, and determinism for a seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import instantiate_module

from recsys.data.batching import make_batch, random_batch
from recsys.data.encoders import Preprocessor
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.export import ServingModule, check_parity_in_fresh_process, export_model, synthetic_inputs
from recsys.models.archs import DLRM, DCNv2, DeepFM
from recsys.models.base import RankingModel
from recsys.train.module import RankingTask
from selection.model_based.leap import (
    LeAP,
    LeAPEvalGate,
    LeAPFusion,
    LeAPRegularizer,
    LeAPSeam,
    borda_fusion,
    fuse,
    leap_gates,
    product_fusion,
    sum_fusion,
)
from selection.model_based.leap_fusion import heldout_fusion
from tests.selection.model_based.test_permutation import make_frame

B = 16
SPARSE, DIMS, DENSE = ["a", "b"], [3, 2], ["x", "y"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread (with two, every small op waits on a barrier, which on
    a busy shared machine made the module's training take 40 s instead of 0.3 s). Module scope,
    so it is in force before the module-scoped fixtures train."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bound_seam(**kwargs: Any) -> LeAPSeam:
    seam = LeAPSeam(**kwargs)
    seam.bind(SPARSE, DIMS, DENSE)
    return seam


def toy_inputs(seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``a`` dense-valued; ``b`` at its default (zeros) in most rows; dense ``y`` constant."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(B, 3, generator=g)
    b = torch.randn(B, 2, generator=g) * (torch.rand(B, 1, generator=g) < 0.25)
    dense = torch.stack([torch.randn(B, generator=g), torch.full((B,), 0.7)], dim=1)
    return {"a": a, "b": b}, dense


def toy_task(sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
    """A fixed nonlinear head and labels: BCE of tanh-features."""
    g = torch.Generator().manual_seed(123)
    x = torch.cat([sparse["a"], sparse["b"], dense], dim=1)
    w1 = torch.randn(x.size(1), 6, generator=g)
    w2 = torch.randn(6, generator=g)
    labels = (torch.rand(x.size(0), generator=g) < 0.4).float()
    return F.binary_cross_entropy_with_logits(torch.tanh(x @ w1) @ w2, labels)


def fixed_permutations(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(B, generator=g) for _ in range(len(SPARSE) + len(DENSE))])


# -- mixing ------------------------------------------------------------------------------------------
def test_mix_matches_a_per_row_reference() -> None:
    seam = bound_seam()
    sparse, dense = toy_inputs()
    s = torch.tensor([0.9, 0.3, 0.6, 0.05])
    perms = fixed_permutations(0)
    out, out_dense, rho = seam.mix(sparse, dense, s, perms)
    for i, name in enumerate(SPARSE):
        for b in range(B):
            expected = s[i] * sparse[name][b] + (1 - s[i]) * sparse[name][perms[i, b]]
            torch.testing.assert_close(out[name][b], expected, rtol=0, atol=1e-6)
    for j in range(len(DENSE)):
        i = len(SPARSE) + j
        for b in range(B):
            expected = s[i] * dense[b, j] + (1 - s[i]) * dense[perms[i, b], j]
            torch.testing.assert_close(out_dense[b, j], expected, rtol=0, atol=1e-6)
    # rho: share of rows whose value differs from its partner's
    expected_rho = [
        float((sparse["a"] != sparse["a"][perms[0]]).any(1).float().mean()),
        float((sparse["b"] != sparse["b"][perms[1]]).any(1).float().mean()),
        float((dense[:, 0] != dense[perms[2], 0]).float().mean()),
        0.0,  # constant column
    ]
    assert rho.tolist() == pytest.approx(expected_rho)
    assert 0 < expected_rho[1] < 0.7  # b is mostly at its default


def test_training_forward_uses_independent_permutations_per_field() -> None:
    seam = bound_seam(init_logit=-20.0)  # s ~ 0: every field is (almost) its replica
    seam.train()
    sparse = {
        "a": torch.arange(B, dtype=torch.float32).repeat(3, 1).t().contiguous(),
        "b": torch.arange(B, dtype=torch.float32).repeat(2, 1).t().contiguous(),
    }
    dense = torch.arange(B, dtype=torch.float32).repeat(2, 1).t().contiguous()
    torch.manual_seed(0)
    out, d = seam(sparse, dense)
    rows = [out["a"][:, 0].round(), out["b"][:, 0].round(), d[:, 0].round(), d[:, 1].round()]
    for r in rows:
        assert sorted(r.tolist()) == list(range(B))  # a permutation of the rows
    assert len({tuple(r.tolist()) for r in rows}) == 4  # drawn independently
    assert torch.equal(out["a"][:, 0], out["a"][:, 2])  # one permutation per field, all its columns


def test_eval_is_the_identity_and_scripts() -> None:
    seam = bound_seam()
    sparse, dense = toy_inputs()
    seam.eval()
    out, d = seam(sparse, dense)
    assert out is sparse and d is dense
    scripted = torch.jit.script(seam)
    out, d = scripted(sparse, dense)
    assert all(torch.equal(out[k], sparse[k]) for k in SPARSE) and torch.equal(d, dense)


def test_hard_eval_gate_replaces_removed_fields_by_their_training_mean() -> None:
    seam = bound_seam(eval_gate="hard", threshold=0.5)
    seam.train()
    sparse, dense = toy_inputs()
    seam(sparse, dense)  # the first training batch sets the running mean
    with torch.no_grad():
        seam.logits.copy_(torch.tensor([-3.0, 3.0, 3.0, -3.0]))  # remove "a" and "y"
    seam.eval()
    other, other_dense = toy_inputs(seed=1)
    out, d = seam(other, other_dense)
    torch.testing.assert_close(out["a"], sparse["a"].mean(0).expand(B, 3))
    assert torch.equal(out["b"], other["b"])
    assert torch.equal(d[:, 0], other_dense[:, 0])
    torch.testing.assert_close(d[:, 1], dense[:, 1].mean().expand(B))
    scripted = torch.jit.script(seam)
    s_out, s_d = scripted(other, other_dense)
    assert all(torch.equal(s_out[k], out[k]) for k in SPARSE) and torch.equal(s_d, d)


# -- gradients -------------------------------------------------------------------------------------
def reference_task_gradient(
    seam: LeAPSeam, sparse: dict[str, torch.Tensor], dense: torch.Tensor, perms: torch.Tensor
) -> torch.Tensor:
    s = seam.gates().detach().requires_grad_(True)
    out, d, _ = seam.mix(sparse, dense, s, perms)
    (grad,) = torch.autograd.grad(toy_task(out, d), s)
    return grad


def train_step(
    seam: LeAPSeam, sparse: dict[str, torch.Tensor], dense: torch.Tensor, perms: torch.Tensor
) -> torch.Tensor:
    """One step's backward of ``task + penalty`` with the given permutations; returns dθ."""
    seam.train()
    seam.draw_permutations = lambda batch_size, device: perms  # type: ignore[method-assign]
    seam.logits.grad = None
    out, d = seam(sparse, dense)
    (toy_task(out, d) + seam.regularization()).backward()
    return seam.logits.grad.clone()


def test_hook_sees_the_task_only_gradient_and_penalty_scaling_uses_its_ema() -> None:
    lam, tau, ema = 0.4, 0.7, 0.8
    seam = bound_seam(penalty=lam, regularizer="penalty_scaling", temperature=tau, ema=ema)
    with torch.no_grad():
        seam.logits.copy_(torch.tensor([1.0, -0.5, 2.0, 0.3]))
    sparse, dense = toy_inputs()
    s = seam.gates().detach()
    ds_dtheta = s * (1 - s) / tau

    p1 = fixed_permutations(1)
    g1 = reference_task_gradient(seam, sparse, dense, p1)
    grad = train_step(seam, sparse, dense, p1)
    torch.testing.assert_close(seam.last_task_grad, g1, rtol=1e-5, atol=1e-7)  # the penalty never reaches the hook
    torch.testing.assert_close(grad, g1 * ds_dtheta, rtol=1e-5, atol=1e-7)  # c = 0 before any gradient was seen

    p2 = fixed_permutations(2)
    g2 = reference_task_gradient(seam, sparse, dense, p2)
    grad = train_step(seam, sparse, dense, p2)
    torch.testing.assert_close(seam.last_task_grad, g2, rtol=1e-5, atol=1e-7)
    # c = bias-corrected EMA of |g| over the steps before: after one step, |g1|
    torch.testing.assert_close(grad, (g2 + lam * g1.abs()) * ds_dtheta, rtol=1e-5, atol=1e-7)
    c = ((1 - ema) * (ema * g1.abs() + g2.abs())) / (1 - ema**2)
    torch.testing.assert_close(torch.tensor(list(seam.coefficients().values())), c, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_gradient_normalization_divides_the_task_gradient(alpha: float) -> None:
    lam, eps = 0.05, 0.1
    seam = bound_seam(penalty=lam, regularizer=LeAPRegularizer.GRADIENT_NORMALIZATION, alpha=alpha, epsilon=eps)
    sparse, dense = toy_inputs()
    perms = fixed_permutations(3)
    g = reference_task_gradient(seam, sparse, dense, perms)
    _, _, rho = seam.mix(sparse, dense, seam.gates().detach(), perms)
    widths = torch.tensor([3.0, 2.0, 1.0, 1.0])
    divisor = widths**alpha * rho.clamp(min=eps)
    assert rho[3] == 0 and divisor[3] == pytest.approx(eps)  # the constant column hits the floor
    s = seam.gates().detach()
    grad = train_step(seam, sparse, dense, perms)
    torch.testing.assert_close(seam.last_task_grad, g, rtol=1e-5, atol=1e-7)  # recorded before the division
    torch.testing.assert_close(seam.last_rho, rho)
    torch.testing.assert_close(grad, (g / divisor + lam) * s * (1 - s), rtol=1e-5, atol=1e-7)
    assert seam.coefficients() == {n: 1.0 for n in SPARSE + DENSE}


def test_validation_gates_step_only_in_the_controller_on_the_normalised_task_gradient_plus_penalty() -> None:
    """``gate_data="validation"``: the gates are controller parameters (out of the model's
    optimizer), the training loss carries no penalty, and one controller step is Adam on
    (normalised validation task gradient + λ) · ds/dθ, without counting as a training step."""
    lam, lr, eps = 0.05, 0.1, 0.1
    seam = bound_seam(penalty=lam, gate_data="validation", controller_every=3, learning_rate=lr, epsilon=eps)
    assert seam.controller_every == 3 and seam.controller_parameters() == [seam.logits]
    assert bound_seam().controller_every == 0 and bound_seam().controller_parameters() == []
    sparse, dense = toy_inputs()
    perms = fixed_permutations(4)
    seam.train()
    seam.draw_permutations = lambda batch_size, device: perms  # type: ignore[method-assign]
    assert float(seam.regularization()) == 0.0
    g = reference_task_gradient(seam, sparse, dense, perms)
    _, _, rho = seam.mix(sparse, dense, seam.gates().detach(), perms)
    s = seam.gates().detach()
    expected = (g / (torch.tensor([3.0, 2.0, 1.0, 1.0]) ** 0.5 * rho.clamp(min=eps)) + lam) * s * (1 - s)
    reference = torch.nn.Parameter(seam.logits.detach().clone())
    adam = torch.optim.Adam([reference], lr=lr)
    reference.grad = expected
    adam.step()
    seam.controller_step(lambda: toy_task(*seam(sparse, dense)))
    torch.testing.assert_close(seam.logits.detach(), reference.detach(), rtol=1e-5, atol=1e-7)
    assert seam.controller_steps == 1 and seam._train_steps == 0 and seam.logits.grad is None
    seam(sparse, dense)  # a training batch counts
    assert seam._train_steps == 1


def test_options_are_typed_and_validated() -> None:
    seam = LeAPSeam(regularizer="penalty_scaling", eval_gate="hard")
    assert seam.regularizer_kind == LeAPRegularizer.PENALTY_SCALING.value and seam.hard_eval
    assert LeAPEvalGate("identity") is LeAPEvalGate.IDENTITY
    with pytest.raises(ValueError):
        LeAPSeam(regularizer="l1")
    with pytest.raises(ValueError, match="penalty"):
        LeAPSeam(penalty=-1.0)
    # model.seam in config form, resolved by jsonargparse as `salience fit` does
    seam = {"class_path": "selection.model_based.leap.LeAPSeam", "init_args": {"penalty": 0.002}}
    task = instantiate_module(RankingTask, {"schema": small_schema().to_dict(), "embedding_kernel": "plain", "seam": seam})
    built = task.model.seam
    assert isinstance(built, LeAPSeam) and built.penalty == 0.002 and built.learning_rate == LeAPSeam().learning_rate
    assert built.field_names == ["u", "tags", "c", "x0", "x1"]  # bound to the model's fields
    with pytest.raises(RuntimeError, match="not bound"):
        LeAPSeam().train()({"a": torch.zeros(2, 3)}, torch.zeros(2, 0))


# -- backbones -------------------------------------------------------------------------------------
def small_schema() -> Schema:
    return Schema(
        (
            FeatureSpec("u", embedding_dim=8, num_embeddings=20),
            FeatureSpec("tags", kind=FeatureKind.MULTI_CATEGORICAL, embedding_dim=4, num_embeddings=12),
            FeatureSpec("c", embedding_dim=4, num_embeddings=6),
            FeatureSpec("x0", kind=FeatureKind.DENSE),
            FeatureSpec("x1", kind=FeatureKind.DENSE),
        )
    )


def build(arch: type[RankingModel], schema: Schema, seam: LeAPSeam) -> RankingModel:
    if arch is DLRM:
        return DLRM(schema, bottom_mlp=[8, 8], top_mlp=[16], seam=seam)
    if arch is DCNv2:
        return DCNv2(schema, cross_layers=1, deep_mlp=[16], seam=seam)
    return DeepFM(schema, deep_mlp=[16], seam=seam)


@pytest.mark.parametrize("arch", [DLRM, DCNv2, DeepFM])
def test_every_backbone_trains_with_the_seam_and_scripts(arch: type[RankingModel]) -> None:
    torch.manual_seed(0)
    schema = small_schema()
    model = build(arch, schema, LeAPSeam(penalty=0.01, record_every=2))
    assert model.seam.field_names == ["u", "tags", "c", "x0", "x1"]
    seam_ids = {id(p) for p in model.seam.parameters()}
    opt = torch.optim.Adam(
        [
            {"params": [p for p in model.parameters() if id(p) not in seam_ids], "lr": 0.01},
            {"params": list(model.seam.parameters()), "lr": model.seam.learning_rate},
        ]
    )
    start = model.seam.gates().detach().clone()
    model.train()
    for step in range(6):
        batch = random_batch(schema, 64, seed=step)
        logits = model(batch.dense_features, batch.sparse_features)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels) + model.seam.regularization()
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.equal(model.seam.gates().detach(), start)
    assert model.seam.trajectory()["steps"] == [2, 4, 6]
    assert set(leap_gates(model)) == {"u", "tags", "c", "x0", "x1"}
    model.eval()
    values, lengths, dense = synthetic_inputs(schema, 9)
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(keys=schema.sparse_names, values=torch.cat(values), lengths=torch.cat(lengths).int())
    for hard in (False, True):
        model.seam.hard_eval = hard
        with torch.no_grad():
            model.seam.logits[[1, 3]] = -5.0  # "tags" and "x0" below the threshold
            eager = torch.sigmoid(model(dense, kjt))
            scripted = torch.jit.script(ServingModule(model))(values, lengths, dense)
        torch.testing.assert_close(scripted, eager, rtol=0, atol=1e-6)


def test_trained_model_exports_and_matches_in_a_fresh_process(tmp_path: Path) -> None:
    torch.manual_seed(0)
    frame, schema = make_frame(600)
    pre = Preprocessor(schema).fit(frame.iloc[:400])
    train, val = pre.transform(frame.iloc[:400]), pre.transform(frame.iloc[400:])
    model = DCNv2(pre.fitted_schema, cross_layers=1, deep_mlp=[16], seam=LeAPSeam(penalty=0.01, eval_gate="hard"))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    model.train()
    for start in range(0, len(train), 64):
        batch = make_batch(train, np.arange(start, min(start + 64, len(train))))
        loss = F.binary_cross_entropy_with_logits(model(batch.dense_features, batch.sparse_features), batch.labels)
        opt.zero_grad()
        (loss + model.seam.regularization()).backward()
        opt.step()
    with torch.no_grad():
        model.seam.logits[1] = -5.0  # "junk" removed: the hard-gate path is exported
    result = export_model(model.eval(), pre, tmp_path / "export")
    assert result.max_abs_diff <= 1e-6
    batches = [make_batch(val, np.arange(0, 50)), make_batch(val, np.arange(50, 57))]
    # same float32 kernels in both processes: agreement to rounding
    assert check_parity_in_fresh_process(tmp_path / "export", model, batches) <= 1e-6


# -- through a recipe --------------------------------------------------------------------------------
def synthetic_config(n_rows: int, epochs: int, root: Path) -> dict[str, Any]:
    return {
        "seed_everything": 0,
        "trainer": {"max_epochs": epochs, "enable_progress_bar": False, "enable_model_summary": False},
        "model": {
            "backbone": {"class_path": "recsys.models.DCNv2", "init_args": {"cross_layers": 1, "deep_mlp": [32]}},
            "embedding_kernel": "plain",
            "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.003}},
            "early_stopping_patience": 0,
        },
        "data": {
            "reader": {
                "class_path": "recsys.data.synthetic.SyntheticReader",
                "init_args": {
                    "n_rows": n_rows,
                    "seed": 0,
                    "cardinality_scale": 0.05,
                    "n_noise": 6,
                    "n_noise_dense": 2,
                    "embedding_dim": "by_cardinality",
                    "interaction": False,
                    "near_copy": False,
                },
            },
            "batch_size": 256,
            "cache_dir": str(root / "cache"),
        },
    }


def test_planted_truth_through_a_recipe(tmp_cwd: Path) -> None:
    from recsys.data.synthetic import GroundTruth
    from recsys.train.recipe import Recipe

    recipe = Recipe(synthetic_config(30_000, 3, tmp_cwd), workdir=tmp_cwd / "fits", quiet=True)
    report = LeAP(tracking=False).rank(recipe)
    truth = GroundTruth.from_dict(recipe.schema.extras["ground_truth"])
    gates = report.extras["gates"]
    # the ranking fuses the gates with OutRank's relevance of the training rows and the model's
    # held-out drops, then moves the lower of each planted copy pair (a relabelled user_id,
    # price in cents) after the rest
    heldout = report.extras["heldout"]
    fused = fuse(gates, report.extras["relevance"], "relevance_heldout", heldout)
    copies = report.extras["copies"]
    assert {frozenset(pair) for pair in copies.items()} == {frozenset({"user_id", "user_id_copy"}),
                                                           frozenset({"price", "price_cents"})}
    # ... and after them the ID-like noise with no signal beyond chance (the shared ID screen)
    memorised = report.extras["memorisable"]
    assert set(memorised) == {"noise_id"} and report.ranking[-1] == "noise_id" and "id_like" in report["noise_id"].flags
    assert set(report.ranking[-3:-1]) == set(copies) and all("copy" in report[f].flags for f in copies)
    moved = {*copies, *memorised}
    assert {f: v for f, v in report.scores.items() if f not in moved} == pytest.approx(
        {f: v for f, v in fused.items() if f not in moved})
    unscreened = report.extras["unscreened_ranking"]  # the screen moved noise_id and nothing else
    assert sorted(unscreened) == sorted(report.ranking) and [f for f in unscreened if f != "noise_id"] == report.ranking[:-1]
    plain = LeAP().refuse(report, "relevance_heldout", copies=False)  # the ablation: the fused ranking as it was
    assert {f: v for f, v in plain.scores.items() if f != "noise_id"} == pytest.approx(
        {f: v for f, v in fused.items() if f != "noise_id"})
    two = LeAP().refuse(report, "sum", copies=False)  # the gates and relevance only
    assert {f: v for f, v in two.scores.items() if f != "noise_id"} == pytest.approx(
        {f: v for f, v in sum_fusion(gates, report.extras["relevance"]).items() if f != "noise_id"})
    assert "copies" not in plain.extras and plain.config["copy_threshold"] == 0 and plain.ranking[-1] == "noise_id"
    alone = LeAP().refuse(report, "none", copies=False)  # another fusion re-ranks the same fit
    assert {f: v for f, v in alone.scores.items() if f != "noise_id"} == pytest.approx(
        {f: v for f, v in gates.items() if f != "noise_id"})
    assert alone.cost_seconds == report.cost_seconds and alone.extras["memorisable"] == memorised
    again = LeAP().refuse(report, "none")  # and demotes the lower of each copied pair in its own ranking
    assert set(again.ranking[-3:-1]) == set(again.extras["copies"]) and len(again.extras["copies"]) == 2
    assert again.ranking[-1] == "noise_id" and again["noise_id"].flags.count("id_like") == 1
    assert alone.config["fusion"] == "none" and {f.feature: f.width for f in alone.features} == {
        f.feature: f.width for f in report.features}
    assert report.extras["relevance"]["item_id"] > report.extras["relevance"]["noise_c2"]
    noise = truth.names("noise")
    strong = [f for f in truth.signal if truth[f].strength >= 0.3]  # all but the weak U-shaped engagement_score
    assert set(gates) == set(recipe.schema.names) and not report.excluded
    assert "promo_flag" in strong and "tags" in strong and "relevance_score" in strong  # rare, multi-hot, 1-D dense
    assert min(gates[f] for f in strong) > 0.7 > 0.2 > max(gates[f] for f in noise)  # polarised in 3 epochs
    # the held-out drops: the model loses validation AUC without its strongest fields, not without noise
    assert set(heldout) == set(gates) and heldout["item_id"] > 0.01 > max(abs(heldout[f]) for f in noise)
    assert sum(heldout[f] for f in strong) > 10 * sum(abs(heldout[f]) for f in noise)
    # report contents
    removed = [f for f in gates if gates[f] < 0.5]
    widths = {f.feature: f.width for f in report.features}
    assert report.extras["fields_removed_at_threshold"] == removed or set(
        report.extras["fields_removed_at_threshold"]
    ) == set(removed)
    assert report.extras["dimensions_removed_at_threshold"] == sum(widths[f] for f in removed) > 0
    assert report.extras["regularizer"] == "gradient_normalization" and report.extras["test_auc"] > 0.6
    trajectory = report.extras["gate_trajectory"]
    assert len(trajectory["steps"]) > 5 and trajectory["gates"]["item_id"][-1] == pytest.approx(gates["item_id"])
    assert widths["price"] == 1 and widths["tags"] == report["tags"].width > 1
    assert report.cost_seconds >= report.extras["fit_seconds"] > 0
    # the best checkpoint reloads without pickle, seam included (its gates: the best-val epoch's)
    from recsys.train.checkpoint import load_checkpoint

    (best,) = Path(report.extras["run_dir"]).rglob("best-*.ckpt")
    loaded = load_checkpoint(best).model
    assert isinstance(loaded.seam, LeAPSeam)
    assert loaded.seam.gate_dict(final=False) == pytest.approx(report.extras["best_checkpoint_gates"])


def test_borda_fusion_averages_the_two_ranks_and_breaks_ties_by_the_gate() -> None:
    gates = {"a": 0.9, "b": 0.8, "c": 0.1}
    fused = borda_fusion(gates, {"a": 0.0, "b": 0.5, "c": 0.4})  # gate ranks a0 b1 c2, relevance b0 c1 a2
    assert sorted(fused, key=lambda f: -fused[f]) == ["b", "a", "c"]
    assert fused["b"] == pytest.approx(2 - 0.5 - 1 / 12)
    tie = borda_fusion({"a": 0.9, "b": 0.8}, {"b": 1.0})  # rank sums 1 and 1; "a" has no relevance (0)
    assert tie["a"] > tie["b"] and tie["a"] - tie["b"] < 0.5
    assert LeAP(fusion="none").fusion is LeAPFusion.NONE and LeAP().fusion is LeAPFusion.AUTO
    # auto: the held-out drops up to heldout_fields fields (one pass each), gate + relevance beyond
    assert LeAP().resolved_fusion(64) is LeAPFusion.RELEVANCE_HELDOUT and LeAP().resolved_fusion(65) is LeAPFusion.SUM
    assert LeAP(heldout_fields=None).resolved_fusion(5000) is LeAPFusion.RELEVANCE_HELDOUT
    assert LeAP(fusion="heldout").resolved_fusion(5000) is LeAPFusion.HELDOUT
    with pytest.raises(ValueError):
        LeAP(fusion="rank")
    product = product_fusion(gates, {"a": 0.0, "b": 0.5, "c": 0.4})  # relevance ranks b0 c1 a2 of F = 3
    assert product == pytest.approx({"a": 0.9 / 3, "b": 0.8, "c": 0.1 * 2 / 3})
    assert fuse(gates, {}, LeAPFusion.NONE) == gates and fuse(gates, {"a": 1.0}, "borda") == borda_fusion(gates, {"a": 1.0})


def test_sum_fusion_keeps_a_gated_field_whose_relevance_is_about_zero() -> None:
    """Frappe's shape: ``user`` is kept by its gate (0.89) while its chance-corrected relevance is
    about 0 (slightly negative), like that of the noise fields. The rank-based product puts it
    last; the sum of the two [0, 1] scores keeps it second, and a relevance near 0 moves nothing."""
    gates = {"item": 0.99, "user": 0.89, "cost": 0.72, "homework": 0.27, "city": 0.04}
    relevance = {"item": 0.287, "user": -0.0004, "cost": -0.00002, "homework": -0.00001, "city": 0.0002}
    fused = sum_fusion(gates, relevance)
    assert fused == pytest.approx(
        {"item": 1.99, "user": 0.89, "cost": 0.72, "homework": 0.27, "city": 0.04 + 0.0002 / 0.287})
    assert sorted(fused, key=lambda f: -fused[f]) == ["item", "user", "cost", "homework", "city"]
    product = product_fusion(gates, relevance)
    assert sorted(product, key=lambda f: -product[f])[1] != "user"  # the rank product demotes it
    assert fuse(gates, relevance, "sum") == fused and sum_fusion(gates, {}) == gates  # no relevance: the gates
    assert sum_fusion({"a": 0.5, "b": 0.5}, {"a": 0.2, "b": 0.1}) == pytest.approx({"a": 1.5, "b": 1.0})


def test_heldout_fusion_demotes_a_field_the_model_memorised() -> None:
    """A memorised id: high gate and training relevance, no validation AUC lost without it. The
    sum of gate and relevance keeps it first; the held-out drop, the third score on [0, 1],
    puts the context field that generalises above it."""
    gates = {"id": 0.95, "ctx": 0.6, "noise": 0.1}
    relevance = {"id": 0.3, "ctx": 0.15, "noise": -0.01}
    heldout = {"id": -0.002, "ctx": 0.02, "noise": 0.0}
    fused = heldout_fusion(gates, relevance, heldout)
    assert fused == pytest.approx({"id": 0.95 + 1.0, "ctx": 0.6 + 0.5 + 1.0, "noise": 0.1})
    assert sorted(fused, key=lambda f: -fused[f]) == ["ctx", "id", "noise"]
    summed = sum_fusion(gates, relevance)
    assert sorted(summed, key=lambda f: -summed[f]) == ["id", "ctx", "noise"]
    assert fuse(gates, relevance, "heldout", heldout) == fused
    assert fuse(gates, relevance, "relevance_heldout", heldout) == pytest.approx(
        {"id": 1.0 + 0.95e-3, "ctx": 1.5 + 0.6e-3, "noise": 0.1e-3})
    drop = fuse(gates, relevance, "drop", {"id": 0.0, "ctx": 0.0, "noise": 0.01})  # the gates break ties
    assert sorted(drop, key=lambda f: -drop[f]) == ["noise", "id", "ctx"]
    assert heldout_fusion(gates, relevance, {}) == pytest.approx(sum_fusion(gates, relevance))  # no drops: the sum
    for fusion in ("heldout", "relevance_heldout", "drop"):
        assert LeAPFusion(fusion).reads_heldout
        with pytest.raises(ValueError, match="held-out drops"):
            fuse(gates, relevance, fusion)
        with pytest.raises(ValueError, match="heldout_rows"):
            LeAP(fusion=fusion, heldout_rows=0)
    assert not LeAPFusion.SUM.reads_heldout and LeAP(fusion="sum", heldout_rows=0).heldout_rows == 0


def test_refuse_into_a_heldout_fusion_needs_the_drops() -> None:
    from selection.report import ImportanceReport

    gates, relevance = {"a": 0.9, "b": 0.5}, {"a": 0.1, "b": 0.2}
    old = ImportanceReport.from_scores("leap", sum_fusion(gates, relevance), extras={"gates": gates, "relevance": relevance})
    assert LeAP().refuse(old, "sum").ranking == ["b", "a"]
    with pytest.raises(ValueError, match="held-out drops"):
        LeAP().refuse(old, "heldout")
    new = ImportanceReport.from_scores("leap", gates, extras={"gates": gates, "relevance": relevance,
                                                           "heldout": {"a": 0.05, "b": 0.0}})
    assert LeAP().refuse(new, "heldout").scores == pytest.approx({"a": 0.9 + 0.5 + 1.0, "b": 0.5 + 1.0})


def test_same_seed_same_gates(tmp_cwd: Path) -> None:
    from recsys.train.recipe import Recipe

    recipe = Recipe(synthetic_config(6_000, 1, tmp_cwd), workdir=tmp_cwd / "fits", quiet=True)
    a = LeAP(seed=3, tracking=False).rank(recipe, run_name="a")
    b = LeAP(seed=3, tracking=False).rank(recipe, run_name="b")
    assert a.scores == b.scores
    assert a.extras["gate_trajectory"] == b.extras["gate_trajectory"]
    c = LeAP(seed=4, tracking=False).rank(recipe, run_name="c")
    assert c.scores != a.scores


def test_validation_gates_through_a_recipe(tmp_cwd: Path) -> None:
    """LeAP with gates learned on validation batches: one fit, the gates out of the model's
    optimizer and stepped by the controller; the strongest planted field outranks the noise."""
    from recsys.data.synthetic import GroundTruth
    from recsys.train.recipe import Recipe

    recipe = Recipe(synthetic_config(6_000, 2, tmp_cwd), workdir=tmp_cwd / "fits", quiet=True)
    method = LeAP(seed=0, tracking=False, gate_data="validation", controller_every=1)
    assert method.seam_spec()["init_args"]["gate_data"] == "validation"
    report = method.rank(recipe)
    truth = GroundTruth.from_dict(recipe.schema.extras["ground_truth"])
    gates = report.extras["gates"]
    assert set(gates) == set(recipe.schema.names)
    noise = truth.names("noise")
    strong = [f for f in truth.signal if truth[f].strength >= 0.3]
    assert np.mean([gates[f] for f in strong]) > np.mean([gates[f] for f in noise])
    trajectory = report.extras["gate_trajectory"]["gates"]["item_id"]
    assert len(set(trajectory)) > 1  # the gates moved (only the controller steps them)
    model = recipe.fit(seam=method.seam_spec(), tracking=False, max_epochs=1).task
    optimizer = model.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    assert all(p is not model.model.seam.logits for g in optimizer.param_groups for p in g["params"])
    assert model.model.seam.controller_steps > 0
