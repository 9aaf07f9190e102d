"""Every head and scorer computes on the device it is asked to, with all of its fitted state
there: checked on a CPU-only machine with PyTorch's ``meta`` device standing in for a GPU. A
``meta`` tensor has a shape and no values, and an operation mixing it with a CPU tensor raises,
as mixing a CUDA and a CPU tensor does. What a GPU allows and ``meta`` cannot do, copying
values back to the host (``.cpu()``, ``.item()``, ``bool``), gives ones of the right shape
here (:func:`meta_as_accelerator`), so a prediction runs to its end; ``.numpy()`` of a device
tensor raises as on a GPU."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from etn_cli.heads import Head, heads

VARIANTS = [(name, {}) for name in heads.names()] + [
    ("etn", {"variant": "vector"}),
    ("etn", {"variant": "matrix"}),
    ("static", {"variant": "vector"}),
    ("static", {"variant": "matrix"}),
    ("laplace", {"hessian_structure": "diag"}),
    ("laplace", {"backend": "laplace_torch"}),
    ("sngp", {"covariance": "shared"}),
]
IDS = [f"{n}:{','.join(f'{k}={v}' for k, v in s.items())}" if s else n for n, s in VARIANTS]


def fit(name: str, settings: dict, data) -> Head:
    fields = {f.name for f in dataclasses.fields(heads.get(name).Config)}
    head = heads.get(name)(**{k: v for k, v in {"epochs": 2}.items() if k in fields}, **settings)
    classifier = {k: torch.from_numpy(v) for k, v in data.classifier.items()}
    layers = data.layers
    return head.fit(data.hidden, data.logits, data.labels, classifier=classifier, layers=layers)


def tensors_in(value, seen: set[int] | None = None, path: str = "head"):
    """Every tensor reachable from ``value``: attributes of any object (a library's too),
    modules' parameters and buffers, containers; with the path that reaches it."""
    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, str | bytes | int | float | bool | type(None)):
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, torch.nn.Module):
        for name, t in [*value.named_parameters(), *value.named_buffers()]:
            yield f"{path}.{name}", t
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from tensors_in(v, seen, f"{path}[{k!r}]")
    elif isinstance(value, list | tuple | set):
        for i, v in enumerate(value):
            yield from tensors_in(v, seen, f"{path}[{i}]")
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for k, v in vars(value).items():
            yield from tensors_in(v, seen, f"{path}.{k}")


@pytest.fixture(scope="module")
def data(features_factory):
    return features_factory(n=120, d=16, c=4, seed=0)


@pytest.fixture(scope="module", params=VARIANTS, ids=IDS)
def fitted(request, data) -> Head:
    name, settings = request.param
    return fit(name, settings, data)


def test_moving_a_fitted_head_leaves_no_tensor_behind(fitted):
    moved = copy.deepcopy(fitted).to("meta")  # meta keeps no values: move a copy
    left = [path for path, t in tensors_in(vars(moved)) if not t.is_meta]
    assert not left, f"still on the CPU after head.to('meta'): {left}"


def test_every_head_predicts_with_its_state_and_inputs_on_another_device(
    fitted, data, meta_as_accelerator
):
    """``predict(device="meta")`` runs every operation of the head's prediction on ``meta``: a
    tensor it made on the CPU (or a fitted tensor the mover missed) would raise here."""
    if getattr(fitted.config, "backend", "") == "laplace_torch":
        pytest.skip("laplace-torch draws with a generator of the scoring device; meta has none")
    head = copy.deepcopy(fitted)
    pred = head.predict(data.hidden, data.logits, layers=data.layers, device="meta")
    assert pred.probs.shape == data.logits.shape
    head.score(data.hidden, data.logits, layers=data.layers, device="meta")


def test_a_head_moved_to_its_device_and_back_predicts_exactly_as_before(fitted, data):
    before = fitted.predict(data.hidden, data.logits, layers=data.layers)
    fitted.to("cpu")
    after = fitted.predict(data.hidden, data.logits, layers=data.layers)
    np.testing.assert_array_equal(before.probs, after.probs)
    for name, values in before.scores.items():
        np.testing.assert_array_equal(values, after.scores[name], err_msg=name)


ORDER_KEEPING = [
    ("etn", {}),
    ("etn", {"calibrate": "temperature"}),
    ("static", {}),
    ("adats", {}),
    ("temperature", {}),
]


@pytest.mark.parametrize(("name", "settings"), ORDER_KEEPING, ids=lambda v: str(v))
def test_order_keeping_heads_predict_the_classifiers_argmax_at_any_logit_scale(name, settings):
    """The scalar transformations scale the logits by a positive factor: the predicted class is
    the classifier's on every row, also where huge logits make the probabilities tie or round
    (C = 1,000; logits up to 1e4, many rows with all logits far negative)."""
    rng = np.random.default_rng(0)
    n, d, c = 300, 8, 1000
    hidden = rng.normal(size=(n, d)).astype(np.float32)
    labels = rng.integers(0, c, n)
    logits = rng.normal(scale=3.0, size=(n, c))
    logits[np.arange(n), labels] += 5.0
    logits *= np.exp(rng.uniform(0, np.log(2000), size=(n, 1)))  # scales 1 .. 2,000
    logits[::3] -= 5000.0  # rows whose logits are all far negative
    logits = logits.astype(np.float32)
    classifier = {"weight": torch.ones(c, d), "bias": torch.ones(c)}
    fields = {f.name for f in dataclasses.fields(heads.get(name).Config)}
    fast = {k: v for k, v in {"epochs": 2, "batch_size": 64}.items() if k in fields}
    head = heads.get(name)(**fast, **settings)
    head.fit(hidden, logits, labels, classifier=classifier)
    assert head.keeps_argmax
    pred = head.predict(hidden, logits)
    np.testing.assert_array_equal(pred.predictions, logits.argmax(1))
