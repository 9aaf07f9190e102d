"""The scorers whose cut or inverse depends on second moments, on layers where float32 would
decide the result: each against numpy written out in float64 from the paper's formula.

* ViM and Residual on a nearly rank-deficient final layer (condition number 1.5e7): the origin
  ``u = -pinv(W) b`` lies about 10^4 times farther out than the features, so a float32 moment
  about it (or float32 rows minus it) blurs the eigenvalues near the cut. pytorch-ood's ViM,
  float32 throughout, ranks these rows with a rank correlation of only 0.95 to the float64
  reference, so it is no oracle here (tests/test_scorers_pytorch_ood.py compares on a
  well-conditioned layer).
* Mahalanobis, Mahalanobis++ and RMDS with a nearly collinear pair of units (covariance
  condition number about 4e6): float32 products lost 14% of the Mahalanobis distance.
* DDU with units that never fire for some classes (singular class covariances): the jitter
  must not be decided by rounding noise, so that features a few last bits apart (another
  machine's) give the same densities.
* The float64 moments themselves, by panels of the upper triangle (D = 300), against numpy's
  float64 products: float32 products would be 1e-7 of the largest entry off.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from sklearn.metrics import roc_auc_score

from etn_cli.heads import heads


def rank_deficient_layer(seed: int) -> dict[str, np.ndarray]:
    """40 classes in 64 non-negative dims; W (40, 64) with singular values from 1 to 1/1.5e7."""
    rng = np.random.default_rng(seed)
    dim, classes = 64, 40
    means = np.abs(rng.normal(size=(classes, dim))) * 2

    def rows(n: int, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
        y = rng.integers(0, classes, n)
        h = means[y] * (1 - shift / 2) + rng.normal(size=(n, dim)) * scale + shift
        return np.maximum(h, 0).astype(np.float32), y

    h, y = rows(2000)
    h_id, _ = rows(500)
    h_ood, _ = rows(500, scale=1.0, shift=0.6)
    left, _ = np.linalg.qr(rng.normal(size=(classes, classes)))
    right, _ = np.linalg.qr(rng.normal(size=(dim, classes)))
    weight = ((left * np.geomspace(1.0, 1 / 1.5e7, classes)) @ right.T).astype(np.float32)
    bias = (rng.normal(size=classes) * 1e-2).astype(np.float32)
    test = np.concatenate([h_id, h_ood])
    return {
        "h": h, "y": y, "z": h @ weight.T + bias, "test": test, "z_test": test @ weight.T + bias,
        "weight": weight, "bias": bias, "is_id": np.r_[np.ones(500, bool), np.zeros(500, bool)],
    }  # fmt: skip


def float64_residual_space(data: dict, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The paper's origin (by the SVD's pseudo-inverse) and residual basis, all float64."""
    w, b = data["weight"].astype(np.float64), data["bias"].astype(np.float64)
    origin = -np.linalg.pinv(w) @ b
    x = data["h"].astype(np.float64) - origin
    _, vectors = np.linalg.eigh(x.T @ x / len(x))
    return origin, vectors[:, : x.shape[1] - d]


@pytest.mark.parametrize("seed", [0, 1])
def test_vim_and_residual_on_a_nearly_rank_deficient_layer_match_float64(seed):
    data = rank_deficient_layer(seed)
    origin, basis = float64_residual_space(data, 32)
    assert np.linalg.norm(origin) > 1e4 * np.linalg.norm(data["h"], axis=1).mean()

    def residual(h: np.ndarray) -> np.ndarray:
        return np.linalg.norm((h.astype(np.float64) - origin) @ basis, axis=1)

    alpha = data["z"].astype(np.float64).max(1).mean() / residual(data["h"]).mean()
    energy = logsumexp(data["z_test"].astype(np.float64), axis=1)
    expected = {"vim": energy - alpha * residual(data["test"]), "residual": -residual(data["test"])}
    classifier = {k: torch.from_numpy(data[k]) for k in ("weight", "bias")}
    for name, reference in expected.items():
        head = heads.get(name)(dim=32).fit(data["h"], data["z"], data["y"], classifier=classifier)
        mine = head.score(data["test"], data["z_test"])
        np.testing.assert_allclose(mine, reference, rtol=0, atol=2e-5 * np.abs(reference).max())
        auroc = roc_auc_score(data["is_id"], mine)
        assert auroc == pytest.approx(roc_auc_score(data["is_id"], reference), abs=1e-4)


