"""Math of the MATRIX variant of ETN (paper supplementary, "Modeling Transformation
Parameterizations"): a Gaussian with Kronecker-factored covariance over the C x C transformation.

The network predicts, per sample, a mean ``mu`` and two lower-triangular Cholesky factors with
positive diagonal, and::

    vec(A) ~ N(vec(mu), B (x) D),   B = L_B L_B^T,   D = L_D L_D^T

``vec`` stacks the COLUMNS of A (the standard convention, ``vec(X Y Z) = (Z^T (x) X) vec(Y)``).
Then ``A = mu + L_D E L_B^T`` with ``E`` a C x C standard normal has exactly that covariance,
since ``vec(L_D E L_B^T) = (L_B (x) L_D) vec(E)``: ``D`` is the row covariance (between the
entries of one column, ``Cov(A_ik, A_jk) = D_ij B_kk``) and ``B`` the column covariance. The
C^2 x C^2 covariance is never built. Each sampled A gets a softplus on its diagonal, the
Dirichlet evidence uses ``A z``, the prior is an isotropic Gaussian matching the Gamma prior's
mode and variance, and ODIR (Kull et al., NeurIPS 2019) regularises ``mu``.

The samples alone take ``M * B * C^2`` numbers, so for ImageNet's 1,000 classes the variant
cannot train; :func:`check_matrix_feasible` says so up front instead of running out of memory.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from etn_cli.errors import EtnError

GIB = 2**30


def lower_triangular_factor(raw: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """A Cholesky factor (..., C, C) from an unconstrained network output of the same shape:
    the strict lower triangle as is, ``softplus(raw_ii) + eps`` on the diagonal."""
    diagonal = F.softplus(raw.diagonal(dim1=-2, dim2=-1)) + eps  # (..., C)
    return torch.tril(raw, diagonal=-1) + torch.diag_embed(diagonal)


def sample_matrix_normal(
    mu: torch.Tensor,
    l_b: torch.Tensor,
    l_d: torch.Tensor,
    m: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``m`` reparameterised draws of A with ``vec(A) ~ N(vec(mu), (L_B L_B^T) (x) (L_D L_D^T))``.

    ``A = mu + L_D E L_B^T``, ``E_ij ~ N(0, 1)`` (column-stacking ``vec``, see the module
    docstring), so gradients flow to ``mu``, ``l_b`` and ``l_d``. Inputs are (B, C, C); the
    result is (m, B, C, C).
    """
    noise = torch.randn(
        (m, *mu.shape), dtype=mu.dtype, device=mu.device, generator=generator
    )  # (m, B, C, C)
    return mu + l_d @ noise @ l_b.transpose(-1, -2)


def apply_softplus_diagonal(a: torch.Tensor) -> torch.Tensor:
    """``A`` with ``softplus`` on its diagonal and the off-diagonal entries unchanged (paper:
    "to encourage monotonic behavior"); (..., C, C) in and out."""
    diagonal = F.softplus(a.diagonal(dim1=-2, dim2=-1))  # (..., C)
    return a.diagonal_scatter(diagonal, dim1=-2, dim2=-1)


