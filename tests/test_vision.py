"""The torchvision backbone and the image datasets, offline on the CPU: FakeData, small randomly
initialised torchvision models, tiny folders of images written to ``tmp_path``."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from safetensors.torch import save_file

from etn_cli.backbones import backbones
from etn_cli.backbones.image_inputs import ImageTransform, collate_images, spec_from_weights
from etn_cli.backbones.torchvision_model import Config, TorchvisionBackbone
from etn_cli.backbones.torchvision_weights import forced_weights_only
from etn_cli.datasets import datasets
from etn_cli.datasets.imagenet import imagenet_wnids
from etn_cli.datasets.vision import CIFAR10_FRACTIONS
from etn_cli.errors import EtnError
from etn_cli.stages.shard_sink import BackgroundAppender

CLASSES = 4


def make(tmp: Path, model: str = "resnet18", **options) -> TorchvisionBackbone:
    options = {"weights": "none", "num_classes": CLASSES} | options
    return TorchvisionBackbone(Config(model=model, **options), tmp)


def fake(split: str = "test", size: int = 6, image_size: int = 32):
    source = datasets.get("fake")(size=size, image_size=image_size, num_classes=CLASSES)
    return source.load_split(split)


def first_batch(backbone: TorchvisionBackbone, split, batch_size: int = 6):
    return next(iter(backbone.loader(split, batch_size)))


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> TorchvisionBackbone:
    return make(tmp_path_factory.mktemp("cache"), layers=("layer1", "layer4", "avgpool"))


@pytest.mark.parametrize(
    ("model", "head", "width"), [("resnet18", "fc", 512), ("vgg11_bn", "classifier.6", 4096)]
)
def test_logits_are_the_classifier_applied_to_the_hidden_state(tmp_path, model, head, width):
    backbone = make(tmp_path, model)
    inputs, _, _ = first_batch(backbone, fake(size=3), 3)
    hidden, logits, _ = backbone.extract_batch(inputs)
    weights = backbone.classifier()
    assert backbone.head_name == head  # the last nn.Linear: fc, or the end of a Sequential
    assert hidden.shape == (3, width) and logits.shape == (3, CLASSES)
    torch.testing.assert_close(hidden @ weights["weight"].T + weights["bias"], logits)
    with torch.no_grad():
        torch.testing.assert_close(backbone.model(backbone.prepare(inputs)), logits)  # own output


def test_batched_extraction_equals_one_sample_at_a_time(resnet: TorchvisionBackbone) -> None:
    split = fake(size=5)
    batched = [torch.cat(parts) for parts in zip(*resnet.loader(split, 5), strict=True)]
    single = [torch.cat(parts) for parts in zip(*resnet.loader(split, 1), strict=True)]
    for a, b in zip(batched, single, strict=True):
        torch.testing.assert_close(a, b)
    hidden, logits, extras = resnet.extract_batch(batched[0])
    for i in range(5):
        h, z, e = resnet.extract_batch(batched[0][i : i + 1])
        torch.testing.assert_close(h, hidden[i : i + 1], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(z, logits[i : i + 1], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(e["layer4"], extras["layer4"][i : i + 1], atol=1e-5, rtol=1e-4)


def test_loader_keeps_split_order_labels_and_index(resnet: TorchvisionBackbone) -> None:
    split = fake(size=5)
    _, labels, index = (torch.cat(p) for p in zip(*resnet.loader(split, 2), strict=True))
    assert index.tolist() == list(range(5))
    assert labels.tolist() == [split.data[i][1] for i in range(5)]


def test_layers_are_pooled_over_height_and_width(resnet: TorchvisionBackbone) -> None:
    inputs, _, _ = first_batch(resnet, fake(size=2), 2)
    hidden, _, extras = resnet.extract_batch(inputs)
    assert {k: tuple(v.shape) for k, v in extras.items()} == {
        "layer1": (2, 64),
        "layer4": (2, 512),
        "avgpool": (2, 512),
    }
    # a ResNet's hidden state is the spatial mean of layer4, which avgpool outputs as 4-D
    torch.testing.assert_close(extras["layer4"], hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(extras["avgpool"], hidden)
    with torch.no_grad():
        x = resnet.prepare(inputs)
        stem = resnet.model.maxpool(resnet.model.relu(resnet.model.bn1(resnet.model.conv1(x))))
        torch.testing.assert_close(extras["layer1"], resnet.model.layer1(stem).mean(dim=(2, 3)))


def test_an_unknown_layer_names_the_valid_ones_while_planning(tmp_path: Path) -> None:
    with pytest.raises(EtnError, match=r"Unknown layer\(s\) \['layer9'\].*layer1.*layer4"):
        make(tmp_path, layers=("layer9",))
    with pytest.raises(EtnError, match="classifier_layer = 'layer4' names Sequential"):
        make(tmp_path, classifier_layer="layer4")


def test_odin_logits_equal_an_independent_autograd_computation(tmp_path: Path) -> None:
    t, eps = 10.0, 0.05
    backbone = make(tmp_path, odin=True, odin_temperature=t, odin_epsilon=eps)
    inputs, _, _ = first_batch(backbone, fake(size=4), 4)
    _, logits, extras = backbone.extract_batch(inputs)

    model = torchvision.models.resnet18(num_classes=CLASSES).eval()
    model.load_state_dict(backbone.model.state_dict())
    x = backbone.prepare(inputs).clone().requires_grad_(True)
    scaled = model(x) / t
    loss = F.cross_entropy(scaled, scaled.argmax(1), reduction="sum")  # -sum log S_yhat
    (grad,) = torch.autograd.grad(loss, x)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = model(x - eps * grad.sign() / std) / t
    torch.testing.assert_close(extras["odin"], expected)
    assert not torch.allclose(extras["odin"], logits / t)  # the perturbation did something


def save_resnet(path: Path, fmt: str) -> torch.nn.Module:
    torch.manual_seed(3)
    model = torchvision.models.resnet18(num_classes=CLASSES).eval()
    state = model.state_dict()
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    elif fmt == "state_dict":
        torch.save(state, path)
    elif fmt == "wrapped":
        torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, path)
    return model


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("safetensors", "m.safetensors"), ("state_dict", "m.pt"), ("wrapped", "m.pth")],
)
def test_local_checkpoints_load_and_set_the_classes(tmp_path: Path, fmt: str, name: str) -> None:
    reference = save_resnet(tmp_path / name, fmt)
    backbone = TorchvisionBackbone(
        Config(model="resnet18", weights=str(tmp_path / name)), tmp_path
    )  # num_classes read from the checkpoint
    inputs, _, _ = first_batch(backbone, fake(size=2), 2)
    _, logits, _ = backbone.extract_batch(inputs)
    with torch.no_grad():
        torch.testing.assert_close(logits, reference(backbone.prepare(inputs)))
    assert backbone.fingerprint()["weights"]["sha256"] != make(tmp_path).fingerprint()["weights"]


def test_a_pickled_model_is_refused(tmp_path: Path) -> None:
    torch.save(torchvision.models.resnet18(num_classes=CLASSES), tmp_path / "model.pt")
    backbone = make(tmp_path, weights=str(tmp_path / "model.pt"))
    with pytest.raises(EtnError, match=r"weights_only=True.*state_dict") as error:
        backbone.extract_batch(torch.zeros(1, 3, 32, 32))
    assert "\n" not in str(error.value)


def test_a_checkpoint_of_another_shape_names_the_model_and_num_classes(tmp_path: Path) -> None:
    save_resnet(tmp_path / "m.safetensors", "safetensors")
    backbone = make(tmp_path, weights=str(tmp_path / "m.safetensors"), num_classes=7)
    with pytest.raises(EtnError, match="does not fit the model.*num_classes"):
        backbone.extract_batch(torch.zeros(1, 3, 32, 32))


def test_missing_hub_weights_name_the_file_and_how_to_get_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(EtnError) as error:
        TorchvisionBackbone(Config(model="resnet18", weights="IMAGENET1K_V1"), tmp_path)
    expected = tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert str(expected) in str(error.value) and "download = true" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_corrupt_hub_file_is_caught_by_the_hash_in_its_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save(torchvision.models.resnet18().state_dict(), folder / "resnet18-f37072fd.pth")
    backbone = TorchvisionBackbone(Config(model="resnet18", weights="IMAGENET1K_V1"), tmp_path)
    assert backbone.fingerprint()["weights"]["weights"] == "ResNet18_Weights.IMAGENET1K_V1"
    with pytest.raises(EtnError, match="incomplete or corrupt"):
        backbone.extract_batch(torch.zeros(1, 3, 224, 224))


def test_hub_weights_are_unpickled_with_the_safe_loader_only(tmp_path: Path) -> None:
    """torchvision's builders call torch.load(weights_only=False); etn forces the safe one."""
    torch.save(torchvision.models.resnet18(num_classes=CLASSES), tmp_path / "model.pth")
    with forced_weights_only(), pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "model.pth", weights_only=False)
    assert isinstance(torch.load(tmp_path / "model.pth", weights_only=False), torch.nn.Module)


