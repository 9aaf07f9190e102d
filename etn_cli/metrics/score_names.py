"""The uncertainty scores etn knows by name and which way each points, without numpy or scipy:
``etn predict --threshold`` checks a score's name, and a report reads a direction, before
anything heavy is imported. :mod:`etn_cli.metrics.scores` computes the scores.
"""

from __future__ import annotations

HIGHER_MEANS_ID: dict[str, bool] = {
    "mp": True,  # max probability
    "um": True,  # uncertainty mass alpha_0 (total evidence)
    "mi": False,  # mutual information
    "de": False,  # differential entropy of the Dirichlet
    "md": True,  # Mahalanobis score, reported as the negative distance
    "energy": True,  # logsumexp of the logits
    "kernel": True,  # DUQ's largest RBF kernel value max_c K_c
    # the post-hoc scorers' own scores (etn_cli/heads/scorers), named here so that a report
    # reads them without importing the scorers; each scorer declares its own with
    # register_score, which refuses a direction that differs from this one
    **dict.fromkeys(("react", "vra", "ash", "scale", "fdbd", "she", "gradnorm", "ddu"), True),
    **dict.fromkeys(("dice", "mahalanobis_pp", "rmds", "klm", "knn", "nnguide", "mls"), True),
    "entropy": False,  # the softmax entropy: higher means more OOD
    **dict.fromkeys(("gen", "vim", "residual"), True),
}


def register_score(name: str, higher_means_id: bool) -> None:
    """Declare a score and its direction once; a second, different declaration is a bug."""
    if HIGHER_MEANS_ID.setdefault(name, higher_means_id) != higher_means_id:
        raise ValueError(f"score {name!r} is registered with both directions")
