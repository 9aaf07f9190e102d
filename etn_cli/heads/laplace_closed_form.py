"""Last-layer Laplace in closed form: laplace-torch's last-layer GGN posterior, computed with a
few matrix products instead of one backward pass per class.

For a linear last layer ``f(h) = W h + c`` under the softmax likelihood the GGN of each row is
``Lambda_n (x) h_n h_n^T`` with ``Lambda_n = diag(p_n) - p_n p_n^T``, so the curvature that
laplace-torch (its default Curvlinops backend, exact type-2 GGN) assembles from C backward
passes per batch is, over N rows with probabilities P (N, C):

* KFAC (``kron``): ``G = sum_n Lambda_n = diag(P^T 1) - P^T P`` (C, C) and ``A = H^T H / N``
  (D, D) for ``W``; ``G`` alone for ``c`` (laplace-torch sums the factors of its batches, and
  scales the input factor by the batch's share of N);
* diagonal (``diag``): ``(P (1 - P))^T (H * H)`` (C, D) for ``W`` and ``sum_n p_n (1 - p_n)`` for
  ``c``.

The prior precision ``delta`` (one scalar) maximises the Laplace log marginal likelihood
``-sum_n CE_n - 1/2 (log det P - P_params log delta + delta |theta|^2)`` with
``P = G (x) A + delta I`` (eigenvalues ``g_i a_j + delta``), by the same Adam steps on
``log delta`` as laplace-torch's ``optimize_prior_precision(method="marglik")``. The predictive
draws ``theta_s = theta + P^{-1/2} e_s`` from one ``randn(S, P_params)`` of the given generator,
as laplace-torch's ``sample`` does, so both give the same weight samples.
``tests/test_laplace_closed_form.py`` checks factors, prior precision and predictive against
laplace-torch to 1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


def last_layer_curvature(
    weight: torch.Tensor, bias: torch.Tensor, h: torch.Tensor, y: torch.Tensor, structure: str
) -> tuple[float, list[torch.Tensor]]:
    """The summed cross-entropy and the GGN of ``(W, c)`` on ``(h, y)``, in float64: KFAC
    factors ``[G, A, G]`` (weight's two, bias's one) or diagonals ``[H_W (C*D,), H_c (C,)]``."""
    h = h.double()
    logits = F.linear(h, weight.double(), bias.double())  # (N, C)
    loss = float(F.cross_entropy(logits, y, reduction="sum"))
    p = torch.softmax(logits, dim=1)  # (N, C)
    if structure == "kron":
        g = torch.diag(p.sum(0)) - p.T @ p  # (C, C)
        return loss, [g, h.T @ h / len(h), g.clone()]
    variance = p * (1 - p)  # (N, C)
    return loss, [(variance.T @ (h * h)).flatten(), variance.sum(0)]


def symmetric_eigen(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues clamped at 0 and eigenvectors, as laplace-torch's ``symeig``."""
    values, vectors = torch.linalg.eigh(matrix, UPLO="U")
    return values.clamp(min=0.0).nan_to_num(), vectors.nan_to_num()


