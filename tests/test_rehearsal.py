"""A rehearsal of every shipped paper pipeline on miniature copies of its real files.

Each test copies ``pipelines/<name>.toml`` unchanged into ``tmp/pipelines/`` and builds, under
``tmp/data/`` (the pipelines' ``../data/...`` roots), the datasets it reads in their published
formats (:mod:`tests.rehearsal_data`, built without etn's readers). ``etn run`` must reach the
table. Only sizes are overridden with ``--set``:

* ``seeds=[0]`` (one seed of three);
* ``finetune.epochs`` (1, or 60 for openood_cifar10: its from-scratch ResNet-18 fits the
  training list in training mode well before that, but its batch-norm running statistics need
  the many small-lr steps at the end of the cosine schedule before the network in eval mode
  classifies a row of every class right, as SHE needs) and ``finetune.batch_size``;
* ``heads.<name>.epochs=1`` and ``heads.<name>.batch_size`` for the heads that train;
* ``data.batch_size``, ``data.workers=0`` and, for openood_imagenet, ``data.fit_rows``;
* for the two ResNet-50 pipelines ``backbone.resize=32`` and ``backbone.crop=32``: the
  weights' normalisation stays, the images come to 32x32 (ResNet-50 at a fiftieth of its
  224x224 cost), as a run on small images would set them.

Besides sizes, ``imagenet_resnet50`` and ``openood_imagenet`` get
``backbone.checkpoint=<random ResNet-50 state dict>``: torchvision's hub file names carry the
first hex digits of their sha256 (``resnet50-11ad3fa6.pth``), which etn checks, so random
weights cannot stand in under that name; a checkpoint beside ``weights`` keeps the weights'
architecture and transforms, as a local copy of the real file would. Their miniatures hold
all 1,000 classes, since Mahalanobis, SHE and the other per-class heads need every class of
the model in their fit split. ``imagenet_vit_b16`` is not rehearsed: ViT-B/16 takes 224x224
inputs only (its position embeddings), so at 1,000 classes its miniature would cost more
than a CPU run can afford. The LLM pipelines read
the hub id from a Hugging Face cache holding a tiny random model under that id.

CIFAR and SVHN are read by etn from their published formats (not through torchvision, whose
md5 check refuses anything but the full release); that reader equals torchvision's on
real-format bytes in ``tests/test_vision.py``.

Fast by default: the failures before any work of ``openood_cifar10`` without its resize and
crop and of ``cifar10_vgg16`` on an adaptation split missing classes (seconds each), and the
ImageNet miniature's class sizes. Every run to a table is ``slow`` (``python -m pytest -q -m
slow tests/test_rehearsal.py``): each trains a backbone or LoRA adapter and about thirty heads
on the CPU, minutes to an hour apiece (docs/pipelines.md lists each one's time).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import rehearsal_data as rd
from tests.cli_runner import etn
from tests.llm_fixtures import make_gemma2, make_llama

REPO = Path(__file__).resolve().parents[1]
TRAINED = ("etn", "static", "adats", "map_edl", "ib_edl", "dmm", "ensemble")


def shipped(tmp_path: Path, name: str) -> Path:
    """The shipped pipeline file, unchanged, in ``tmp/pipelines/``."""
    folder = tmp_path / "pipelines"
    folder.mkdir(exist_ok=True)
    return Path(shutil.copy(REPO / "pipelines" / f"{name}.toml", folder))


def sets(*pairs: str, heads: tuple[str, ...] = (), batch: int = 8) -> list[str]:
    """``--set`` arguments: ``pairs`` and one epoch of ``batch`` rows for each trained head."""
    values = ["seeds=[0]", *pairs]
    for head in heads:
        values += [f"heads.{head}.epochs=1", f"heads.{head}.batch_size={batch}"]
    return [arg for value in values for arg in ("--set", value)]


def run(tmp_path: Path, name: str, *args: str) -> tuple[int, str]:
    """``etn run`` of the shipped pipeline ``name``, copied unless a copy is there already."""
    copy = tmp_path / "pipelines" / f"{name}.toml"
    path = copy if copy.is_file() else shipped(tmp_path, name)
    data = tmp_path / "etn-data"
    return etn("run", path, "--data-dir", data, "--device", "cpu", *args)


def assert_table(code: int, out: str, name: str) -> None:
    assert code == 0, out
    assert f"{name}.toml" in out and "ok " in out, out
    assert "AUPR" in out or "aupr" in out.lower(), out


# -- OpenOOD CIFAR-10 ---------------------------------------------------------------------------

OPENOOD_CIFAR10 = {
    "train": ("train_cifar10.txt", "images_classic", 10),
    "val": ("val_cifar10.txt", "images_classic", 10),
    "test": ("test_cifar10.txt", "images_classic", 10),
    **{
        name: (f"test_{name}.txt", "images_classic", None)
        for name in ("cifar100", "tin", "mnist", "svhn", "texture", "places365")
    },
}
MIXED = [(333, 500), (400, 400), (500, 333)]  # Textures' and Places365's sizes


def openood_cifar10(root: Path, rows: int = 20) -> None:
    sizes = {split: [(32, 32)] for split in OPENOOD_CIFAR10}
    sizes |= {"mnist": [(28, 28)], "tin": [(64, 64)], "texture": MIXED, "places365": [(256, 256)]}
    counts = {split: rows for split in OPENOOD_CIFAR10} | {"train": 4 * rows}
    rd.write_openood(root, "cifar10", OPENOOD_CIFAR10, sizes, counts)


def test_openood_cifar10_without_resize_fails_before_stage_zero_listing_every_list(tmp_path):
    openood_cifar10(tmp_path / "data" / "openood", rows=6)
    path = shipped(tmp_path, "openood_cifar10")  # as it was shipped before: no resize, no crop
    kept = [
        line for line in path.read_text().splitlines() if not line.startswith(("resize", "crop"))
    ]
    path.write_text("\n".join(kept) + "\n")
    code, out = run(tmp_path, "openood_cifar10", *sets())
    assert code == 2, out
    assert "2 problems in the input files, found before any work" in out, out
    assert "Images of split image_list:texture come to the sizes [(333, 500)" in out, out
    assert "28x28: image_list:mnist; 32x32: image_list:train" in out, out
    assert "64x64: image_list:tin; 256x256: image_list:places365" in out, out
    assert not list((tmp_path / "etn-data").glob("backbones/*finetune*")), "stage zero ran"


@pytest.mark.slow
def test_openood_cifar10_runs_to_its_table(tmp_path: Path) -> None:
    openood_cifar10(tmp_path / "data" / "openood", rows=20)
    args = sets("finetune.epochs=60", "finetune.batch_size=16", "finetune.workers=0",
                "data.workers=0", "data.batch_size=64")  # fmt: skip
    args += sets(heads=("etn", "static", "map_edl", "ib_edl", "ensemble"))[2:]
    assert_table(*run(tmp_path, "openood_cifar10", *args), "openood_cifar10")


# -- CIFAR-10 with VGG16 ------------------------------------------------------------------------


def cifar_files(vision: Path, per_batch: int) -> None:
    rd.write_cifar10(vision, per_batch=per_batch, test_rows=40)
    rd.write_cifar100(vision, train_rows=20, test_rows=30)
    rd.write_svhn(vision, "test", rows=30)


def test_cifar10_vgg16_on_an_adapt_split_missing_classes_fails_before_stage_zero(tmp_path):
    """200 training rows leave 10 for adapt (5%), without classes 6 and 7: Mahalanobis would
    refuse them after the fine-tune and a dozen heads; the files say so before any work."""
    cifar_files(tmp_path / "data" / "vision", per_batch=40)
    code, out = run(tmp_path, "cifar10_vgg16", *sets("finetune.epochs=1"))
    assert code == 2, out
    assert "Split cifar10:adapt has no rows of 2 of its 10 classes (6, 7)" in out, out
    assert "Mahalanobis need rows of every class" in out, out
    assert not list((tmp_path / "etn-data").glob("backbones/*finetune*")), "stage zero ran"


@pytest.mark.slow
def test_cifar10_vgg16_runs_to_its_table_on_cifar_pickles_and_svhn_mat(tmp_path: Path) -> None:
    vision = tmp_path / "data" / "vision"
    cifar_files(vision, per_batch=200)  # 1,000 rows: 50 adapt rows hold every class
    args = sets("finetune.epochs=1", "finetune.batch_size=32", "finetune.workers=0",
                "data.workers=0", "data.batch_size=64", heads=TRAINED)  # fmt: skip
    assert_table(*run(tmp_path, "cifar10_vgg16", *args), "cifar10_vgg16")


# -- ImageNet -----------------------------------------------------------------------------------

SMALL_IMAGES = ("backbone.resize=32", "backbone.crop=32")  # ResNet-50 on 32x32 inputs


def test_imagenet_miniature_puts_every_class_into_the_adapt_part() -> None:
    """The class sizes of the miniature validation set, against etn's seeded 20% / 80% split
    (milliseconds: no image is written)."""
    import numpy as np

    from etn_cli.datasets.imagenet import VAL_FRACTIONS
    from etn_cli.datasets.vision import seeded_partition

    wnids = rd.imagenet_wnids()
    assert len(wnids) == len(set(wnids)) == 1000 and wnids == sorted(wnids)
    sizes = rd.adapt_covering_sizes(len(wnids))
    labels = np.repeat(np.arange(1000), sizes)  # files in sorted order: class-major
    parts = seeded_partition(len(labels), VAL_FRACTIONS, 0)
    assert np.array_equal(np.unique(labels[parts["adapt"]]), np.arange(1000))
    assert min(sizes) >= 2 and sum(sizes) < 6000


@pytest.mark.slow
def test_imagenet_resnet50_runs_to_its_table_on_wordnet_folders(tmp_path: Path) -> None:
    """All 1,000 WordNet-id folders (Mahalanobis fits on the adapt split and needs every class
    there), 5,500 small JPEGs; ResNet-50 random, the weights' transforms cut to 32x32."""
    vision = tmp_path / "data" / "vision"
    rd.write_imagenet(vision)
    checkpoint = rd.torchvision_checkpoint(tmp_path / "weights" / "resnet50.pth", "resnet50")
    args = sets(f"backbone.checkpoint={checkpoint}", *SMALL_IMAGES, "data.workers=0",
                "data.batch_size=128", heads=(*TRAINED, "duq", "sngp"), batch=64)  # fmt: skip
    assert_table(*run(tmp_path, "imagenet_resnet50", *args), "imagenet_resnet50")


