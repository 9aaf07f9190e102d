"""Image lists in OpenOOD's format: one image per line, ``relative/path label``.

OpenOOD's benchmark lists (``benchmark_imglist/<benchmark>/<split>.txt``) name each image by
its path relative to an image folder, followed by an integer label; OOD lists carry ``-1`` or
leave the label out. This module only reads such a file; :mod:`etn_cli.datasets.image_folder`
turns it into a split, and any other dataset may reuse :func:`read_image_list`.

A line is split at its last run of white space: when the last field is an integer it is the
label, otherwise the whole line is the path (an unlabelled image; a path may contain spaces).
A list mixing labelled and unlabelled lines, a label beyond 2**31, a path that escapes the image
folder or names no file, and an empty list are one-line :class:`EtnError` s naming the file and
the line. A list is keyed by its text and the XXH3-128 digest of every image it names
(:mod:`etn_cli.store.content`), so a replaced image gives new features.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.content import content_digest

UNLABELLED = -1  # the label of an image without one (OOD sets)
LABEL_LIMIT = 2**31  # a class index beyond this is a typo, and would not fit in int64 at 10**19
LABELLED_LINE = re.compile(r"^(.*\S)\s+(-?\d+)$")


@dataclass(frozen=True)
class ImageList:
    """The images of one list: paths relative to ``folder``, labels (-1 where unlabelled)."""

    folder: Path
    files: tuple[str, ...]
    labels: np.ndarray  # (N,) int64
    sha256: str  # of the list's text (names and labels, in order) and each image's bytes

    @property
    def labelled(self) -> bool:
        return bool(len(self.labels)) and bool((self.labels != UNLABELLED).any())


def parse_line(line: str) -> tuple[str, int | None]:
    """``"a/b.png 3"`` -> ``("a/b.png", 3)``; ``"a/b.png"`` -> ``("a/b.png", None)``."""
    text = line.strip()
    match = LABELLED_LINE.match(text)
    return (match[1], int(match[2])) if match else (text, None)


def read_image_list(path: Path, folder: Path) -> ImageList:
    """Every ``path label`` line of ``path``; image paths are relative to ``folder``."""
    path, folder = Path(path), Path(folder)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise EtnError(
            f"Cannot read the image list {path} ({type(err).__name__}). Expected a text file "
            "with one 'relative/path label' line per image."
        ) from None
    files, labels = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, label = parse_line(line)
        if label is not None and not -LABEL_LIMIT < label < LABEL_LIMIT:
            raise EtnError(
                f"{path}:{number} gives label {label}; expected a class index (0, 1, ...) or -1. "
                "Fix the list."
            )
        check_entry(path, number, folder, name)
        files.append(name)
        labels.append(label)
    if not files:
        raise EtnError(
            f"The image list {path} names no images. Expected one 'relative/path label' line "
            "per image, as OpenOOD's benchmark lists."
        )
    given = [label is not None for label in labels]
    if any(given) and not all(given):
        number = given.index(False) + 1
        raise EtnError(
            f"The image list {path} gives labels on some lines but not on entry {number}; "
            "expected a label on every line (-1 for an unlabelled image) or on none."
        )
    array = np.asarray([UNLABELLED if v is None else v for v in labels], dtype=np.int64)
    digest = hashlib.sha256(text.encode())
    for name in files:  # the bytes of every image, not only their names
        digest.update(f"\n{content_digest(folder / name)}".encode())
    return ImageList(folder, tuple(files), array, digest.hexdigest())


def check_entry(path: Path, number: int, folder: Path, name: str) -> None:
    """The line's image lies inside ``folder`` and exists."""
    if "\0" in name:
        raise EtnError(
            f"{path}:{number} names a path with a NUL byte; expected 'relative/path label'. "
            "Fix or regenerate the list."
        )
    target = (folder / name).resolve()
    if Path(name).is_absolute() or not target.is_relative_to(folder.resolve()):
        raise EtnError(
            f"{path}:{number} names {name!r}, which lies outside the image folder {folder}; "
            "expected a path relative to it."
        )
    if not target.is_file():
        raise EtnError(
            f"{path}:{number} names {name!r}, but {folder / name} does not exist. Set the "
            'image folder (images = "..." in the dataset\'s [data.options] table) or fix the list.'
        )
