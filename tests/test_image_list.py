"""The image-list dataset (OpenOOD's benchmark format) and the OpenOOD pipelines, on a tiny
stand-in of OpenOOD's folder layout: real PNG files and list files written here."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from etn_cli.datasets.image_list import ImageListSource
from etn_cli.datasets.openood_lists import read_image_list
from etn_cli.errors import EtnError
from etn_cli.planning.pipeline import load_pipeline
from etn_cli.planning.plan import make_plan

REPO = Path(__file__).resolve().parents[1]


def write_images(root: Path, folder: str, names: list[str], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for name in names:
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)


def write_list(root: Path, name: str, lines: list[str]) -> str:
    path = root / "benchmark_imglist" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path.relative_to(root))


def test_a_list_split_yields_images_and_labels_in_list_order(tmp_path: Path) -> None:
    names = ["cifar10/a b.png", "cifar10/c.png", "cifar10/d.png"]  # a path with a space
    write_images(tmp_path, "images_classic", names, 0)
    listed = write_list(tmp_path, "test.txt", [f"{n} {i + 3}" for i, n in enumerate(names)])
    source = ImageListSource(root=str(tmp_path), images="images_classic", lists={"test": listed})
    split = source.load_split("test")
    assert len(split) == 3 and split.index.tolist() == [0, 1, 2]
    image, label = split.data[1]
    assert image.size == (8, 8) and image.mode == "RGB" and label == 4
    assert (
        split.fingerprint["list_sha256"]
        == read_image_list(tmp_path / listed, tmp_path / "images_classic").sha256
    )


def test_a_split_can_name_its_own_images_folder(tmp_path: Path) -> None:
    write_images(tmp_path, "images_classic", ["texture/t.png"], 1)
    listed = write_list(tmp_path, "tex.txt", ["texture/t.png -1"])
    lists = {"textures": {"list": listed, "images": "images_classic"}}
    source = ImageListSource(root=str(tmp_path), images="images_largescale", lists=lists)
    assert source.load_split("textures").data[0][1] == -1


@pytest.mark.parametrize(
    "lines,lists,match",
    [
        (["x.png 1"], {"test": "missing.txt"}, "does not exist"),
        (["x.png 1", "x.png"], {"test": "benchmark_imglist/l.txt"}, "labels on some lines"),
        (["nope.png 1"], {"test": "benchmark_imglist/l.txt"}, "names 'nope.png', but"),
        (["../x.png 1"], {"test": "benchmark_imglist/l.txt"}, "outside the image folder"),
        (["x.png 1"], {"test": 3}, "needs lists"),
    ],
)
def test_bad_lists_are_one_line_errors(tmp_path: Path, lines, lists, match) -> None:
    write_images(tmp_path, "img", ["x.png"], 2)
    write_list(tmp_path, "l.txt", lines)
    with pytest.raises(EtnError, match=match):
        ImageListSource(root=str(tmp_path), images="img", lists=lists).split_fingerprint("test")


def openood_standin(root: Path) -> None:
    """OpenOOD's CIFAR-10 lists and folders with 4 images per list."""
    sets = ["train", "val", "test", "cifar100", "tin", "mnist", "svhn", "texture", "places365"]
    for i, name in enumerate(sets):
        files = [f"{name}/{j}.png" for j in range(4)]
        write_images(root / "images_classic", "", files, i)
        kind = "cifar10" if name in ("train", "val", "test") else name
        list_name = f"{name}_{kind}.txt" if kind == "cifar10" else f"test_{name}.txt"
        write_list(root, f"cifar10/{list_name}", [f"{f} {j % 3}" for j, f in enumerate(files)])


def test_the_openood_cifar10_pipeline_plans_on_a_standin(tmp_path: Path) -> None:
    openood_standin(tmp_path / "data" / "openood")
    (tmp_path / "pipelines").mkdir()
    pipeline = shutil.copy(REPO / "pipelines" / "openood_cifar10.toml", tmp_path / "pipelines")
    plan = make_plan(load_pipeline(Path(pipeline)), tmp_path / "out")
    assert plan.fit is not None and plan.fit.split == "train"
    assert [u.name for u in plan.ood][:2] == ["image_list:cifar100", "image_list:tin"]
    assert plan.groups["image_list:svhn"] == "far" and plan.groups["image_list:tin"] == "near"
    knn = next(u for u in plan.heads if u.head.name == "knn")
    etn = [u for u in plan.heads if u.head.name == "etn"]
    assert len(etn) == 3 and knn.seed == 0  # scorers are seed-free: fitted once
    assert plan.fit_unit(knn.head) is plan.fit and plan.fit_unit(etn[0].head) is plan.adapt


def test_the_openood_imagenet_pipeline_lists_every_scorer_and_group() -> None:
    from etn_cli.heads import heads
    from etn_cli.heads.scorers.base import Scorer

    pipeline = load_pipeline(REPO / "pipelines" / "openood_imagenet.toml")
    names = {spec.name for spec in pipeline.heads}
    scorers = {n for n in heads.names() if issubclass(heads.get(n), Scorer)}
    assert scorers - names == {"ddu"}  # refused at 1,000 classes, said in the file
    assert pipeline.data.fit_rows == 128000 and set(pipeline.data.groups) == {"near", "far"}


