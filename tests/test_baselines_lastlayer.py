"""The last-layer baselines (MAP_EDL, AdaTS, IB-EDL, Laplace) do what their papers define, checked
on tiny seeded features against closed forms, independent computations and laplace-torch."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from etn_cli.errors import EtnError
from etn_cli.heads import Head, heads
from etn_cli.heads import laplace as laplace_module
from etn_cli.heads.adats import AdaTS
from etn_cli.heads.ib_edl import IBEDL
from etn_cli.heads.map_edl import EPS, MapEDL
from etn_cli.metrics.scores import dirichlet_scores, sample_scores


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def classifier_of(data) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in data.classifier.items()}


@pytest.fixture(scope="module")
def data(features_factory):
    return features_factory(n=400, d=16, c=4, seed=0)


@pytest.fixture(scope="module")
def held_out(features_factory):
    return features_factory(n=400, d=16, c=4, seed=0, split=1)


# ----------------------------------------------------------------------------- MAP_EDL
# One Adam step of 1e-12 cannot move float32 weights: the head as it was initialised (an
# untrained head, epochs = 0, is refused as a setting).
UNTRAINED = {"epochs": 1, "lr": 1e-12}


def test_map_edl_starts_from_the_backbone_classifier(data):
    head = MapEDL(**UNTRAINED).fit(
        data.hidden, data.logits, data.labels, classifier=classifier_of(data)
    )
    logits = data.hidden.astype(np.float64) @ data.weight.T + data.bias
    expected = softplus(logits) + 1.0 + EPS  # b starts at b_init = 1
    np.testing.assert_allclose(head.predict(data.hidden, data.logits).alpha, expected, rtol=1e-6)


def test_map_edl_training_concentrates_the_evidence_on_the_true_class(data, held_out):
    clf = classifier_of(data)
    before = MapEDL(**UNTRAINED).fit(data.hidden, data.logits, data.labels, classifier=clf)
    after = MapEDL(epochs=30, batch_size=100, lr=1e-2).fit(
        data.hidden, data.logits, data.labels, classifier=clf
    )
    rows = np.arange(len(held_out.labels))

    def true_and_other_evidence(head: Head) -> tuple[np.ndarray, np.ndarray]:
        alpha = head.predict(held_out.hidden, held_out.logits).alpha
        true = alpha[rows, held_out.labels]
        return true, (alpha.sum(1) - true) / 3

    true_before, other_before = true_and_other_evidence(before)
    true_after, other_after = true_and_other_evidence(after)
    share_before = true_before / (true_before + 3 * other_before)
    share_after = true_after / (true_after + 3 * other_after)
    assert np.median(share_after) > np.median(share_before) + 0.2
    assert np.median(true_after) > 1.5 * np.median(true_before)
    assert np.median(other_after) < 0.7 * np.median(other_before)
    assert (true_after > other_after).mean() > 0.9


@pytest.mark.parametrize("name", ["map_edl", "ib_edl", "laplace"])
def test_last_layer_heads_refuse_a_classifier_of_another_shape(name, data):
    wrong = {"weight": torch.zeros(4, 8), "bias": torch.zeros(4)}
    with pytest.raises(EtnError, match=r"weight \(4, 16\)"):
        heads.get(name)(**({"epochs": 1} if name != "laplace" else {})).fit(
            data.hidden, data.logits, data.labels, classifier=wrong
        )


# ----------------------------------------------------------------------------- AdaTS
def _two_regions(n: int, seed: int):
    """Two clusters of hidden states with the same kind of logits; in the first the label is
    the logits' argmax, in the second it is random."""
    rng = np.random.default_rng(seed)
    d, c = 8, 3
    region = np.repeat([0, 1], [n // 2, n - n // 2])
    centre = np.zeros((2, d))
    centre[:, 0] = [4.0, -4.0]
    hidden = centre[region] + rng.normal(size=(n, d))
    logits = rng.normal(scale=3.0, size=(n, c))
    labels = logits.argmax(1)
    labels[region == 1] = rng.integers(0, c, (region == 1).sum())
    return hidden.astype(np.float32), logits.astype(np.float32), labels, region


def test_adats_learns_a_higher_temperature_where_the_logits_are_unreliable():
    hidden, logits, labels, _ = _two_regions(200, seed=0)
    head = AdaTS(
        widths=(32, 32),
        temperature_widths=(16, 16),
        latent_dim=4,
        epochs=30,
        batch_size=100,
        lr=3e-3,
    ).fit(hidden, logits, labels)
    test_hidden, test_logits, _, region = _two_regions(200, seed=1)
    temperature = head.temperatures(torch.from_numpy(test_hidden)).numpy()
    assert np.median(temperature[region == 1]) > 10 * np.median(temperature[region == 0])
    # one temperature per sample scales every logit: the backbone's class is kept
    pred = head.predict(test_hidden, test_logits)
    np.testing.assert_array_equal(pred.predictions, test_logits.argmax(1))
    expected = softplus(test_logits / temperature[:, None].astype(np.float64))
    np.testing.assert_allclose(pred.alpha - expected, head.module_.b.item(), rtol=1e-6)


# ----------------------------------------------------------------------------- IB-EDL
def _tiny_ib_edl(beta: float):
    """An IB-EDL head on 3 features and 2 classes with input-dependent sigma, and its layer."""
    hidden = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]], dtype=np.float32)
    labels = np.array([1, 0])
    weight = np.array([[0.4, -0.2, 0.1], [-0.3, 0.8, 0.5]], dtype=np.float32)
    bias = np.array([0.2, -0.1], dtype=np.float32)
    logits = hidden @ weight.T + bias
    clf = {"weight": weight, "bias": bias}
    head = IBEDL(beta=beta, mc_samples=3, b_init=0.7, **UNTRAINED).fit(
        hidden, logits, labels, classifier=clf
    )
    std_rows = np.array([[0.3, 0.1, -0.2], [-0.5, 0.2, 0.4]], dtype=np.float32)
    with torch.no_grad():
        head.module_.linear.weight[2:] = torch.from_numpy(std_rows)
    std_bias = head.module_.linear.bias[2:].detach().numpy()
    layer = np.concatenate([weight, std_rows]), np.concatenate([bias, std_bias])
    return head, hidden, labels, layer