def openood_imagenet(root: Path) -> tuple[tuple[Path, ...], tuple[int, ...]]:
    """OpenOOD v1.5's ImageNet-1K lists: one image of each of the 1,000 classes in train and in
    val (the scorers with per-class statistics fit on train, the heads on val), 200 test
    images, 6 of each OOD list at Textures' and Places' mixed sizes. Returns train's images."""
    lists = {"train": ("train_imagenet.txt", "images_largescale", 1000),
             "val": ("val_imagenet.txt", "images_largescale", 1000),
             "test": ("test_imagenet.txt", "images_largescale", 1000)}  # fmt: skip
    ood = ("ssb_hard", "ninco", "inaturalist", "openimage_o", "imagenet_r", "imagenet_v2")
    lists |= {name: (f"test_{name}.txt", "images_largescale", None) for name in ood}
    lists["textures"] = ("test_textures.txt", "images_classic", None)
    sizes = {split: rd.SMALL for split in ("train", "val", "test")}
    sizes |= {split: MIXED for split in lists if split not in sizes}
    counts = {split: 6 for split in lists} | {"train": 1000, "val": 1000, "test": 200}
    rd.write_openood(root, "imagenet", lists, sizes, counts, stride={"test": 5})
    listing = "benchmark_imglist/imagenet/train_imagenet.txt"
    return rd.labelled_images(root, listing, "images_largescale")


