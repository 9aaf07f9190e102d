"""The embedded offline default: scikit-learn's bundled 8x8 handwritten digits.

Digits 0-6 play the in-distribution role of CIFAR-10 (``digits``); the held-out digits 7-9 are
the semantic-shift OOD set (``digits_unseen``) and the ID test images under strong Gaussian
noise are the covariate-shift OOD set (``digits_noise``). Nothing is downloaded:
``load_digits`` reads a file shipped inside scikit-learn. ``Split.index`` is the row of each
sample in ``load_digits()``, so every extracted feature traces back to its image.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from etn_cli.datasets.base import DatasetSource, Split, datasets
from etn_cli.errors import EtnError

ID_CLASSES = (0, 1, 2, 3, 4, 5, 6)
UNSEEN_CLASSES = (7, 8, 9)
SPLIT_FRACTIONS = {"train": 0.60, "adapt": 0.15, "test": 0.25}
SPLIT_SEED = 0
NOISE_SIGMA = 0.5  # on [0, 1] pixels: accuracy drops clearly, yet stays well above chance
NOISE_SEED = 1
PIXEL_MAX = 16.0  # sklearn digits pixels are integers 0..16


@functools.lru_cache(maxsize=1)
def load_raw() -> tuple[np.ndarray, np.ndarray, str]:
    """All 1,797 digits as ``(images (N, 1, 8, 8) float32 in [0, 1], labels (N,) int64, sha256)``.

    The sha256 covers the raw pixels and labels, so a changed sklearn dataset changes every
    fingerprint built on it.
    """
    raw = load_digits()
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(raw.images, dtype=np.float64).tobytes())
    digest.update(np.ascontiguousarray(raw.target, dtype=np.int64).tobytes())
    images = (raw.images / PIXEL_MAX).astype(np.float32)[:, None]  # (N, 1, 8, 8)
    labels = raw.target.astype(np.int64)  # (N,)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels, digest.hexdigest()


@functools.lru_cache(maxsize=1)
def id_split_rows() -> dict[str, np.ndarray]:
    """Rows of ``load_digits()`` in each ID split: stratified by class, seeded, sorted."""
    _, labels, _ = load_raw()
    rows = np.flatnonzero(np.isin(labels, ID_CLASSES))
    rest, test = train_test_split(
        rows, test_size=SPLIT_FRACTIONS["test"], stratify=labels[rows], random_state=SPLIT_SEED
    )
    adapt_share = SPLIT_FRACTIONS["adapt"] / (1.0 - SPLIT_FRACTIONS["test"])
    train, adapt = train_test_split(
        rest, test_size=adapt_share, stratify=labels[rest], random_state=SPLIT_SEED
    )
    return {"train": np.sort(train), "adapt": np.sort(adapt), "test": np.sort(test)}


def rows_sha256(rows: np.ndarray) -> str:
    """A digest of the selected rows, so that a different selection never shares a cache key."""
    return hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()


def base_fingerprint(classes: tuple[int, ...], rows: np.ndarray) -> dict[str, Any]:
    """What every digits split has in common: the source, its digest and the selection."""
    return {
        "source": "sklearn.datasets.load_digits",
        "data_sha256": load_raw()[2],
        "classes": list(classes),
        "pixel_scale": f"x / {PIXEL_MAX:g}",
        "rows": len(rows),
        "rows_sha256": rows_sha256(rows),
    }


def make_split(
    name: str, split: str, rows: np.ndarray, images: np.ndarray, num_classes: int, fp: dict
) -> Split:
    """Wrap ``images`` (N, 1, 8, 8) of the given source ``rows`` as a :class:`Split`."""
    labels = torch.from_numpy(load_raw()[1][rows].copy())  # (N,)
    data = TensorDataset(torch.from_numpy(np.array(images, dtype=np.float32)), labels)
    index = rows.astype(np.int64)  # (N,)
    return Split(name, split, data, index, num_classes, {"dataset": name, "split": split, **fp})


class DigitsSource(DatasetSource):
    """Shared checks for the three digits sources; subclasses implement :meth:`build`."""

    def __init__(self, root: str | None = None, **options: Any) -> None:
        if options:
            raise EtnError(
                f"Dataset {self.name!r} takes no options, found {sorted(options)}. "
                "Remove them from the pipeline file; the digits splits are fixed."
            )
        super().__init__(root)

    def load_split(self, split: str) -> Split:
        if split not in self.splits:
            raise EtnError(
                f"Dataset {self.name!r} has no split {split!r}. "
                f"Available splits: {', '.join(self.splits)}. Use one of them."
            )
        return self.build(split)

    def build(self, split: str) -> Split:
        raise NotImplementedError


@datasets.register("digits")
class Digits(DigitsSource):
    """In-distribution digits 0-6: ``train`` for the backbone, ``adapt`` for heads, ``test``."""

    name = "digits"
    splits = ("train", "adapt", "test")

    def build(self, split: str) -> Split:
        rows = id_split_rows()[split]
        fp = base_fingerprint(ID_CLASSES, rows)
        fp.update(split_fractions=SPLIT_FRACTIONS, split_seed=SPLIT_SEED)
        return make_split(self.name, split, rows, load_raw()[0][rows], len(ID_CLASSES), fp)


@datasets.register("digits_unseen")
class DigitsUnseen(DigitsSource):
    """Semantic-shift OOD: every image of the held-out digits 7-9, labelled with its digit."""

    name = "digits_unseen"
    splits = ("test",)

    def build(self, split: str) -> Split:
        images, labels, _ = load_raw()
        rows = np.flatnonzero(np.isin(labels, UNSEEN_CLASSES))
        fp = base_fingerprint(UNSEEN_CLASSES, rows)
        return make_split(self.name, split, rows, images[rows], 10, fp)


@datasets.register("digits_noise")
class DigitsNoise(DigitsSource):
    """Covariate-shift OOD: the ``digits`` test images plus seeded Gaussian noise, clipped."""

    name = "digits_noise"
    splits = ("test",)

    def build(self, split: str) -> Split:
        rows = id_split_rows()["test"]
        clean = load_raw()[0][rows]  # (N, 1, 8, 8)
        noise = np.random.default_rng(NOISE_SEED).normal(0.0, NOISE_SIGMA, size=clean.shape)
        noisy = np.clip(clean + noise, 0.0, 1.0).astype(np.float32)  # (N, 1, 8, 8)
        fp = base_fingerprint(ID_CLASSES, rows)
        fp.update(
            split_fractions=SPLIT_FRACTIONS,
            split_seed=SPLIT_SEED,
            corruption="gaussian_noise",
            noise_sigma=NOISE_SIGMA,
            noise_seed=NOISE_SEED,
        )
        return make_split(self.name, split, rows, noisy, len(ID_CLASSES), fp)