def collinear_units(seed: int = 3) -> dict[str, np.ndarray]:
    """4 classes in 16 dims far from the origin, the last unit the first plus 1e-3 noise."""
    rng = np.random.default_rng(seed)
    classes, dim = 4, 16
    means = rng.normal(size=(classes, dim)) * 2 + 20

    def rows(n: int, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, classes, n)
        h = means[y] + rng.normal(size=(n, dim)) * spread
        h[:, -1] = h[:, 0] + 1e-3 * rng.normal(size=n) * spread
        return h.astype(np.float32), y

    h, y = rows(3000)
    test = np.concatenate([rows(500)[0], rows(500, spread=1.5)[0]])
    z = np.eye(classes, dtype=np.float32)[y]  # unused by these scorers
    return {"h": h, "y": y, "z": z, "test": test, "z_test": np.zeros((1000, classes), np.float32)}


def float64_distances(h: np.ndarray, y: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, ...]:
    """Squared Mahalanobis distances of ``test`` to each class mean (tied covariance) and to
    the mean of all rows (their covariance), pinv of float64 covariances (``/ N``)."""
    h, test = h.astype(np.float64), test.astype(np.float64)
    means = np.stack([h[y == c].mean(0) for c in np.unique(y)])
    within = sum((h[y == c] - m).T @ (h[y == c] - m) for c, m in enumerate(means)) / len(h)
    prec = np.linalg.pinv(within, hermitian=True)
    md = np.stack([np.einsum("nd,de,ne->n", test - m, prec, test - m) for m in means], axis=1)
    centre = h.mean(0)
    prec0 = np.linalg.pinv((h - centre).T @ (h - centre) / len(h), hermitian=True)
    return md, np.einsum("nd,de,ne->n", test - centre, prec0, test - centre)


def test_gaussian_scorers_on_a_nearly_singular_covariance_match_float64():
    data = collinear_units()
    md, md0 = float64_distances(data["h"], data["y"], data["test"])

    def unit(a: np.ndarray) -> np.ndarray:
        a = a.astype(np.float64)
        return a / (np.linalg.norm(a, axis=1, keepdims=True) + 1e-10)

    md_pp, _ = float64_distances(unit(data["h"]), data["y"], unit(data["test"]))
    expected = {
        "mahalanobis": -md.min(1),
        "rmds": -(md - md0[:, None]).min(1),
        "mahalanobis_pp": -md_pp.min(1),
    }
    # RMDS subtracts two distances: a score near 0 keeps the absolute error of its terms, so the
    # tolerance is also 1e-6 of the smallest distance (numpy 2.4's pinv moved one such score by
    # 5e-8, 2e-6 of its value)
    atol = 1e-6 * md.min()
    for name, reference in expected.items():
        head = heads.get(name)().fit(data["h"], data["z"], data["y"])
        mine = head.score(data["test"], data["z_test"])
        np.testing.assert_allclose(mine, reference, rtol=1e-6, atol=atol, err_msg=name)


def silent_units(seed: int = 0) -> dict[str, np.ndarray]:
    """3 classes in 12 post-ReLU dims; each class has 3 units that never fire for it, and
    fewer rows (10) than dims for one class: singular class covariances."""
    rng = np.random.default_rng(seed)
    classes, dim = 3, 12
    means = np.abs(rng.normal(size=(classes, dim))) * 2 + 0.5
    silent = np.ones((classes, dim), bool)
    for c in range(classes):
        silent[c, rng.choice(dim, 3, replace=False)] = False

    def rows(n: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, classes, n)
        h = np.maximum(means[y] + rng.normal(size=(n, dim)) + shift, 0) * silent[y]
        return h.astype(np.float32), y

    h, y = rows(300)
    h, y = np.concatenate([h[y != 2], h[y == 2][:10]]), np.concatenate([y[y != 2], y[y == 2][:10]])
    test = np.concatenate([rows(200)[0], rows(200, shift=1.0)[0]])
    return {"h": h, "y": y, "z": np.eye(classes, dtype=np.float32)[y], "test": test}