def test_bad_model_and_weights_names_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(EtnError, match="Did you mean: resnet18"):
        make(tmp_path, model="resnet19")
    with pytest.raises(EtnError, match="IMAGENET1K_V1.*'none'"):
        make(tmp_path, weights="IMAGENET_V9")


def test_preprocessing_from_weights_equals_torchvisions_own_transforms() -> None:
    weights = torchvision.models.ResNet50_Weights.IMAGENET1K_V2
    ours = ImageTransform(spec_from_weights(weights.transforms(), str(weights)))
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (300, 260, 3), dtype=np.uint8))
    expected = weights.transforms()(image)
    assert ours(image).shape == (3, 224, 224)
    torch.testing.assert_close(ours(image), expected)


def test_the_loader_gives_uint8_pixels_normalised_on_the_device_as_one_transform(
    tmp_path: Path,
) -> None:
    backbone, split = make(tmp_path, resize=40, crop=36), fake(size=5)
    pixels, _, index = first_batch(backbone, split, 5)
    assert pixels.dtype == torch.uint8 and pixels.shape == (5, 3, 36, 36)  # a quarter the bytes
    per_image = torch.stack([backbone.transform(split.data[i][0]) for i in range(len(index))])
    assert torch.equal(backbone.prepare(pixels), per_image)  # bit for bit
    floats = [(backbone.transform.pixels(split.data[0][0]).float() / 255, 0, 0)]
    mixed, _, _ = collate_images(floats + [(pixels[1], 0, 1)])  # float and uint8 images
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(backbone.prepare(mixed)[1], per_image[1])


