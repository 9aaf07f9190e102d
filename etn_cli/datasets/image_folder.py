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

Hidden entries (``.name``) are skipped; files count as images by their suffix; symbolic links
are followed once per real folder or image, and a loop or a link to nothing is refused. The
split's fingerprint holds every file name with the XXH3-128 digest of its bytes
(:mod:`etn_cli.store.content`, remembered by path, size, times and inode, so a rerun hashes
only what changed), the labels and the class names, so renaming a class folder, adding an
image or changing one pixel re-extracts. The class count is checked against
the backbone before anything is extracted (:mod:`etn_cli.datasets.class_check`).
"""

from __future__ import annotations

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
from etn_cli.datasets.settings import ImageFolderOptions
from etn_cli.datasets.vision import VisionSource, rows_sha256
from etn_cli.errors import EtnError
from etn_cli.store.content import content_digest

LIST_SUFFIXES = (".txt", ".lst", ".list")


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


def images_below(folder: Path, seen: set[tuple[int, int]] | None = None) -> list[Path]:
    """Image files under ``folder`` at any depth, sorted, hidden entries skipped.

    Symbolic links are followed, each real folder and each real image at most once (``seen``
    holds the ``(device, inode)`` of those already listed, shared by the class folders of one
    split): a link to a folder or image already listed adds nothing, a link back to a folder
    above it (a loop) and a link to nothing are refused in one line. Two names of one file
    that are not links (hard links) are two images, as they are to torchvision."""
    seen = set() if seen is None else seen
    images: list[tuple[Path, tuple[int, int], bool]] = []  # (path, real file, via a link)
    stack: list[tuple[Path, tuple[tuple[int, int], ...]]] = [(Path(folder), ())]
    while stack:
        top, above = stack.pop()
        ident = identity(top, folder)
        if ident in above:
            raise EtnError(
                f"{top} links back to a folder above it in {folder}: a symbolic link loop. "
                "Expected folders of images; remove the link."
            )
        if ident in seen:
            continue
        seen.add(ident)
        folders = []
        for entry in sorted(os.scandir(top), key=lambda e: e.name):
            path = Path(entry.path)
            if entry.name.startswith("."):
                continue
            if entry.is_dir():  # follows a link
                folders.append((path, (*above, ident)))
            elif is_image(path):
                linked = entry.is_symlink()
                real = identity(path, folder) if linked else (ident[0], entry.inode())
                images.append((path, real, linked))
        stack += reversed(folders)  # walked in name order: the first name of a folder counts
    return once_per_file(images, seen)


def once_per_file(
    images: list[tuple[Path, tuple[int, int], bool]], seen: set[tuple[int, int]]
) -> list[Path]:
    """The images, sorted, less every link to a file listed already (as itself or by an
    earlier link, here or in ``seen``, which learns the files listed)."""
    files = {real for _, real, linked in images if not linked}
    kept = []
    for path, real, linked in sorted(images):
        if linked and (real in files or real in seen):
            continue
        seen.add(real)
        kept.append(path)
    return kept


def identity(path: Path, folder: Path) -> tuple[int, int]:
    """``(device, inode)`` of what ``path`` points to; one line when it points to nothing."""
    try:
        stat = os.stat(path)
    except OSError as err:
        what = f"a link to {os.readlink(path)}, " if os.path.islink(path) else ""
        raise EtnError(
            f"{path} in {folder} is {what}unreadable ({err.strerror}). Expected images and "
            "folders of images; restore the file or remove the link."
        ) from None
    return stat.st_dev, stat.st_ino


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


def list_folder(folder: Path, classes: tuple[str, ...] | None) -> Listing:
    """Scan ``folder``: labelled by class sub-folders, or unlabelled (see the module doc)."""
    labelled_by = folder_classes(folder, classes)
    files: list[Path] = []
    labels: list[int] = []
    seen: set[tuple[int, int]] = set()
    if labelled_by is None:
        files = images_below(folder, seen)
        labels = [UNLABELLED] * len(files)
    else:
        for name in subfolders(folder):
            found = images_below(folder / name, seen)
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
    relative = tuple(p.relative_to(folder).as_posix() for p in files)
    digest = hashlib.sha256()
    for name, path, label in zip(relative, files, labels, strict=True):
        digest.update(f"{name}\t{content_digest(path)}\t{label}\n".encode())
    array = np.asarray(labels, dtype=np.int64)
    return Listing(folder, relative, array, labelled_by, "image folder", digest.hexdigest())


def list_file(path: Path, images: Path, classes: tuple[str, ...] | None) -> Listing:
    """An OpenOOD image list, keyed by its text and the bytes of every image it names."""
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
        return list_file(path, images.resolve(), classes)

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
