"""Last-layer Laplace approximation (Daxberger et al., NeurIPS 2021, "Laplace Redux"), built on
the laplace-torch library as the paper does (Supp. "Baselines": last layer, Kronecker-factored
GGN, post hoc, MC predictive with 20 samples).

The backbone's classifier ``f(h) = W h + c`` is the MAP estimate ``theta``. laplace-torch fits
the posterior ``N(theta, P^-1)`` on the adaptation features, with

    P = sum_n J_n^T Lambda_n J_n + delta I,   Lambda_n = diag(p_n) - p_n p_n^T   (GGN, KFAC),

and tunes the prior precision ``delta`` by maximising its marginal likelihood
(``optimize_prior_precision``, the library's default method and scalar prior). Prediction is
an MC predictive with S = 20 samples ``p_s = softmax(f_s)``: ``p = (1/S) sum_s p_s``, MP and
MI from the samples. By default (``pred_type = "nn"``) the S samples are weight samples
``theta_s ~ N(theta, P^-1)`` with ``f_s = f(h; theta_s)``; the last layer is linear in its
weights, so this is exactly the GLM predictive ``f ~ N(f(h), J P^-1 J^T)`` that
``pred_type = "glm"`` samples through per-row Jacobians (the library's KFAC GLM path costs
about 5 ms of CPU per row for C = 10; the weight samples are about 140 times faster).

Determinism: every chunk of rows gets a generator seeded with the head's seed; laplace-torch
draws one set of standard-normal vectors (or weight samples) per call and shares it by all
rows, so a sample's prediction does not depend on its batch.

With ``hessian_structure = "diag"`` (the paper's choice for ImageNet) the classes' logits are
independent under the posterior and the GLM predictive uses laplace-torch's diagonal output
variance, which needs no per-row Jacobians; the KFAC GLM predictive materialises Jacobians of
C x C(D + 1) per row and is refused where one row would need more than 4 GiB.

Backends: ``backend = "closed_form"`` (the default) computes the same posterior, prior precision
and weight samples with a few matrix products (:mod:`etn_cli.heads.laplace_closed_form`, equal to
laplace-torch to 1e-13 on the tests' shapes); laplace-torch's Curvlinops backend builds the GGN
from one backward pass per class and per batch, which at ImageNet's C = 1,000 took more than 14
minutes. ``backend = "laplace_torch"`` runs the library itself (needed for ``pred_type =
"glm"``), and the tests use it as the oracle.

Differs from the paper: the MAP is the backbone's classifier as cached (the paper applies LA to
its fine-tuned model). Saved state: the posterior mean, the Kronecker factors (or
diagonal), the prior precision and the data terms, round-tripped through laplace-torch's own
``state_dict`` / ``load_state_dict`` via safetensors.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

import torch
from torch import nn
from torch.nn.utils import vector_to_parameters
from torch.utils.data import DataLoader, TensorDataset

from etn_cli.errors import EtnError
from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.laplace_closed_form import ClosedFormLaplace
from etn_cli.heads.lastlayer import linear_from_classifier
from etn_cli.heads.settings import LaplaceConfig
from etn_cli.metrics.scores import sample_scores

FIT_BATCH = 512  # rows per curvature batch in la.fit
MEMORY_BUDGET = 2**28  # bytes of per-row Jacobians in one GLM predictive chunk
MAX_ROW_BYTES = 2**32  # a single row needing more than this is refused
LAYER = "classifier"
FLOAT64_WEIGHTS = 10**6  # up to C x D this many, sampled logits are computed in float64


def import_laplace() -> Any:
    """laplace-torch, imported on first use (it takes seconds to import)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*torch.jit")
        from laplace import Laplace
    return Laplace


def build_laplace(layer: nn.Linear, hessian_structure: str) -> Any:
    """A last-layer laplace-torch object around ``layer`` (float64)."""
    model = nn.Sequential(OrderedDict([(LAYER, layer)])).double()
    return import_laplace()(
        model, "classification", subset_of_weights="last_layer",
        hessian_structure=hessian_structure, last_layer_name=LAYER,
    )  # fmt: skip


def fit_laplace(la: Any, h: torch.Tensor, y: torch.Tensor, cfg: LaplaceConfig) -> None:
    """Fit the GGN on ``(h, y)`` and tune the prior precision by marginal likelihood."""
    loader = DataLoader(TensorDataset(h.double(), y), batch_size=FIT_BATCH)
    la.fit(loader)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="By default `link_approx`")
        la.optimize_prior_precision(
            pred_type=cfg.pred_type, method="marglik", n_steps=cfg.prior_steps, lr=cfg.prior_lr,
            link_approx="mc", n_samples=cfg.mc_samples,
        )  # fmt: skip


