"""The post-hoc scorers' settings, as frozen dataclasses that import no torch (see
:mod:`etn_cli.heads.settings`, which holds those of the trained heads and the reason)."""

from __future__ import annotations

from dataclasses import dataclass

from etn_cli.errors import EtnError
from etn_cli.heads.settings import HeadConfig


def check_percent(name: str, value: float, head: str) -> None:
    if not 0 <= value <= 100:
        raise EtnError(f"{head} expects {name} in [0, 100] (a percentile), got {value}.")


def percentile_config(default: float, head: str) -> type[HeadConfig]:
    """The settings of an activation-shaping head: ``percentile`` with its paper's default."""

    @dataclass(frozen=True)
    class ShapingConfig(HeadConfig):
        percentile: float = default

        def __post_init__(self) -> None:
            check_percent("percentile", self.percentile, head)

    return ShapingConfig


@dataclass(frozen=True)
class GradNormConfig(HeadConfig):
    temperature: float = 1.0  # the paper's T = 1

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise EtnError(f"gradnorm expects temperature > 0, got {self.temperature}.")


@dataclass(frozen=True)
class DDUConfig(HeadConfig):
    memory_limit_gib: float = 4.0


@dataclass(frozen=True)
class DICEConfig(HeadConfig):
    sparsity: float = 90.0  # p, in percent of the weights removed

    def __post_init__(self) -> None:
        check_percent("sparsity", self.sparsity, "dice")


@dataclass(frozen=True)
class NeighboursConfig(HeadConfig):
    k: int = 50

    def __post_init__(self) -> None:
        if self.k < 1:
            raise EtnError(f"k must be an integer >= 1 (neighbours), got {self.k}.")


@dataclass(frozen=True)
class NNGuideConfig(NeighboursConfig):
    k: int = 10  # the authors' code (knn_k: 10) and pytorch-ood; OpenOOD's K is 100


@dataclass(frozen=True)
class GENConfig(HeadConfig):
    gamma: float = 0.1  # the paper's default
    top_m: int = 100  # classes kept; min(top_m, C)

    def __post_init__(self) -> None:
        if not 0 < self.gamma < 1 or self.top_m < 1:
            raise EtnError(
                f"gen expects 0 < gamma < 1 and top_m >= 1, got {self.gamma} and {self.top_m}. "
                "The paper uses gamma = 0.1, top_m = 100."
            )


@dataclass(frozen=True)
class ReActConfig(HeadConfig):
    percentile: float = 90.0  # the paper's p = 90

    def __post_init__(self) -> None:
        check_percent("percentile", self.percentile, "react")


@dataclass(frozen=True)
class VRAConfig(HeadConfig):
    lower_percentile: float = 60.0  # alpha: the paper's CIFAR setting (q1 = 0.6)
    upper_percentile: float = 90.0  # beta (q2 = 0.9)
    lower: float | None = None  # absolute alpha instead (the paper's ImageNet ResNet-50: 0.5)
    upper: float | None = None  # absolute beta (ImageNet ResNet-50: 1.0)
    gamma: float = 0.0  # VRA+'s shift of the kept activations; 0 is plain VRA

    def __post_init__(self) -> None:
        check_percent("lower_percentile", self.lower_percentile, "vra")
        check_percent("upper_percentile", self.upper_percentile, "vra")
        if self.lower_percentile > self.upper_percentile:
            raise EtnError(
                f"vra expects lower_percentile <= upper_percentile, got "
                f"{self.lower_percentile} > {self.upper_percentile}."
            )


@dataclass(frozen=True)
class SubspaceConfig(HeadConfig):
    dim: int = 0  # d; 0 = the paper's rule

    def __post_init__(self) -> None:
        if self.dim < 0:
            raise EtnError(f"dim must be >= 0 (0 = the paper's rule), got {self.dim}.")


ASHPConfig = percentile_config(60.0, "ash_p")
ASHBConfig = percentile_config(65.0, "ash_b")
ASHSConfig = percentile_config(90.0, "ash_s")
SCALEConfig = percentile_config(85.0, "scale")


@dataclass(frozen=True)
class NCIConfig(HeadConfig):
    norm_weight: float = 0.0  # alpha, the weight of the feature's L1 norm

    def __post_init__(self) -> None:
        if self.norm_weight < 0:
            raise EtnError(
                f"head 'nci' key 'norm_weight' must be a number >= 0, got {self.norm_weight}. "
                "Fix the value."
            )
