"""The uncertainty scores etn knows by name and which way each points, without numpy or scipy:
``etn predict --threshold`` checks a score's name, and a report reads a direction, before
anything heavy is imported. :mod:`etn_cli.metrics.scores` computes the standard scores; a
method's own score and its direction are in its record (:mod:`etn_cli.catalogue`).
"""

from __future__ import annotations

from etn_cli.catalogue import METHODS

STANDARD: dict[str, bool] = {
    "mp": True,  # max probability
    "um": True,  # uncertainty mass alpha_0 (total evidence)
    "mi": False,  # mutual information
    "de": False,  # differential entropy of the Dirichlet
    "md": True,  # Mahalanobis score, reported as the negative distance
    "energy": True,  # logsumexp of the logits
}


def _directions() -> dict[str, bool]:
    directions = dict(STANDARD)
    for method in METHODS.values():
        if directions.setdefault(method.score, method.higher_means_id) != method.higher_means_id:
            raise ValueError(f"score {method.score!r} is given both directions ({method.name})")
    return directions


HIGHER_MEANS_ID: dict[str, bool] = _directions()
