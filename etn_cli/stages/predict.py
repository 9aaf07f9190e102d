"""``etn predict``: a pipeline's trained head on new inputs, one row per input.

Inputs (:func:`resolve_inputs`) are one of

* a folder of images, searched recursively (``.jpg``, ``.png``, … as for ImageNet folders),
  for the image backbones (``torchvision``, ``timm``, ``hf_image``);
* a ``.jsonl`` file of multiple-choice questions in etn's MCQA schema
  (:mod:`etn_cli.datasets.mcqa_files`; ``answer`` optional), for ``hf_causal_lm``;
* a registered dataset split, ``<dataset>:<split>`` (``digits:test``) or ``<dataset>`` (its
  ``test`` split), for any backbone.

The backbone computes what ``etn extract`` would store for the same inputs (``extract_batch``
with the pipeline's batch size, fine-tuned weights, layers and ODIN logits) and the head
predicts as ``etn evaluate`` does, so on a split the pipeline extracted the rows reproduce the
evaluated predictions. Columns: ``input`` (path, question id or ``<dataset>:<split>#<index>``),
``index`` and ``label`` where known, ``prediction`` (and ``letter`` for LLMs),
``probability`` of the prediction, ``prob_<class>`` for every class, every score of the head,
with thresholds ``threshold_<score>`` (the value used), ``flagged_<score>`` and ``flagged``,
and with a ``[conformal]`` section the conformal ``prediction_set`` and ``set_size`` of each
row. A score where higher means more ID (:data:`~etn_cli.metrics.score_names.HIGHER_MEANS_ID`:
mp, um, …) flags rows below its threshold; mi and de flag rows above it. A threshold is given
as a value (``mp=0.5``) or chosen on the adaptation split (``mp@95``: the value that keeps 95%
of its rows, all ID, as OpenOOD's FPR95 reads the threshold at 95% of ID rows kept).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etn_cli import progress
from etn_cli.datasets.base import Split
from etn_cli.errors import EtnError, did_you_mean
from etn_cli.metrics.score_names import HIGHER_MEANS_ID
from etn_cli.planning.plan import Plan, open_source
from etn_cli.stages.predict_options import (
    check_input_named,
    check_out_outside_store,
    output_format,
)
from etn_cli.stages.trained_heads import pipeline_head, read_head
from etn_cli.store.atomic import atomic_write_bytes

IMAGES = ("images", "split")
INPUT_KINDS = {
    "torchvision": IMAGES,
    "timm": IMAGES,
    "hf_image": IMAGES,
    "hf_causal_lm": ("questions", "split"),
}
ANSWER_KEYS = ("answer", "answerKey", "answers")  # a question without them is unlabelled


@dataclass
class Inputs:
    """New inputs as a :class:`Split` the backbone can batch, with one name per row."""

    split: Split
    names: list[str]
    kind: str  # "images", "questions" or "split"
    labelled: bool  # whether the labels are real (dataset splits, answered questions)


@dataclass
class PredictResult:
    path: Path
    rows: int
    flagged: int | None
    frame: Any = None  # the rows written

    def summary(self) -> str:
        flagged = "" if self.flagged is None else f", {self.flagged} flagged"
        return f"predict: {self.rows} rows written to {self.path}{flagged}"


def predict(
    plan: Plan,
    inputs: str,
    *,
    head: str = "etn",
    seed: int = 0,
    out: Path,
    thresholds: dict[str, float] | None = None,
    keep: dict[str, float] | None = None,
    device: str = "cpu",
) -> PredictResult:
    """Predict ``inputs`` with the pipeline's head and write the rows to ``out`` atomically;
    ``keep`` maps a score to the percentage of the adaptation split's rows its threshold keeps
    (``--threshold mp@95``)."""
    fmt = output_format(out)
    check_out_outside_store(out, plan.data_dir)
    options = {"thresholds": thresholds, "keep": keep, "device": device}
    frame = predict_frame(plan, inputs, head=head, seed=seed, **options)
    buffer = io.BytesIO()
    frame.write_parquet(buffer) if fmt == "parquet" else frame.write_csv(buffer)
    atomic_write_bytes(Path(out), buffer.getvalue())
    flagged = int(frame["flagged"].sum()) if "flagged" in frame.columns else None
    return PredictResult(Path(out), len(frame), flagged, frame)


def predict_frame(
    plan: Plan,
    inputs: str,
    *,
    head: str = "etn",
    seed: int = 0,
    thresholds: dict[str, float] | None = None,
    keep: dict[str, float] | None = None,
    device: str = "cpu",
) -> Any:
    """The rows :func:`predict` writes, as a polars DataFrame; nothing is written."""
    from etn_cli.stages.conformal_sets import calibrate
    from etn_cli.stages.extract import load_backbone
    from etn_cli.store.reading.reader import read_split

    check_input_named(inputs)
    trained = read_head(pipeline_head(plan, head, seed).path)
    if plan.backbone is None:
        raise EtnError(
            f"{plan.pipeline.path} reads your own features ([features]), so etn has no backbone "
            "to run on new inputs. Extract features yourself and use etn_cli.load_head(...)."
        )
    found = resolve_inputs(plan, inputs, trained.n_classes_)
    chosen = {**(thresholds or {}), **kept_thresholds(plan, trained, keep or {}, device)}
    hidden, logits, layers, labels = backbone_outputs(load_backbone(plan, device), found, plan)
    prediction = trained.predict(hidden, logits, layers=layers, device=device)
    names, kind = class_names(plan, trained.n_classes_)
    columns: dict[str, Any] = {"input": found.names}
    if found.kind == "split":
        columns["index"] = found.split.index
    if found.labelled:
        columns["label"] = labels
    columns.update(prediction_columns(prediction, names, kind))
    columns.update(flag_columns(prediction.scores, chosen, trained.name))
    if plan.pipeline.conformal is not None:
        rows = found.split.index if found.kind == "split" else np.arange(len(found.names))
        name = f"{found.split.dataset}:{found.split.split}"
        member = calibrate(plan, trained, read_split, device).sets(prediction.probs, rows, name)
        columns.update(set_columns(member, names))  # member: (N, C)
    import polars as pl

    return pl.DataFrame(columns)


def class_names(plan: Plan, n_classes: int) -> tuple[list | None, str]:
    """The pipeline's names of its ``n_classes`` classes and what they are: an LLM's answer
    letters (``"letter"``), the class names (``"class"``) of an image folder (or the digits'
    numbers), or none."""
    letters = getattr(plan.backbone.config, "letters", None) if plan.backbone else None
    if letters:
        return list(letters), "letter"
    classes = (plan.adapt.fingerprint or {}).get("source", {}).get("classes")  # image_folder
    return (list(classes), "class") if classes and len(classes) == n_classes else (None, "class")


def prediction_columns(prediction: Any, named: list | None, kind: str) -> dict[str, Any]:
    """Prediction (and, with ``named`` classes, its letter or class name: ``kind``), its
    probability, every class's probability (``prob_<letter>`` / ``prob_<class name>`` where
    known), every score."""
    probs, predicted = prediction.probs, prediction.predictions  # (N, C), (N,)
    names = named or [str(k) for k in range(probs.shape[1])]
    columns: dict[str, Any] = {"prediction": predicted}
    if named:
        columns[kind] = [names[k] for k in predicted]
    columns["probability"] = probs[np.arange(len(probs)), predicted]
    columns.update({f"prob_{name}": probs[:, k] for k, name in enumerate(names)})
    columns.update(prediction.scores)
    return columns


def set_columns(member: np.ndarray, named: list | None) -> dict[str, Any]:
    """``prediction_set`` (``{3, 5}``; ``{fox, owl}`` with ``named`` classes or letters) and
    ``set_size`` of each row's conformal set, ``member`` (N, C) marking its classes (the head
    calibrated on the pipeline's calibration rows as ``etn evaluate`` calibrates it, so on a
    split it evaluated the same sets)."""
    names = named or [str(k) for k in range(member.shape[1])]
    sets = ["{" + ", ".join(str(names[k]) for k in np.flatnonzero(row)) + "}" for row in member]
    return {"prediction_set": sets, "set_size": member.sum(axis=1)}


def flag_columns(
    scores: dict[str, np.ndarray], thresholds: dict[str, float], head: str
) -> dict[str, np.ndarray]:
    """``threshold_<score>`` (the value, on every row: the file records it) and
    ``flagged_<score>`` per threshold (below it for scores where higher means ID, above it
    otherwise), and ``flagged``, their union."""
    columns, flags = {}, []
    for name, value in thresholds.items():
        score = scores_of(scores, name, head)  # (N,)
        columns[f"threshold_{name}"] = np.full(len(score), value)
        flags.append(score < value if HIGHER_MEANS_ID[name] else score > value)
        columns[f"flagged_{name}"] = flags[-1]
    if flags:
        columns["flagged"] = np.logical_or.reduce(flags)
    return columns


def kept_thresholds(plan: Plan, head: Any, keep: dict[str, float], device: str) -> dict[str, float]:
    """The threshold of each score in ``keep`` that keeps that percentage of the adaptation
    split's rows (all of them ID): the strictest value that keeps at least p% of them, i.e. the
    (100 - p)th percentile of a score where higher means ID and the p-th of one where higher
    means OOD (mi, de), each said in one line."""
    if not keep:
        return {}
    from etn_cli.store.reading.reader import read_split

    adapt = read_split(plan.adapt.path)
    scores = head.predict(adapt.hidden, adapt.logits, layers=adapt.layers, device=device).scores
    chosen = {}
    for name, percent in keep.items():
        score, id_high = scores_of(scores, name, head.name), HIGHER_MEANS_ID[name]  # (N,)
        ood_up = -1.0 if id_high else 1.0  # the score turned to grow towards OOD
        # the strictest value the scores take that keeps at least the share
        value = ood_up * np.quantile(ood_up * score, percent / 100, method="inverted_cdf")
        share = np.mean(score >= value if id_high else score <= value)
        progress.say(
            f"threshold {name} = {value:.6g}: keeps {100 * share:.1f}% of the {len(score)} "
            f"rows of the adaptation split ({plan.adapt.name}); flags rows "
            f"{'below' if id_high else 'above'} it"
        )
        chosen[name] = float(value)
    return chosen


def scores_of(scores: dict[str, np.ndarray], name: str, head: str) -> np.ndarray:
    if name not in scores:
        raise EtnError(
            f"Head {head!r} gives no {name!r} score (it gives {', '.join(scores)}). Drop "
            f"--threshold {name}... or pick another head."
        )
    return scores[name]


# ------------------------------------------------------------------------- inputs
def resolve_inputs(plan: Plan, text: str, num_classes: int) -> Inputs:
    """An image folder, a ``.jsonl`` of questions or a dataset split, checked against what
    the pipeline's backbone reads."""
    path = Path(text).expanduser()
    if path.is_dir():
        kind = "images"
    elif path.is_file() and path.suffix.lower() == ".jsonl":
        kind = "questions"
    elif path.exists():
        raise EtnError(
            f"Input {text} is a file but not a .jsonl of questions. Pass an image folder, a "
            ".jsonl file, or a dataset split such as digits:test."
        )
    else:
        kind = "split"
    backbone = plan.backbone.name
    accepted = INPUT_KINDS.get(backbone, ("split",))
    if kind not in accepted:
        reads = {"images": "image folders", "questions": ".jsonl question files"}
        wanted = [reads[k] for k in accepted if k in reads] + ["dataset splits (digits:test)"]
        raise EtnError(
            f"Backbone {backbone!r} of {plan.pipeline.path} cannot read {reads[kind]} ({text}); "
            f"it reads {' or '.join(wanted)}."
        )
    if kind == "images":
        return image_folder(path, num_classes)
    if kind == "questions":
        return question_file(path)
    return dataset_split(plan, text)


