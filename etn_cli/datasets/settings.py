"""The options of the datasets that take any (a pipeline's ``[data.options.<dataset>]``), as
frozen dataclasses that import no torch, and the refusal of options by those that take none.

They live here rather than beside each source so that a pipeline file's options tables are
checked (unknown keys, types, these ``__post_init__`` rules) in milliseconds, before any source
or torch is imported; which options each dataset takes is the table in :mod:`etn_cli.datasets`,
which ``tests/test_registries.py`` keeps in step with the sources.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from etn_cli.errors import EtnError

NO_OPTIONS = {  # module under etn_cli.datasets -> why its datasets take no options
    "digits": "Remove them from the pipeline file; the digits splits are fixed.",
    "mcqa": "Remove them; the prompt template is a [backbone] option.",
    "mcqa_jsonl": "Remove them; the prompt template and letters are [backbone] options.",
    "tiny_mcqa": "Remove them; the synthetic questions are fixed.",
}


def refuse_options(dataset: str, module: str, options: dict[str, Any]) -> None:
    """One line if ``options`` is not empty, for a dataset of ``module`` that takes none."""
    if options:
        raise EtnError(
            f"Dataset {dataset!r} takes no options, found {sorted(options)}. {NO_OPTIONS[module]}"
        )


@dataclass(frozen=True)
class TorchvisionOptions:
    """``download``: fetch missing files (only then does etn touch the network);
    ``seed``: the seed of the train / adapt permutation (CIFAR-10)."""

    download: bool = False
    seed: int = 0


@dataclass(frozen=True)
class FakeOptions:
    """``size`` images per split, ``image_size`` pixels square, labels in ``0..num_classes-1``
    drawn independently of the images, ``seed`` shifting every split's random stream."""

    size: int = 64
    image_size: int = 32
    num_classes: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.size, self.image_size, self.num_classes) < 1:
            raise EtnError(
                f"fake dataset options expect positive size, image_size and num_classes; found "
                f"{dataclasses.asdict(self)}. Fix them under [data.options.fake]."
            )


@dataclass(frozen=True)
class FolderOptions:
    """``folder``: where the class folders are, relative to ``[data] root`` (or absolute);
    ``seed``: the seed of the validation set's adapt / test permutation."""

    folder: str | None = None
    seed: int = 0


@dataclass(frozen=True)
class ImageFolderOptions:
    """``classes``: class names in label order, or a file under the root with one per line;
    ``images``: the folder (under the root) that the paths of image lists start from."""

    classes: tuple[str, ...] | str | None = None
    images: str | None = None


@dataclass(frozen=True)
class ImageListOptions:
    """``images``: the folder the listed paths are relative to (relative to ``[data] root``);
    ``lists``: split name -> list file (relative to ``[data] root``, or absolute), or a table
    ``{ list = "...", images = "..." }`` with the split's own images folder."""

    images: str = "."
    lists: dict = field(default_factory=dict)


def no_root(dataset: str) -> EtnError:
    """The refusal of a dataset of your own files in a pipeline without ``[data] root``."""
    return EtnError(
        f"Dataset {dataset!r} reads your files under [data] root, but the pipeline sets none. "
        'Add root = "folder/with/the/files" to its [data] table.'
    )