def test_transform_options_override_and_enter_the_fingerprint(tmp_path: Path) -> None:
    plain, resized = make(tmp_path), make(tmp_path, resize=40, crop=36)
    assert resized.transform(fake(size=1).data[0][0]).shape == (3, 36, 36)
    assert plain.fingerprint()["transform"] != resized.fingerprint()["transform"]


def test_random_initialisation_is_seeded(tmp_path: Path) -> None:
    inputs = torch.randn(2, 3, 32, 32)
    a, b, c = make(tmp_path), make(tmp_path), make(tmp_path, seed=1)
    torch.testing.assert_close(a.extract_batch(inputs)[1], b.extract_batch(inputs)[1])
    assert not torch.allclose(a.extract_batch(inputs)[1], c.extract_batch(inputs)[1])


def test_fake_splits_are_deterministic_and_distinct() -> None:
    first, again, other = fake("adapt"), fake("adapt"), fake("test")
    assert np.array_equal(np.asarray(first.data[0][0]), np.asarray(again.data[0][0]))
    assert not np.array_equal(np.asarray(first.data[0][0]), np.asarray(other.data[0][0]))
    assert first.fingerprint != other.fingerprint and first.num_classes == CLASSES


def test_cifar10_train_split_is_95_5_seeded_and_disjoint(tmp_path: Path) -> None:
    cifar = datasets.get("cifar10")(root=str(tmp_path))
    train, adapt = cifar.rows("train"), cifar.rows("adapt")
    assert (len(train), len(adapt)) == (47500, 2500)
    assert not set(train) & set(adapt) and len(set(train) | set(adapt)) == 50000
    assert np.array_equal(adapt, datasets.get("cifar10")(root=str(tmp_path)).rows("adapt"))
    assert not np.array_equal(adapt, datasets.get("cifar10")(root="x", seed=1).rows("adapt"))
    fp = cifar.fingerprint("adapt")
    assert fp["split_seed"] == 0 and fp["split_fractions"] == CIFAR10_FRACTIONS
    assert fp["rows"] == 2500 and "split_seed" not in cifar.fingerprint("test")


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("cifar10", "cifar-10-batches-py/test_batch"),
        ("cifar100", "cifar-100-python/test"),
        ("svhn", "test_32x32.mat"),
    ],
)
def test_missing_files_are_a_one_line_error_naming_the_path(tmp_path, name, path) -> None:
    with pytest.raises(EtnError) as error:
        datasets.get(name)(root=str(tmp_path)).load_split("test")
    message = str(error.value)
    assert str(tmp_path / path) in message and "download = true" in message
    assert "\n" not in message


