"""Image datasets read from local files: CIFAR-10, CIFAR-100 and SVHN in their published
formats (torchvision downloads them on request), and torchvision's ``FakeData`` for tests,
demos and benchmarks.

Every split yields ``(PIL image, label)``; the backbone applies its own preprocessing. Files
are looked for under the pipeline's ``[data] root`` and downloaded only when the dataset's
options say ``download = true`` (``[data.options.cifar10] download = true``); a missing file is
a one-line :class:`EtnError` naming the path and how to get it, raised while planning, before
anything is written.

CIFAR-10's training set is split as in the paper (Supp. "Datasets"): 95% ``train`` (to train
the backbone with ``etn finetune``) and 5% ``adapt`` (to fit the heads), by a seeded
permutation of its rows (50,000 in the release; the files are read by
:mod:`etn_cli.datasets.array_files`, so a subset or a miniature in the same format works
too); the seed, fractions and a digest of the rows are in every
split's fingerprint and hence in the shard manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset, Subset

from etn_cli.config import build_config
from etn_cli.datasets.array_files import ArrayImages, read_cifar, read_svhn, svhn_rows
from etn_cli.datasets.base import DatasetSource, Split, datasets
from etn_cli.datasets.settings import FakeOptions, TorchvisionOptions
from etn_cli.errors import EtnError, require_extra

CIFAR10_FRACTIONS = {"train": 0.95, "adapt": 0.05}


def seeded_partition(n: int, fractions: dict[str, float], seed: int) -> dict[str, np.ndarray]:
    """Split rows ``0..n-1`` into disjoint, sorted parts of the given fractions.

    A permutation drawn with ``numpy.random.default_rng(seed)`` is cut into consecutive pieces
    of ``round(fraction * n)`` rows; the last part takes the remainder, so the parts cover every
    row exactly once.
    """
    order = np.random.default_rng(seed).permutation(n)  # (n,)
    parts, start = {}, 0
    names = list(fractions)
    for i, name in enumerate(names):
        stop = n if i == len(names) - 1 else start + round(fractions[name] * n)
        parts[name] = np.sort(order[start:stop]).astype(np.int64)
        start = stop
    return parts


def rows_sha256(rows: np.ndarray) -> str:
    """A digest of the selected rows, so that another selection never shares a cache key."""
    return hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()


class VisionSource(DatasetSource):
    """Shared checks: options through a frozen ``Options`` dataclass, known split names."""

    Options: ClassVar[type]
    title: ClassVar[str]
    needs_torchvision: ClassVar[bool] = True  # its files are read by torchvision.datasets

    def __init__(self, root: str | None = None, **options: Any) -> None:
        if self.needs_torchvision:
            require_extra(("torchvision",), "vision", f"Dataset {self.name!r}")
        super().__init__(root)
        where = f"[data.options.{self.name}]"
        self.opts = build_config(self.Options, options, where)

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise EtnError(
                f"Dataset {self.name!r} has no split {split!r}. "
                f"Available splits: {', '.join(self.splits)}. Use one of them."
            )

    def root_path(self) -> Path:
        if self.root is None:
            raise EtnError(
                f"Dataset {self.name!r} reads {self.title} from files, but the pipeline sets no "
                '[data] root. Add root = "/path/to/datasets" to its [data] table.'
            )
        return Path(self.root).expanduser().resolve()

    def split_fingerprint(self, split: str) -> dict[str, Any]:
        self.check_split(split)
        self.check_files(split)
        return self.fingerprint(split)

    def load_split(self, split: str) -> Split:
        self.check_split(split)
        self.check_files(split)
        data, rows, num_classes = self.open(split)
        return Split(self.name, split, data, rows, num_classes, self.fingerprint(split))

    def check_files(self, split: str) -> None:
        """Raise a one-line EtnError when the files ``split`` needs are absent."""

    def fingerprint(self, split: str) -> dict[str, Any]:
        raise NotImplementedError

    def open(self, split: str) -> tuple[Dataset, np.ndarray, int]:
        """``(data, index (N,), num_classes)``: ``data[i]`` is ``(PIL image, label)``."""
        raise NotImplementedError


class TorchvisionSource(VisionSource):
    """A dataset torchvision can download, read from its published files by
    :mod:`etn_cli.datasets.array_files`: the row count is the files', and a file's md5 (the one
    torchvision checks for the official release) is in the fingerprint."""

    Options = TorchvisionOptions
    sizes: ClassVar[dict[str, int]]  # rows of each official source split (before download)
    num_classes: ClassVar[int]

    def torchvision_class(self) -> type:
        raise NotImplementedError

    def files(self, split: str) -> list[tuple[Path, str]]:
        """``(path, md5)`` of every file the split reads (md5 as published for the release)."""
        raise NotImplementedError

    def source_split(self, split: str) -> str:
        return split

    def fetched(self, split: str) -> bool:
        """Whether every file of ``split`` is here (else ``download = true`` fetches them)."""
        return all(path.is_file() for path, _ in self.files(split))

    def source_rows(self, split: str) -> int:
        """Rows of the source split: the files', or the official count before a download."""
        if not self.fetched(split):
            return self.sizes[self.source_split(split)]
        return len(self.read(self.source_split(split))[1])

    def rows(self, split: str) -> np.ndarray:
        return np.arange(self.source_rows(split), dtype=np.int64)

    def check_files(self, split: str) -> None:
        if self.opts.download:
            return
        for path, _ in self.files(split):
            if not path.is_file():
                raise EtnError(
                    f"Expected {self.title} ({split}) at {path}, found no such file. "
                    f"{self.get_advice(split)}"
                )

    def get_advice(self, split: str) -> str:
        cls = self.torchvision_class()
        return (
            f"Download and extract {cls.url} into {self.root_path()}, or set download = true "
            f"under [data.options.{self.name}]."
        )

    def fingerprint(self, split: str) -> dict[str, Any]:
        from etn_cli.store.content import published_md5

        here = self.fetched(split)
        rows = self.rows(split)
        return {
            "dataset": self.name,
            "split": split,
            "source": f"torchvision.datasets.{self.torchvision_class().__name__}",
            "source_split": self.source_split(split),
            "files_md5": [published_md5(p) if here else md5 for p, md5 in self.files(split)],
            "rows": len(rows),
            "rows_sha256": rows_sha256(rows),
        }

    def open(self, split: str) -> tuple[Dataset, np.ndarray, int]:
        source = self.source_split(split)
        if self.opts.download and not self.fetched(split):
            self.download(source)
        images, labels = self.read(source)
        rows = self.rows(split)
        data = ArrayImages(images, labels)
        subset = data if len(rows) == len(data) else Subset(data, rows.tolist())
        return subset, rows, self.num_classes

    def read(self, source_split: str) -> tuple[np.ndarray, np.ndarray]:
        """Images (N, 32, 32, 3) uint8 and labels (N,) of a source split."""
        raise NotImplementedError

    def download(self, source_split: str) -> None:
        """torchvision's download (it checks the published md5 of what it fetched)."""
        raise NotImplementedError