def transform_logits(a: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The transformed logits ``A z`` for every draw: A (m, B, C, C), z (B, C) -> (m, B, C)."""
    return (a @ z.unsqueeze(-1)).squeeze(-1)


def gaussian_prior_from_mode_variance(mode: float, variance: float) -> tuple[float, float]:
    """Mean and variance of the Gaussian with the given mode and variance: ``(mode, variance)``.

    The Gaussian's mode is its mean; this mirrors :func:`etn_cli.heads.edl.gamma_prior` so the
    matrix variant reads its prior from the same ``prior_mode`` / ``prior_variance`` settings.
    """
    if variance <= 0:
        raise ValueError(f"prior variance must be positive, got {variance}")
    return float(mode), float(variance)


def matrix_normal_kl(
    mu: torch.Tensor,
    l_b: torch.Tensor,
    l_d: torch.Tensor,
    prior_mean: float,
    prior_var: float,
) -> torch.Tensor:
    """Closed-form ``KL(N(vec(mu), B (x) D) || N(prior_mean vec(I), prior_var I))`` per sample (B,).

    The paper sets the prior to "a Gaussian with mode and variance matching the scalar and
    vector Gamma priors"; we read that as mean ``m0`` (the Gamma prior's mode) on the diagonal,
    0 off it (A starts as ``m0 I``, the scalar variant's transformation), and isotropic variance
    ``v`` (the Gamma prior's variance) on every entry. With ``k = C^2`` and the Kronecker
    identities ``tr(B (x) D) = tr(B) tr(D)``, ``logdet(B (x) D) = C logdet B + C logdet D``::

        KL = 1/2 [ tr(B) tr(D) / v + ||mu - m0 I||_F^2 / v - C^2
                   + C^2 log v - 2 C (sum_i log L_B,ii + sum_i log L_D,ii) ]

    ``l_b`` and ``l_d`` (B, C, C) must be lower triangular with positive diagonal.
    """
    num_classes = mu.shape[-1]
    k = num_classes**2
    eye = torch.eye(num_classes, dtype=mu.dtype, device=mu.device)
    trace = l_b.square().sum((-2, -1)) * l_d.square().sum((-2, -1))  # tr(L L^T) = ||L||_F^2
    mahalanobis = (mu - prior_mean * eye).square().sum((-2, -1))
    log_diag_b = l_b.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # (B,) = logdet(B) / 2
    log_diag_d = l_d.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    logdet = 2 * num_classes * (log_diag_b + log_diag_d)
    return 0.5 * ((trace + mahalanobis) / prior_var - k + k * math.log(prior_var) - logdet)


def odir_penalty(mu: torch.Tensor) -> torch.Tensor:
    """ODIR on ``mu`` (Kull et al., NeurIPS 2019, "Beyond temperature scaling"), per sample (B,).

    ODIR is ``1/(C(C-1)) sum_{i != j} W_ij^2`` plus an intercept term ``1/C sum_j b_j^2``. Here
    A has no intercept (the evidence offset ``b`` is a separate learnable term), so only the
    off-diagonal part applies: the mean of the squared off-diagonal entries of ``mu``.
    """
    num_classes = mu.shape[-1]
    if num_classes < 2:
        return mu.new_zeros(mu.shape[:-2])
    off_diagonal = mu.square().sum((-2, -1)) - mu.diagonal(dim1=-2, dim2=-1).square().sum(-1)
    return off_diagonal / (num_classes * (num_classes - 1))


def matrix_memory_bytes(
    num_classes: int, batch_size: int, mc_samples: int, dtype_bytes: int = 4, width: int = 0
) -> int:
    """Rough memory of one training step of the matrix variant, in bytes.

    Per draw the forward pass keeps four (m, B, C, C) tensors (the noise ``E``, ``L_D E``, the
    sampled A and its softplus-diagonal copy) and the backward pass a gradient for each: 8 of
    them. The three (B, C, C) factors ``mu``, ``L_B``, ``L_D`` and their gradients add 6 more of
    size B C^2. The network's output layers map ``width`` hidden units to 3 C^2 outputs; with
    their gradients and Adam's two moments they hold 4 copies. Smaller terms are left out.
    """
    per_draw = mc_samples * batch_size * num_classes**2
    factors = batch_size * num_classes**2
    output_layers = 4 * (width + 1) * 3 * num_classes**2
    return (8 * per_draw + 6 * factors + output_layers) * dtype_bytes


def check_matrix_feasible(
    num_classes: int, batch_size: int, mc_samples: int, limit_bytes: int, width: int = 0
) -> None:
    """Raise :class:`EtnError` when the matrix variant would need more than ``limit_bytes``."""
    needed = matrix_memory_bytes(num_classes, batch_size, mc_samples, width=width)
    if needed > limit_bytes:
        raise EtnError(
            f"The matrix variant needs about {needed / GIB:.1f} GiB for C = {num_classes}, "
            f"batch_size = {batch_size}, mc_samples = {mc_samples} "
            f'(limit {limit_bytes / GIB:.1f} GiB). Use variant = "scalar" or "vector", '
            "or lower batch_size / mc_samples."
        )
