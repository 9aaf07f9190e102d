"""ImageNet validation, ImageNet-A, ImageNet-R and ImageNet-Sketch from folders of images.

Each dataset is a folder with one sub-folder per WordNet id (``n01440764/``, ...), the layout
of the published ImageNet-A, -R and -Sketch archives and of the ILSVRC2012 validation images
once sorted into class folders. Labels are indices in the 1,000-class ImageNet space: index
``i`` is the ``i``-th id of ``imagenet_wnids.txt`` (the ILSVRC2012 ids in sorted order, the
order of torchvision's ImageNet weights; the list was taken from timm's
``imagenet_synsets.txt`` and checked against the category names of torchvision's ResNet50
weights). ImageNet-A and -R cover 200 of those classes and keep their 1,000-class indices, so
the backbone's logits and the labels share one space.

The validation set is split as in the paper (Supp. "Datasets", after Minderer et al. 2021):
20% ``adapt``, 80% ``test``, by a seeded permutation of the sorted file list. ``Split.index``
is a file's position in that sorted list. The fingerprint holds the file names and sizes (not
the pixels, which would take minutes to hash on every run).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset

from etn_cli.datasets.base import datasets
from etn_cli.datasets.settings import FolderOptions
from etn_cli.datasets.vision import VisionSource, rows_sha256, seeded_partition
from etn_cli.errors import EtnError

WNIDS_FILE = Path(__file__).with_name("imagenet_wnids.txt")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
VAL_FRACTIONS = {"adapt": 0.2, "test": 0.8}


@functools.cache
def imagenet_wnids() -> tuple[str, ...]:
    """The 1,000 ImageNet-1k WordNet ids; position = class index."""
    lines = WNIDS_FILE.read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@functools.cache
def wnid_index() -> dict[str, int]:
    return {wnid: i for i, wnid in enumerate(imagenet_wnids())}


@dataclass(frozen=True)
class FolderListing:
    """Every image under a class-folder tree, sorted by relative path."""

    folder: Path
    files: tuple[str, ...]  # relative paths "n01440764/x.JPEG"
    labels: np.ndarray  # (N,) int64 ImageNet indices
    sha256: str  # of the relative paths and byte sizes


@functools.cache
def list_images(folder: Path) -> FolderListing:
    """Scan ``folder``: class sub-folders named by WordNet id, images inside (any depth).

    Unknown folder names raise; loose files at the top (a README) are ignored.
    """
    index = wnid_index()
    classes = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    unknown = [name for name in classes if name not in index]
    if unknown:
        raise EtnError(
            f"Folder {folder} has sub-folders that are not ImageNet WordNet ids: "
            f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}. Expected only "
            "folders such as n01440764/; move the others out, or read folders named by your "
            'own classes with id = "image_folder".'
        )
    files, labels, digest = [], [], hashlib.sha256()
    for name in classes:
        for path in sorted(folder.joinpath(name).rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                relative = path.relative_to(folder).as_posix()
                files.append(relative)
                labels.append(index[name])
                digest.update(f"{relative}\t{path.stat().st_size}\n".encode())
    if not files:
        raise EtnError(
            f"Folder {folder} holds no images in WordNet-id sub-folders. Expected files such as "
            f"{folder}/n01440764/image.JPEG; check the path and the extraction."
        )
    labels_array = np.asarray(labels, dtype=np.int64)  # (N,)
    return FolderListing(folder, tuple(files), labels_array, digest.hexdigest())


class ImageFiles(Dataset):
    """``(PIL RGB image, label)`` for a list of image files, read lazily (fine in workers)."""

    def __init__(self, folder: Path, files: list[str], labels: np.ndarray) -> None:
        self.folder, self.files, self.labels = folder, files, labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return read_image(self.folder / self.files[i]), int(self.labels[i])

    def check_headers(self, rows: Iterable[int] | None = None) -> set[tuple[int, int]]:
        """Decode every image (``rows``: those only), so that a file that is no image, or a
        damaged one, stops a run before any split is written; the first unreadable one raises
        :func:`unreadable_image`. Returns the (width, height) sizes found."""
        chosen = range(len(self.files)) if rows is None else rows
        paths = [self.folder / self.files[i] for i in chosen]
        sizes = set()
        with ThreadPoolExecutor(max_workers=HEADER_THREADS) as pool:  # PIL decodes off the GIL
            for path, found in zip(paths, pool.map(header_error, paths), strict=True):
                if isinstance(found, BaseException):
                    raise unreadable_image(path, found)
                sizes.add(found)
        return sizes


HEADER_THREADS = 8


def image_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises on a file that is no image it can read: not an image, a damaged one
    (``SyntaxError``, ``ValueError``, ``EOFError`` from some decoders), or one whose header
    claims more pixels than PIL agrees to decode (a decompression bomb)."""
    from PIL import Image, UnidentifiedImageError

    return (
        UnidentifiedImageError,
        Image.DecompressionBombError,
        OSError,
        SyntaxError,
        ValueError,
        EOFError,
        SystemError,
    )


def read_image(path: Path) -> Any:
    """The image at ``path`` in RGB, or one line saying why it cannot be read."""
    from PIL import Image

    try:
        with open(path, "rb") as handle:
            return Image.open(handle).convert("RGB")
    except image_errors() as err:
        raise unreadable_image(path, err) from None