def test_ib_edl_loss_matches_an_independent_computation():
    head, hidden, labels, (w, c) = _tiny_ib_edl(beta=0.3)
    noise = np.random.default_rng(0).normal(size=(3, 2, 2))  # (M, B, C)
    out = hidden.astype(np.float64) @ w.T.astype(np.float64) + c.astype(np.float64)
    mu, sigma = out[:, :2], softplus(out[:, 2:]) + 1e-6
    alpha = softplus(mu + sigma * noise) + 0.7 + 1e-4  # b = softplus(inverse_softplus(0.7)) + eps
    p = alpha / alpha.sum(-1, keepdims=True)
    onehot = np.eye(2)[labels]
    risk = ((onehot - p) ** 2 + p * (1 - p) / (alpha.sum(-1, keepdims=True) + 1)).sum(-1)
    kl = 0.5 * (mu**2 + sigma**2 - 2 * np.log(sigma) - 1).sum(-1)
    expected = risk.mean(0) + 0.3 * kl
    h, y = torch.from_numpy(hidden), torch.from_numpy(labels)
    got = head.loss(h, y, torch.from_numpy(noise).float()).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    # the information bottleneck term is there, weighted by beta
    no_ib, _, _, _ = _tiny_ib_edl(beta=0.0)
    gap = got - no_ib.loss(h, y, torch.from_numpy(noise).float()).detach().numpy()
    np.testing.assert_allclose(gap, 0.3 * kl, rtol=1e-5)
    assert (kl > 0).all()


def test_ib_edl_predicts_the_dirichlet_of_its_mean_concentration_over_seeded_draws():
    head, hidden, _, (w, c) = _tiny_ib_edl(beta=1e-5)
    out = hidden.astype(np.float64) @ w.T.astype(np.float64) + c.astype(np.float64)
    mu, sigma = out[:, :2], softplus(out[:, 2:]) + 1e-6
    noise = torch.randn(3, 2, generator=torch.Generator().manual_seed(0)).double().numpy()
    b = head.module_.b.item()
    alpha = (softplus(mu[None] + sigma[None] * noise[:, None, :]) + b).mean(0)
    pred = head.predict(hidden, hidden[:, :2])
    np.testing.assert_allclose(pred.alpha, alpha, rtol=1e-6)
    np.testing.assert_allclose(pred.probs, alpha / alpha.sum(1, keepdims=True), rtol=1e-6)
    for name, values in dirichlet_scores(pred.alpha).items():
        np.testing.assert_array_equal(pred.scores[name], values, err_msg=name)


