"""The ``image_folder`` dataset: torchvision's ImageFolder conventions, class lists, unlabelled
OOD folders and OpenOOD image lists, checked against what the files on disk say."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from etn_cli.datasets import datasets
from etn_cli.datasets.openood_lists import parse_line, read_image_list
from etn_cli.errors import EtnError


def write_images(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.fromarray(np.full((4, 4, 3), i * 20, np.uint8)).save(folder / name)


def source(root: Path, **options):
    return datasets.get("image_folder")(root=str(root), **options)


def labels_by_file(split) -> dict[str, int]:
    pairs = zip(split.data.files, split.data.labels, strict=True)
    return {Path(f).as_posix(): int(y) for f, y in pairs}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Class folders with any names (not WordNet ids), nested images, a hidden folder."""
    write_images(tmp_path / "train" / "zebra", ["z1.png", "z2.jpg"])
    write_images(tmp_path / "train" / "ant" / "deep", ["a1.png"])
    write_images(tmp_path / "train" / "mole", ["m1.png"])
    write_images(tmp_path / "train" / ".ipynb_checkpoints", ["x.png"])
    (tmp_path / "train" / "notes.txt").write_text("not an image")
    return tmp_path


def test_classes_are_the_sorted_folder_names_like_torchvision(tree: Path) -> None:
    from torchvision.datasets import ImageFolder

    split = source(tree).load_split("train")
    assert labels_by_file(split) == {
        "ant/deep/a1.png": 0,
        "mole/m1.png": 1,
        "zebra/z1.png": 2,
        "zebra/z2.jpg": 2,
    }
    reference = ImageFolder(str(tree / "train"))  # the convention followed
    assert reference.classes[1:] == ["ant", "mole", "zebra"]  # it keeps the hidden folder
    fp = source(tree).split_fingerprint("train")
    assert fp["classes"] == ["ant", "mole", "zebra"] and fp["num_classes"] == 3


def test_a_class_list_sets_the_order_and_may_come_from_a_file(tree: Path) -> None:
    (tree / "names.txt").write_text("zebra\nant\nmole\n")
    by_list = labels_by_file(source(tree, classes=["zebra", "ant", "mole"]).load_split("train"))
    by_file = labels_by_file(source(tree, classes="names.txt").load_split("train"))
    assert (
        by_list
        == by_file
        == {
            "ant/deep/a1.png": 1,
            "mole/m1.png": 2,
            "zebra/z1.png": 0,
            "zebra/z2.jpg": 0,
        }
    )


def test_with_a_class_list_a_split_may_lack_classes(tree: Path) -> None:
    write_images(tree / "test" / "mole", ["m.png"])
    split = source(tree, classes=["zebra", "ant", "mole"]).load_split("test")
    assert split.data.labels.tolist() == [2] and split.num_classes == 3


def test_folders_without_class_folders_are_unlabelled(tree: Path) -> None:
    write_images(tree / "flat", ["b.png", "a.png"])
    write_images(tree / "textures" / "banded", ["t.png"])  # an OOD set with its own classes
    flat = source(tree).load_split("flat")
    assert flat.data.files == ["a.png", "b.png"] and (flat.data.labels == -1).all()
    own = source(tree, classes=["zebra", "ant", "mole"]).load_split("textures")
    assert own.data.labels.tolist() == [-1]
    assert source(tree).display_name("textures") == "textures"
    assert source(tree).display_name(None) == tree.name


def test_images_load_as_rgb_and_an_unreadable_one_names_its_file(tree: Path) -> None:
    split = source(tree).load_split("train")
    image, label = split.data[0]
    assert image.mode == "RGB" and image.size == (4, 4) and label == 0
    (tree / "train" / "mole" / "m1.png").write_bytes(b"garbage")
    with pytest.raises(EtnError, match="Cannot read image .*mole/m1.png"):
        split.data[1]


def test_the_fingerprint_follows_names(tree: Path) -> None:
    before = source(tree).split_fingerprint("train")
    (tree / "train" / "mole").rename(tree / "train" / "vole")
    after = source(tree).split_fingerprint("train")
    assert before["files_sha256"] != after["files_sha256"] and after["classes"][1] == "vole"


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("cifar10/test/airplane/0001.png 0", ("cifar10/test/airplane/0001.png", 0)),
        ("ood/img 12.png\t-1", ("ood/img 12.png", -1)),
        ("textures/banded_0001.jpg", ("textures/banded_0001.jpg", None)),
        ("  a/b.png   7  ", ("a/b.png", 7)),
    ],
)
def test_openood_lines_split_at_the_last_field(line: str, parsed: tuple) -> None:
    assert parse_line(line) == parsed


def test_an_openood_list_loads_with_its_labels(tmp_path: Path) -> None:
    write_images(tmp_path / "images" / "cifar10" / "test", ["a.png", "b.png", "c.png"])
    listing = tmp_path / "benchmark_imglist" / "test_cifar10.txt"
    listing.parent.mkdir()
    listing.write_text("cifar10/test/c.png 2\n\ncifar10/test/a.png 0\ncifar10/test/b.png 1\n")
    read = read_image_list(listing, tmp_path / "images")
    assert read.files == ("cifar10/test/c.png", "cifar10/test/a.png", "cifar10/test/b.png")
    split = source(tmp_path, images="images").load_split("benchmark_imglist/test_cifar10.txt")
    assert split.data.labels.tolist() == [2, 0, 1] and split.data[0][1] == 2
    fp = source(tmp_path, images="images").split_fingerprint("benchmark_imglist/test_cifar10.txt")
    assert fp["source"] == "image list" and fp["labels_max"] == 2 and fp["num_classes"] is None


def test_a_list_path_may_not_leave_the_image_folder(tmp_path: Path) -> None:
    write_images(tmp_path, ["x.png"])
    (tmp_path / "l.txt").write_text("../x.png 0\n")
    (tmp_path / "sub").mkdir()
    with pytest.raises(EtnError, match="lies outside the image folder"):
        read_image_list(tmp_path / "l.txt", tmp_path / "sub")