@pytest.mark.slow
def test_openood_imagenet_runs_to_its_table(tmp_path: Path) -> None:
    """The random ResNet-50's final layer is the nearest mean of the training list's images,
    so that SHE finds a correctly classified row of every class there."""
    images, labels = openood_imagenet(tmp_path / "data" / "openood")
    path = tmp_path / "weights" / "resnet50.pth"
    checkpoint = rd.torchvision_checkpoint(path, "resnet50", images, labels, "IMAGENET1K_V1", 32)
    args = sets(f"backbone.checkpoint={checkpoint}", *SMALL_IMAGES, "data.workers=0",
                "data.batch_size=128", "data.fit_rows=1000",
                heads=("etn", "static", "map_edl", "ib_edl"), batch=64)  # fmt: skip
    assert_table(*run(tmp_path, "openood_imagenet", *args), "openood_imagenet")


# -- RACE and OpenBookQA with a tiny Llama and Gemma-2 ------------------------------------------

LLM_SETS = ("finetune.epochs=1", "finetune.batch_size=8", "data.batch_size=8")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache holding tiny random models under the pipelines' hub ids, read
    offline (what HF_HUB_CACHE=<tmp> HF_HUB_OFFLINE=1 set before the process amount to)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    rd.hub_cache_model(cache, "meta-llama/Llama-3.1-8B", make_llama(tmp_path / "llama"))
    rd.hub_cache_model(cache, "google/gemma-2-9b", make_gemma2(tmp_path / "gemma"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return cache


def mcqa_files(root: Path) -> None:
    """RACE and MMLU as `hf download --local-dir` leaves them, OpenBookQA's original jsonl."""
    rd.write_race(root / "race", {"train": 24, "validation": 16, "test": 16})
    rd.write_mmlu(root / "mmlu", rows=3)
    rd.write_obqa_original(root / "obqa", {"train": 24, "dev": 16, "test": 16})


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    ["race_llama3", "obqa_llama3", "race_gemma2", "obqa_gemma2", "race_llama3_ablation_prior"],
)
def test_the_llm_pipelines_run_to_their_tables(tmp_path: Path, hub_cache: Path, name: str) -> None:
    mcqa_files(tmp_path / "data" / "mcqa")
    heads = ("etn",) if name.endswith("prior") else TRAINED
    args = sets(*LLM_SETS, heads=heads)
    assert_table(*run(tmp_path, name, *args), name)
