"""Every trained head's settings, as frozen dataclasses that import no torch.

A head's ``Config`` lives here rather than beside its code so that a pipeline file's
``[[heads]]`` tables are checked (unknown keys, types, ranges, these ``__post_init__`` rules)
in milliseconds, before any head or torch is imported: a misspelt setting is refused at once.
The post-hoc scorers' settings are in :mod:`etn_cli.heads.scorers.settings`; which settings
each head name takes is its record in :mod:`etn_cli.catalogue`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from etn_cli.errors import EtnError

MAX_INNER_WEIGHTS = 2**28  # ETN: 1 GiB of float32 per module
SIGMA_FLOOR = 1e-6  # IB-EDL: keeps log(sigma) finite where softplus underflows in float32


@dataclass(frozen=True)
class HeadConfig:
    """Settings every head has. ``seed`` fixes initialisation, data order and MC draws;
    ``calibrate = "temperature"`` fits a temperature to the head's probabilities on the
    adaptation NLL after its own fit (:mod:`etn_cli.heads.calibration`)."""

    seed: int = 0
    calibrate: Literal["none", "temperature"] = "none"


def check_setting(head: str, name: str, value: object, ok: bool, expected: str) -> None:
    """Refuse a setting outside its range with an EtnError naming it."""
    if not ok:
        raise EtnError(
            f"Head {head!r}: expected {name} {expected}, got {value!r}. Fix the value in the "
            "pipeline's [[heads]] table."
        )


def require_positive(head: str, **values: float) -> None:
    for name, value in values.items():
        check_setting(head, name, value, value > 0, "> 0")


@dataclass(frozen=True)
class AdaTSConfig(HeadConfig):
    latent_dim: int = 16
    widths: tuple[int, ...] = (1024, 512, 512)  # encoder; the decoder mirrors it
    temperature_widths: tuple[int, ...] = (128, 128)
    kl_weight: float = 1.0
    nu: float = 1e4
    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-3
    b_init: float = 1.0
    select: Literal["loss", "accuracy"] = "accuracy"  # the paper's rule for baselines

    def __post_init__(self) -> None:
        for name in ("widths", "temperature_widths"):
            widths = getattr(self, name)
            ok = all(w > 0 for w in widths) and (len(widths) > 0 or name != "widths")
            check_setting("adats", name, list(widths), ok, "a list of positive layer widths")
        require_positive("adats", latent_dim=self.latent_dim, batch_size=self.batch_size)
        require_positive("adats", lr=self.lr, b_init=self.b_init)
        check_setting("adats", "nu", self.nu, self.nu > 1, "> 1")


@dataclass(frozen=True)
class DMMConfig(HeadConfig):
    width: int = 256  # hidden units of each layer's module (the reference's last module)
    kl_weight: float = 1e-3  # the reference's lambda_KL
    prior: float = 1.0
    include_hidden: bool = True
    epochs: int = 20  # the reference's
    batch_size: int = 128  # the reference's
    lr: float = 1e-3
    weight_decay: float = 5e-4  # the reference's
    select: Literal["loss", "accuracy"] = "accuracy"  # the paper's rule for baselines


@dataclass(frozen=True)
class DUQConfig(HeadConfig):
    """The reference's CIFAR-10 defaults (train_duq_cifar.py), except the schedule: 30 epochs
    with the learning rate times 0.2 at epochs 10 and 20 (its FashionMNIST script) instead of
    75 epochs, since only the head is trained."""

    centroid_size: int = 512  # E
    length_scale: float = 0.1  # sigma
    gamma: float = 0.999
    gradient_penalty: float = 0.5  # lambda
    epochs: int = 30
    batch_size: int = 128
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_milestones: tuple[int, ...] = (10, 20)
    lr_decay: float = 0.2
    select: Literal["last", "loss", "accuracy"] = "accuracy"  # the paper's rule for baselines

    def __post_init__(self) -> None:
        if self.centroid_size < 1 or self.length_scale <= 0 or not 0 < self.gamma < 1:
            raise EtnError(
                f"duq expects centroid_size >= 1, length_scale > 0 and 0 < gamma < 1, got "
                f"{self.centroid_size}, {self.length_scale}, {self.gamma}. Fix the pipeline file."
            )
        milestones = list(self.lr_milestones)
        if milestones != sorted(set(milestones)):  # each >= 1: config.RANGES
            raise EtnError(
                f"duq expects lr_milestones as increasing epochs, got {milestones}. Fix the "
                "pipeline file, e.g. lr_milestones = [10, 20]."
            )


@dataclass(frozen=True)
class EnergyConfig(HeadConfig):
    temperature: float = 1.0


@dataclass(frozen=True)
class EnsembleConfig(HeadConfig):
    members: int = 3  # the paper's ensemble size
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    select: Literal["loss", "accuracy"] = "accuracy"  # the paper's rule for baselines

    def __post_init__(self) -> None:
        if self.members < 2:
            raise EtnError(
                f"ensemble expects members >= 2, got {self.members}. An ensemble of one is the "
                "fine-tuned last layer; use map_edl or map instead."
            )


@dataclass(frozen=True)
class ETNConfig(HeadConfig):
    """Defaults are the paper's CIFAR-10 / VGG16 settings (Table "Training and hyperparameter
    settings"); the pipeline file overrides them per setting."""

    variant: Literal["scalar", "vector", "matrix"] = "scalar"
    prior_mode: float = 10.0
    prior_variance: float = 5.0
    mc_samples: int = 20
    kl_weight: float = 1.0  # lambda
    nu: float = 1e4
    width: int = 256
    depth: int = 2  # linear layers per module: 2 for vision, 3 for LLMs
    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-3
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_fraction: float = 0.0
    standardize: bool = False  # z-score h with adaptation-set statistics (not in the paper)
    b_init: float = 1.0
    odir_weight: float = 1.0  # matrix variant: weight of ODIR on mu (Kull et al. 2019)
    memory_limit_gib: float | None = None  # matrix variant: refuse above this (default: free RAM)
    select: Literal["loss", "accuracy"] = "loss"  # the paper's rule for ETN (Supp.)

    def __post_init__(self) -> None:
        inner = self.width**2 * max(self.depth - 1, 0)  # hidden-to-hidden weights per module
        if inner > MAX_INNER_WEIGHTS:
            raise EtnError(
                f"etn expects width**2 * (depth - 1) <= {MAX_INNER_WEIGHTS:,} weights per module "
                f"(4 bytes each, and Adam keeps three copies), got width = {self.width}, depth = "
                f"{self.depth}: {inner:,}. The paper uses width 256 with depth 2 or 512 with 3."
            )


