"""Paper Figure 1, readable at 35 methods: OOD detection quality against ID accuracy, and
against inference time where timings tell methods apart (``frontier-<metric>.png`` / ``.pdf``).

* **One marker per distinct result.** Methods with the same accuracy and the same quality (a
  head and its temperature-scaled twin) are one marker, named together. Nothing is moved
  sideways: a shared accuracy is a shared x.
* **A crowded accuracy is one glyph.** When four or more results share one accuracy (the
  post-hoc scorers and ETN keep MAP's argmax; :mod:`etn_cli.report.frontier_results`), panel
  (a) draws them as one bar from the worst to the best, a tick per result, and a panel of
  their own ranks them by name with their 95% intervals, so no marker, bar or label sits on
  another.
* **One score per method, not chosen on the test set.** Each method is drawn with the score of
  the summary table's headline columns: its own OOD score when it has exactly one (``md``,
  ``energy``, ``knn``, ...), else max probability (:func:`etn_cli.report.views.own_scores`).
* **Labels only on the Pareto front** (no method is both more accurate and better at detecting
  OOD), placed where they overlap nothing (:mod:`etn_cli.report.labels`); every other marker
  is named in the legend under the figure. Colour and marker per method as in every figure
  (:mod:`etn_cli.report.style`).
* **Runtime** (backbone passes plus head, per sample; bars from the fastest to the slowest of
  every timed repeat and seed) only when some two methods' ranges do not overlap: otherwise the
  differences are timing noise and the panel is left out with a note saying so.
* When every method has the same accuracy (an ablation of ETN, which keeps the argmax), the
  accuracy axis says nothing: the figure is a ranked dot plot with 95% intervals.
"""

from __future__ import annotations

from pathlib import Path

from etn_cli.report.frontier_results import distinct_results
from etn_cli.report.summary import Summary


def frontier_plot(summary: Summary, folder: Path, metric: str = "aupr") -> list[Path]:
    """Draw ``frontier-<metric>`` of ``summary`` into ``folder`` (see the module docstring);
    returns the written paths, none when the metrics hold no OOD results."""
    from etn_cli.report.frontier_figure import frontier_figure
    from etn_cli.report.plots import save_figure

    results = distinct_results(summary, metric)
    if not results:
        return []
    figure = frontier_figure(results, summary.ood_set, metric)
    return save_figure(figure, folder, f"frontier-{metric}")
