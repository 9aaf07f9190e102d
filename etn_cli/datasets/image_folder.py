"""``image_folder``: your own images, in torchvision's ``ImageFolder`` layout or OpenOOD's lists.

A split is named by its path under ``[data] root``::

    [data]
    id = "image_folder"
    root = "images"                       # relative to the pipeline file
    adapt = "adapt"                       # images/adapt/<class>/*.png
    test = "test"                         # images/test/<class>/*.png
    ood = ["image_folder:ood"]            # images/ood/*.png: no class folders, unlabelled

* **A folder with sub-folders** is labelled: one sub-folder per class, any names, images at any
  depth below it (torchvision's ``ImageFolder``). The class order is the ``classes`` option (a
  list, or a text file under the root with one name per line) or else the sorted sub-folder
  names, as torchvision sorts them. With ``classes`` given, a split may lack some classes, and
  a folder none of whose sub-folders is a class (an OOD set with classes of its own) is read
  unlabelled; a folder mixing classes and other names is an error naming them.
* **A folder without sub-folders** is unlabelled (label -1): an OOD set.
* **A text file** is an image list in OpenOOD's format (``relative/path label`` per line,
  :mod:`etn_cli.datasets.openood_lists`), paths relative to the ``images`` option (default:
  the root), so OpenOOD's benchmark lists load as they are.

Hidden entries (``.name``) are skipped; files count as images by their suffix. The split's
fingerprint holds every file name and size (not the pixels), the labels and the class names,
so renaming a class folder or adding an image re-extracts. The class count is checked against
the backbone before anything is extracted (:mod:`etn_cli.datasets.class_check`).
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from etn_cli.datasets.base import PathSplits, datasets
from etn_cli.datasets.imagenet import IMAGE_SUFFIXES, ImageFiles
from etn_cli.datasets.openood_lists import UNLABELLED, read_image_list
from etn_cli.datasets.vision import VisionSource, rows_sha256
from etn_cli.errors import EtnError

LIST_SUFFIXES = (".txt", ".lst", ".list")


@dataclass(frozen=True)
class ImageFolderOptions:
    """``classes``: class names in label order, or a file under the root with one per line;
    ``images``: the folder (under the root) that the paths of image lists start from."""

    classes: tuple[str, ...] | str | None = None
    images: str | None = None


@dataclass(frozen=True)
class Listing:
    """The images of one split, sorted, with labels (-1 where unlabelled)."""

    folder: Path
    files: tuple[str, ...]
    labels: np.ndarray  # (N,) int64
    classes: tuple[str, ...] | None  # names of the labels, None for an unlabelled split
    kind: str  # "image folder" or "image list"
    sha256: str


def is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def images_below(folder: Path) -> list[Path]:
    """Image files under ``folder`` at any depth, sorted, hidden folders skipped."""
    found = []
    for top, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(top) / f for f in files if is_image(Path(f))]
    return sorted(found)


def subfolders(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def folder_classes(folder: Path, classes: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The class list that labels ``folder``'s sub-folders, or None when it is unlabelled."""
    names = subfolders(folder)
    if not names:
        return None
    if classes is None:
        return tuple(names)
    unknown = [name for name in names if name not in classes]
    if len(unknown) == len(names):
        return None  # none of its folders is a class: an OOD set with classes of its own
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise EtnError(
            f"Folder {folder} has sub-folders that are not among the {len(classes)} classes: "
            f"{shown}. Expected only class folders; add them to classes or move them out."
        )
    return classes


@functools.cache
def list_folder(folder: Path, classes: tuple[str, ...] | None) -> Listing:
    """Scan ``folder``: labelled by class sub-folders, or unlabelled (see the module doc)."""
    labelled_by = folder_classes(folder, classes)
    files: list[Path] = []
    labels: list[int] = []
    if labelled_by is None:
        files = images_below(folder)
        labels = [UNLABELLED] * len(files)
    else:
        for name in subfolders(folder):
            found = images_below(folder / name)
            if not found:
                raise EtnError(
                    f"Class folder {folder / name} holds no images ({', '.join(IMAGE_SUFFIXES)})"
                    "; expected at least one. Add images or remove the folder."
                )
            files += found
            labels += [labelled_by.index(name)] * len(found)
    if not files:
        raise EtnError(
            f"Folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}, searched "
            "recursively). Check the path."
        )
    digest = hashlib.sha256()
    relative = tuple(p.relative_to(folder).as_posix() for p in files)
    for name, path, label in zip(relative, files, labels, strict=True):
        digest.update(f"{name}\t{path.stat().st_size}\t{label}\n".encode())
    array = np.asarray(labels, dtype=np.int64)
    return Listing(folder, relative, array, labelled_by, "image folder", digest.hexdigest())


