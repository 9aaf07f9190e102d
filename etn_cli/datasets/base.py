"""The dataset interface: a registered source that yields labelled inputs for one split."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from etn_cli.datasets import datasets as datasets  # the registry, for the modules that register
from etn_cli.datasets.settings import no_root

if TYPE_CHECKING:
    from torch.utils.data import Dataset as TorchDataset


@dataclass
class Split:
    """One split of one dataset, ready for a backbone.

    ``data[i]`` returns ``(input, label)``; ``index[i]`` is that sample's position in its source
    split (stored in every shard so rows can be traced back). ``fingerprint`` holds everything
    about the split that changes extracted features (source files, selection, seed,
    corruption) and goes into the shard manifest.
    """

    dataset: str
    split: str
    data: TorchDataset
    index: np.ndarray  # (N,) int64
    num_classes: int
    fingerprint: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index)


def subsample(split: Split, rows: int, seed: int) -> Split:
    """The split restricted to ``rows`` rows drawn without replacement by ``seed``, kept in
    their original order (all of it when it has no more rows); ``index`` still names each
    sample's position in its source split."""
    if rows >= len(split):
        return split
    chosen = np.sort(np.random.default_rng(seed).choice(len(split), rows, replace=False))
    fingerprint = split.fingerprint | {"rows": rows, "row_seed": seed}
    return Split(
        split.dataset, split.split, _rows_of(split.data, chosen), split.index[chosen],
        split.num_classes, fingerprint,
    )  # fmt: skip


def select_rows(split: Split, positions: np.ndarray) -> Split:
    """The split restricted to the rows at ``positions`` (sorted), ``index`` still naming each
    sample's position in its source split."""
    positions = np.sort(np.asarray(positions, dtype=np.int64))
    return Split(
        split.dataset, split.split, _rows_of(split.data, positions),
        split.index[positions], split.num_classes, split.fingerprint,
    )  # fmt: skip


def _rows_of(data: Any, positions: np.ndarray) -> Any:
    """The rows of ``data`` at ``positions``: its own ``select`` where it has one (questions
    stay questions, which the language model's prompts need), else a torch ``Subset``."""
    select = getattr(data, "select", None)
    if select is not None:
        return select(positions.tolist())
    from torch.utils.data import Subset

    return Subset(data, positions.tolist())


def held_out(n: int, fraction: float, seed: int) -> np.ndarray:
    """Which of ``n`` rows form the calibration part (N,): ``round(fraction n)`` of them (at
    least one, never all), drawn without replacement by ``seed``."""
    count = min(max(round(fraction * n), 1), n - 1)
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n)[:count]] = True
    return mask


def check_inputs(split: Split) -> set[tuple[int, int]] | None:
    """Check every input of ``split`` before anything is extracted: a dataset of image files
    decodes every image (``check_headers``; a file that is no image raises one line naming
    it) and returns their (width, height) sizes. Inputs held in memory or checked when listed
    (questions, arrays) need nothing more (None)."""
    from torch.utils.data import Subset

    data, rows = split.data, None
    while isinstance(data, Subset):  # a seeded sample (fit_rows) or a fixed selection
        chosen = list(data.indices)
        rows = chosen if rows is None else [chosen[r] for r in rows]
        data = data.dataset
    check = getattr(data, "check_headers", None)
    return None if check is None else check(rows)


class DatasetSource:
    """A registered dataset. Subclasses set ``splits`` and implement :meth:`load_split`."""

    name: ClassVar[str]
    splits: ClassVar[tuple[str, ...]]
    # As an OOD set: "semantic" (classes the model does not know) or "covariate" (the model's
    # own classes, seen differently), the grouping of OpenOOD v1.5 (``[data] grouping``).
    shift: ClassVar[str] = "semantic"

    def __init__(self, root: str | None = None, **options: Any) -> None:
        self.root = root
        self.options = options

    def data_path(self, split: str) -> Path | None:
        """The file or folder a split of your own reads (an image list, a folder, a JSONL
        file), resolved; None for datasets whose splits are not files of yours."""
        return None

    def has_split(self, split: str) -> bool:
        """Whether ``split`` names a split (datasets whose splits are paths override it)."""
        return split in self.splits

    def display_name(self, split: str | None) -> str:
        """How reports name the dataset (``split=None``: as the ID set) or one of its splits
        as an OOD set: ``svhn`` for its test split, ``digits_noise:adapt`` for another."""
        return self.name if split in (None, "test") else f"{self.name}:{split}"

    def available(self) -> tuple[str, ...]:
        """The split names to suggest when a name is wrong."""
        return tuple(self.splits)

    def load_split(self, split: str) -> Split:
        raise NotImplementedError

    def split_fingerprint(self, split: str) -> dict[str, Any]:
        """The split's fingerprint without its data; override when loading is expensive."""
        return self.load_split(split).fingerprint


class PathSplits:
    """For datasets of your own files, whose splits are paths under ``[data] root``
    (``image_folder``, ``mcqa_jsonl``): reports name them by the root folder (as the ID set)
    and by each split's path without its suffix (``ood``, ``other``)."""

    name: ClassVar[str]
    root: str | None

    def root_path(self) -> Path:
        if self.root is None:
            raise no_root(self.name)
        return Path(self.root).expanduser().resolve()

    def data_path(self, split: str) -> Path | None:
        return self.inside_root(split)

    def inside_root(self, split: str) -> Path | None:
        """The split's path if it names something that exists inside the root."""
        root = self.root_path()
        target = (root / split).resolve()
        return target if split and target.is_relative_to(root) and target.exists() else None

    def display_name(self, split: str | None) -> str:
        if split is None:
            return self.root_path().name
        return Path(split).with_suffix("").as_posix()
