"""Images named by list files in OpenOOD's benchmark format: one ``relative/path label`` per
line (``benchmark_imglist/imagenet/test_ninco.txt``, ...), each split its own list.

```toml
[data]
id = "image_list"
root = "../data/openood"          # holds images_largescale/ and benchmark_imglist/
[data.options.image_list]
images = "images_largescale"      # where the listed paths start, relative to root
[data.options.image_list.lists]   # split name -> list file, relative to root
val = "benchmark_imglist/imagenet/val_imagenet.txt"
ninco = "benchmark_imglist/imagenet/test_ninco.txt"
textures = { list = "benchmark_imglist/imagenet/test_textures.txt", images = "images_classic" }
```

A split given as a table names its own ``images`` folder (OpenOOD keeps Textures under
``images_classic/``, the other ImageNet sets under ``images_largescale/``).

Every split yields ``(PIL RGB image, label)`` read lazily; the label is the list's integer
(OpenOOD's OOD lists carry -1 or a placeholder, which etn never uses for OOD sets). A split's
fingerprint covers its list file and the bytes of every image it names, so an edited list or
a replaced image gives new features. A missing
list, a malformed line or a missing image stops planning with one line naming the file and
line (the lists are read by :mod:`etn_cli.datasets.openood_lists`, as ``image_folder`` reads
them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from etn_cli.datasets.base import datasets
from etn_cli.datasets.imagenet import ImageFiles
from etn_cli.datasets.openood_lists import ImageList, read_image_list
from etn_cli.datasets.settings import ImageListOptions
from etn_cli.datasets.vision import VisionSource
from etn_cli.errors import EtnError


def list_source(entry: Any) -> tuple[str, str | None] | None:
    """``(list file, images folder or None)`` of one ``lists`` entry; None if malformed."""
    if isinstance(entry, str):
        return entry, None
    if (
        isinstance(entry, dict)
        and isinstance(entry.get("list"), str)
        and set(entry) <= {"list", "images"}
    ):
        return entry["list"], entry.get("images")
    return None


@datasets.register("image_list")
class ImageListSource(VisionSource):
    name = "image_list"
    title = "images named by list files"
    Options = ImageListOptions

    def __init__(self, root: str | None = None, **options: Any) -> None:
        super().__init__(root, **options)
        self.sources = {split: list_source(entry) for split, entry in self.opts.lists.items()}
        if not self.sources or None in self.sources.values():
            raise EtnError(
                '[data.options.image_list] needs lists = { split = "path/to/list.txt", ... } '
                f'(or {{ list = "...", images = "..." }} per split), found {self.opts.lists!r}.'
            )
        self.splits = tuple(self.sources)
        self._lists: dict[str, ImageList] = {}

    def _path(self, relative: str) -> Path:
        path = Path(relative).expanduser()
        return path if path.is_absolute() else self.root_path() / path

    def data_path(self, split: str) -> Path | None:
        return self._path(self.sources[split][0]).resolve() if split in self.sources else None

    def images(self, split: str) -> Path:
        return self._path(self.sources[split][1] or self.opts.images)

    def image_list(self, split: str) -> ImageList:
        if split not in self._lists:
            path = self._path(self.sources[split][0])
            if not path.is_file():
                raise EtnError(
                    f"Image list {path} does not exist. Put OpenOOD's benchmark_imglist/ under "
                    "[data] root (or fix lists = {...} in [data.options.image_list])."
                )
            self._lists[split] = read_image_list(path, self.images(split))
        return self._lists[split]

    def check_files(self, split: str) -> None:
        self.image_list(split)  # reading the list checks that every image it names exists

    def fingerprint(self, split: str) -> dict[str, Any]:
        listed = self.image_list(split)
        return {"dataset": self.name, "split": split, "list_sha256": listed.sha256,
                "images": self.sources[split][1] or self.opts.images,
                "rows": len(listed.files)}  # fmt: skip

    def open(self, split: str) -> tuple[Dataset, np.ndarray, int]:
        listed = self.image_list(split)
        data = ImageFiles(self.images(split), list(listed.files), listed.labels)
        classes = int(max(listed.labels.max() + 1, 1))
        return data, np.arange(len(listed.files), dtype=np.int64), classes
