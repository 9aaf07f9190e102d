"""One builder for the tiny pipelines the tests and benchmarks run.

``tiny_pipeline(name, ...)`` is the TOML of a pipeline on the digits default (the digits CNN
trained 2 epochs, ``digits`` against ``digits_unseen``, MAP) with what a test changes:
``backbone`` and ``data`` update those tables (a table naming another backbone or dataset
replaces it), other tables (``conformal``, ``finetune``) are added, and each of ``heads`` is a
head's name or a table of its settings. A dict in a table is a sub-table
(``[data.options.fake]``), in a head's settings an inline table (``sweep = { ... }``); a
setting given as None is left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DIGITS_BACKBONE = {"name": "digits_cnn", "epochs": 2}
DIGITS_DATA = {"id": "digits", "ood": ["digits_unseen"]}
BOTH_OOD = ["digits_unseen", "digits_noise"]


def tiny_pipeline(
    name: str = "tiny",
    *,
    seeds: tuple[int, ...] = (0,),
    backbone: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    heads: tuple[str | dict[str, Any], ...] = ("map",),
    **tables: dict[str, Any],
) -> str:
    lines = [f"name = {value(name)}", f"seeds = {value(list(seeds))}"]
    for table, default, given in (
        ("backbone", DIGITS_BACKBONE, backbone),
        ("data", DIGITS_DATA, data),
    ):
        own = given is not None and {"name", "id"} & given.keys()
        content = dict(given or {}) if own else {**default, **(given or {})}
        lines += table_lines(table, {k: v for k, v in content.items() if v is not None})
    for table, content in tables.items():
        lines += table_lines(table, content)
    for head in heads:
        settings = {"name": head} if isinstance(head, str) else head
        lines += ["[[heads]]", *(f"{k} = {value(v)}" for k, v in settings.items())]
    return "\n".join(lines) + "\n"


def resnet18(num_classes: int | None, **more: Any) -> dict[str, Any]:
    """torchvision's ResNet-18 with random weights as the backbone."""
    return {"name": "torchvision", "model": "resnet18", "weights": "none",
            "num_classes": num_classes, **more}  # fmt: skip


def fake_data(num_classes: int = 4, batch_size: int | None = 8, **options: Any) -> dict[str, Any]:
    """torchvision's FakeData as ID (``fake``) and OOD (``fake:ood``) data."""
    fake = {**options, "num_classes": num_classes}
    return {"id": "fake", "ood": ["fake:ood"], "batch_size": batch_size, "options": {"fake": fake}}


def causal_lm(model: object, **more: Any) -> dict[str, Any]:
    """A (tiny) causal language model from ``model``'s folder, in float32."""
    return {"name": "hf_causal_lm", "model": model, "dtype": "float32", **more}


def questions(**more: Any) -> dict[str, Any]:
    """Your own multiple-choice questions: ``questions/adapt.jsonl`` and ``test.jsonl``."""
    files = {"root": "questions", "adapt": "adapt.jsonl", "test": "test.jsonl"}
    return {"id": "mcqa_jsonl", **files, **more}


def image_folder(**more: Any) -> dict[str, Any]:
    """Your own images: ``images/adapt/<class>/`` and ``images/test/<class>/``."""
    return {"id": "image_folder", "root": "images", "adapt": "adapt", "test": "test", **more}


TINY_MCQA = {"id": "tiny_mcqa", "adapt": "validation", "ood": ["tiny_mcqa_ood"]}
SMALL_ETN = {
    "name": "etn",
    "depth": 3,
    "width": 32,
    "epochs": 2,
    "batch_size": 8,
    "prior_mode": 100,
}


def calibrated_pair(epochs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """ETN twice, the second with its temperature fitted."""
    etn = {"name": "etn", "epochs": epochs}
    return etn, etn | {"calibrate": "temperature"}


def write_pipeline(folder: Path, name: str = "tiny", **changes: Any) -> Path:
    """``tiny_pipeline(name, **changes)`` written to ``folder / f"{name}.toml"``."""
    path = Path(folder) / f"{name}.toml"
    path.write_text(tiny_pipeline(name, **changes))
    return path


def table_lines(table: str, content: dict[str, Any]) -> list[str]:
    """``[table]`` with its values, then each dict in it as a sub-table (``[data.options]``)."""
    lines = [f"[{table}]", *(f"{k} = {value(v)}" for k, v in content.items() if not is_table(v))]
    for key, sub in content.items():
        lines += table_lines(f"{table}.{key}", sub) if is_table(sub) else []
    return lines


def is_table(v: Any) -> bool:
    return isinstance(v, dict)


def value(v: Any) -> str:
    """A TOML value: strings and paths quoted, booleans lower case, lists and inline tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))
    return repr(v)
