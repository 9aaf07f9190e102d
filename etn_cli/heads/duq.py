"""DUQ, Deterministic Uncertainty Quantification (van Amersfoort et al., ICML 2020), as a head on
the frozen backbone's cached features (reference y0ast/deterministic-uncertainty-quantification).

Each class c has a weight matrix ``W_c`` (E, D) and a centroid ``e_c`` (E,); the kernel value

    K_c(x) = exp(-||W_c x - e_c||^2 / (2 E sigma^2))      (the reference's mean over E)

is trained towards the one-hot label by binary cross-entropy plus the two-sided gradient penalty
``lambda (||grad_x sum_c K_c(x)||_2 - 1)^2``. Centroids are not learned by gradient: after every
step they follow the batch's embeddings by an exponential moving average with ``gamma``,
``N_c <- gamma N_c + (1 - gamma) n_c``, ``m_c <- gamma m_c + (1 - gamma) sum_{y_i = c} W_c x_i``,
``e_c = m_c / N_c``.

"DUQ (head)": the backbone is frozen, so the head's input ``x`` is the cached last hidden state,
z-scored with adaptation statistics, and the gradient penalty is taken with respect to ``x``, not
the input image. The reference trains the feature extractor jointly, which sets the feature
scale; on frozen features of arbitrary scale a length scale of 0.1 makes every kernel value
underflow at the reference's initialisation, hence the standardisation.

Scores: ``kernel = max_c K_c`` (higher = more ID) and MP of the normalised kernel values
``p_c = K_c / sum_k K_k`` (computed as a softmax of ``log K`` so that far-away points, whose
kernel values all underflow, still get a distribution).
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import torch
from torch import nn
from torch.nn import functional as F

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.settings import DUQConfig
from etn_cli.heads.steps import Steps
from etn_cli.heads.training import EVAL_ROWS, Training, progress


class RBFHead(nn.Module):
    """The per-class maps ``W_c`` stored side by side as ``W`` (D, E C) (column ``e C + c`` is
    row e of ``W_c``) and the EMA centroid sums ``m`` (E, C) with counts ``N`` (C,)."""

    def __init__(self, n_features: int, n_classes: int, cfg: DUQConfig) -> None:
        super().__init__()
        self.sigma, self.gamma = cfg.length_scale, cfg.gamma
        e, c, d = cfg.centroid_size, n_classes, n_features
        weight = torch.empty(e, c, d)
        nn.init.kaiming_normal_(weight, nonlinearity="relu")  # the reference's initialisation
        self.W = nn.Parameter(weight.permute(2, 0, 1).reshape(d, e * c).contiguous())
        self.register_buffer("N", torch.full((c,), 13.0))
        self.register_buffer("m", torch.randn(e, c) * 0.05 * 13.0)
        self.register_buffer("mean", torch.zeros(d))
        self.register_buffer("std", torch.ones(d))

    def standardize(self, h: torch.Tensor) -> torch.Tensor:
        return (h - self.mean) / self.std  # (B, D)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``W_c x`` for every class (B, E, C), ``x`` standardised features."""
        return (x @ self.W).unflatten(1, self.m.shape)

    def kernel_and_gradient(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``K_c(x)`` (B, C) and ``grad_x sum_c K_c(x)`` (B, D) in closed form:
        ``grad = -(1 / (E sigma^2)) sum_c K_c W_c^T (W_c x - e_c)``, differentiable in ``W``
        (one matrix product instead of a double backward pass)."""
        diff = self.embed(x) - self.m / self.N  # (B, E, C)
        scale = diff.shape[1] * self.sigma**2
        kernel = torch.exp(-(diff**2).sum(1) / (2 * scale))  # (B, C)
        grad = -((kernel[:, None, :] * diff).flatten(1) @ self.W.T) / scale  # (B, D)
        return kernel, grad

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """``K_c(x)`` (B, C) alone, as :meth:`kernel_and_gradient` computes it."""
        diff = self.embed(x) - self.m / self.N  # (B, E, C)
        return torch.exp(-(diff**2).sum(1) / (2 * diff.shape[1] * self.sigma**2))

    def loss_and_gradient(
        self, x: torch.Tensor, onehot: torch.Tensor, penalty_weight: float
    ) -> torch.Tensor:
        """DUQ's loss (BCE plus ``penalty_weight`` times the gradient penalty) at standardised
        ``x`` (B, D), with its gradient in ``W`` written to ``W.grad`` (overwritten, not added).

        The same loss as ``kernel_and_gradient`` plus autograd, with the products by ``W`` (each
        B x D x E C, the whole cost of a step) done once each: the embedding ``U = x W`` is
        taken outside the graph, the input gradient ``g = -V W^T / s`` (``V = K * diff``) with
        ``W`` held constant, so autograd only runs the cheap (B, E C) part and returns
        ``dL/dU`` and ``G = dL/dg``; the two terms of ``dL/dW = x^T dL/dU - G^T V / s`` are then
        one product with an inner dimension of 2B, written into a buffer kept across steps."""
        with torch.no_grad():
            embedding = x @ self.W  # (B, E C)
        embedding.requires_grad_(True)
        diff = embedding.unflatten(1, self.m.shape) - self.m / self.N  # (B, E, C)
        scale = diff.shape[1] * self.sigma**2
        kernel = torch.exp(-(diff**2).sum(1) / (2 * scale))  # (B, C)
        weighted = (kernel[:, None, :] * diff).flatten(1)  # V (B, E C)
        grad = -(weighted @ self.W.detach().T) / scale  # (B, D)
        grad.retain_grad()
        penalty = ((grad.norm(dim=1) - 1) ** 2).mean()
        loss = F.binary_cross_entropy(kernel, onehot) + penalty_weight * penalty
        loss.backward()
        left = torch.cat([x, grad.grad])  # (2B, D)
        right = torch.cat([embedding.grad, weighted.detach() / -scale])  # (2B, E C)
        if self.W.grad is None:
            self.W.grad = torch.empty_like(self.W)
        torch.mm(left.T, right, out=self.W.grad)
        return loss.detach()

    @torch.no_grad()
    def update_centroids(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> None:
        """The EMA step with the batch's labels ``y`` (B,), one-hot ``onehot`` (B, C). With more
        classes than rows each row is embedded only by its own class's map, ``W_{y_i} x_i``
        (B x D x E, after copying those B maps) instead of by all C of them; with at most as
        many classes as rows the whole ``x W`` is cheaper than that copy (LLM shape: 10x).
        The counts are the one-hot column sums (exact), not ``bincount``, which reads the
        largest label back to the host on a GPU."""
        counts = onehot.sum(0).to(self.N.dtype)  # (C,)
        self.N.mul_(self.gamma).add_((1 - self.gamma) * counts)
        if len(self.N) <= len(y):
            embedding_sum = torch.einsum("bec,bc->ec", self.embed(x), onehot)  # (E, C)
        else:
            own = self.W.unflatten(1, self.m.shape)[:, :, y]  # (D, E, B): W_{y_i}^T
            embedding = torch.einsum("bd,deb->eb", x, own)  # (E, B)
            embedding_sum = torch.zeros_like(self.m).index_add_(1, y, embedding)  # (E, C)
        self.m.mul_(self.gamma).add_((1 - self.gamma) * embedding_sum)


@heads.register("duq")
class DUQ(Head):
    def _build(self, n_features: int, n_classes: int) -> None:
        with torch.random.fork_rng(devices=[]):  # the head's seed fixes W and the centroids
            torch.manual_seed(self.config.seed)
            self.net_ = RBFHead(n_features, n_classes, self.config)

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        self._build(h.shape[1], z.shape[1])
        net = self.net_
        net.mean.copy_(h.mean(0))
        net.std.copy_(h.std(0).clamp_min(1e-6))
        x = net.standardize(h).to(device)  # (N, D)
        labels = y.to(device)
        onehot = F.one_hot(labels, z.shape[1]).float()
        net.to(device)
        optimizer = torch.optim.SGD(  # fused: one pass over W instead of five, same values
            net.parameters(),
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            fused=True,
        )
        total = torch.zeros((), device=device)  # summed on the device: no sync per step

        def step(batch: torch.Tensor, onehot_: torch.Tensor, labels_: torch.Tensor) -> None:
            loss = net.loss_and_gradient(batch, onehot_, cfg.gradient_penalty)
            optimizer.step()
            net.update_centroids(batch, labels_, onehot_)  # after the step, as the reference
            total.add_(loss * len(labels_))

        runner = Steps(step, (x, onehot, labels), cfg.batch_size, [optimizer])
        decays = Counter(cfg.lr_milestones)  # MultiStepLR: times lr_decay at each milestone
        lr = cfg.lr
        order = torch.Generator().manual_seed(cfg.seed)
        training = Training(cfg.select if cfg.select != "last" else "loss")
        best: tuple = ((math.inf,), None)
        for epoch in progress(range(cfg.epochs), "duq"):
            total.zero_()
            runner.set_lr(lr)
            for idx in torch.randperm(len(x), generator=order).to(device).split(cfg.batch_size):
                runner(idx)
            if not math.isfinite(mean := total.item() / len(x)):
                raise EtnError(
                    f"duq: the loss became {mean} in epoch {epoch + 1}. Lower lr or "
                    "gradient_penalty, or check the features for extreme values."
                )
            lr = lr * cfg.lr_decay ** decays[epoch + 1]
            training.losses.append(mean)
            if cfg.select == "accuracy":
                training.accuracies.append(self._accuracy(x, labels))
            if cfg.select == "last" or training.rank() < best[0]:
                best = (training.rank(), copy.deepcopy(net.state_dict()))
                training.epoch = epoch + 1
        training.steps = runner.mode
        runner.close()
        net.load_state_dict(best[1])
        self.net_ = net
        self.selection_ = training.record() | {"select": cfg.select}

    @torch.no_grad()
    def _accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Adaptation accuracy of the current maps and centroids: argmax of the kernel."""
        correct = sum(
            int((self.net_.kernel(x[i : i + EVAL_ROWS]).argmax(1)
                 == y[i : i + EVAL_ROWS]).sum())
            for i in range(0, len(x), EVAL_ROWS)
        )  # fmt: skip
        return correct / len(x)

    def loss(self, x: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Mean BCE of the kernel values against one-hot labels plus the gradient penalty, for
        standardised features ``x`` (B, D)."""
        kernel, grad = self.net_.kernel_and_gradient(x)
        penalty = ((grad.norm(dim=1) - 1) ** 2).mean()
        return F.binary_cross_entropy(kernel, onehot) + self.config.gradient_penalty * penalty

    @torch.no_grad()
    def log_kernel(self, h: torch.Tensor) -> torch.Tensor:
        """``log K_c(h)`` (N, C) in float64."""
        net = self.net_
        x = (h.double() - net.mean.double()) / net.std.double()  # (N, D)
        embeddings = (x @ net.W.double()).unflatten(1, net.m.shape)  # (N, E, C)
        diff = embeddings - (net.m / net.N).double()
        return -(diff**2).mean(1) / (2 * net.sigma**2)

    def _predict(self, h, z, *, layers, device) -> Prediction:
        rows = max(1, 2**22 // (self.config.centroid_size * self.n_classes_))
        log_k = torch.cat([self.log_kernel(h[i : i + rows]) for i in range(0, len(h), rows)])
        probs = torch.softmax(log_k, dim=1).cpu().numpy()  # (N, C): K_c / sum_k K_k
        kernel = log_k.max(1).values.exp().cpu().numpy()  # (N,)
        return Prediction(probs, {"mp": probs.max(axis=1), "kernel": kernel})

    def _state(self) -> dict[str, torch.Tensor]:
        return dict(self.net_.state_dict())

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._build(self.n_features_, self.n_classes_)
        self.net_.load_state_dict(tensors)