def image_folder(folder: Path, num_classes: int) -> Inputs:
    from etn_cli.datasets.image_folder import images_below
    from etn_cli.datasets.imagenet import IMAGE_SUFFIXES

    files = images_below(folder)  # links followed once, a loop or a dangling link refused
    if not files:
        raise EtnError(
            f"Folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}, searched "
            "recursively). Check the path."
        )
    index = np.arange(len(files), dtype=np.int64)
    split = Split(folder.name, "predict", ImagePaths(files), index, num_classes)
    return Inputs(split, [str(p) for p in files], "images", labelled=False)


class ImagePaths(torch.utils.data.Dataset):
    """``(PIL RGB image, -1)`` per file: new images have no label."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from etn_cli.datasets.imagenet import read_image

        return read_image(self.files[i]), -1


def question_file(path: Path) -> Inputs:
    """Questions of a ``.jsonl`` file; ``answer`` may be missing in some or all records."""
    from etn_cli.datasets.mcqa import QuestionSet
    from etn_cli.datasets.mcqa_files import parse_record, read_records

    questions, answered = [], []
    for raw, where in read_records(path):
        known = isinstance(raw, dict) and any(raw.get(k) is not None for k in ANSWER_KEYS)
        parsed = parse_record(raw if known else {**raw, "answer": 0}, where)
        questions += parsed
        answered += [known] * len(parsed)
    if not questions:
        raise EtnError(f"{path} holds no questions. Expected one JSON object per line.")
    names = [q.id or f"{path.name}#{i}" for i, q in enumerate(questions)]
    index = np.arange(len(questions), dtype=np.int64)
    split = Split(path.name, "predict", QuestionSet(questions), index, len(questions[0].choices))
    return Inputs(split, names, "questions", labelled=all(answered))


def dataset_split(plan: Plan, text: str) -> Inputs:
    """``<dataset>:<split>`` or ``<dataset>`` (its test split) of a registered dataset."""
    from etn_cli.datasets import datasets

    name, _, split_name = text.partition(":")
    if name not in datasets:
        hint = did_you_mean(name, datasets.names(), n=3, cutoff=0.5)
        raise EtnError(
            f"Input {text!r} is no image folder, .jsonl file or dataset split (no file or "
            f"folder of that name): Unknown dataset {name!r}.{hint} Check the path, or see "
            "`etn ls datasets`."
        )
    source = open_source(plan.pipeline, name)
    split_name = split_name or "test"
    if not source.has_split(split_name):
        raise EtnError(
            f"Dataset {name!r} has no split {split_name!r}. "
            f"Available: {', '.join(source.available()) or 'none'}"
        )
    split = source.load_split(split_name)
    names = [f"{name}:{split_name}#{i}" for i in split.index]
    return Inputs(split, names, "split", labelled=True)


def backbone_outputs(
    backbone: Any, inputs: Inputs, plan: Plan
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], np.ndarray]:
    """``hidden`` (N, D), ``logits`` (N, C), extra arrays and labels (N,) in input order, as
    ``etn extract`` computes them batch by batch."""
    data, split = plan.pipeline.data, inputs.split
    assert data is not None
    pin = str(backbone.device).startswith("cuda")
    batches = backbone.loader(split, data.batch_size, workers=data.workers, pin_memory=pin)
    total = -(-len(split) // data.batch_size)
    parts = []
    for batch, labels, index in progress.bar(batches, f"predict {split.dataset}", total):
        hidden, logits, extras = backbone.extract_batch(batch)
        parts.append((index, hidden, logits, labels, extras))
    position = {int(v): i for i, v in enumerate(split.index)}
    found = torch.cat([p[0] for p in parts])  # (N,) source indices, in batch order
    order = torch.argsort(torch.tensor([position[int(v)] for v in found]))  # (N,)
    hidden, logits, labels = (torch.cat([p[k] for p in parts])[order] for k in (1, 2, 3))
    layers = {name: torch.cat([p[4][name] for p in parts])[order] for name in parts[0][4]}
    return hidden, logits, layers, labels.numpy()
