"""Your own images in Python: :class:`ImageFolder` and :func:`image_features`.

The Python twins of ``dataset = "image_folder"`` and ``etn extract`` for an image classifier
(docs/own-data.md)::

    adapt = etn_cli.ImageFolder("my_images/adapt", classes="my_images/classes.txt")
    hidden, logits, labels = etn_cli.image_features(model, adapt, transform)
    head = etn_cli.ETN().fit(hidden, logits, labels)

Folders follow torchvision's ``ImageFolder`` (one sub-folder per class, class order sorted or
from ``classes``); a folder without sub-folders is unlabelled (label -1), and a text file is an
OpenOOD image list (:mod:`etn_cli.datasets.image_folder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from etn_cli.api.evidential_model import ImageClassifierFeatures
from etn_cli.datasets.image_folder import Listing, list_file, list_folder
from etn_cli.datasets.imagenet import ImageFiles
from etn_cli.errors import EtnError


class ImageFolder(ImageFiles):
    """``(PIL RGB image, label)`` for every image of ``path``; ``classes`` names the labels
    (``None`` for an unlabelled folder), ``files`` the images relative to the folder."""

    def __init__(self, path: str | Path, classes: Sequence[str] | str | Path | None = None) -> None:
        path = Path(path).expanduser().resolve()
        names = class_list(classes)
        if path.is_dir():
            listing: Listing = list_folder(path, names)
        elif path.is_file():
            listing = list_file(path, path.parent, names, path.stat().st_mtime_ns)
        else:
            raise EtnError(f"No image folder or image list at {path}. Check the path.")
        super().__init__(listing.folder, list(listing.files), listing.labels)
        self.classes = listing.classes


def class_list(classes: Sequence[str] | str | Path | None) -> tuple[str, ...] | None:
    """Class names from a list, or from a text file with one name per line."""
    if classes is None or isinstance(classes, (list, tuple)):
        return None if classes is None else tuple(classes)
    lines = Path(classes).expanduser().read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip())


@torch.inference_mode()
def image_features(
    model: nn.Module,
    images: Any,
    transform: Any,
    *,
    batch_size: int = 64,
    classifier_layer: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(hidden (N, D), logits (N, C), labels (N,))`` of ``(image, label)`` pairs, read as
    ``etn extract`` reads them: the input of the final linear layer and the model's output."""
    reader = ImageClassifierFeatures(model.eval(), transform, classifier_layer, ())
    parts = []
    for start in range(0, len(images), batch_size):
        pairs = [images[i] for i in range(start, min(start + batch_size, len(images)))]
        hidden, logits, _ = reader([image for image, _ in pairs])
        parts.append((hidden.numpy(), logits.numpy(), np.array([y for _, y in pairs])))
    hidden, logits, labels = (np.concatenate([p[k] for p in parts]) for k in range(3))
    return hidden, logits, labels.astype(np.int64)