@dataclass(frozen=True)
class IBEDLConfig(HeadConfig):
    beta: float = 1e-5
    mc_samples: int = 20
    sigma_init: float = 1.0
    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-3
    b_init: float = 1.0
    learn_b: bool = True
    select: Literal["loss", "accuracy"] = "accuracy"  # the paper's rule for baselines

    def __post_init__(self) -> None:
        require_positive("ib_edl", mc_samples=self.mc_samples)
        ok = self.sigma_init > SIGMA_FLOOR
        check_setting("ib_edl", "sigma_init", self.sigma_init, ok, f"> {SIGMA_FLOOR}")
        require_positive("ib_edl", batch_size=self.batch_size, lr=self.lr, b_init=self.b_init)
        check_setting("ib_edl", "beta", self.beta, self.beta >= 0, ">= 0")


@dataclass(frozen=True)
class LaplaceConfig(HeadConfig):
    hessian_structure: Literal["kron", "diag"] = "kron"
    pred_type: Literal["nn", "glm"] = "nn"  # the same predictive for a linear last layer
    mc_samples: int = 20
    prior_steps: int = 100  # Adam steps on the log marginal likelihood (library default)
    prior_lr: float = 0.1
    backend: Literal["closed_form", "laplace_torch"] = "closed_form"

    def __post_init__(self) -> None:
        require_positive("laplace", mc_samples=self.mc_samples, prior_lr=self.prior_lr)
        check_setting("laplace", "prior_steps", self.prior_steps, self.prior_steps >= 0, ">= 0")
        ok = self.pred_type == "nn" or self.backend == "laplace_torch"
        check_setting("laplace", "backend", self.backend, ok, '"laplace_torch" for pred_type glm')


@dataclass(frozen=True)
class MapEDLConfig(HeadConfig):
    """Defaults: the paper's uncertainty-adaptation settings for VGG16 / CIFAR-10."""

    nu: float = 1e4
    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 0.0
    b_init: float = 1.0
    select: Literal["loss", "accuracy"] = "accuracy"  # the paper's rule for baselines

    def __post_init__(self) -> None:
        require_positive("map_edl", batch_size=self.batch_size, lr=self.lr, b_init=self.b_init)
        check_setting("map_edl", "nu", self.nu, self.nu > 1, "> 1")


@dataclass(frozen=True)
class MCDropoutConfig(HeadConfig):
    p: float = 0.5  # OpenOOD's DropoutNet; the paper used its VGG16's own rate, 0.2
    passes: int = 20  # the paper's number of forward passes

    def __post_init__(self) -> None:
        if not 0.0 <= self.p < 1.0 or self.passes < 1:
            raise EtnError(
                f"mcd expects 0 <= p < 1 and passes >= 1, got p = {self.p}, passes = "
                f"{self.passes}. Fix them in the pipeline's [[heads]] table."
            )


@dataclass(frozen=True)
class ODINConfig(HeadConfig):
    temperature: float = 1000.0  # used by the fallback only; extract applies its own T

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise EtnError(
                f"odin expects temperature > 0, got {self.temperature}. Fix the pipeline file."
            )


@dataclass(frozen=True)
class SNGPConfig(HeadConfig):
    random_features: int = 1024  # M, the paper's and reference's default
    length_scale: float = 1.0  # in units of the median pairwise distance of adaptation features
    ridge: float = 1.0  # prior precision of beta; the reference's gp_cov_ridge_penalty
    mean_field_factor: float = math.pi / 8  # lambda
    covariance: Literal["per_class", "shared"] = "per_class"
    epochs: int = 100
    batch_size: int = 128
    lr: float = 1e-2
    select: Literal["loss", "accuracy"] = "accuracy"  # the paper's rule for baselines

    def __post_init__(self) -> None:
        if self.random_features < 1 or self.length_scale <= 0 or self.ridge <= 0:
            raise EtnError(
                f"sngp expects random_features >= 1, length_scale > 0 and ridge > 0, got "
                f"{self.random_features}, {self.length_scale}, {self.ridge}. Fix the pipeline file."
            )


@dataclass(frozen=True)
class StaticConfig(HeadConfig):
    variant: Literal["scalar", "vector", "matrix"] = "scalar"
    nu: float = 1e4
    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-2
    a_init: float = 1.0
    b_init: float = 1.0
    odir_weight: float = 1.0  # matrix variant only
    init: Literal["search", "fixed"] = "search"  # the 1-D loss optimum of the scale, or a_init
    select: Literal["loss", "accuracy"] = "accuracy"  # the paper's rule for baselines
