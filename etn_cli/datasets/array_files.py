"""CIFAR's python batches and SVHN's ``.mat`` files, read by etn itself.

torchvision's readers check every file's md5 against the one published for the full dataset
and so refuse anything else: a subset, a miniature for a rehearsal, a file rebuilt from the
same images. Here the published formats are read as they are documented, and the row count
comes from the files:

* CIFAR-10 / CIFAR-100 "python version" (https://www.cs.toronto.edu/~kriz/cifar.html): each
  batch is a pickled dict with ``data``, a (N, 3072) uint8 array of 1024 red, 1024 green and
  1024 blue values per row (row-major 32x32 planes), and ``labels`` (CIFAR-10) or
  ``fine_labels`` (CIFAR-100). Unpickled by :func:`~etn_cli.datasets.safe_pickle.load_arrays_only`,
  which rebuilds numpy arrays and nothing else.
* SVHN format 2 (http://ufldl.stanford.edu/housenumbers/): a MATLAB file with ``X`` of shape
  (32, 32, 3, N) uint8 and ``y`` of shape (N, 1), digit 0 labelled 10 (read as 0, as
  torchvision does).

Each yields the same PIL images and labels as torchvision's readers, row for row
(``tests/test_vision.py``). Arrays are read once per process and file version.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from etn_cli.errors import EtnError


class ArrayImages(Dataset):
    """``(PIL RGB image, label)`` from uint8 images (N, H, W, 3) and labels (N,)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[object, int]:
        from PIL import Image

        return Image.fromarray(self.images[i]), int(self.labels[i])


def read_cifar(paths: list[Path], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """The batches at ``paths``, concatenated: images (N, 32, 32, 3) uint8, labels (N,)."""
    parts = [_cifar_batch(str(p), label_key, *_stamp(p)) for p in paths]
    return np.concatenate([i for i, _ in parts]), np.concatenate([y for _, y in parts])


def read_svhn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An SVHN format-2 file: images (N, 32, 32, 3) uint8, labels (N,) with 10 read as 0."""
    return _svhn(str(path), *_stamp(path))


def svhn_rows(path: Path) -> int:
    """Rows of an SVHN file from its header, without reading the images."""
    from scipy.io import whosmat

    shapes = dict((name, shape) for name, shape, _ in _read(path, whosmat))
    if len(shapes.get("X", ())) != 4:
        raise _malformed(path, "SVHN format 2", f"variables {sorted(shapes)}")
    return int(shapes["X"][3])


def _stamp(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


@functools.cache
def _cifar_batch(path: str, label_key: str, size: int, mtime: int) -> tuple[np.ndarray, ...]:
    from etn_cli.datasets.safe_pickle import load_arrays_only

    def load(p: Path) -> object:
        with open(p, "rb") as handle:
            return load_arrays_only(handle, encoding="latin1")

    entry = _read(Path(path), load)
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise _malformed(Path(path), f"a CIFAR batch with data and {label_key}", keys)
    data, labels = np.asarray(entry["data"]), np.asarray(entry[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape != (len(labels), 3072):
        raise _malformed(Path(path), "data of shape (N, 3072) uint8", f"{data.shape} {data.dtype}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels  # (N, 32, 32, 3), (N,)


@functools.cache
def _svhn(path: str, size: int, mtime: int) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat

    mat = _read(Path(path), loadmat)
    x, y = mat.get("X"), mat.get("y")
    if x is None or y is None or x.ndim != 4 or x.shape[:3] != (32, 32, 3) or y.size != x.shape[3]:
        raise _malformed(Path(path), "X (32, 32, 3, N) and y (N, 1)", sorted(mat))
    labels = y.reshape(-1).astype(np.int64) % 10  # (N,): SVHN labels digit 0 as 10
    return np.ascontiguousarray(x.transpose(3, 0, 1, 2)), labels  # (N, 32, 32, 3)


def _read(path: Path, reader: Callable[[Path], Any]) -> Any:
    try:
        return reader(path)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, NotImplementedError) as err:
        raise _malformed(path, "the published format", f"{type(err).__name__}: {err}") from None


def _malformed(path: Path, expected: str, found: object) -> EtnError:
    return EtnError(
        f"Cannot read {path}: expected {expected}, found {found}. Delete the file and download "
        "the dataset again."
    )