def test_ib_edl_with_learn_b_false_keeps_the_reference_prior_of_one(data):
    head = IBEDL(epochs=3, batch_size=64, learn_b=False).fit(
        data.hidden, data.logits, data.labels, classifier=classifier_of(data)
    )
    assert head.module_.b.item() == pytest.approx(1.0 + 1e-4, rel=1e-6)


# ----------------------------------------------------------------------------- Laplace
def _laplace_torch(data, structure: str = "kron"):
    """laplace-torch used directly, as its documentation shows, on the same classifier."""
    from laplace import Laplace

    layer = nn.Linear(data.weight.shape[1], data.weight.shape[0]).double()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(data.weight))
        layer.bias.copy_(torch.from_numpy(data.bias))
    la = Laplace(
        nn.Sequential(OrderedDict([("classifier", layer)])),
        "classification",
        subset_of_weights="last_layer",
        hessian_structure=structure,
        last_layer_name="classifier",
    )
    h, y = torch.from_numpy(data.hidden).double(), torch.from_numpy(data.labels)
    la.fit(DataLoader(TensorDataset(h, y), batch_size=laplace_module.FIT_BATCH))
    with pytest.warns(UserWarning, match="link_approx"):
        la.optimize_prior_precision(pred_type="glm", method="marglik", link_approx="mc")
    return la


@pytest.mark.parametrize("pred_type", ["nn", "glm"])
@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_laplace_saved_and_loaded_predicts_exactly_like_laplace_torch(
    structure, pred_type, data, held_out, tmp_path
):
    backend = "closed_form" if pred_type == "nn" else "laplace_torch"  # glm: the library's
    head = heads.get("laplace")(
        hessian_structure=structure, pred_type=pred_type, seed=3, backend=backend
    )
    head.fit(data.hidden, data.logits, data.labels, classifier=classifier_of(data))
    head.save(tmp_path)
    loaded = Head.load(tmp_path)
    pred = loaded.predict(held_out.hidden, held_out.logits)

    la = _laplace_torch(data, structure)
    samples = la.predictive_samples(
        torch.from_numpy(held_out.hidden).double(),
        pred_type=pred_type,
        n_samples=20,
        generator=torch.Generator().manual_seed(3),
    ).numpy()
    torch.testing.assert_close(loaded.la_.prior_precision, la.prior_precision)
    # diag: the head takes the library's diagonal output variance, equal up to rounding
    rtol = 1e-9 if (structure, pred_type) == ("diag", "glm") else 1e-12
    np.testing.assert_allclose(pred.probs, samples.mean(0), rtol=rtol, atol=1e-15)
    expected = sample_scores(samples)
    np.testing.assert_allclose(pred.scores["mi"], expected["mi"], rtol=1e3 * rtol, atol=1e-12)
    np.testing.assert_allclose(pred.scores["mp"], expected["mp"], rtol=rtol)


def test_laplace_mutual_information_grows_away_from_the_data(features_factory):
    # Hidden states live in the first 4 of 8 dimensions and the classifier ignores the rest,
    # so moving along the other 4 keeps the mean logits but leaves the data's support.
    data = features_factory(n=300, d=8, c=3, seed=2)
    data.hidden[:, 4:] = 0
    data.weight[:, 4:] = 0
    head = heads.get("laplace")().fit(
        data.hidden, data.logits, data.labels, classifier=classifier_of(data)
    )
    near = features_factory(n=60, d=8, c=3, seed=2, split=1)
    near.hidden[:, 4:] = 0
    far = near.hidden.copy()
    far[:, 4:] = 30.0
    mi_near = head.predict(near.hidden, near.logits).scores["mi"]
    mi_far = head.predict(far, near.logits).scores["mi"]
    assert (mi_far > mi_near).all()
    assert np.median(mi_far) > 10 * np.median(mi_near)


