"""Checkpoint selection (issue 17.1): the post-hoc baselines keep the epoch of highest adaptation
accuracy, ETN the epoch of lowest adaptation loss (paper Supp. "Experimental Setting"), and the
head records which rule kept which epoch."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from etn_cli.errors import EtnError
from etn_cli.heads import heads
from etn_cli.heads.training import fit_module

EPOCHS = 10


class Threshold(nn.Module):
    """Predicts class 1 where ``x > w``; its loss ``-w`` falls every epoch while the accuracy on
    labels ``x > 0.3`` peaks when ``w`` passes 0.3 (Adam moves ``w`` by about ``lr`` a step)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def scores(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.zeros_like(x), x - self.w], -1)  # (B, 2)


def _fit_threshold(select: str) -> tuple[Threshold, object]:
    module = Threshold()
    x = torch.linspace(0.01, 0.99, 50)
    y = (x > 0.3).long()
    training = fit_module(
        module, lambda x_, y_: -module.w.expand(len(x_)), (x, y), epochs=EPOCHS, batch_size=50,
        lr=0.1, seed=0, device=torch.device("cpu"), select=select, class_scores=module.scores,
    )  # fmt: skip
    return module, training


def test_accuracy_selection_keeps_the_most_accurate_epoch_where_the_loss_keeps_falling():
    module, training = _fit_threshold("accuracy")
    best = max(range(EPOCHS), key=lambda e: (training.accuracies[e], -training.losses[e])) + 1
    assert training.epoch == best == 3  # w near 0.3 after three steps
    assert training.accuracies[best - 1] == 1.0
    assert min(training.losses) < training.losses[best - 1]  # the loss rule would differ
    assert module.w.item() == pytest.approx(0.3, abs=0.02)
    assert training.record() == {
        "select": "accuracy", "epoch": 3, "epochs": EPOCHS, "loss": training.losses[2],
        "accuracy": 1.0,
    }  # fmt: skip


def test_loss_selection_keeps_the_lowest_loss_epoch_and_never_measures_accuracy():
    module, training = _fit_threshold("loss")
    assert training.epoch == EPOCHS
    assert training.accuracies == []
    assert module.w.item() == pytest.approx(1.0, abs=0.02)  # after the tenth step


def test_an_unknown_selection_rule_is_refused():
    with pytest.raises(EtnError, match="select must be 'loss' or 'accuracy'"):
        _fit_threshold("auroc")


@pytest.mark.parametrize(
    ("name", "rule"),
    [("etn", "loss"), ("static", "accuracy"), ("map_edl", "accuracy"), ("ib_edl", "accuracy"),
     ("adats", "accuracy"), ("dmm", "accuracy"), ("ensemble", "accuracy"), ("sngp", "accuracy"),
     ("duq", "accuracy"), ("etn_offset", "loss")],
)  # fmt: skip
def test_each_trained_head_defaults_to_the_papers_rule(name, rule):
    assert heads.get(name)().config.select == rule


def test_a_head_records_its_rule_and_kept_epoch_and_keeps_them_when_saved(
    features_factory, tmp_path
):
    data = features_factory(n=120, d=8, c=3, seed=0)
    classifier = {k: torch.from_numpy(v) for k, v in data.classifier.items()}
    head = heads.get("map_edl")(epochs=6, batch_size=32, lr=0.05)
    head.fit(data.hidden, data.logits, data.labels, classifier=classifier)
    kept = head.selection_
    assert kept["select"] == "accuracy" and 1 <= kept["epoch"] <= 6
    correct = head.predict(data.hidden, data.logits).predictions == data.labels
    assert correct.mean() == pytest.approx(kept["accuracy"])  # the kept weights are predicting
    head.save(tmp_path)
    assert json.loads((tmp_path / "head.json").read_text())["selection"] == kept
    assert type(head).load(tmp_path).selection_ == kept


@pytest.mark.parametrize("select", ["accuracy", "last"])
def test_duq_keeps_the_epoch_its_rule_names(features_factory, select):
    data = features_factory(n=120, d=8, c=3, seed=0)
    head = heads.get("duq")(epochs=5, batch_size=32, centroid_size=8, select=select)
    head.fit(data.hidden, data.logits, data.labels)
    kept = head.selection_
    assert kept["select"] == select and kept["epochs"] == 5
    if select == "last":
        assert kept["epoch"] == 5
    else:
        correct = head.predict(data.hidden, data.logits).predictions == data.labels
        assert correct.mean() == pytest.approx(kept["accuracy"])
