"""The embedded offline default: scikit-learn's bundled 8x8 handwritten digits.

Digits 0-6 play the in-distribution role of CIFAR-10 (``digits``); the held-out digits 7-9 are
the semantic-shift OOD set (``digits_unseen``) and the ID test images under strong Gaussian
noise are the covariate-shift OOD set (``digits_noise``). Nothing is downloaded:
``load_digits`` reads a file shipped inside scikit-learn. ``Split.index`` is the row of each
sample in ``load_digits()``, so every extracted feature traces back to its image.

Fingerprints are computed from that file's sha256, the scikit-learn version (which fixes
``train_test_split``) and the selection settings, without importing scikit-learn: the import
alone takes about a second, which a rerun that only checks its caches should not pay.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.datasets.base import DatasetSource, Split, datasets
from etn_cli.datasets.settings import refuse_options
from etn_cli.errors import EtnError
from etn_cli.store.fingerprint import file_sha256

ID_CLASSES = (0, 1, 2, 3, 4, 5, 6)
UNSEEN_CLASSES = (7, 8, 9)
SPLIT_FRACTIONS = {"train": 0.60, "adapt": 0.15, "test": 0.25}
SPLIT_SEED = 0
NOISE_SIGMA = 0.5  # on [0, 1] pixels: accuracy drops clearly, yet stays well above chance
NOISE_SEED = 1
PIXEL_MAX = 16.0  # sklearn digits pixels are integers 0..16


@functools.lru_cache(maxsize=1)
def load_raw() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as ``(images (N, 1, 8, 8) float32 in [0, 1], labels (N,) int64)``."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    images = (raw.images / PIXEL_MAX).astype(np.float32)[:, None]  # (N, 1, 8, 8)
    labels = raw.target.astype(np.int64)  # (N,)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


@functools.lru_cache(maxsize=1)
def data_sha256() -> str:
    """The sha256 of the file ``load_digits`` reads, found without importing scikit-learn; if
    a scikit-learn release moves it, the sha256 of the loaded pixels and labels instead."""
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return file_sha256(path)
    images, labels = load_raw()
    digest = hashlib.sha256(np.ascontiguousarray(images).tobytes())
    digest.update(np.ascontiguousarray(labels).tobytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def id_split_rows() -> dict[str, np.ndarray]:
    """Rows of ``load_digits()`` in each ID split: stratified by class, seeded, sorted."""
    from sklearn.model_selection import train_test_split

    _, labels = load_raw()
    rows = np.flatnonzero(np.isin(labels, ID_CLASSES))
    rest, test = train_test_split(
        rows, test_size=SPLIT_FRACTIONS["test"], stratify=labels[rows], random_state=SPLIT_SEED
    )
    adapt_share = SPLIT_FRACTIONS["adapt"] / (1.0 - SPLIT_FRACTIONS["test"])
    train, adapt = train_test_split(
        rest, test_size=adapt_share, stratify=labels[rest], random_state=SPLIT_SEED
    )
    return {"train": np.sort(train), "adapt": np.sort(adapt), "test": np.sort(test)}


def base_fingerprint(name: str, split: str, classes: tuple[int, ...]) -> dict[str, Any]:
    """What every digits split has in common: the source file's digest, the scikit-learn
    version and the classes (the rows follow from these and the split's own settings)."""
    return {
        "dataset": name,
        "split": split,
        "source": "sklearn.datasets.load_digits",
        "scikit_learn": importlib.metadata.version("scikit-learn"),
        "data_sha256": data_sha256(),
        "classes": list(classes),
        "pixel_scale": f"x / {PIXEL_MAX:g}",
    }


def make_split(source: DigitsSource, split: str, rows: np.ndarray, images: np.ndarray) -> Split:
    """Wrap ``images`` (N, 1, 8, 8) of the given source ``rows`` as a :class:`Split`."""
    import torch
    from torch.utils.data import TensorDataset

    labels = torch.from_numpy(load_raw()[1][rows].copy())  # (N,)
    data = TensorDataset(torch.from_numpy(np.array(images, dtype=np.float32)), labels)
    index = rows.astype(np.int64)  # (N,)
    fp = source.split_fingerprint(split)
    return Split(source.name, split, data, index, source.num_classes, fp)


class DigitsSource(DatasetSource):
    """Shared checks for the three digits sources; subclasses implement :meth:`fingerprint`
    (cheap: no data is loaded) and :meth:`build`."""

    num_classes: int

    def __init__(self, root: str | None = None, **options: Any) -> None:
        refuse_options(self.name, "digits", options)
        super().__init__(root)

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise EtnError(
                f"Dataset {self.name!r} has no split {split!r}. "
                f"Available splits: {', '.join(self.splits)}. Use one of them."
            )

    def load_split(self, split: str) -> Split:
        self.check_split(split)
        return self.build(split)

    def split_fingerprint(self, split: str) -> dict[str, Any]:
        self.check_split(split)
        return self.fingerprint(split)

    def fingerprint(self, split: str) -> dict[str, Any]:
        raise NotImplementedError

    def build(self, split: str) -> Split:
        raise NotImplementedError


@datasets.register("digits")
class Digits(DigitsSource):
    """In-distribution digits 0-6: ``train`` for the backbone, ``adapt`` for heads, ``test``."""

    name = "digits"
    splits = ("train", "adapt", "test")
    num_classes = len(ID_CLASSES)

    def fingerprint(self, split: str) -> dict[str, Any]:
        fp = base_fingerprint(self.name, split, ID_CLASSES)
        return fp | {"split_fractions": SPLIT_FRACTIONS, "split_seed": SPLIT_SEED}

    def build(self, split: str) -> Split:
        rows = id_split_rows()[split]
        return make_split(self, split, rows, load_raw()[0][rows])


@datasets.register("digits_unseen")
class DigitsUnseen(DigitsSource):
    """Semantic-shift OOD: every image of the held-out digits 7-9, labelled with its digit."""

    name = "digits_unseen"
    splits = ("test",)
    num_classes = 10

    def fingerprint(self, split: str) -> dict[str, Any]:
        return base_fingerprint(self.name, split, UNSEEN_CLASSES)

    def build(self, split: str) -> Split:
        images, labels = load_raw()
        rows = np.flatnonzero(np.isin(labels, UNSEEN_CLASSES))
        return make_split(self, split, rows, images[rows])


@datasets.register("digits_noise")
class DigitsNoise(DigitsSource):
    """Covariate-shift OOD: the ``digits`` test images plus seeded Gaussian noise, clipped."""

    name = "digits_noise"
    shift = "covariate"  # the known digits 0-6, seen through noise
    splits = ("test",)
    num_classes = len(ID_CLASSES)

    def fingerprint(self, split: str) -> dict[str, Any]:
        fp = base_fingerprint(self.name, split, ID_CLASSES)
        return fp | {
            "split_fractions": SPLIT_FRACTIONS,
            "split_seed": SPLIT_SEED,
            "corruption": "gaussian_noise",
            "noise_sigma": NOISE_SIGMA,
            "noise_seed": NOISE_SEED,
        }

    def build(self, split: str) -> Split:
        rows = id_split_rows()["test"]
        clean = load_raw()[0][rows]  # (N, 1, 8, 8)
        noise = np.random.default_rng(NOISE_SEED).normal(0.0, NOISE_SIGMA, size=clean.shape)
        noisy = np.clip(clean + noise, 0.0, 1.0).astype(np.float32)  # (N, 1, 8, 8)
        return make_split(self, split, rows, noisy)