class CIFARSource(TorchvisionSource):
    """The two CIFAR datasets: python-pickle batches in ``<root>/<base_folder>/``."""

    sizes = {"train": 50000, "test": 10000}
    label_key: ClassVar[str]

    def files(self, split: str) -> list[tuple[Path, str]]:
        cls = self.torchvision_class()
        listed = cls.test_list if self.source_split(split) == "test" else cls.train_list
        folder = self.root_path() / cls.base_folder
        return [(folder / name, md5) for name, md5 in listed]

    def read(self, source_split: str) -> tuple[np.ndarray, np.ndarray]:
        return read_cifar([path for path, _ in self.files(source_split)], self.label_key)

    def download(self, source_split: str) -> None:
        from etn_cli.datasets.safe_pickle import arrays_only_unpickling

        cls = self.torchvision_class()
        try:
            with arrays_only_unpickling():  # the batches are pickles: rebuild arrays only
                cls(str(self.root_path()), train=source_split != "test", download=True)
        except (RuntimeError, pickle.UnpicklingError) as err:
            raise self.corrupted(err) from None

    def corrupted(self, err: Exception) -> EtnError:
        return EtnError(
            f"torchvision could not fetch {self.title} into {self.root_path()} ({err}). "
            f"Delete the files and download them again."
        )


