"""Scorers that read the predicted class's geometry: fDBD, SHE and GradNorm."""

from __future__ import annotations

import torch

from etn_cli.errors import EtnError
from etn_cli.heads.base import heads
from etn_cli.heads.scorers.base import Scorer
from etn_cli.heads.scorers.statistics import SMALL_CELLS, float64_blocks
from etn_cli.heads.scorers.threads import one_thread


@heads.register("fdbd")
class FDBD(Scorer):
    """fDBD (Liu & Qin, "Fast Decision Boundary based Out-of-Distribution Detector", ICML
    2024): the mean distance from the feature to the decision boundaries between the predicted
    class ``k`` and each other class ``i``, ``|z_k - z_i| / ||w_k - w_i||`` (the logit gap is
    ``(w_k - w_i)^T h + b_k - b_i``), divided by the feature's distance to the ID mean:
    ``fdbd = sum_{i != k} |z_k - z_i| / ||w_k - w_i|| / ((C - 1) ||h - mu_ID||)``, higher = more
    ID (the paper's distance-normalised variant, its and OpenOOD's default)."""

    def fit_scorer(self, h, z, y, classifier) -> None:
        self.mean_ = h.mean(0).double()  # float32's cascaded sum: within 1e-7 of float64's
        w = classifier["weight"].double()
        gaps = torch.cdist(w, w)  # ||w_k - w_i|| (C, C)
        self.gap_norms_ = gaps.fill_diagonal_(1.0)  # the predicted class's own term is 0

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Float32 elementwise terms (as the float32 features and logits), float64 result."""
        with one_thread():  # memory-bound (:mod:`~etn_cli.heads.scorers.threads`)
            top, predicted = z.max(dim=1)
            boundary = ((top[:, None] - z) / self.gap_norms_.float()[predicted]).sum(1)
            spread = (h - self.mean_.float()).norm(dim=1).clamp_min(1e-12)
            return boundary.double() / ((z.shape[1] - 1) * spread.double())


@heads.register("she")
class SHE(Scorer):
    """SHE, simplified Hopfield energy (Zhang et al., "Out-of-Distribution Detection based on
    In-Distribution Data Patterns Memorization with Modern Hopfield Energy", ICLR 2023): the
    stored pattern of class c is the mean feature of the ID rows of class c that the backbone
    classifies correctly; ``she = h^T S_k`` with k the predicted class, higher = more ID."""

    def fit_scorer(self, h, z, y, classifier) -> None:
        correct = z.argmax(dim=1) == y
        counts = torch.bincount(y[correct], minlength=z.shape[1])
        if (counts == 0).any():
            missing = torch.nonzero(counts == 0).flatten()[:10].tolist()
            raise EtnError(
                f"SHE stores the mean of the correctly classified ID rows of each class; classes "
                f'{missing} have none. Use a larger fit split (fit = "train" in [data]).'
            )
        sums = torch.zeros(z.shape[1] + 1, h.shape[1], dtype=torch.float64, device=h.device)
        slot = torch.where(correct, y, z.shape[1])  # the wrong rows add into a last, unused row
        for rows, block in float64_blocks(h):
            with one_thread():
                sums.index_add_(0, slot[rows], block)
        self.patterns_ = (sums[:-1] / counts[:, None]).float()  # (C, D)

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Float64 products and sums over reused blocks of rows (a float64 copy of every row
        costs its page faults, 0.49 s of 0.83 s at 10,000 x 512 on a loaded machine), on one
        thread (memory-bound: :mod:`~etn_cli.heads.scorers.threads`)."""
        predicted = z.argmax(dim=1)
        patterns = self.patterns_.double()
        out = torch.empty(len(h), dtype=torch.float64, device=h.device)
        gathered = None
        for rows, block in float64_blocks(h, cells=SMALL_CELLS):
            with one_thread():
                if gathered is None:
                    gathered = torch.empty_like(block)
                stored = gathered[: len(block)]
                torch.index_select(patterns, 0, predicted[rows], out=stored)
                out[rows] = block.mul_(stored).sum(1)
        return out


@heads.register("gradnorm")
class GradNorm(Scorer):
    """GradNorm (Huang et al., "On the Importance of Gradients for Detecting Distributional
    Shifts in the Wild", NeurIPS 2021): the L1 norm of the gradient of
    ``KL(u || softmax(z / T))`` (u uniform) with respect to the final layer's weights W. With
    ``z = W h + b`` the gradient is ``(p - u) h^T / T``, an outer product, so its L1 norm is
    exactly ``gradnorm = ||p - u||_1 ||h||_1 / T`` (p = softmax(z / T)), higher = more ID:
    no backward pass, and W itself is not needed (the cached logits are W h + b). OpenOOD
    back-propagates a loss C times as large (targets of ones), which ranks the same."""

    def score_rows(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        t = self.config.temperature
        p = torch.softmax(z.double() / t, dim=1)
        return (p - 1.0 / p.shape[1]).abs().sum(1) * h.double().abs().sum(1) / t
