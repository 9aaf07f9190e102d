"""The dataset interface: a registered source that yields labelled inputs for one split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset as TorchDataset

from etn_cli.registry import Registry


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

    def load_split(self, split: str) -> Split:
        raise NotImplementedError

    def split_fingerprint(self, split: str) -> dict[str, Any]:
        """The split's fingerprint without its data; override when loading is expensive."""
        return self.load_split(split).fingerprint


datasets: Registry[type[DatasetSource]] = Registry("dataset")
