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
from etn_cli.pipeline import load_pipeline
from etn_cli.plan import make_plan

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
