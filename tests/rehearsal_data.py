"""Miniature copies of the files the shipped pipelines read, in their published formats.

Every builder follows the format's own description, never etn's readers or writers, so a
rehearsal on them finds what the real files would break:

* CIFAR-10 / CIFAR-100 "python version" (https://www.cs.toronto.edu/~kriz/cifar.html):
  ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``, ``cifar-100-python/train`` and
  ``test``: pickled dicts (protocol 2, as the Python 2 originals) with ``data`` (N, 3072) uint8,
  red then green then blue 32x32 planes, and ``labels`` (``fine_labels`` / ``coarse_labels``);
* SVHN format 2 (http://ufldl.stanford.edu/housenumbers/): ``test_32x32.mat`` with ``X``
  (32, 32, 3, N) uint8 and ``y`` (N, 1), digit 0 labelled 10, written by ``scipy.io.savemat``;
* ImageNet validation images sorted into WordNet-id folders (and ImageNet-A, -R, -Sketch), JPEGs
  of several sizes including a grayscale and a CMYK one, as the real validation set has;
* OpenOOD v1.5's ``benchmark_imglist/<benchmark>/<split>.txt`` (``relative/path label`` lines)
  over ``images_classic/`` and ``images_largescale/``, OOD images of mixed sizes (Textures,
  Places365 and Tiny ImageNet are not 32x32);
* RACE and MMLU as the Hugging Face hub serves them (parquet, one folder per config as
  ``hf download --repo-type dataset`` leaves them), OpenBookQA's original release
  (``Main/*.jsonl``);
* a tiny random Llama and Gemma-2 in the Hugging Face cache layout
  (``models--org--name/snapshots/<commit>/`` and ``refs/main``), tokenizers built locally;
* random torchvision weights saved as torchvision's checkpoints are (a ``state_dict``).
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MMLU_SUBJECTS = (
    "college_computer_science", "computer_security", "high_school_computer_science",
    "machine_learning", "electrical_engineering", "college_mathematics",
    "high_school_mathematics", "abstract_algebra",
)  # fmt: skip


PALETTE = np.array(
    [[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48],
     [145, 30, 180], [70, 240, 240], [240, 50, 230], [140, 90, 40], [250, 190, 212]],
    dtype=np.float32,
)  # fmt: skip


def class_colours(labels: np.ndarray) -> np.ndarray:
    """(N, 3) float colours: PALETTE's for classes 0..9, a seeded colour of its own for each
    class above (ImageNet's 1,000)."""
    labels = np.asarray(labels)
    out = PALETTE[labels % 10].copy()
    for c in np.unique(labels[labels >= 10]):
        out[labels == c] = np.random.default_rng(int(c)).uniform(0, 255, 3)
    return out


def random_pixels(
    rng: np.random.Generator, n: int, size: tuple[int, int], labels: np.ndarray | None = None
) -> np.ndarray:
    """``n`` random RGB images (n, H, W, 3) uint8. With ``labels``, each is its class's colour
    (:func:`class_colours`) plus noise, so that one short epoch learns them and every class has rows
    classified right (SHE, Mahalanobis and the class-conditional scorers need some); without,
    a class-free colour field (OOD images)."""
    h, w = size
    if labels is not None:
        base = class_colours(np.asarray(labels))[:, None, None, :]  # (n, 1, 1, 3)
        return np.clip(base + rng.normal(0, 25, (n, h, w, 3)), 0, 255).astype(np.uint8)
    coarse = rng.integers(0, 256, (n, 4, 4, 3)).astype(np.float32)
    rows, cols = np.linspace(0, 3, h).round().astype(int), np.linspace(0, 3, w).round().astype(int)
    noise = rng.normal(0, 20, (n, h, w, 3))
    return np.clip(coarse[:, rows][:, :, cols] + noise, 0, 255).astype(np.uint8)


# -- CIFAR and SVHN -----------------------------------------------------------------------------


def cifar_rows(images: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) -> (N, 3072): the 1024 red, then green, then blue values of each row."""
    return images.transpose(0, 3, 1, 2).reshape(len(images), 3072)


def dump_batch(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        pickle.dump(record, handle, protocol=2)


def write_cifar10(root: Path, per_batch: int, test_rows: int, seed: int = 0) -> None:
    """``root/cifar-10-batches-py/``: five training batches of ``per_batch`` rows, one test."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = test_rows if name == "test_batch" else per_batch
        labels = [int(v) for v in np.arange(n) % 10]
        record = {
            "batch_label": f"{name} of 5",
            "labels": labels,
            "data": cifar_rows(random_pixels(rng, n, (32, 32), np.asarray(labels))),
            "filenames": [f"img_{i}.png" for i in range(n)],
        }
        dump_batch(folder / name, record)
    dump_batch(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})


