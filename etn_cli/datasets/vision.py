"""Image datasets read from local files: CIFAR-10, CIFAR-100 and SVHN through torchvision, and
torchvision's ``FakeData`` for tests, demos and benchmarks.

Every split yields ``(PIL image, label)``; the backbone applies its own preprocessing. Files
are looked for under the pipeline's ``[data] root`` and downloaded only when the dataset's
options say ``download = true`` (``[data.options.cifar10] download = true``); a missing file is
a one-line :class:`EtnError` naming the path and how to get it, raised while planning, before
anything is written.

CIFAR-10's training set is split as in the paper (Supp. "Datasets"): 95% ``train`` (to train
the backbone with ``etn finetune``) and 5% ``adapt`` (to fit the heads), by a seeded
permutation of its 50,000 rows; the seed, fractions and a digest of the rows are in every
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
    """A dataset class of ``torchvision.datasets`` with fixed sizes and checksums per split."""

    Options = TorchvisionOptions
    sizes: ClassVar[dict[str, int]]  # rows of each source split torchvision reads
    num_classes: ClassVar[int]

    def torchvision_class(self) -> type:
        raise NotImplementedError

    def files(self, split: str) -> list[tuple[Path, str]]:
        """``(path, md5)`` of every file the split reads (md5 as torchvision checks it)."""
        raise NotImplementedError

    def source_split(self, split: str) -> str:
        return split

    def rows(self, split: str) -> np.ndarray:
        return np.arange(self.sizes[self.source_split(split)], dtype=np.int64)

    def check_files(self, split: str) -> None:
        if self.opts.download:
            return
        for path, _ in self.files(split):
            if not path.is_file():
                cls = self.torchvision_class()
                raise EtnError(
                    f"Expected {self.title} ({split}) at {path}, found no such file. Download "
                    f"and extract {cls.url} into {self.root_path()}, or set download = true "
                    f"under [data.options.{self.name}]."
                )

    def fingerprint(self, split: str) -> dict[str, Any]:
        rows = self.rows(split)
        fp = {
            "dataset": self.name,
            "split": split,
            "source": f"torchvision.datasets.{self.torchvision_class().__name__}",
            "source_split": self.source_split(split),
            "files_md5": [md5 for _, md5 in self.files(split)],
            "rows": len(rows),
            "rows_sha256": rows_sha256(rows),
        }
        return fp

    def open(self, split: str) -> tuple[Dataset, np.ndarray, int]:
        data = self.construct(self.source_split(split))
        expected = self.sizes[self.source_split(split)]
        if len(data) != expected:
            raise EtnError(
                f"Expected {expected} images in {self.title} ({split}) under "
                f"{self.root_path()}, found {len(data)}. Download the official files again."
            )
        rows = self.rows(split)
        subset = data if len(rows) == len(data) else Subset(data, rows.tolist())
        return subset, rows, self.num_classes

    def construct(self, source_split: str) -> Dataset:
        raise NotImplementedError

    def corrupted(self, err: Exception) -> EtnError:
        return EtnError(
            f"torchvision could not read {self.title} under {self.root_path()} ({err}). "
            f"Delete the files and download them again (or set download = true under "
            f"[data.options.{self.name}])."
        )


class CIFARSource(TorchvisionSource):
    """The two CIFAR datasets: python-pickle batches in ``<root>/<base_folder>/``."""

    sizes = {"train": 50000, "test": 10000}

    def files(self, split: str) -> list[tuple[Path, str]]:
        cls = self.torchvision_class()
        listed = cls.test_list if self.source_split(split) == "test" else cls.train_list
        folder = self.root_path() / cls.base_folder
        return [(folder / name, md5) for name, md5 in listed]

    def construct(self, source_split: str) -> Dataset:
        from etn_cli.datasets.safe_pickle import arrays_only_unpickling

        cls = self.torchvision_class()
        train = source_split == "train"
        try:
            with arrays_only_unpickling():  # the batches are pickles: rebuild arrays only
                return cls(str(self.root_path()), train=train, download=self.opts.download)
        except (RuntimeError, pickle.UnpicklingError) as err:
            raise self.corrupted(err) from None


@datasets.register("cifar10")
class CIFAR10(CIFARSource):
    """CIFAR-10: ``train`` (95% of the training set), ``adapt`` (5%), ``test`` (official)."""

    name = "cifar10"
    title = "CIFAR-10"
    splits = ("train", "adapt", "test")
    num_classes = 10

    def torchvision_class(self) -> type:
        from torchvision.datasets import CIFAR10 as Cls

        return Cls

    def source_split(self, split: str) -> str:
        return "test" if split == "test" else "train"

    def rows(self, split: str) -> np.ndarray:
        if split == "test":
            return super().rows(split)
        return seeded_partition(self.sizes["train"], CIFAR10_FRACTIONS, self.opts.seed)[split]

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

    def check_files(self, split: str) -> None:
        if not self.opts.download:
            path = self.files(split)[0][0]
            if not path.is_file():
                url = self.torchvision_class().split_list[split][0]
                raise EtnError(
                    f"Expected SVHN ({split}) at {path}, found no such file. Download {url} "
                    f"into {self.root_path()}, or set download = true under [data.options.svhn]."
                )

    def construct(self, source_split: str) -> Dataset:
        cls = self.torchvision_class()
        try:
            return cls(str(self.root_path()), split=source_split, download=self.opts.download)
        except RuntimeError as err:
            raise self.corrupted(err) from None


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