def another_machine(features: np.ndarray, seed: int) -> np.ndarray:
    """The same features as another processor's kernels might give: 1e-6 relative noise, and
    2% of the exact zeros (ReLU outputs at a pre-activation of about 0) become up to 1e-7."""
    rng = np.random.default_rng(seed)
    moved = features * (1 + 1e-6 * rng.standard_normal(features.shape))
    woken = (features == 0) & (rng.random(features.shape) < 0.02)
    return np.where(woken, 1e-7 * rng.random(features.shape), moved).astype(np.float32)


def test_ddu_densities_do_not_depend_on_the_last_bits_of_the_features():
    data = silent_units()
    z_test = np.zeros((len(data["test"]), 3), np.float32)
    is_id = np.r_[np.ones(200, bool), np.zeros(200, bool)]
    head = heads.get("ddu")().fit(data["h"], data["z"], data["y"])
    mine = head.score(data["test"], z_test)
    jitter = float(head.jitter_)
    h = data["h"].astype(np.float64)
    assert 0 < jitter < 1e-6
    dens = []
    for c in range(3):  # log N(x; mu, S) written out: -(x-mu)^T S^-1 (x-mu)/2 - log|2 pi S|/2
        rows = h[data["y"] == c]
        cov = np.cov(rows, rowvar=False) + jitter * np.eye(12)
        centred = data["test"].astype(np.float64) - rows.mean(0)
        quadratic = np.einsum("nd,nd->n", centred, np.linalg.solve(cov, centred.T).T)
        dens.append(-0.5 * (quadratic + np.linalg.slogdet(2 * np.pi * cov)[1]))
    np.testing.assert_allclose(mine, logsumexp(np.stack(dens, 1), axis=1), rtol=1e-6)
    auroc = roc_auc_score(is_id, mine)
    for seed in range(3):
        other = heads.get("ddu")().fit(another_machine(data["h"], seed), data["z"], data["y"])
        theirs = other.score(another_machine(data["test"], seed + 10), z_test)
        assert float(other.jitter_) == jitter
        assert roc_auc_score(is_id, theirs) == pytest.approx(auroc, abs=1e-3)


def test_ddu_bisection_finds_the_jitter_a_scan_of_the_authors_list_finds():
    from etn_cli.heads.scorers.ddu import JITTERS, smallest_jitter

    data = silent_units()
    h, y = torch.from_numpy(data["h"]).double(), torch.from_numpy(data["y"])
    covs = torch.stack([torch.cov(h[y == c].T) for c in range(3)])  # (C, D, D), / (n_c - 1)
    floor = covs.diagonal(dim1=1, dim2=2).amax(1) * 12 * torch.finfo(torch.float64).eps
    for scale in (1.0, 1e-6, 1e6):  # the floor follows the variances
        scanned = next(
            eps
            for eps in JITTERS
            if ((f := torch.linalg.cholesky_ex(scale * covs + eps * torch.eye(12)))[1] == 0).all()
            and (f[0].diagonal(dim1=1, dim2=2).square() > scale * floor[:, None]).all()
        )
        assert smallest_jitter(scale * covs)[0] == scanned > 0


def test_moments_by_panels_equal_numpy_in_float64():
    from etn_cli.heads.scorers.statistics import by_panels, column_mean, gram, second_moment

    rng = np.random.default_rng(5)
    h = np.maximum(rng.normal(size=(3000, 300)) + 20, 0).astype(np.float32)  # three panels
    y = rng.integers(0, 5, len(h))
    scale = rng.random(len(h)) + 0.5
    means = np.stack([h[y == c].astype(np.float64).mean(0) for c in range(5)])
    x = torch.from_numpy(h)
    assert by_panels(x)
    cases = {
        "about a point": (means[0], None, None, h - means[0]),
        "about class means, scaled rows": (means, y, scale, h * scale[:, None] - means[y]),
    }
    for name, (centres, labels, weights, centred) in cases.items():
        mine = second_moment(
            x,
            torch.from_numpy(centres),
            None if labels is None else torch.from_numpy(labels),
            None if weights is None else torch.from_numpy(weights),
        )
        reference = centred.T @ centred
        scale = np.abs(reference).max()
        np.testing.assert_allclose(
            mine.numpy(), reference, rtol=0, atol=1e-13 * scale, err_msg=name
        )
        assert torch.equal(mine, mine.T)
    block = torch.from_numpy(h[:700] - means[0])
    reference = block.numpy().T @ block.numpy()
    np.testing.assert_allclose(gram(block).numpy(), reference, atol=1e-13 * reference.max())
    assert torch.equal(column_mean(x), x.double().mean(0))