def fakedata_pngs(root: Path, files: list[str], seed: int, size: int) -> None:
    """``FakeData`` images saved as PNG files at ``root / file``."""
    from torchvision.datasets import FakeData

    data = FakeData(len(files), (3, size, size), 10, random_offset=1000 * seed)
    for file, (image, _) in zip(files, data, strict=True):
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / file)


# split -> (list file under benchmark_imglist/, images folder, labels: None = OOD's -1)
IMAGENET_LISTS = {
    "train": ("imagenet/train_imagenet.txt", "images_largescale", [0, 999, 5, 17, 3]),
    "val": ("imagenet/val_imagenet.txt", "images_largescale", [65, 0, 999]),
    "test": ("imagenet/test_imagenet.txt", "images_largescale", [1, 2, 998]),
    "ssb_hard": ("imagenet/test_ssb_hard.txt", "images_largescale", None),
    "ninco": ("imagenet/test_ninco.txt", "images_largescale", None),
    "inaturalist": ("imagenet/test_inaturalist.txt", "images_largescale", None),
    "textures": ("imagenet/test_textures.txt", "images_classic", None),
    "openimage_o": ("imagenet/test_openimage_o.txt", "images_largescale", None),
}
CIFAR10_LISTS = {
    "train": ("cifar10/train_cifar10.txt", "images_classic", [0, 1, 2, 3, 9]),
    "val": ("cifar10/val_cifar10.txt", "images_classic", [4, 0, 9]),
    "test": ("cifar10/test_cifar10.txt", "images_classic", [7, 8, 1]),
    **{
        name: (f"cifar10/test_{name}.txt", "images_classic", None)
        for name in ("cifar100", "tin", "mnist", "svhn", "texture", "places365")
    },
}


def listed_standin(root: Path, lists: dict, size: int) -> dict[str, list[int]]:
    """OpenOOD's layout: a list per split naming FakeData PNGs (2 per OOD list, labelled -1
    as OpenOOD's OOD lists are), as its download script lays them out; the labels by split."""
    labels = {}
    for seed, (split, (list_file, images, listed)) in enumerate(lists.items()):
        listed = listed or [-1, -1]
        prefix = f"imagenet_1k/{split}" if "imagenet/" in list_file and listed[0] >= 0 else split
        files = [f"{prefix}/{split}_{i:03d}.png" for i in range(len(listed))]
        fakedata_pngs(root / images, files, seed, size)
        write_list(
            root, list_file, [f"{f} {label}" for f, label in zip(files, listed, strict=True)]
        )
        labels[split] = listed
    return labels


@pytest.mark.parametrize("suite", ["imagenet", "cifar10"])
def test_the_openood_pipelines_extract_images_from_standin_lists(suite, tmp_path) -> None:
    """Each shipped OpenOOD pipeline as it is, on a stand-in of OpenOOD's lists and folders
    (random weights, ImageNet's at 56 x 56 pixels; CIFAR-10's fine-tuned for one epoch first):
    every split holds the listed images' rows, with the listed labels in list order (the ID
    training list as a seeded sample of fit_rows = 3 for ImageNet)."""
    from cli_runner import etn

    from etn_cli.store.reading.reader import read_split

    lists, size = (IMAGENET_LISTS, 40) if suite == "imagenet" else (CIFAR10_LISTS, 32)
    labels = listed_standin(tmp_path / "data" / "openood", lists, size)
    (tmp_path / "pipelines").mkdir()
    pipeline = shutil.copy(REPO / "pipelines" / f"openood_{suite}.toml", tmp_path / "pipelines")
    settings = ["data.workers=0", "data.batch_size=4"]
    if suite == "imagenet":
        settings += [
            "backbone.weights=none",
            "backbone.transforms=IMAGENET1K_V1",
            "data.fit_rows=3",
        ]
    else:
        settings += ["finetune.epochs=1", "finetune.batch_size=4", "finetune.workers=0"]
    sets = [a for s in settings for a in ("--set", s)]
    data = tmp_path / "out"
    if suite == "cifar10":
        code, output = etn("finetune", pipeline, "-d", data, "--device", "cpu", *sets)
        assert code == 0, output
    code, output = etn("extract", pipeline, "-d", data, "--device", "cpu", *sets)
    assert code == 0, output
    found = {p.name.split("-")[0]: p for p in data.glob("features/*/image_list.*") if p.is_dir()}
    assert sorted(found) == sorted(f"image_list.{split}" for split in lists)
    classes = 1000 if suite == "imagenet" else 10
    for split, listed in labels.items():
        features = read_split(found[f"image_list.{split}"])
        rows = 3 if (suite, split) == ("imagenet", "train") else len(listed)
        assert len(features) == rows and features.logits.shape == (rows, classes)
        np.testing.assert_array_equal(features.labels, np.asarray(listed)[features.index])
        assert np.all(np.diff(features.index) > 0)  # list order (a sample keeps its order)