@heads.register("laplace")
class LastLayerLaplace(Head):
    @property
    def variant(self) -> str:
        return self.config.hessian_structure

    @property
    def display_label(self) -> str:
        structure = "KFAC" if self.config.hessian_structure == "kron" else "diag"
        return f"Laplace (last layer, {structure})"

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        cfg = self.config
        layer = linear_from_classifier(classifier, h.shape[1], z.shape[1])
        self.samples_ = None
        if cfg.backend == "closed_form":
            weight, bias = layer.weight.detach(), layer.bias.detach()
            self.la_ = ClosedFormLaplace.fit(weight, bias, h, y, cfg.hessian_structure)
            self.la_.optimize_prior_precision(cfg.prior_steps, cfg.prior_lr)
            return
        self.la_ = build_laplace(layer, cfg.hessian_structure)
        fit_laplace(self.la_, h, y, cfg)

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        rows = self._chunk_rows()
        samples = (
            torch.cat(
                [self.predictive_samples(h[i : i + rows]) for i in range(0, len(h), rows)], dim=1
            )
            .cpu()
            .numpy()
        )  # (S, N, C)
        return Prediction(samples.mean(0), sample_scores(samples))

    def predictive_samples(self, h: torch.Tensor) -> torch.Tensor:
        """S softmax samples (S, n, C) of laplace-torch's predictive, seeded by the head."""
        cfg, la = self.config, self.la_
        # the closed form draws its weights on the host (the same on every device);
        # laplace-torch draws on the scoring device, with a generator of that device
        device = h.device if cfg.backend == "laplace_torch" else torch.device("cpu")
        generator = torch.Generator(device).manual_seed(cfg.seed)
        if cfg.backend == "closed_form":
            if self.samples_ is None:  # every chunk draws the same S weights (seeded alike)
                self.samples_ = la.weight_samples(cfg.mc_samples, generator)
            weight, bias = self.samples_  # (S, C, D), (S, C)
            if weight[0].numel() > FLOAT64_WEIGHTS:  # ImageNet-sized: float32 products
                weight, bias, h = weight.float(), bias.float(), h.float()
            logits = torch.einsum("nd,scd->snc", h.to(weight.dtype), weight) + bias[:, None]
            return torch.softmax(logits.double(), dim=-1)  # (S, n, C)
        if cfg.pred_type == "glm" and cfg.hessian_structure == "diag":
            # A diagonal posterior leaves the classes' logits independent: laplace-torch's fast
            # diagonal output variance is exact here and needs no per-row Jacobians.
            from laplace.utils import normal_samples

            f_mu, f_var = la._glm_predictive_distribution(h.double(), diagonal_output=True)
            f = normal_samples(f_mu, f_var, cfg.mc_samples, generator)  # (S, n, C)
            return torch.softmax(f, dim=-1)
        return la.predictive_samples(
            h.double(), pred_type=cfg.pred_type, n_samples=cfg.mc_samples, generator=generator
        )

    def _chunk_rows(self) -> int:
        """Rows per predictive call, so the KFAC GLM's (n, C, P) Jacobians stay in budget."""
        c, p = self.n_classes_, self.n_classes_ * (self.n_features_ + 1)
        if self.config.pred_type == "nn" or self.config.hessian_structure == "diag":
            return max(1, MEMORY_BUDGET // (8 * c * (self.config.mc_samples + 3)))
        row_bytes = 3 * 8 * c * p
        if row_bytes > MAX_ROW_BYTES:
            raise EtnError(
                f"The KFAC GLM predictive needs {row_bytes / 2**30:.1f} GiB of Jacobians per "
                f'sample for {c} classes and {p} last-layer parameters. Set pred_type = "nn" '
                '(the same predictive for a linear last layer) or hessian_structure = "diag".'
            )
        return max(1, MEMORY_BUDGET // row_bytes)

    def _state(self) -> dict[str, torch.Tensor]:
        if self.config.backend == "closed_form":
            return self.la_.state()
        state = self.la_.state_dict()
        tensors = {
            "mean": state["mean"],
            "prior_precision": state["prior_precision"],
            "loss": torch.as_tensor(state["loss"], dtype=torch.float64),
            "n_data": torch.tensor(state["n_data"]),
        }
        if self.config.hessian_structure == "kron":
            for i, factors in enumerate(state["H"]):
                tensors |= {f"H.{i}.{j}": f for j, f in enumerate(factors)}
        else:
            tensors["H"] = state["H"]
        return tensors

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.samples_ = None
        if self.config.backend == "closed_form":
            structure = self.config.hessian_structure
            self.la_ = ClosedFormLaplace.from_state(tensors, structure, self.n_classes_)
            if self.la_.mean.shape != (self.n_classes_ * (self.n_features_ + 1),):
                raise RuntimeError(f"mean has shape {tuple(self.la_.mean.shape)}")
            return
        layer = nn.Linear(self.n_features_, self.n_classes_).double()
        mean = tensors["mean"].double()
        if mean.shape != (self.n_classes_ * (self.n_features_ + 1),):
            raise RuntimeError(f"mean has shape {tuple(mean.shape)}")
        vector_to_parameters(mean, layer.parameters())
        self.la_ = build_laplace(layer, self.config.hessian_structure)
        self.la_.load_state_dict(
            {
                "mean": mean,
                "H": self._hessian_from(tensors),
                "loss": tensors["loss"],
                "prior_mean": 0.0,
                "prior_precision": tensors["prior_precision"],
                "sigma_noise": 1.0,
                "n_data": int(tensors["n_data"]),
                "n_outputs": self.n_classes_,
                "likelihood": "classification",
                "temperature": 1.0,
                "enable_backprop": False,
                "cls_name": type(self.la_).__name__,
                "data": None,
                "_last_layer_name": LAYER,
            }
        )

    def _hessian_from(self, tensors: dict[str, torch.Tensor]) -> Any:
        if self.config.hessian_structure == "diag":
            return tensors["H"]
        # Kron factors of the last layer, saved as H.<group>.<factor>: [[G, A], [G_bias]]
        index = sorted(
            (tuple(int(part) for part in key.split(".")[1:]), key)
            for key in tensors
            if key.startswith("H.")
        )
        if not index:
            raise KeyError("H.0.0")
        groups: dict[int, list[torch.Tensor]] = {}
        for (i, _), key in index:
            groups.setdefault(i, []).append(tensors[key])
        return [groups[i] for i in sorted(groups)]
