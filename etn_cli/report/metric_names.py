"""The metrics a table can show, by name, and the check of ``--metric``: kept apart from the
tables (polars, numpy) so that a mistyped ``--metric`` is refused before anything loads."""

from __future__ import annotations

RANKING = ("aupr", "auroc", "fpr95", "aupr_in", "aupr_out", "fpr95_id")
CALIBRATION = ("acc", "ece", "nll", "brier")
SELECTIVE = ("aurc", "eaurc", "risk80", "risk90", "risk95")
CONFORMAL = ("coverage", "set_size")
OOD_SET_SIZE = "ood_set_size"  # a table cell's metric: set size on an OOD set, not ranked
METRICS = (*RANKING, *CALIBRATION, *SELECTIVE, *CONFORMAL, "runtime")


def check_metric(metric: str | None) -> str | None:
    """``None`` (the summary) or a metric name the evaluation writes; else a usage error."""
    if metric is None:
        return None
    from etn_cli.errors import choose

    aliases = {"runtime_ms": "runtime", "fpr": "fpr95", "e-aurc": "eaurc", "e_aurc": "eaurc"}
    return choose(metric.lower(), METRICS, "metric", aliases)
