"""The sampling, distance-aware, meta-model and ODIN baselines (mcd, ensemble, duq, sngp, dmm,
odin) and the digits CNN's extract-time options they rely on: each head's defining behaviour,
checked where the right answer is known in closed form or by an independent computation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import softmax
from sklearn.metrics import roc_auc_score
from tiny_pipeline import tiny_pipeline

from etn_cli.backbones import digits_cnn
from etn_cli.datasets import datasets
from etn_cli.errors import EtnError
from etn_cli.heads import Head
from etn_cli.heads.dmm import DMM, belief_matching_loss
from etn_cli.heads.duq import DUQ
from etn_cli.heads.ensemble import Ensemble
from etn_cli.heads.mcd import MCDropout, keep_masks, seed_key
from etn_cli.heads.odin import ODIN
from etn_cli.heads.sngp import SNGP


@pytest.fixture(scope="module")
def data(features_factory):
    return features_factory(n=200, d=16, c=4, seed=0)


def classifier_logits(data) -> np.ndarray:
    return data.hidden.astype(np.float64) @ data.weight.T.astype(np.float64) + data.bias


# ----------------------------------------------------------------------------- MC dropout
def test_mc_dropout_without_dropout_is_the_classifier_softmax_with_zero_mi(data):
    head = MCDropout(p=0.0).fit(data.hidden, data.logits, data.labels, classifier=data.classifier)
    pred = head.predict(data.hidden, data.logits)
    np.testing.assert_allclose(pred.probs, softmax(classifier_logits(data), axis=1), atol=1e-12)
    np.testing.assert_allclose(pred.scores["mi"], 0.0, atol=1e-12)


def test_mc_dropout_gives_every_sample_positive_mi(data):
    head = MCDropout(p=0.5).fit(data.hidden, data.logits, data.labels, classifier=data.classifier)
    assert (head.predict(data.hidden, data.logits).scores["mi"] > 1e-6).all()


def test_mc_dropout_masks_keep_a_fraction_one_minus_p_and_depend_on_the_seed_alone(data):
    keep = keep_masks(seed_key(0), passes=2000, width=32, p=0.3)  # (S, 1, D): 64,000 draws
    assert keep.shape == (2000, 1, 32)
    assert abs(keep.mean() - 0.7) < 4 * np.sqrt(0.21 / keep.size)
    assert not np.array_equal(keep[0], keep[1])  # passes differ
    assert not np.array_equal(keep, keep_masks(seed_key(1), 2000, 32, 0.3))
    np.testing.assert_array_equal(keep, keep_masks(seed_key(0), 2000, 32, 0.3))


def test_mc_dropout_is_the_average_of_s_dropout_networks_shared_by_every_row(data):
    head = MCDropout(p=0.3, passes=5, seed=3)
    head.fit(data.hidden, data.logits, data.labels, classifier=data.classifier)
    keep = keep_masks(seed_key(3), 5, 16, 0.3)[:, 0]  # (S, D)
    logits = np.einsum("nd,sd,cd->snc", data.hidden.astype(np.float64), keep / 0.7, data.weight)
    expected = softmax(logits + data.bias, axis=2).mean(0)
    pred = head.predict(data.hidden, data.logits)
    np.testing.assert_allclose(pred.probs, expected, rtol=1e-6, atol=1e-9)
    alone = head.predict(data.hidden[7:8], data.logits[7:8])  # the same row in any batch
    np.testing.assert_allclose(alone.probs[0], pred.probs[7], rtol=1e-12, atol=0)


def test_mc_dropout_refuses_a_classifier_of_the_wrong_shape(data):
    classifier = {"weight": data.weight[:, :8], "bias": data.bias}
    with pytest.raises(EtnError, match="weight"):
        MCDropout().fit(data.hidden, data.logits, data.labels, classifier=classifier)


# ----------------------------------------------------------------------------- ensemble
def test_ensemble_members_differ_but_their_mean_logits_stay_near_the_classifier(data):
    head = Ensemble(epochs=5).fit(data.hidden, data.logits, data.labels, classifier=data.classifier)
    weights = head.weight_.numpy()  # (M, C, D)
    assert weights.shape == (3, 4, 16)
    assert all(not np.allclose(weights[i], weights[j]) for i, j in ((0, 1), (0, 2), (1, 2)))
    members = np.einsum("nd,mcd->mnc", data.hidden, weights) + head.bias_.numpy()[:, None]
    base = classifier_logits(data)
    change = np.abs(members.mean(0) - base).mean() / np.abs(base).mean()
    assert 0 < change < 0.05
    pred = head.predict(data.hidden, data.logits)
    np.testing.assert_allclose(pred.probs, softmax(members.mean(0), axis=1), atol=1e-6)
    assert (pred.scores["mi"] >= 0).all() and pred.scores["mi"].max() > 0


def test_ensemble_refuses_a_single_member():
    with pytest.raises(EtnError, match="members >= 2"):
        Ensemble(members=1)


# ----------------------------------------------------------------------------- DUQ
@pytest.fixture(scope="module")
def duq(data) -> DUQ:
    return DUQ(epochs=5, centroid_size=32).fit(data.hidden, data.logits, data.labels)


def test_duq_kernel_matches_an_independent_rbf_computation(duq, data):
    net = duq.net_
    x = (data.hidden - net.mean.double().numpy()) / net.std.double().numpy()  # (N, D)
    w = net.W.detach().double().numpy().reshape(16, 32, 4)  # (D, E, C)
    centroids = (net.m / net.N).double().numpy()  # (E, C)
    dist = ((np.einsum("nd,dec->nec", x, w) - centroids) ** 2).mean(1)  # (N, C)
    kernel = np.exp(-dist / (2 * 0.1**2))
    pred = duq.predict(data.hidden, data.logits)
    np.testing.assert_allclose(pred.scores["kernel"], kernel.max(1), rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(pred.probs, kernel / kernel.sum(1, keepdims=True), rtol=1e-9)


def test_duq_kernel_is_highest_at_a_centroid_and_decreases_away_from_it(duq, data):
    net = duq.net_
    w = net.W.detach().double().reshape(16, 32, 4)  # (D, E, C)
    centroids = (net.m / net.N).double()  # (E, C)
    rng = np.random.default_rng(0)
    for c in range(4):
        # the input whose embedding is nearest to centroid c (least squares)
        x_star = torch.linalg.lstsq(w[:, :, c].T, centroids[:, c]).solution  # (D,)
        h_star = x_star.numpy() * net.std.numpy() + net.mean.numpy()
        direction = rng.normal(size=16) * net.std.numpy()
        path = np.stack([h_star + t * direction for t in (0.0, 0.3, 1.0, 3.0)])
        values = duq.log_kernel(torch.from_numpy(path))[:, c].numpy()
        assert (np.diff(values) < 0).all()
        training = duq.log_kernel(torch.from_numpy(data.hidden))[:, c].numpy()
        assert values[0] >= training.max()


def test_duq_gradient_penalty_uses_the_exact_input_gradient(duq, data):
    x = duq.net_.standardize(torch.from_numpy(data.hidden[:10])).requires_grad_(True)
    kernel, grad = duq.net_.kernel_and_gradient(x)
    (autograd,) = torch.autograd.grad(kernel.sum(), x)
    torch.testing.assert_close(grad, autograd, rtol=1e-4, atol=1e-7)


# ----------------------------------------------------------------------------- SNGP
@pytest.fixture(scope="module")
def sngp(data) -> SNGP:
    return SNGP(random_features=256).fit(data.hidden, data.logits, data.labels)


def test_sngp_predictive_variance_grows_away_from_the_data(sngp, data):
    direction = np.random.default_rng(3).normal(size=(50, 16))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    far = (data.hidden[:50] + 20.0 * direction).astype(np.float32)
    near_var = sngp.predictive_variance(torch.from_numpy(data.hidden)).numpy()  # (N, C)
    far_var = sngp.predictive_variance(torch.from_numpy(far)).numpy()
    assert far_var.min() > near_var.max()
    near_mp = sngp.predict(data.hidden, data.logits).scores["mp"]
    far_mp = sngp.predict(far, data.logits[:50]).scores["mp"]
    assert np.median(far_mp) < np.median(near_mp)


def test_sngp_covariance_is_the_inverse_laplace_precision(sngp, data):
    phi = sngp.gp_.features(torch.from_numpy(data.hidden).double()).numpy()  # (N, M)
    probs = softmax(phi @ sngp.gp_.beta.weight.detach().double().numpy().T, axis=1)
    for k in (0, 3):
        weights = probs[:, k] * (1 - probs[:, k])
        precision = np.eye(256) + (phi * weights[:, None]).T @ phi
        np.testing.assert_allclose(
            sngp.covariance_[k].numpy(), np.linalg.inv(precision), rtol=1e-4, atol=1e-6
        )
    logits = phi @ sngp.gp_.beta.weight.detach().double().numpy().T
    variance = sngp.predictive_variance(torch.from_numpy(data.hidden)).numpy()
    expected = softmax(logits / np.sqrt(1 + np.pi / 8 * variance), axis=1)
    np.testing.assert_allclose(sngp.predict(data.hidden, data.logits).probs, expected, rtol=1e-6)


def test_sngp_refuses_per_class_covariances_that_do_not_fit_in_memory(data):
    with pytest.raises(EtnError, match="covariance = 'shared'"):
        SNGP(random_features=16384).fit(data.hidden, data.logits, data.labels)


# ----------------------------------------------------------------------------- DMM
def ambiguous_features(split: int, n: int = 300, d: int = 8, c: int = 3):
    """Three clean class clusters and a fourth cluster whose labels are random; one pooled
    "layer" is a ReLU projection of the hidden state."""
    rng = np.random.default_rng([0, split])
    centres = np.random.default_rng(0).normal(scale=4.0, size=(c + 1, d))
    cluster = rng.integers(0, c + 1, size=n)
    hidden = (centres[cluster] + rng.normal(size=(n, d))).astype(np.float32)
    labels = np.where(cluster < c, cluster, rng.integers(0, c, size=n))
    projection = np.random.default_rng(1).normal(size=(d, 6))
    layers = {"block": np.maximum(hidden @ projection, 0).astype(np.float32)}
    return hidden, np.zeros((n, c), np.float32), labels, layers, cluster == c


def test_dmm_ranks_samples_with_ambiguous_labels_as_more_uncertain():
    hidden, logits, labels, layers, _ = ambiguous_features(0)
    head = DMM(epochs=100, batch_size=64).fit(hidden, logits, labels, layers=layers)
    hidden, logits, _, layers, ambiguous = ambiguous_features(1)
    pred = head.predict(hidden, logits, layers=layers)
    # MP and DE separate the ambiguous cluster almost perfectly; evidence (UM) and MI also
    # rank it lower / higher, less sharply: samples at the edges of clean clusters get less
    # evidence too.
    expected_auroc = {"mp": 0.95, "de": 0.95, "um": 0.6, "mi": 0.6}
    for score, higher_when_ambiguous in (("mp", False), ("um", False), ("mi", True), ("de", True)):
        values = pred.scores[score] if higher_when_ambiguous else -pred.scores[score]
        assert roc_auc_score(ambiguous, values) > expected_auroc[score], score
        assert np.median(values[ambiguous]) > np.median(values[~ambiguous]), score


def test_dmm_kl_term_matches_a_monte_carlo_estimate():
    alpha = np.array([[2.0, 0.7, 5.0]])
    log_alpha = torch.from_numpy(np.log(alpha))
    y = torch.tensor([1])
    kl = belief_matching_loss(log_alpha, y, 1.0, 1.0) - belief_matching_loss(log_alpha, y, 0, 1)
    draws = stats.dirichlet(alpha[0]).rvs(200_000, random_state=0)
    estimate = np.mean(
        stats.dirichlet(alpha[0]).logpdf(draws.T) - stats.dirichlet([1.0] * 3).logpdf(draws.T)
    )
    assert float(kl) == pytest.approx(estimate, abs=0.02)


def test_dmm_needs_intermediate_layers_and_the_same_ones_at_prediction(data):
    with pytest.raises(EtnError, match="layers"):
        DMM(epochs=1).fit(data.hidden, data.logits, data.labels)
    odin_only = {"odin": data.logits / 1000}
    with pytest.raises(EtnError, match="besides ODIN"):
        DMM(epochs=1).fit(data.hidden, data.logits, data.labels, layers=odin_only)
    head = DMM(epochs=1).fit(data.hidden, data.logits, data.labels, layers=data.layers)
    with pytest.raises(EtnError, match="block2"):
        head.predict(data.hidden, data.logits, layers={"block1": data.layers["block1"]})


# ----------------------------------------------------------------------------- ODIN
def test_odin_uses_the_perturbed_logits_when_the_features_have_them(data, tmp_path):
    perturbed = (data.logits + 0.5) / 1000.0
    head = ODIN().fit(data.hidden, data.logits, data.labels, layers={"odin": perturbed})
    pred = head.predict(data.hidden, data.logits, layers={"odin": perturbed})
    np.testing.assert_allclose(pred.probs, softmax(perturbed.astype(np.float64), axis=1))
    assert head.display_label == "ODIN"
    head.save(tmp_path)
    assert Head.load(tmp_path).display_label == "ODIN"
    with pytest.raises(EtnError, match="odin = true"):
        head.predict(data.hidden, data.logits)


def test_odin_without_perturbed_logits_falls_back_to_temperature_only(data, tmp_path):
    head = ODIN(temperature=10.0).fit(data.hidden, data.logits, data.labels)
    pred = head.predict(data.hidden, data.logits)
    np.testing.assert_allclose(pred.probs, softmax(data.logits.astype(np.float64) / 10, axis=1))
    np.testing.assert_allclose(pred.scores["mp"], pred.probs.max(1))
    assert head.display_label == "ODIN (temperature only)"
    head.save(tmp_path)
    assert Head.load(tmp_path).display_label == "ODIN (temperature only)"


# ----------------------------------------------------------------------------- digits CNN
SMALL = digits_cnn.Config(epochs=2, layers=("features.0", "features.6"), odin=True)


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> digits_cnn.DigitsCNNBackbone:
    return built(SMALL, tmp_path_factory.mktemp("cache"))


def built(config: digits_cnn.Config, cache, device: str = "cpu") -> digits_cnn.DigitsCNNBackbone:
    """The backbone with its weights trained (or found) by stage zero, as ``etn extract``."""
    from etn_cli.stages.prepare import prepared

    backbone = digits_cnn.DigitsCNNBackbone(config, cache, device=device)
    prepared(backbone)
    return backbone


@pytest.fixture(scope="module")
def images(backbone) -> torch.Tensor:
    split = datasets.get("digits")().load_split("test")
    return next(backbone.batches(split, 8))[0]  # (8, 1, 8, 8)


def test_digits_cnn_stores_pooled_layers_equal_to_the_module_outputs(backbone, images):
    hidden, logits, extras = backbone.extract_batch(images)
    assert set(extras) == {"features.0", "features.6", "odin"}
    assert extras["features.0"].shape == (8, SMALL.channels)
    assert extras["features.6"].shape == (8, SMALL.hidden)
    assert all(a.dtype == torch.float32 for a in extras.values())
    with torch.no_grad():  # the CNN computes in float64 (its float32 weights, exactly)
        conv = backbone.model.features[0](images.double())  # (8, channels, 8, 8)
        linear = backbone.model.features[:7](images.double())  # (8, hidden)
    torch.testing.assert_close(extras["features.0"], conv.mean(dim=(2, 3)).float())
    torch.testing.assert_close(extras["features.6"], linear.float())
    plain_hidden, plain_logits = backbone.forward(images)
    torch.testing.assert_close(hidden, plain_hidden)
    torch.testing.assert_close(logits, plain_logits)


def test_digits_cnn_odin_logits_match_an_independent_autograd_perturbation(backbone, images):
    _, _, extras = backbone.extract_batch(images)
    model, t, eps = backbone.model, SMALL.odin_temperature, SMALL.odin_epsilon
    for i in (0, 5):
        x = images[i : i + 1].double().requires_grad_(True)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits / t, logits.argmax(1))  # -log S_yhat
        loss.backward()
        perturbed = x.detach() - eps * torch.sign(x.grad)
        with torch.no_grad():
            expected = model(perturbed) / t
        torch.testing.assert_close(
            extras["odin"][i : i + 1], expected.float(), rtol=1e-5, atol=1e-8
        )
        assert not torch.allclose(expected, model(x.detach()) / t)


def test_unknown_layer_names_raise_an_error_listing_the_valid_ones(backbone, tmp_path):
    config = dataclasses.replace(SMALL, layers=("features.9",))
    with pytest.raises(EtnError, match=r"Unknown layer.*features\.9.*Valid names: features, "):
        digits_cnn.DigitsCNNBackbone(config, backbone.cache_dir)
    with pytest.raises(EtnError, match="more than once"):
        dataclasses.replace(SMALL, layers=("dropout", "dropout"))


def test_extract_options_change_the_fingerprint_but_not_the_cached_weights(backbone):
    plain = built(dataclasses.replace(SMALL, layers=(), odin=False), backbone.cache_dir)
    assert plain.folder == backbone.folder  # no retraining for extract-time options
    assert plain.weights_sha256 == backbone.weights_sha256
    assert plain.fingerprint() != backbone.fingerprint()
    hidden, logits, extras = plain.extract_batch(torch.zeros(2, 1, 8, 8))
    assert extras == {} and hidden.shape == (2, SMALL.hidden) and logits.shape == (2, 7)


def test_digits_cnn_extracts_with_odin_on_another_device(backbone, images, meta_as_accelerator):
    """The model moves to its device at the first forward pass, outside inference mode: ODIN
    differentiates through weights moved there (``meta`` stands in for a GPU)."""
    moved = built(SMALL, backbone.cache_dir, device="meta")
    assert next(moved.model.parameters()).device.type == "cpu"  # planning moves nothing
    hidden, logits, extras = moved.extract_batch(images)
    assert hidden.shape == (8, SMALL.hidden) and extras["odin"].shape == (8, 7)
    assert next(moved.model.parameters()).is_meta


@pytest.mark.parametrize(
    "temperature", ["temperature = 10.0", "sweep = { temperature = [10, 1000] }"]
)
def test_odin_temperature_fixed_by_the_backbone_is_refused_in_one_line(tmp_path, temperature):
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.planning.plan import make_plan

    pipeline = tmp_path / "odin.toml"
    odin = {"backbone": {"epochs": None, "odin": True}, "data": {"ood": None}, "heads": ("odin",)}
    pipeline.write_text(tiny_pipeline("odin", **odin) + f"{temperature}\n")
    with pytest.raises(EtnError, match="'temperature' = 10(.0)? would be ignored") as err:
        make_plan(load_pipeline(pipeline), tmp_path / "data")
    assert "odin_temperature in [backbone]" in str(err.value) and "\n" not in str(err.value)
    pipeline.write_text(pipeline.read_text().replace("odin = true\n", ""))  # the fallback uses T
    assert len(make_plan(load_pipeline(pipeline), tmp_path / "data").heads) >= 1


def test_odin_refuses_its_own_temperature_on_features_with_perturbed_logits(data):
    perturbed = (data.logits + 0.5) / 1000.0
    with pytest.raises(EtnError, match="temperature = 10.0 would be ignored") as err:
        ODIN(temperature=10.0).fit(
            data.hidden, data.logits, data.labels, layers={"odin": perturbed}
        )
    assert "\n" not in str(err.value)
