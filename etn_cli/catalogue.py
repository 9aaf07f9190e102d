"""Every method etn knows, one record each: the only place a head's or scorer's facts are written.

A record says which module under ``etn_cli.heads`` registers the method (``@heads.register``),
its label in reports, its family, its settings class (by name, in ``etn_cli.heads.settings`` or
``etn_cli.heads.scorers.settings``), what it needs beyond the cached hidden states and logits
and what of the cache it reads, whether it draws anything at random, its version (raised when
its results change for the same inputs: a new unit key), its own OOD score and which way that
score points, and the names other libraries give it. Nothing here imports torch, numpy or a
head: the registry (:mod:`etn_cli.heads`), the refusals before torch, ``etn ls``, planning and
the report's score directions (:mod:`etn_cli.metrics.score_names`) all read these records, and
``heads.register`` writes a record's facts onto the class it registers, so a head's class holds
only its method. Adding a method is one module and one record (docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass

EVIDENTIAL, BAYESIAN, DETERMINISTIC, POSTHOC = "evidential", "bayesian", "deterministic", "posthoc"
FAMILIES = (EVIDENTIAL, BAYESIAN, DETERMINISTIC, POSTHOC)
NEEDS = ("classifier", "layers", "id_statistics", "every_class")
READS = ("hidden", "fit_rows")


@dataclass(frozen=True)
class Method:
    """One head or scorer.

    ``needs``: the backbone's final layer (``classifier``), pooled intermediate layers
    (``layers``), fitting on the ``[data] fit`` split when there is one (``id_statistics``),
    rows of every class in that split (``every_class``). ``reads``: what its fit and predict
    read of the cache, so what is scanned for NaN (``hidden``: the hidden states, not only the
    logits; ``fit_rows``: the rows of its fit split, not only their sizes). ``seed_free``
    (default: a post-hoc method) draws nothing at random: one seed stands for all.
    """

    name: str
    module: str  # under etn_cli.heads
    label: str
    family: str
    settings: str = "HeadConfig"
    needs: tuple[str, ...] = ()
    reads: tuple[str, ...] = READS
    seed_free: bool | None = None
    version: int = 0
    score: str = "mp"  # the OOD score ``Head.score`` returns
    higher_means_id: bool = True
    aliases: tuple[str, ...] = ()  # the names OpenOOD and pytorch-ood use

    def __post_init__(self) -> None:
        if self.seed_free is None:
            object.__setattr__(self, "seed_free", self.family == POSTHOC)
        odd = [v for v in self.needs if v not in NEEDS] + [v for v in self.reads if v not in READS]
        if self.family not in FAMILIES or odd:
            raise ValueError(f"method {self.name!r}: unknown family or needs/reads {odd}")


# version 1 (issue 29): float64 covariances and distances (mahalanobis, rmds, mahalanobis_pp),
# float64 moment and QR origin (vim, residual), a jitter clear of rounding noise (ddu), exact
# on rows whose p_max rounds to 1 (entropy, gen), the fallback where the NLL has no finite
# optimum (temperature)
# fmt: off
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("map", "map", "MAP", POSTHOC, reads=(), aliases=("msp",)),
    Method("etn", "etn", "ETN", EVIDENTIAL, "ETNConfig"),
    Method("etn_offset", "etn_offset", "ETN (fitted offset)", EVIDENTIAL, "ETNConfig"),
    Method("static", "static", "Static scaling", EVIDENTIAL, "StaticConfig"),
    Method("energy", "energy", "Energy", POSTHOC, "EnergyConfig", reads=(), score="energy",
           aliases=("ebo",)),
    Method("mahalanobis", "mahalanobis", "Mahalanobis", POSTHOC,
           needs=("id_statistics", "every_class"), version=1, score="md", aliases=("mds",)),
    Method("map_edl", "map_edl", "MAP_EDL (last layer)", EVIDENTIAL, "MapEDLConfig",
           needs=("classifier",)),
    Method("adats", "adats", "AdaTS (EDL loss)", EVIDENTIAL, "AdaTSConfig"),
    Method("ib_edl", "ib_edl", "IB-EDL (last layer)", EVIDENTIAL, "IBEDLConfig",
           needs=("classifier",)),
    Method("laplace", "laplace", "Laplace (last layer, KFAC)", BAYESIAN, "LaplaceConfig",
           needs=("classifier",)),
    Method("mcd", "mcd", "MC dropout", BAYESIAN, "MCDropoutConfig", needs=("classifier",)),
    Method("ensemble", "ensemble", "Deep ensemble (last layer)", BAYESIAN, "EnsembleConfig",
           needs=("classifier",)),
    Method("odin", "odin", "ODIN", POSTHOC, "ODINConfig"),
    Method("duq", "duq", "DUQ (head)", DETERMINISTIC, "DUQConfig", score="kernel"),
    Method("sngp", "sngp", "SNGP (head)", DETERMINISTIC, "SNGPConfig"),
    Method("dmm", "dmm", "DMM", EVIDENTIAL, "DMMConfig", needs=("layers",)),
    Method("max_logit", "scorers.logit_scores", "Max logit", POSTHOC, reads=(), score="mls",
           aliases=("mls",)),
    Method("entropy", "scorers.logit_scores", "Entropy", POSTHOC, reads=(), version=1,
           score="entropy", higher_means_id=False),
    Method("gen", "scorers.logit_scores", "GEN", POSTHOC, "GENConfig", reads=(), version=1,
           score="gen"),
    Method("temperature", "scorers.temperature", "Temperature scaling", POSTHOC,
           reads=("fit_rows",), version=1, aliases=("temp_scaling",)),
    Method("kl_matching", "scorers.kl_matching", "KL matching", POSTHOC, needs=("id_statistics",),
           reads=("fit_rows",), score="klm", aliases=("klm",)),
    Method("react", "scorers.rectified", "ReAct", POSTHOC, "ReActConfig",
           needs=("classifier", "id_statistics"), score="react"),
    Method("vra", "scorers.rectified", "VRA", POSTHOC, "VRAConfig",
           needs=("classifier", "id_statistics"), score="vra"),
    Method("ash_p", "scorers.activation_shaping", "ASH-P", POSTHOC, "ASHPConfig",
           needs=("classifier",), reads=("hidden",), score="ash"),
    Method("ash_b", "scorers.activation_shaping", "ASH-B", POSTHOC, "ASHBConfig",
           needs=("classifier",), reads=("hidden",), score="ash", aliases=("ash",)),
    Method("ash_s", "scorers.activation_shaping", "ASH-S", POSTHOC, "ASHSConfig",
           needs=("classifier",), reads=("hidden",), score="ash"),
    Method("scale", "scorers.activation_shaping", "SCALE", POSTHOC, "SCALEConfig",
           needs=("classifier",), reads=("hidden",), score="scale"),
    Method("dice", "scorers.dice", "DICE", POSTHOC, "DICEConfig",
           needs=("classifier", "id_statistics"), score="dice"),
    Method("knn", "scorers.knn", "KNN", POSTHOC, "NeighboursConfig", needs=("id_statistics",),
           score="knn"),
    Method("nnguide", "scorers.knn", "NNGuide", POSTHOC, "NNGuideConfig", needs=("id_statistics",),
           score="nnguide"),
    Method("vim", "scorers.subspace", "ViM", POSTHOC, "SubspaceConfig",
           needs=("classifier", "id_statistics"), version=1, score="vim"),
    Method("residual", "scorers.subspace", "Residual", POSTHOC, "SubspaceConfig",
           needs=("classifier", "id_statistics"), version=1, score="residual"),
    Method("rmds", "scorers.gaussian", "RMDS", POSTHOC, needs=("id_statistics", "every_class"),
           version=1, score="rmds"),
    Method("mahalanobis_pp", "scorers.gaussian", "Mahalanobis++", POSTHOC,
           needs=("id_statistics", "every_class"), version=1, score="mahalanobis_pp"),
    Method("ddu", "scorers.ddu", "DDU (GDA)", POSTHOC, "DDUConfig",
           needs=("id_statistics", "every_class"), version=1, score="ddu", aliases=("gda",)),
    Method("fdbd", "scorers.boundary", "fDBD", POSTHOC, needs=("classifier", "id_statistics"),
           score="fdbd"),
    Method("she", "scorers.boundary", "SHE", POSTHOC, needs=("id_statistics", "every_class"),
           score="she"),
    Method("gradnorm", "scorers.boundary", "GradNorm", POSTHOC, "GradNormConfig", reads=("hidden",),
           score="gradnorm"),
    Method("nci", "scorers.nci", "NCI", POSTHOC, "NCIConfig", needs=("classifier", "id_statistics"),
           score="nci"),
)}
# fmt: on
