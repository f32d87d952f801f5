"""Token-weighting losses (the generative.weighting package) on tiny examples computed by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from generative.weighting import (
    Frequency,
    FrontGreater,
    MultiTarget,
    PlainCE,
    TokenWeighting,
    dispersion_gains,
    front_position_weights,
    prefix_entropy_gains,
    token_cross_entropy,
)

NEG = -1e9


def _ce(row: list[float], label: int) -> float:
    """Cross-entropy of one logit row, by hand."""
    top = max(row)
    return -(row[label] - top - math.log(sum(math.exp(x - top) for x in row)))


def _table(*rows: tuple[int, ...]) -> np.ndarray:
    """A codes table [num_items + 1, L] with the padding row -1."""
    return np.array([[-1] * len(rows[0]), *rows], dtype=np.int64)


def _random_batch(b: int, num_levels: int, v: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, num_levels, v, generator=g), torch.randint(0, v, (b, num_levels), generator=g)


# -- per-token CE and plain ------------------------------------------------------------------


def test_plain_equals_cross_entropy() -> None:
    logits, labels = _random_batch(5, 3, 7)
    loss = PlainCE()(logits, labels)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(15, 7), labels.reshape(15)))
    rows = [[0.0, 1.0, NEG], [2.0, 0.0, -1.0]]
    logits = torch.tensor([rows])  # [1, 2, 3]
    expected = (_ce(rows[0], 1) + _ce(rows[1], 2)) / 2
    assert PlainCE()(logits, torch.tensor([[1, 2]])).item() == pytest.approx(expected, rel=1e-6)


def test_token_cross_entropy_checks_shapes() -> None:
    logits, labels = _random_batch(2, 3, 4)
    assert token_cross_entropy(logits, labels).shape == (2, 3)
    with pytest.raises(ValueError, match="labels must be"):
        token_cross_entropy(logits, labels[:, :2])
    with pytest.raises(ValueError, match="logits must be"):
        token_cross_entropy(logits[0], labels)
    with pytest.raises(ValueError, match="int64"):
        token_cross_entropy(logits, labels.int())


# -- Front-Greater -----------------------------------------------------------------------------


def test_dispersion_gains_by_hand() -> None:
    # two groups of two items at depth 1, each point 1 from its group centroid; global centroid (3, 4)
    codes = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    vectors = np.array([[0.0, 0.0], [0.0, 2.0], [6.0, 8.0], [6.0, 6.0]])
    d0 = (5 + math.sqrt(13) + 5 + math.sqrt(13)) / 4
    np.testing.assert_allclose(dispersion_gains(codes, vectors), [d0 - 1.0, 1.0 - 0.0], rtol=1e-12)
    # unequal groups: size weighting. 1-D values 0, 2, 4 | 10: D0 = (4+2+0+6)/4 = 3,
    # D1 = (3 · (2+0+2)/3 + 1 · 0) / 4 = 1, D2 = 0
    codes = np.array([[0, 0], [0, 1], [0, 2], [1, 0]])
    np.testing.assert_allclose(dispersion_gains(codes, np.array([[0.0], [2.0], [4.0], [10.0]])), [2.0, 1.0])


def test_prefix_entropy_gains_by_hand() -> None:
    # items (0,0), (0,1), (1,0) with popularity 3, 2, 2 (of 7)
    codes = np.array([[0, 0], [0, 1], [1, 0]])
    g = prefix_entropy_gains(codes, np.array([3.0, 2.0, 2.0]))
    h_first = -(5 / 7 * math.log(5 / 7) + 2 / 7 * math.log(2 / 7))  # H(token 1)
    h_second = 5 / 7 * -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))  # H(token 2 | token 1)
    np.testing.assert_allclose(g, [h_first, h_second], rtol=1e-12)
    h_items = -(3 / 7 * math.log(3 / 7) + 2 * (2 / 7) * math.log(2 / 7))
    assert g.sum() == pytest.approx(h_items)  # chain rule: unique codes resolve all item entropy
    # an item with zero popularity carries no mass
    np.testing.assert_allclose(prefix_entropy_gains(codes, np.array([1.0, 0.0, 1.0])), [math.log(2), 0.0], atol=1e-12)


def test_front_position_weights_formula() -> None:
    w = front_position_weights(np.array([4.0, 1.5, -2.0]))
    denom = math.log(5.0) + math.log(2.5)
    np.testing.assert_allclose(w, [3 * math.log(5.0) / denom, 3 * math.log(2.5) / denom, 0.0])
    assert w.sum() == pytest.approx(3.0)
    np.testing.assert_array_equal(front_position_weights(np.array([0.0, -1.0])), [1.0, 1.0])


def test_front_dispersion_loss_by_hand() -> None:
    codes = _table((0, 0), (0, 1), (0, 2), (1, 0))
    vectors = np.array([[0.0], [0.0], [2.0], [4.0], [10.0]])  # row 0 (padding) ignored
    front = FrontGreater(gain="dispersion").fit(codes, [2, 3], np.array([1, 2]), vectors)
    denom = math.log(3.0) + math.log(2.0)  # gains (2, 1) from test_dispersion_gains_by_hand
    w = [2 * math.log(3.0) / denom, 2 * math.log(2.0) / denom]
    assert front.weights_table()["gains"] == pytest.approx([2.0, 1.0])
    assert front.weights_table()["position_weights"] == pytest.approx(w)
    rows = [[[1.0, 0.0, -1.0], [0.5, 0.0, 2.0]], [[0.0, 3.0, NEG], [1.0, 1.0, 1.0]]]
    labels = [[0, 2], [1, 0]]
    ce = [[_ce(rows[b][t], labels[b][t]) for t in range(2)] for b in range(2)]
    expected = sum(w[t] * ce[b][t] for b in range(2) for t in range(2)) / (2 * sum(w))
    loss = front(torch.tensor(rows), torch.tensor(labels))
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_front_entropy_uses_smoothed_target_counts() -> None:
    codes = _table((0, 0), (0, 1), (1, 0))
    # targets: item 1 twice, item 2 once, item 3 never -> +1 smoothing -> 3, 2, 1
    front = FrontGreater(gain="entropy").fit(codes, [2, 2], np.array([1, 1, 2]))
    h_first = -(5 / 6 * math.log(5 / 6) + 1 / 6 * math.log(1 / 6))
    h_second = 5 / 6 * -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))
    assert front.weights_table()["gains"] == pytest.approx([h_first, h_second], rel=1e-6)
    # without smoothing the unseen item 3 is dropped: token 1 is certain, token 2 splits 2:1
    front = FrontGreater(gain="entropy", smoothing=0.0).fit(codes, [2, 2], np.array([1, 1, 2]))
    h = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert front.weights_table()["gains"] == pytest.approx([0.0, h], abs=1e-7)
    assert front.weights_table()["position_weights"] == pytest.approx([0.0, 2.0])


def test_front_dispersion_needs_vectors() -> None:
    with pytest.raises(ValueError, match="item_vectors"):
        FrontGreater().fit(_table((0, 0), (1, 1)), [2, 2], np.array([1]))


# -- Frequency ---------------------------------------------------------------------------------


def test_frequency_weights_and_renormalisation_by_hand() -> None:
    codes = _table((0, 0), (0, 1), (1, 2))
    # targets 1, 1, 1, 2 -> level 0: code 0 x4, code 1 x0; level 1: code 0 x3, code 1 x1, code 2 x0
    freq = Frequency(beta=0.9).fit(codes, [2, 3], np.array([1, 1, 1, 2]))

    def eff(f: int) -> float:
        return 1.0 if f == 0 else 0.1 / (1 - 0.9**f)

    table = freq.weights_table()["token_weights"]
    assert table[0] == pytest.approx([eff(4), eff(0)])
    assert table[1] == pytest.approx([eff(3), eff(1), eff(0)])
    assert eff(1) == pytest.approx(1.0)

    labels = [[0, 0], [1, 2], [0, 1]]  # item 1, item 3, item 2
    raw = [[eff(4), eff(3)], [1.0, 1.0], [eff(4), eff(1)]]
    w = [[2 * x / sum(r) for x in r] for r in raw]  # each sample sums to L = 2
    torch.testing.assert_close(freq.sample_weights(torch.tensor(labels)), torch.tensor(w))
    rows = [
        [[0.2, 0.1, NEG], [1.0, -1.0, 0.5]],
        [[0.0, 2.0, NEG], [0.3, 0.3, 0.0]],
        [[-1.0, 1.0, NEG], [0.0, 1.0, 2.0]],
    ]
    ce = [[_ce(rows[b][t], labels[b][t]) for t in range(2)] for b in range(3)]
    expected = sum(w[b][t] * ce[b][t] for b in range(3) for t in range(2)) / 6
    assert freq(torch.tensor(rows), torch.tensor(labels)).item() == pytest.approx(expected, rel=1e-6)


def test_frequency_rejects_bad_beta() -> None:
    with pytest.raises(ValueError, match="beta"):
        Frequency(beta=1.0)


# -- Multi-target ------------------------------------------------------------------------------


def _fitted_multi(**options: object) -> MultiTarget:
    codes = _table((0, 0), (0, 1), (1, 2))
    vectors = np.array([[0.0], [0.0], [1.0], [5.0]])
    return MultiTarget(**options).fit(codes, [2, 3], np.array([1, 1, 2, 3]), vectors)  # type: ignore[arg-type]


def _components(m: MultiTarget, logits: torch.Tensor, labels: torch.Tensor) -> list[float]:
    return [part(logits, labels).item() for part in (m.plain, m.front, m.frequency)]


def test_multi_starts_at_the_pace_and_follows_the_formula() -> None:
    m = _fitted_multi(rate=1e-3, normalise=False)
    logits, labels = _random_batch(4, 2, 3)
    labels[:, 0] %= 2
    lp, lf, lq = _components(m, logits, labels)
    m.eval()
    # t = 0, s = 0: pace (1, 1, 0) -> shares (1/2, 1/2, 0), regulariser 0
    assert m(logits, labels).item() == pytest.approx(0.5 * lp + 0.5 * lf, rel=1e-6)
    assert m.weights_table()["mixture_weights"] == pytest.approx([0.5, 0.5, 0.0])

    t, s = 700, [0.3, -0.2, 0.5]
    m.step.fill_(t)
    with torch.no_grad():
        m.s.copy_(torch.tensor(s))
    e = math.exp(-1e-3 * t)
    p = [e / (1 + e), e / (1 + e), (1 - e) / (1 + e)]
    expected = sum(p[k] * (math.exp(-s[k]) * [lp, lf, lq][k] + 0.5 * s[k]) for k in range(3))
    assert m(logits, labels).item() == pytest.approx(expected, rel=1e-5)
    table = m.weights_table()
    assert table["t"] == t and table["pace"] == pytest.approx([e, e, 1 - e])
    coef = [p[k] * math.exp(-s[k]) for k in range(3)]
    assert table["coefficients"] == pytest.approx(coef, rel=1e-5)
    assert table["mixture_weights"] == pytest.approx([c / sum(coef) for c in coef], rel=1e-5)
    json.dumps(table)


def test_multi_normalised_mixture_gradients_by_hand() -> None:
    """normalise=True: the logits get the gradient of the normalised mixture c/Σc (scale 1 whatever
    s is), s gets the gradient of the regularised objective (the same as without normalise)."""
    logits, labels = _random_batch(4, 2, 3, seed=3)
    labels[:, 0] %= 2
    t, s = 400, [0.8, 0.1, 1.5]
    grads = {}
    for normalise in (False, True):
        m = _fitted_multi(rate=1e-3, normalise=normalise).eval()
        m.step.fill_(t)
        with torch.no_grad():
            m.s.copy_(torch.tensor(s))
        x = logits.clone().requires_grad_(True)
        loss = m(x, labels)
        loss.backward()
        grads[normalise] = (x.grad.clone(), m.s.grad.clone(), loss.item())
    e = math.exp(-1e-3 * t)
    p = [e / (1 + e), e / (1 + e), (1 - e) / (1 + e)]
    coef = torch.tensor([p[k] * math.exp(-s[k]) for k in range(3)])
    # the logit gradient is the plain one rescaled by 1 / Σc (every component is linear in the logits' CE)
    m = _fitted_multi(rate=1e-3)
    x = logits.clone().requires_grad_(True)
    parts = torch.stack([part(x, labels) for part in (m.plain, m.front, m.frequency)])
    mixture = (coef / coef.sum() * parts).sum()
    mixture.backward()
    assert grads[True][2] == pytest.approx(mixture.item(), rel=1e-6)  # the value is the normalised mixture
    assert torch.allclose(grads[True][0], x.grad, atol=1e-6)
    assert torch.allclose(grads[False][0], x.grad * coef.sum(), atol=1e-6)
    assert torch.allclose(grads[True][1], grads[False][1], atol=1e-6)


def test_multi_reference_form_and_uniform_start() -> None:
    m = _fitted_multi(regularise=False, curriculum=False).eval()
    logits, labels = _random_batch(3, 2, 3, seed=1)
    labels[:, 0] %= 2
    lp, lf, lq = _components(m, logits, labels)
    assert m(logits, labels).item() == pytest.approx((lp + lf + lq) / 3, rel=1e-6)  # reference HEAD: 1/3 each
    s = [0.1, 0.7, -0.4]
    with torch.no_grad():
        m.s.copy_(torch.tensor(s))
    q = [math.exp(-x) for x in s]
    expected = sum(qk * lk for qk, lk in zip(q, [lp, lf, lq])) / sum(q)
    assert m(logits, labels).item() == pytest.approx(expected, rel=1e-6)


def test_multi_combine_schedule_clamps_front() -> None:
    m = _fitted_multi(schedule="combine", rate=1e-5).eval()
    for t, expected in [(0, [0.0, 1.0, 0.0]), (50_000, [0.5, 0.3, 0.2]), (90_000, [0.9, 0.0, 0.36])]:
        m.step.fill_(t)
        assert m.coefficients().tolist() == pytest.approx(expected, abs=1e-6)


def test_multi_step_counts_training_forwards_only() -> None:
    m = _fitted_multi()
    logits, labels = _random_batch(2, 2, 3)
    labels[:, 0] %= 2
    m.train()
    m(logits, labels)
    m(logits, labels)
    assert int(m.step) == 2
    m.eval()
    m(logits, labels)
    assert int(m.step) == 2


def test_multi_gradients_reach_s_and_logits() -> None:
    m = _fitted_multi(curriculum=False)
    logits, labels = _random_batch(4, 2, 3)
    labels[:, 0] %= 2
    logits.requires_grad_(True)
    m(logits, labels).backward()
    assert m.s.grad is not None and torch.all(m.s.grad != 0)
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("optimiser", ["sgd", "adam"])
def test_regulariser_prevents_collapse(optimiser: str) -> None:
    """Fixed component losses (1, 2, 3): without the regulariser the weight collapses onto the
    smallest loss; with it s_k -> log(2 L_k), so the weights settle at 1/L_k normalised (6, 3, 2)/11."""
    losses = torch.tensor([1.0, 2.0, 3.0])
    final = {}
    for regularise in (True, False):
        m = MultiTarget(curriculum=False, regularise=regularise)
        opt = torch.optim.SGD([m.s], lr=0.5) if optimiser == "sgd" else torch.optim.Adam([m.s], lr=0.05)
        for _ in range(1500):
            opt.zero_grad()
            m.mix(losses).backward()
            opt.step()
        final[regularise] = m.weights_table()["mixture_weights"]
    assert final[True] == pytest.approx([6 / 11, 3 / 11, 2 / 11], abs=1e-3)
    assert final[False][0] > 0.99


# -- all registered weightings ------------------------------------------------------------------


def _all_fitted() -> list[TokenWeighting]:
    """Every registered weighting, fitted on one toy catalogue: the contract the tests below check
    (finite loss and gradients with padding, a state-dict round trip, deterministic fitting)."""
    codes = _table((0, 0, 0), (0, 1, 0), (2, 1, 1), (3, 0, 0))
    vectors = np.array([[0.0, 0.0], [0.0, 1.0], [0.5, 1.0], [3.0, 2.0], [4.0, -1.0]])
    targets = np.array([1, 2, 2, 3, 4, 4, 4])
    # generated from the registry (every weighting at its defaults), plus the variants with their own code paths
    options: list[tuple[str, dict]] = [(n, {}) for n in TokenWeighting.registered_names()]
    options += [("front", {"gain": "entropy"}), ("multi", {"schedule": "combine"})]
    return [TokenWeighting.create(n, **o).fit(codes, [4, 2, 2], targets, vectors) for n, o in options]


def test_registry_names() -> None:
    assert TokenWeighting.registered_names() == ["frequency", "front", "multi", "plain"]
    with pytest.raises(ValueError, match="available"):
        TokenWeighting.create("nope")
    with pytest.raises(ValueError, match="gain must be one of"):
        FrontGreater(gain="purity")


def test_padding_logits_give_finite_loss_and_gradients() -> None:
    # level sizes (4, 2, 2) inside V = 4: entries past each level's size are -1e9
    logits = torch.randn(5, 3, 4)
    logits[:, 1:, 2:] = NEG
    labels = torch.tensor([[0, 0, 0], [0, 1, 0], [2, 1, 1], [3, 0, 0], [3, 1, 1]])
    for weighting in _all_fitted():
        x = logits.clone().requires_grad_(True)
        loss = weighting(x, labels)
        loss.backward()
        assert torch.isfinite(loss), weighting.name
        assert torch.isfinite(x.grad).all(), weighting.name
        json.dumps(weighting.weights_table())
        json.dumps(weighting.describe())


def test_state_dict_round_trip_into_unfitted_instances() -> None:
    logits, labels = _random_batch(3, 3, 4, seed=2)
    labels[:, 1:] %= 2
    for weighting in _all_fitted():
        weighting.eval()
        fresh = TokenWeighting.create(weighting.name, **{k: v for k, v in weighting.describe().items() if k != "name"})
        fresh.load_state_dict(weighting.state_dict())
        fresh.eval()
        torch.testing.assert_close(fresh(logits, labels), weighting(logits, labels))
        assert fresh.weights_table() == weighting.weights_table()


def test_fit_is_deterministic_and_validates() -> None:
    a, b = _all_fitted(), _all_fitted()
    for x, y in zip(a, b):
        assert x.weights_table() == y.weights_table()
    with pytest.raises(RuntimeError, match="fit"):
        Frequency()(*_random_batch(2, 2, 3))
    with pytest.raises(ValueError, match="outside level 1"):
        Frequency().fit(_table((0, 0), (1, 5)), [2, 3], np.array([1]))
    with pytest.raises(ValueError, match="train_targets"):
        Frequency().fit(_table((0, 0), (1, 1)), [2, 2], np.array([3]))
    with pytest.raises(ValueError, match="level_sizes"):
        Frequency().fit(_table((0, 0), (1, 1)), [2], np.array([1]))
    fitted = Frequency().fit(_table((0, 0), (1, 1)), [2, 2], np.array([1]))
    with pytest.raises(ValueError, match="positions"):
        fitted(*_random_batch(2, 3, 2))