@datasets.register("cifar10")
class CIFAR10(CIFARSource):
    """CIFAR-10: ``train`` (95% of the training set), ``adapt`` (5%), ``test`` (official)."""

    name = "cifar10"
    title = "CIFAR-10"
    splits = ("train", "adapt", "test")
    num_classes = 10
    label_key = "labels"

    def torchvision_class(self) -> type:
        from torchvision.datasets import CIFAR10 as Cls

        return Cls

    def source_split(self, split: str) -> str:
        return "test" if split == "test" else "train"

    def rows(self, split: str) -> np.ndarray:
        if split == "test":
            return super().rows(split)
        n = self.source_rows(split)
        return seeded_partition(n, CIFAR10_FRACTIONS, self.opts.seed)[split]

    def fingerprint(self, split: str) -> dict[str, Any]:
        fp = super().fingerprint(split)
        if split != "test":
            fp.update(split_fractions=CIFAR10_FRACTIONS, split_seed=self.opts.seed)
        return fp


@datasets.register("cifar100")
class CIFAR100(CIFARSource):
    """CIFAR-100 (an OOD set for CIFAR-10): ``train`` and ``test`` as published."""

    name = "cifar100"
    title = "CIFAR-100"
    splits = ("train", "test")
    num_classes = 100
    label_key = "fine_labels"

    def torchvision_class(self) -> type:
        from torchvision.datasets import CIFAR100 as Cls

        return Cls


@datasets.register("svhn")
class SVHN(TorchvisionSource):
    """SVHN (an OOD set for CIFAR-10): ``train``, ``test`` and ``extra``; digit 0 is label 0."""

    name = "svhn"
    title = "SVHN"
    splits = ("train", "test", "extra")
    sizes = {"train": 73257, "test": 26032, "extra": 531131}
    num_classes = 10

    def torchvision_class(self) -> type:
        from torchvision.datasets import SVHN as Cls

        return Cls

    def files(self, split: str) -> list[tuple[Path, str]]:
        _, filename, md5 = self.torchvision_class().split_list[split]
        return [(self.root_path() / filename, md5)]

    def get_advice(self, split: str) -> str:
        url = self.torchvision_class().split_list[split][0]
        return (
            f"Download {url} into {self.root_path()}, or set download = true under "
            "[data.options.svhn]."
        )

    def source_rows(self, split: str) -> int:
        if not self.fetched(split):
            return self.sizes[split]
        return svhn_rows(self.files(split)[0][0])  # the header only: planning stays quick

    def read(self, source_split: str) -> tuple[np.ndarray, np.ndarray]:
        return read_svhn(self.files(source_split)[0][0])

    def download(self, source_split: str) -> None:
        cls = self.torchvision_class()
        try:
            cls(str(self.root_path()), split=source_split, download=True)
        except RuntimeError as err:
            raise EtnError(
                f"torchvision could not fetch SVHN into {self.root_path()} ({err}). Delete the "
                "file and download it again."
            ) from None


@datasets.register("fake")
class Fake(VisionSource):
    """Random RGB images from ``torchvision.datasets.FakeData``: ``train``, ``adapt``, ``test``
    and ``ood`` splits of ``size`` images each, drawn from disjoint seeds, no files needed."""

    name = "fake"
    title = "fake images"
    splits = ("train", "adapt", "test", "ood")
    Options = FakeOptions

    def offset(self, split: str) -> int:
        """FakeData seeds image ``i`` with ``i + random_offset``: disjoint blocks per split."""
        return (self.opts.seed * len(self.splits) + self.splits.index(split)) * self.opts.size

    def fingerprint(self, split: str) -> dict[str, Any]:
        return {
            "dataset": self.name,
            "split": split,
            "source": "torchvision.datasets.FakeData",
            **dataclasses.asdict(self.opts),
            "random_offset": self.offset(split),
        }

    def open(self, split: str) -> tuple[Dataset, np.ndarray, int]:
        from torchvision.datasets import FakeData

        o = self.opts
        size = (3, o.image_size, o.image_size)
        data = FakeData(o.size, size, o.num_classes, random_offset=self.offset(split))
        return data, np.arange(o.size, dtype=np.int64), o.num_classes