@functools.cache
def list_file(path: Path, images: Path, classes: tuple[str, ...] | None, stamp: int) -> Listing:
    """An OpenOOD image list (``stamp``: its modification time, so an edit is re-read)."""
    listed = read_image_list(path, images)
    labelled = listed.labelled
    if labelled and classes is not None and int(listed.labels.max()) >= len(classes):
        raise EtnError(
            f"The image list {path} has label {int(listed.labels.max())}, but classes names "
            f"{len(classes)}; expected labels in 0..{len(classes) - 1} (or -1). Fix the list."
        )
    if labelled and int(listed.labels.min()) < UNLABELLED:
        raise EtnError(f"The image list {path} has label {int(listed.labels.min())} < -1.")
    names = classes if labelled else None
    return Listing(images, listed.files, listed.labels, names, "image list", listed.sha256)


@datasets.register("image_folder")
class ImageFolderData(PathSplits, VisionSource):
    """Your own images: class folders, unlabelled folders or OpenOOD image lists under the
    root; a split is a path below it (see the module docstring)."""

    name = "image_folder"
    title = "your images"
    splits = ()  # any path under the root; :meth:`available` lists the top level
    Options = ImageFolderOptions
    needs_torchvision = False  # PIL reads the files

    def available(self) -> tuple[str, ...]:
        """The split names directly under the root: folders and image-list files."""
        root = self.root_path()
        if not root.is_dir():
            return ()
        entries = sorted(os.scandir(root), key=lambda e: e.name)
        entries = [e for e in entries if not e.name.startswith(".")]
        keep = [e.name for e in entries if e.is_dir() or Path(e.name).suffix in LIST_SUFFIXES]
        return tuple(keep)

    def has_split(self, split: str) -> bool:
        return self.inside_root(split) is not None

    def check_split(self, split: str) -> None:
        if not self.has_split(split):
            shown = ", ".join(self.available()) or "nothing"
            raise EtnError(
                f"Dataset 'image_folder' has no split {split!r}: expected a folder of images or "
                f"an image-list file at {self.root_path() / split}. Under [data] root "
                f"{self.root_path()} there is: {shown}."
            )

    def class_names(self) -> tuple[str, ...] | None:
        """The ``classes`` option as names: the list itself, or the lines of its file."""
        value = self.opts.classes
        if value is None or isinstance(value, tuple):
            return value
        path = self.root_path() / value
        if not path.is_file():
            raise EtnError(
                f'classes = "{value}" names no file ({path}). Give a list of names, or a text '
                "file under [data] root with one class name per line."
            )
        names = tuple(line.strip() for line in path.read_text().splitlines() if line.strip())
        if len(names) < 2 or len(set(names)) != len(names):
            raise EtnError(
                f"The class file {path} lists {len(names)} names ({len(set(names))} distinct); "
                "expected at least two distinct class names, one per line."
            )
        return names

    def listing(self, split: str) -> Listing:
        self.check_split(split)
        path = (self.root_path() / split).resolve()
        classes = self.class_names()
        if path.is_dir():
            return list_folder(path, classes)
        images = self.root_path() / (self.opts.images or ".")
        return list_file(path, images.resolve(), classes, path.stat().st_mtime_ns)

    def fingerprint(self, split: str) -> dict[str, Any]:
        listing = self.listing(split)
        rows = np.arange(len(listing.files), dtype=np.int64)
        return {
            "dataset": self.name,
            "split": split,
            "source": listing.kind,
            "files": len(listing.files),
            "files_sha256": listing.sha256,
            "classes": None if listing.classes is None else list(listing.classes),
            "num_classes": None if listing.classes is None else len(listing.classes),
            "labels_max": int(listing.labels.max()),
            "rows": len(rows),
            "rows_sha256": rows_sha256(rows),
        }

    def open(self, split: str) -> tuple[Dataset, np.ndarray, int]:
        listing = self.listing(split)
        data = ImageFiles(listing.folder, list(listing.files), listing.labels)
        num_classes = len(listing.classes) if listing.classes else 0
        return data, np.arange(len(listing.files), dtype=np.int64), num_classes
