"""The closed-form last-layer Laplace equals laplace-torch, its oracle: curvature, prior precision
tuned by marginal likelihood, weight samples and the MC predictive, to 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from etn_cli.heads.laplace import LaplaceConfig, LastLayerLaplace, build_laplace, fit_laplace
from etn_cli.heads.laplace_closed_form import ClosedFormLaplace

pytest.importorskip("laplace")

N, D, C = 1100, 12, 5  # three of laplace-torch's fitting batches of 512


@pytest.fixture(scope="module")
def problem():
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(N, D, generator=generator)
    weight = 0.5 * torch.randn(C, D, generator=generator)
    bias = 0.1 * torch.randn(C, generator=generator)
    y = (h @ weight.T + bias + torch.randn(N, C, generator=generator)).argmax(1)
    return h, y, weight, bias


def _oracle(problem, structure: str):
    h, y, weight, bias = problem
    layer = nn.Linear(D, C)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    la = build_laplace(layer, structure)
    fit_laplace(la, h, y, LaplaceConfig(hessian_structure=structure))
    return la


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_closed_form_laplace_equals_laplace_torch(problem, structure):
    h, y, weight, bias = problem
    la = _oracle(problem, structure)
    ours = ClosedFormLaplace.fit(weight, bias, h, y, structure)
    ours.optimize_prior_precision(steps=100, lr=0.1)
    state = la.state_dict()
    expected = (
        [state["H"][0][0], state["H"][0][1], state["H"][1][0]]
        if structure == "kron"
        else [state["H"][: C * D], state["H"][C * D :]]
    )
    for mine, theirs in zip(ours.factors, expected, strict=True):
        torch.testing.assert_close(mine, theirs.double(), rtol=1e-5, atol=1e-8)
    assert ours.loss == pytest.approx(float(state["loss"]), rel=1e-10)
    assert float(ours.prior_precision) == pytest.approx(float(la.prior_precision), rel=1e-5)
    weights, biases = ours.weight_samples(20, torch.Generator().manual_seed(3))
    theirs = la.sample(20, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(torch.cat([weights.flatten(1), biases], 1), theirs, rtol=1e-5,
                               atol=1e-8)  # fmt: skip


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_the_heads_two_backends_predict_the_same(problem, structure):
    h, y, weight, bias = problem
    classifier = {"weight": weight, "bias": bias}
    logits = h @ weight.T + bias
    predictions = []
    for backend in ("closed_form", "laplace_torch"):
        head = LastLayerLaplace(hessian_structure=structure, backend=backend)
        head.fit(h, logits, y, classifier=classifier)
        predictions.append(head.predict(h[:200], logits[:200]))
    ours, oracle = predictions
    np.testing.assert_allclose(ours.probs, oracle.probs, rtol=1e-5, atol=1e-10)
    for name in oracle.scores:
        np.testing.assert_allclose(ours.scores[name], oracle.scores[name], rtol=1e-5, atol=1e-10)


def test_the_glm_predictive_asks_for_laplace_torch():
    from etn_cli.errors import EtnError

    with pytest.raises(EtnError, match="laplace_torch"):
        LastLayerLaplace(pred_type="glm")
