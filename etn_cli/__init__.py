"""etn: post-hoc evidential uncertainty (the Evidential Transformation Network, CVPR 2026)
for any pretrained classifier, as a feature-caching pipeline.

The head interface works on arrays a user already has::

    from etn_cli.heads import heads
    head = heads.get("etn")().fit(hidden, logits, labels)
    prediction = head.predict(hidden, logits)  # probs, scores (mp, um, mi, de), alpha
"""

from etn_cli.errors import EtnError
from etn_cli.provenance import etn_version

__version__ = etn_version()
__all__ = ["EtnError", "__version__"]