def test_laplace_nn_predictive_samples_the_same_distribution_as_the_glm(data, held_out):
    # For a linear last layer the GLM linearisation is exact: sampling the weights ("nn") and
    # sampling the logits ("glm") must agree up to Monte Carlo error.
    h = torch.from_numpy(held_out.hidden[:10])
    mean, var = {}, {}
    for kind in ("glm", "nn"):
        backend = "closed_form" if kind == "nn" else "laplace_torch"
        head = heads.get("laplace")(pred_type=kind, mc_samples=1500, backend=backend).fit(
            data.hidden, data.logits, data.labels, classifier=classifier_of(data)
        )
        samples = head.predictive_samples(h).numpy()  # (S, 10, C)
        mean[kind], var[kind] = samples.mean(0), samples.var(0) / len(samples)
    standard_error = np.sqrt(var["glm"] + var["nn"])
    assert (np.abs(mean["glm"] - mean["nn"]) < 5 * standard_error + 1e-6).all()
    assert standard_error.max() > 1e-3  # the posterior is not degenerate here


def test_laplace_refuses_a_glm_predictive_that_needs_too_much_memory(data, monkeypatch):
    head = heads.get("laplace")(pred_type="glm", backend="laplace_torch").fit(
        data.hidden, data.logits, data.labels, classifier=classifier_of(data)
    )
    monkeypatch.setattr(laplace_module, "MAX_ROW_BYTES", 1000)
    with pytest.raises(EtnError, match='pred_type = "nn"'):
        head.predict(data.hidden, data.logits)


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("map_edl", {"nu": 1.0}),
        ("adats", {"widths": []}),
        ("ib_edl", {"beta": -1e-5}),
        ("ib_edl", {"sigma_init": 0.0}),
        ("laplace", {"mc_samples": 0}),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_setting(name, setting):
    key = next(iter(setting))
    with pytest.raises(EtnError, match=rf"expected {key}|{key!r} must be"):
        heads.get(name)(**setting)


def test_ib_edls_compiled_risk_equals_the_eager_one_with_its_gradients():
    from etn_cli.heads.ib_edl import compiled_risk, sampled_risk

    generator = torch.Generator().manual_seed(1)
    mu, sigma = torch.randn(16, 50, generator=generator) * 4, torch.rand(16, 50) + 0.1
    noise, labels = torch.randn(20, 16, 50, generator=generator), torch.randint(0, 50, (16,))
    results = []
    for risk in (sampled_risk, compiled_risk()):
        leaves = [t.clone().requires_grad_() for t in (mu, sigma, torch.tensor([0.7]))]
        value = risk(leaves[0], leaves[1], noise, leaves[2], labels)
        value.sum().backward()
        results.append((value.detach(), *(t.grad for t in leaves)))
    for eager, fused in zip(*results, strict=True):
        torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-6)


def test_ib_edls_closed_form_gradients_equal_float64_autograd():
    from etn_cli.heads.ib_edl import risk_and_gradients, sampled_risk

    generator = torch.Generator().manual_seed(2)
    mu = torch.randn(8, 30, generator=generator, dtype=torch.float64) * 4
    sigma = torch.rand(8, 30, generator=generator, dtype=torch.float64) + 0.05
    noise = torch.randn(5, 8, 30, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 30, (8,), generator=generator)
    b = torch.tensor([0.3], dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (mu, sigma, b)]
    weights = torch.rand(8, generator=generator, dtype=torch.float64)  # a row-weighted upstream
    risk = sampled_risk(leaves[0], leaves[1], noise, leaves[2], labels)
    (risk * weights).sum().backward()
    onehot = torch.nn.functional.one_hot(labels, 30).double()
    value, d_mu, d_sigma, d_b = risk_and_gradients(mu, sigma, noise, b, onehot)
    torch.testing.assert_close(value, risk.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights[:, None] * d_mu, leaves[0].grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(weights[:, None] * d_sigma, leaves[1].grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close((weights * d_b).sum().reshape(1), leaves[2].grad, rtol=1e-10, atol=0)


def test_ib_edls_compiled_accuracy_pass_equals_its_prediction_concentrations(data):
    head = IBEDL(epochs=1, batch_size=64).fit(
        data.hidden, data.logits, data.labels, classifier=classifier_of(data)
    )
    hidden = torch.from_numpy(data.hidden)
    eager = head._mean_alpha(hidden, torch.float32)
    fused = head._mean_alpha(hidden, torch.float32, fused=True)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-6)