def write_cifar100(root: Path, train_rows: int, test_rows: int, seed: int = 1) -> None:
    """``root/cifar-100-python/``: ``train`` and ``test`` with fine and coarse labels."""
    rng = np.random.default_rng(seed)
    for name, n in (("train", train_rows), ("test", test_rows)):
        fine = [int(v) for v in np.arange(n) % 100]
        record = {
            "filenames": [f"img_{i}.png" for i in range(n)],
            "batch_label": f"{name} batch",
            "fine_labels": fine,
            "coarse_labels": [v // 5 for v in fine],
            "data": cifar_rows(random_pixels(rng, n, (32, 32))),
        }
        dump_batch(root / "cifar-100-python" / name, record)


def write_svhn(root: Path, split: str, rows: int, seed: int = 2) -> None:
    """``root/<split>_32x32.mat`` in SVHN's format 2."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    images = random_pixels(rng, rows, (32, 32))  # (N, 32, 32, 3)
    labels = (np.arange(rows) % 10 + 1).astype(np.uint8).reshape(-1, 1)  # 1..10, 10 is digit 0
    root.mkdir(parents=True, exist_ok=True)
    savemat(root / f"{split}_32x32.mat", {"X": images.transpose(1, 2, 3, 0), "y": labels})


# -- image folders and lists --------------------------------------------------------------------


def save_image(path: Path, pixels: np.ndarray, mode: str = "RGB") -> None:
    """One image file; ``mode`` "L" (grayscale) or "CMYK" as some real JPEGs are stored."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(pixels)
    image = image.convert(mode) if mode != "RGB" else image
    image.save(path, quality=90) if path.suffix.lower() in (".jpeg", ".jpg") else image.save(path)


def write_class_folders(
    folder: Path, wnids: list[str], per_class: int | list[int], sizes: list[tuple[int, int]],
    seed: int,
) -> None:  # fmt: skip
    """``folder/<wnid>/<n>.JPEG`` (``per_class`` images each, or a count per class), sizes
    cycling through ``sizes``; the first image of the first class is grayscale and the second
    CMYK, as a few of ILSVRC2012's are."""
    rng = np.random.default_rng(seed)
    counts = [per_class] * len(wnids) if isinstance(per_class, int) else per_class
    k = 0
    for c, (wnid, count) in enumerate(zip(wnids, counts, strict=True)):
        label = np.array([c])
        for _ in range(count):
            h, w = sizes[k % len(sizes)]
            mode = {0: "L", 1: "CMYK"}.get(k, "RGB")
            name = f"ILSVRC2012_val_{seed:02d}{k:06d}.JPEG"
            save_image(folder / wnid / name, random_pixels(rng, 1, (h, w), label)[0], mode)
            k += 1


def imagenet_wnids() -> list[str]:
    """The 1,000 ILSVRC2012 WordNet ids in sorted order, the class order of torchvision's
    ImageNet weights (the ids of ILSVRC2012's ``LOC_synset_mapping.txt``; read as text from the
    copy etn ships, not through etn's reader)."""
    text = (Path(__file__).resolve().parents[1] / "etn_cli/datasets/imagenet_wnids.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()[:1] == "n"]


def adapt_covering_sizes(classes: int, fraction: float = 0.2, seed: int = 0) -> list[int]:
    """Images per class such that the paper's split of the validation images (a permutation
    ``numpy.random.default_rng(seed).permutation(n)`` of the files in sorted order, its first
    ``round(fraction * n)`` positions adapt, the rest test) puts at least one image of every
    class into adapt, with about ``1 / fraction`` images per class: the real set's 50 per class
    do so by chance, a miniature with 5 per class would leave a third of the classes out. Each
    class takes the sorted positions up to and including its first adapt position (and two at
    least); the last takes the rest."""
    n = int(classes / fraction * 1.1)
    while True:
        adapt = np.zeros(n, dtype=bool)
        adapt[np.random.default_rng(seed).permutation(n)[: round(fraction * n)]] = True
        sizes, start = [], 0
        for position in range(n):
            if len(sizes) == classes - 1:
                break
            if adapt[start : position + 1].any() and position + 1 - start >= 2:
                sizes.append(position + 1 - start)
                start = position + 1
        if len(sizes) == classes - 1 and adapt[start:].any() and n - start >= 2:
            return sizes + [n - start]
        n += classes // 10


SMALL = [(36, 48), (48, 36), (40, 40), (30, 45)]  # (height, width): mixed, few pixels to decode


def write_imagenet(root: Path, seed: int = 3) -> tuple[Path, list[int]]:
    """``root/imagenet/val/`` with all 1,000 WordNet-id folders (:func:`adapt_covering_sizes`
    images each, small JPEGs of mixed sizes with a grayscale and a CMYK one), and
    ``imagenet-a/``, ``imagenet-r/``, ``imagenet-sketch/sketch/`` with two images in each of
    three classes, of the real sets' larger mixed sizes. Returns the validation folder and its
    class sizes."""
    wnids = imagenet_wnids()
    counts = adapt_covering_sizes(len(wnids))
    write_class_folders(root / "imagenet" / "val", wnids, counts, SMALL, seed)
    large = [(375, 500), (500, 333), (256, 256), (300, 400)]
    for i, name in enumerate(("imagenet-a", "imagenet-r", "imagenet-sketch/sketch")):
        write_class_folders(root / name, wnids[i::400][:3], 2, large, seed + 1 + i)
    return root / "imagenet" / "val", counts


def labelled_images(
    root: Path, listing: str, images: str
) -> tuple[tuple[Path, ...], tuple[int, ...]]:
    """The images and labels an OpenOOD list names, read as its format says."""
    lines = [line.rsplit(maxsplit=1) for line in (root / listing).read_text().splitlines()]
    return tuple(root / images / name for name, _ in lines), tuple(int(y) for _, y in lines)


def write_list(root: Path, listing: str, entries: list[tuple[str, int]]) -> None:
    path = root / listing
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name} {label}\n" for name, label in entries))


def write_openood(
    root: Path, benchmark: str, lists: dict[str, tuple[str, str, int | None]],
    sizes: dict[str, list[tuple[int, int]]], rows: dict[str, int], seed: int = 4,
    stride: dict[str, int] | None = None,
) -> None:  # fmt: skip
    """OpenOOD v1.5's layout for one benchmark: ``lists`` maps a split to (list file under
    ``benchmark_imglist/<benchmark>/``, image root, number of classes or None for OOD -1).
    Row ``i`` of a split is of class ``i * stride[split] mod classes`` (stride 1 by default);
    the small images of ``images_classic`` (CIFAR's, MNIST's) are PNGs, the others JPEGs."""
    rng = np.random.default_rng(seed)
    for split, (listing, images, classes) in lists.items():
        entries, step = [], (stride or {}).get(split, 1)
        for i in range(rows[split]):
            h, w = sizes[split][i % len(sizes[split])]
            png = images == "images_classic" and max(h, w) <= 64
            name = f"{split}/{split}_{i:05d}.{'png' if png else 'jpg'}"
            label = i * step % classes if classes else -1
            pixels = random_pixels(rng, 1, (h, w), np.array([label]) if classes else None)
            save_image(root / images / name, pixels[0])
            entries.append((name, label))
        write_list(root, f"benchmark_imglist/{benchmark}/{listing}", entries)


# -- multiple-choice questions ------------------------------------------------------------------


def questions(rng: np.random.Generator, n: int, prefix: str) -> list[dict]:
    words = ["the", "a", "which", "is", "of", "what", "answer", "question", "best"]
    out = []
    for i in range(n):
        stem = " ".join(rng.choice(words, 6)) + f" {prefix} {i}?"
        out.append(
            {"stem": stem, "options": [f"option {j} {i}" for j in range(4)], "answer": i % 4}
        )
    return out


def write_parquet(path: Path, records: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)


def write_race(folder: Path, rows: dict[str, int], seed: int = 5) -> None:
    """``ehovy/race`` as ``hf download --repo-type dataset --local-dir folder`` leaves it:
    ``all/<split>-00000-of-00001.parquet`` with example_id, article, answer, question, options."""
    rng = np.random.default_rng(seed)
    for split, n in rows.items():
        records = [
            {"example_id": f"{split}{i}.txt", "article": f"An article about thing {i}.",
             "answer": "ABCD"[q["answer"]], "question": q["stem"], "options": q["options"]}
            for i, q in enumerate(questions(rng, n, "race"))
        ]  # fmt: skip
        write_parquet(folder / "all" / f"{split}-00000-of-00001.parquet", records)


def write_mmlu(folder: Path, rows: int, seed: int = 6) -> None:
    """``cais/mmlu`` as ``hf download`` leaves it: ``<subject>/test-00000-of-00001.parquet``
    with question, subject, choices and an integer answer."""
    rng = np.random.default_rng(seed)
    for subject in MMLU_SUBJECTS:
        records = [
            {"question": q["stem"], "subject": subject, "choices": q["options"],
             "answer": q["answer"]}
            for q in questions(rng, rows, subject)
        ]  # fmt: skip
        write_parquet(folder / subject / "test-00000-of-00001.parquet", records)


def write_obqa_original(folder: Path, rows: dict[str, int], seed: int = 7) -> None:
    """OpenBookQA-V1-Sep2018's ``Data/Main/{train,dev,test}.jsonl`` copied into ``folder``:
    ``{"id", "question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}``."""
    import json

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in rows.items():
        lines = []
        for i, q in enumerate(questions(rng, n, "obqa")):
            choices = [{"text": t, "label": "ABCD"[j]} for j, t in enumerate(q["options"])]
            record = {"id": f"{split}-{i}", "question": {"stem": q["stem"], "choices": choices},
                      "answerKey": "ABCD"[q["answer"]]}  # fmt: skip
            lines.append(json.dumps(record) + "\n")
        (folder / f"{split}.jsonl").write_text("".join(lines))


# -- models -------------------------------------------------------------------------------------


def hub_cache_model(cache: Path, repo_id: str, folder: Path) -> Path:
    """Copy a saved model ``folder`` into the hub cache layout under ``cache``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def torchvision_checkpoint(
    path: Path, model: str, images: tuple[Path, ...] = (), labels: tuple[int, ...] = (),
    weights: str = "DEFAULT", size: int | None = None, seed: int = 0,
) -> Path:  # fmt: skip
    """Random weights of torchvision's ``model`` saved as its hub checkpoints are (a state dict
    of ``torch.save``). Given labelled ``images``, the final layer becomes their nearest class
    mean (features through ``weights``' own ``transforms()``, resized and cropped to ``size``
    when given, as the run's ``--set backbone.resize/crop`` do), scaled so that logits differ
    by tens, not millions: the random network classifies those images right, as the scorers
    that keep correctly classified rows of every class (SHE) need. Every other value stays
    random."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    net = torchvision.models.get_model(model, weights=None).eval()
    if images:
        chosen = torchvision.models.get_model_weights(model)[weights]
        sizes = {} if size is None else {"resize_size": size, "crop_size": size}
        preprocess = chosen.transforms(**sizes)
        head = net.fc
        net.fc = torch.nn.Identity()
        with torch.no_grad():
            features = torch.cat(
                [
                    net(torch.stack([preprocess(Image.open(f).convert("RGB")) for f in part]))
                    for part in (images[i : i + 256] for i in range(0, len(images), 256))
                ]
            )  # (N, D)
            y = torch.tensor(labels)
            classes = y.unique()
            means = torch.stack([features[y == c].mean(0) for c in classes])  # (K, D)
            gaps = torch.cdist(means, means).pow(2)  # (K, K)
            scale = 20 / gaps[gaps > 0].median()
            head.weight[classes] = scale * means
            head.bias[classes] = -0.5 * scale * means.pow(2).sum(1)
        net.fc = head
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), path)
    return path