def test_a_file_dataset_without_root_asks_for_one() -> None:
    with pytest.raises(EtnError, match=r"\[data\] root"):
        datasets.get("imagenet_r")().split_fingerprint("test")


def test_unknown_dataset_options_are_refused() -> None:
    with pytest.raises(EtnError, match="Unknown key 'dowload'.*download"):
        datasets.get("cifar10")(root="x", dowload=True)


def test_imagenet_wnid_list_has_the_1000_ids_in_index_order() -> None:
    wnids = imagenet_wnids()
    assert len(wnids) == 1000 and len(set(wnids)) == 1000
    assert wnids[0] == "n01440764" and wnids[-1] == "n15075141"
    assert list(wnids) == sorted(wnids)
    assert all(w.startswith("n") and len(w) == 9 and w[1:].isdigit() for w in wnids)


def write_images(folder: Path, names: dict[str, int]) -> None:
    """``names`` maps "wnid/file" to a pixel value; images of varied sizes and modes."""
    for i, (name, value) in enumerate(names.items()):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        mode = "L" if i % 2 else "RGB"
        Image.new(mode, (20 + i, 18), value).save(folder / name)
    (folder / "README.txt").write_text("not an image")


def test_imagenet_folders_map_wordnet_ids_into_the_1000_classes(tmp_path: Path) -> None:
    images = {"n15075141/b.png": 9, "n01440764/a.JPEG": 200, "n01443537/c.jpg": 40}
    write_images(tmp_path / "imagenet-r", images)
    split = datasets.get("imagenet_r")(root=str(tmp_path)).load_split("test")
    labels = [split.data[i][1] for i in range(len(split))]
    assert labels == [0, 1, 999] and split.index.tolist() == [0, 1, 2]
    assert split.data[1][0].mode == "RGB" and split.num_classes == 1000
    backbone = make(tmp_path, resize=16, crop=16)
    inputs, batch_labels, _ = first_batch(backbone, split, 3)
    assert inputs.shape == (3, 3, 16, 16) and batch_labels.tolist() == [0, 1, 999]


def test_imagenet_validation_is_split_20_80_seeded_and_disjoint(tmp_path: Path) -> None:
    images = {f"{w}/{i}.JPEG": i for i, w in enumerate(imagenet_wnids()[:10])}
    write_images(tmp_path / "imagenet" / "val", images)
    source = datasets.get("imagenet")(root=str(tmp_path))
    adapt, test = source.load_split("adapt"), source.load_split("test")
    assert (len(adapt), len(test)) == (2, 8)
    assert sorted([*adapt.index, *test.index]) == list(range(10))
    labels = {int(i): adapt.data[k][1] for k, i in enumerate(adapt.index)}
    assert all(label == index for index, label in labels.items())  # one image per class here
    assert adapt.fingerprint["split_seed"] == 0 and adapt.fingerprint != test.fingerprint


def test_image_folder_errors_name_the_folder(tmp_path: Path) -> None:
    with pytest.raises(EtnError, match=f"{tmp_path / 'imagenet-a'}.*no such folder"):
        datasets.get("imagenet_a")(root=str(tmp_path)).split_fingerprint("test")
    write_images(tmp_path / "imagenet-a", {"cats/a.png": 1})
    with pytest.raises(EtnError, match="not ImageNet WordNet ids: cats"):
        datasets.get("imagenet_a")(root=str(tmp_path)).split_fingerprint("test")


def test_images_of_different_sizes_without_crop_are_a_clear_error(tmp_path: Path) -> None:
    write_images(tmp_path / "imagenet-a", {"n01440764/a.png": 1, "n01443537/b.png": 2})
    split = datasets.get("imagenet_a")(root=str(tmp_path)).load_split("test")
    with pytest.raises(EtnError, match="crop = N"):
        first_batch(make(tmp_path), split, 2)


