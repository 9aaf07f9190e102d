"""Scorers on the residual of the features outside their principal subspace (Wang et al.,
"ViM: Out-Of-Distribution with Virtual-logit Matching", CVPR 2022): ViM and Residual.

Fit (ID statistics and the classifier): the origin ``u = -pinv(W) b`` (the point whose logits
are all zero), the eigenvectors of the uncentred second moment of ``x = h - u`` over the ID
rows, ``sum_i x_i x_i^T / N`` (the authors' ``EmpiricalCovariance(assume_centered=True)``),
and the complement ``R`` (D, D - d) of the ``d`` leading ones. The residual of a row is
``r(h) = ||(h - u) R||``. ``dim = 0`` picks the paper's ``d``: 1000 for D >= 1500, 512 for
D >= 768 (ViT), else D / 2 (OpenOOD's 256 for a ResNet-18's 512). The paper states no rule
for smaller D; its code sets ``d`` per backbone, and OpenOOD's scripts set it per benchmark
(256 on CIFAR, 1000 on ImageNet with ResNet-50), as ``dim`` does here.

The second moment is float64 throughout (products included): its eigenvalues near the cut can
lie closer together than float32 products of rows far from the origin resolve.
"""

from __future__ import annotations

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer, energy
from etn_cli.heads.scorers.statistics import (
    min_norm_solution,
    second_moment,
    symmetric_eigenvectors,
)

RESIDUAL_CELLS = 1 << 20  # values of (h - u) R per block: 4-8 MiB temporaries, reused


def principal_dim(dim: int, features: int) -> int:
    if dim:
        return dim
    return 1000 if features >= 1500 else 512 if features >= 768 else features // 2


class Subspace(Scorer):
    def fit_scorer(self, h, z, y, classifier) -> None:
        d = principal_dim(self.config.dim, h.shape[1])
        if not 0 < d < h.shape[1]:
            raise EtnError(
                f"{self.name}: the principal subspace needs 0 < dim < {h.shape[1]} (the hidden "
                f"size), got {d}. Set dim in the pipeline file."
            )
        weight, bias = classifier["weight"].double(), classifier["bias"].double()
        self.origin_ = -min_norm_solution(weight, bias)  # -pinv(W) b (D,)
        moment = second_moment(h, self.origin_) / len(h)
        vectors = symmetric_eigenvectors(moment)  # ascending eigenvalues
        basis = vectors[:, : h.shape[1] - d]  # (D, D - d)
        self.residual_basis_ = basis.float().contiguous()
        self.origin_residual_ = self.origin_ @ basis  # u R (D - d,), float64

    def residual(self, h: torch.Tensor) -> torch.Tensor:
        """``||(h - u) R|| = ||h R - u R||`` (N,): ``h R`` a float32 product of the float32
        features, ``u R`` float64 from the fit, so a distant origin (``||u||`` far above
        ``||h||`` on a nearly rank-deficient layer) costs no precision; in blocks of rows."""
        origin, basis = self.origin_residual(), self.residual_basis_
        out = torch.empty(len(h), dtype=torch.float64, device=h.device)
        step = max(1, RESIDUAL_CELLS // basis.shape[1])
        for s in range(0, len(h), step):
            projected = (h[s : s + step].float() @ basis).double().sub_(origin)  # (rows, D - d)
            out[s : s + step] = torch.linalg.vector_norm(projected, dim=1)
        return out

    def origin_residual(self) -> torch.Tensor:
        """``u R`` (D - d,) float64; computed from the basis for a checkpoint without it."""
        stored = getattr(self, "origin_residual_", None)
        if stored is None:
            return self.origin_.double() @ self.residual_basis_.double()
        return stored


@heads.register("vim")
class ViM(Subspace):
    """ViM: the residual scaled by ``alpha = mean_ID(max_i z_i) / mean_ID(r)`` is a virtual
    logit; ``vim = logsumexp(z) - alpha r(h)``, higher = more ID (the authors' score; the
    virtual class's softmax probability ranks the same)."""

    def fit_scorer(self, h, z, y, classifier) -> None:
        super().fit_scorer(h, z, y, classifier)
        max_logit = z.max(dim=1).values.double().mean()
        self.alpha_ = max_logit / self.residual(h).mean()

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return energy(z) - self.alpha_ * self.residual(h)


@heads.register("residual")
class Residual(Subspace):
    """Residual (the ViM paper's feature-only baseline): ``residual = -r(h)``, higher = more
    ID."""

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return -self.residual(h)