@dataclass
class ClosedFormLaplace:
    """The posterior ``N(theta, P^-1)`` of a last layer: ``mean`` ``[W.flatten(), c]``,
    curvature ``factors`` (see :func:`last_layer_curvature`), summed ``loss``, ``n_data`` and
    the scalar ``prior_precision``."""

    structure: str
    mean: torch.Tensor  # (C*D + C,) float64
    factors: list[torch.Tensor]
    loss: float
    n_data: int
    n_classes: int
    prior_precision: torch.Tensor  # (1,)

    @classmethod
    def fit(cls, weight, bias, h, y, structure: str) -> ClosedFormLaplace:
        loss, factors = last_layer_curvature(weight, bias, h, y, structure)
        mean = torch.cat([weight.double().flatten(), bias.double()])
        one = torch.ones(1, dtype=torch.float64)
        return cls(structure, mean, factors, loss, len(h), len(bias), one)

    def __post_init__(self) -> None:
        if self.structure == "kron":  # eigenvalues of G, A (the bias's G is the same matrix)
            self.eigen_ = [symmetric_eigen(f) for f in self.factors[:2]]
            same = torch.equal(self.factors[2], self.factors[0])  # as fitted: one eigh less
            self.eigen_.append(self.eigen_[0] if same else symmetric_eigen(self.factors[2]))

    def log_det_posterior(self, delta: torch.Tensor) -> torch.Tensor:
        if self.structure == "diag":
            return sum(torch.log(f + delta).sum() for f in self.factors)
        (g, _), (a, _), (g_bias, _) = self.eigen_
        return torch.log(torch.outer(g, a) + delta).sum() + torch.log(g_bias + delta).sum()

    def log_marginal_likelihood(self, delta: torch.Tensor) -> torch.Tensor:
        n_params = len(self.mean)
        log_det_ratio = self.log_det_posterior(delta) - n_params * delta.log().sum()
        scatter = (self.mean * delta) @ self.mean
        return -self.loss - 0.5 * (log_det_ratio + scatter)

    def optimize_prior_precision(self, steps: int, lr: float) -> None:
        """Adam on ``log delta`` from ``delta = 1``, maximising the log marginal likelihood."""
        log_delta = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.Adam([log_delta], lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            (-self.log_marginal_likelihood(log_delta.exp())).backward()
            optimizer.step()
        self.prior_precision = log_delta.detach().exp()

    def weight_samples(
        self, n_samples: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``S`` draws of ``W`` (S, C, D) and ``c`` (S, C) from the posterior, float64."""
        c = self.n_classes
        d = (len(self.mean) - c) // c
        noise = torch.randn(n_samples, len(self.mean), dtype=torch.float64, generator=generator)
        noise = noise.to(self.mean.device)  # drawn on the host: the same draws on any device
        delta = self.prior_precision
        e_w, e_c = noise[:, : c * d].reshape(n_samples, c, d), noise[:, c * d :]
        if self.structure == "diag":
            h_w, h_c = self.factors
            step_w = e_w * (h_w.reshape(c, d) + delta).rsqrt()
            step_c = e_c * (h_c + delta).rsqrt()
        else:
            (g, q_g), (a, q_a), (g_bias, q_bias) = self.eigen_
            scale = (torch.outer(g, a) + delta).rsqrt()  # (C, D)
            step_w = q_g @ ((q_g.T @ e_w @ q_a) * scale) @ q_a.T
            step_c = ((e_c @ q_bias) * (g_bias + delta).rsqrt()) @ q_bias.T
        weight = self.mean[: c * d].reshape(c, d) + step_w
        return weight, self.mean[c * d :] + step_c

    def state(self) -> dict[str, torch.Tensor]:
        """laplace-torch's saved state (``mean``, ``H`` factors, ``prior_precision``, ``loss``,
        ``n_data``) under the names the head's checkpoint uses."""
        tensors = {
            "mean": self.mean,
            "prior_precision": self.prior_precision,
            "loss": torch.tensor(self.loss, dtype=torch.float64),
            "n_data": torch.tensor(self.n_data),
        }
        if self.structure == "kron":
            g, a, g_bias = self.factors
            return tensors | {"H.0.0": g, "H.0.1": a, "H.1.0": g_bias}
        return tensors | {"H": torch.cat(self.factors)}

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], structure: str, n_classes: int):
        if structure == "kron":
            factors = [tensors["H.0.0"], tensors["H.0.1"], tensors["H.1.0"]]
        else:
            h = tensors["H"]
            factors = [h[:-n_classes], h[-n_classes:]]
        return cls(
            structure, tensors["mean"].double(), [f.double() for f in factors],
            float(tensors["loss"]), int(tensors["n_data"]), n_classes,
            tensors["prior_precision"].double().reshape(1),
        )  # fmt: skip