def test_the_background_writer_reraises_its_error_in_the_main_thread() -> None:
    written = []

    def append(value: int) -> None:
        if value == 3:
            raise ValueError("disk full")
        written.append(value)

    with pytest.raises(ValueError, match="disk full"), BackgroundAppender(append, 2) as sink:
        for value in range(50):
            sink.put(value)
    assert written == [0, 1, 2]


def test_the_background_writer_writes_everything_in_order() -> None:
    written = []
    with BackgroundAppender(written.append, 2) as sink:
        for value in range(20):
            sink.put(value)
    assert written == list(range(20))


def test_ls_lists_the_vision_backbone_and_datasets() -> None:
    from typer.testing import CliRunner

    from etn_cli.cli.app import app

    assert "torchvision" in CliRunner().invoke(app, ["ls", "backbones"]).output.split()
    names = set(CliRunner().invoke(app, ["ls", "datasets"]).output.split())
    assert {"cifar10", "cifar100", "svhn", "fake", "imagenet", "imagenet_a"} <= names
    assert {"imagenet_r", "imagenet_sketch"} <= names and "torchvision" in backbones


def test_cifar_and_svhn_files_read_as_torchvisions_readers_read_them(tmp_path, monkeypatch):
    """etn's own reader of the published formats (torchvision's refuses any file but the
    release, by md5) gives torchvision's images and labels, row for row, on real-format bytes
    built from the format descriptions; the row count is the files'."""
    from torchvision.datasets import CIFAR10, CIFAR100, SVHN

    from tests import rehearsal_data as rd

    rd.write_cifar10(tmp_path, per_batch=7, test_rows=5)
    rd.write_cifar100(tmp_path, train_rows=6, test_rows=4)
    rd.write_svhn(tmp_path, "test", rows=6)
    monkeypatch.setattr(CIFAR10, "_check_integrity", lambda self: True)  # a miniature, not
    monkeypatch.setattr(CIFAR10, "_load_meta", lambda self: None)  # the release's md5
    monkeypatch.setattr(SVHN, "_check_integrity", lambda self: True)
    cases = [
        ("cifar10", "test", CIFAR10(str(tmp_path), train=False)),
        ("cifar100", "train", CIFAR100(str(tmp_path), train=True)),
        ("svhn", "test", SVHN(str(tmp_path), split="test")),
    ]
    for name, split, theirs in cases:
        ours = datasets.get(name)(root=str(tmp_path)).load_split(split)
        assert len(ours) == len(theirs)
        for (image, label), (expected, expected_label) in zip(ours.data, theirs, strict=True):
            assert np.array_equal(np.asarray(image), np.asarray(expected))
            assert label == expected_label
    cifar = datasets.get("cifar10")(root=str(tmp_path))
    train, adapt = cifar.rows("train"), cifar.rows("adapt")
    assert len(train) + len(adapt) == 35 and len(adapt) == round(0.05 * 35)
    test_batch = (tmp_path / "cifar-10-batches-py" / "test_batch").read_bytes()
    assert cifar.fingerprint("test")["files_md5"] == [hashlib.md5(test_batch).hexdigest()]


def test_a_checkpoint_beside_weights_takes_their_transforms_and_its_own_values(tmp_path):
    """``weights = "IMAGENET1K_V1"`` with ``checkpoint``: the weights' architecture and
    preprocessing, the checkpoint's values (a local copy of the hub file is one setting)."""
    reference = save_resnet(tmp_path / "m.pt", "state_dict")
    config = Config(model="resnet18", weights="IMAGENET1K_V1", checkpoint=str(tmp_path / "m.pt"))
    backbone = TorchvisionBackbone(config, tmp_path)
    spec = backbone.transform.spec
    assert (spec.resize, spec.crop, spec.source) == (
        256,
        224,
        "ResNet18_Weights.IMAGENET1K_V1.transforms()",
    )
    inputs = torch.rand(1, 3, 64, 64)  # any size: the values are what is checked
    _, logits, _ = backbone.extract_batch(inputs)
    with torch.no_grad():
        torch.testing.assert_close(logits, reference(backbone.prepare(inputs)))
    other = Config(
        model="resnet18", weights=str(tmp_path / "m.pt"), checkpoint=str(tmp_path / "m.pt")
    )
    with pytest.raises(EtnError, match="not both.*torchvision weights of resnet18"):
        TorchvisionBackbone(other, tmp_path)