def header_error(path: Path) -> BaseException | tuple[int, int]:
    """The image's (width, height) when PIL decodes ``path`` whole; else the error. Decoding
    (not only the header) is what finds a damaged file before the first split is written; it
    costs little next to the backbone's forward pass, and only splits still to extract are
    checked."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            return image.size
    except image_errors() as err:
        return err


def unreadable_image(path: Path, err: BaseException) -> EtnError:
    """One line naming ``path`` once, with the error's type and its reason (PIL's messages
    repeat the path; the reason is given without it)."""
    from PIL import UnidentifiedImageError
    from PIL.Image import DecompressionBombError

    if isinstance(err, UnidentifiedImageError):
        reason = "not an image format PIL recognises"
    elif isinstance(err, DecompressionBombError):
        reason = "its header claims more pixels than PIL decodes (a decompression bomb)"
    elif isinstance(err, OSError) and err.strerror:
        reason = err.strerror
    else:
        reason = str(err).splitlines()[0] if str(err).strip() else "no details"
        for shown in (repr(str(path)), str(path), path.name):
            reason = reason.replace(shown, "the file")
        if len(reason) > 100:
            reason = reason[:100].rsplit(" ", 1)[0] + " ..."
    return EtnError(
        f"Cannot read image {path} ({type(err).__name__}: {reason}); expected a readable "
        "image file. Remove or replace it, then run again."
    )


class ImageFolderSource(VisionSource):
    """A class-folder tree in the ImageNet label space; one split per fraction (or ``test``)."""

    Options = FolderOptions
    needs_torchvision = False  # PIL reads the files
    default_folder: ClassVar[str]
    how_to_get: ClassVar[str]
    fractions: ClassVar[dict[str, float] | None] = None

    def folder(self) -> Path:
        chosen = Path(self.opts.folder or self.default_folder).expanduser()
        return chosen if chosen.is_absolute() else self.root_path() / chosen

    def check_files(self, split: str) -> None:
        folder = self.folder()
        if not folder.is_dir():
            raise EtnError(
                f"Expected {self.title} under {folder} (one sub-folder per WordNet id, e.g. "
                f"n01440764/), found no such folder. {self.how_to_get} Or set folder = "
                f'"..." under [data.options.{self.name}].'
            )

    def rows(self, split: str) -> np.ndarray:
        n = len(list_images(self.folder()).files)
        if self.fractions is None:
            return np.arange(n, dtype=np.int64)
        return seeded_partition(n, self.fractions, self.opts.seed)[split]

    def fingerprint(self, split: str) -> dict[str, Any]:
        listing = list_images(self.folder())
        rows = self.rows(split)
        fp = {
            "dataset": self.name,
            "split": split,
            "source": "image folders named by WordNet id",
            "files": len(listing.files),
            "files_sha256": listing.sha256,
            "label_space": "imagenet-1k",
            "wnids_sha256": hashlib.sha256("\n".join(imagenet_wnids()).encode()).hexdigest(),
            "rows": len(rows),
            "rows_sha256": rows_sha256(rows),
        }
        if self.fractions is not None:
            fp.update(split_fractions=self.fractions, split_seed=self.opts.seed)
        return fp

    def open(self, split: str) -> tuple[Dataset, np.ndarray, int]:
        listing = list_images(self.folder())
        rows = self.rows(split)
        files = [listing.files[r] for r in rows]
        return ImageFiles(listing.folder, files, listing.labels[rows]), rows, 1000


@datasets.register("imagenet")
class ImageNetVal(ImageFolderSource):
    """ILSVRC2012 validation images: 20% ``adapt``, 80% ``test`` (seeded)."""

    name = "imagenet"
    title = "the ImageNet validation images"
    splits = ("adapt", "test")
    default_folder = "imagenet/val"
    fractions = VAL_FRACTIONS
    how_to_get = (
        "Extract ILSVRC2012_img_val.tar there and sort the images into WordNet-id folders "
        "(e.g. with the widely used valprep.sh script)."
    )


@datasets.register("imagenet_a")
class ImageNetA(ImageFolderSource):
    """ImageNet-A (Hendrycks et al. 2021): 7,500 natural adversarial images of 200 classes."""

    name = "imagenet_a"
    shift = "covariate"  # ImageNet's own classes (OpenOOD v1.5: covariate-shifted ID)
    title = "ImageNet-A"
    splits = ("test",)
    default_folder = "imagenet-a"
    how_to_get = "Extract imagenet-a.tar (hendrycks/natural-adv-examples) into [data] root."


@datasets.register("imagenet_r")
class ImageNetR(ImageFolderSource):
    """ImageNet-R (Hendrycks et al. 2021): 30,000 renditions of 200 classes."""

    name = "imagenet_r"
    shift = "covariate"  # ImageNet's own classes (OpenOOD v1.5: covariate-shifted ID)
    title = "ImageNet-R"
    splits = ("test",)
    default_folder = "imagenet-r"
    how_to_get = "Extract imagenet-r.tar (hendrycks/imagenet-r) into [data] root."


@datasets.register("imagenet_sketch")
class ImageNetSketch(ImageFolderSource):
    """ImageNet-Sketch (Wang et al. 2019): about 50,000 sketches of the 1,000 classes."""

    name = "imagenet_sketch"
    shift = "covariate"  # ImageNet's own classes (OpenOOD v1.5: covariate-shifted ID)
    title = "ImageNet-Sketch"
    splits = ("test",)
    default_folder = "imagenet-sketch/sketch"
    how_to_get = (
        "Unzip ImageNet-Sketch.zip (HaohanWang/ImageNet-Sketch) into [data] root/imagenet-sketch."
    )
