"""Image preprocessing and batching for the image backbones.

:class:`ImageTransform` applies, in order: resize (shorter side to ``resize``), center crop to
``crop``, conversion to float in [0, 1], and normalisation ``(x - mean) / std`` per channel.
With torchvision weights its settings are read from the weights' own ``transforms()`` (e.g.
ResNet50 ``IMAGENET1K_V2``: resize 232, crop 224, bilinear, ImageNet mean / std), and the
result is identical to theirs. Otherwise the default is no resize, no crop and ImageNet's
mean / std; each of ``resize``, ``crop``, ``mean``, ``std`` and ``interpolation`` in the
backbone's options overrides its part (``resize = 0`` / ``crop = 0``: none).

The loader runs the first three per image in its worker processes (:meth:`ImageTransform.pixels`:
a decoded image stays uint8, a quarter of float32's bytes to copy between processes and to the
GPU) and the backbone runs the last two on whole batches on its device
(:meth:`ImageTransform.normalize`), as timm's prefetching loader and DALI do. The values are
the same as one per-image transform's, bit for bit: the same elementwise operations in the same
order (``tests/test_vision.py``).

:class:`LibraryTransform` gives the same two steps to preprocessing a library defines for its
models (timm's ``create_transform``, a Hugging Face image processor), which etn calls as it is
rather than re-reading its settings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from etn_cli.errors import EtnError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class TransformSpec:
    """Everything the preprocessing does; part of the backbone's fingerprint."""

    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bilinear"
    antialias: bool = True
    source: str = "etn default"

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def spec_from_weights(transform: Any, name: str) -> TransformSpec:
    """Read torchvision's ``ImageClassification`` preset (``weights.transforms()``)."""
    (resize,) = transform.resize_size
    (crop,) = transform.crop_size
    return TransformSpec(
        resize=int(resize),
        crop=int(crop),
        mean=tuple(float(m) for m in transform.mean),
        std=tuple(float(s) for s in transform.std),
        interpolation=transform.interpolation.value,
        antialias=bool(transform.antialias),
        source=f"{name}.transforms()",
    )


def override(spec: TransformSpec, **options: Any) -> TransformSpec:
    """``spec`` with every option that is not None replaced (``0`` turns resize / crop off)."""
    changes = {k: v for k, v in options.items() if v is not None}
    for key in ("resize", "crop"):
        if changes.get(key) == 0:
            changes[key] = None
    if not changes:
        return spec
    values = asdict(spec) | changes | {"source": f"{spec.source} with {sorted(changes)} set"}
    new = TransformSpec(**values)
    if len(new.mean) != 3 or len(new.std) != 3 or min(new.std) <= 0:
        raise EtnError(
            f"mean and std expect three values (R, G, B) with std > 0, found {new.mean} and "
            f"{new.std}. Fix them in the pipeline's [backbone] table."
        )
    return new


class ImageTransform:
    """PIL image (or uint8 / float CHW tensor) -> normalised float tensor (3, H, W), in two
    steps: :meth:`pixels` per image, :meth:`normalize` per batch on any device."""

    def __init__(self, spec: TransformSpec) -> None:
        self.spec = spec

    def __call__(self, image: Any) -> torch.Tensor:
        return self.normalize(self.pixels(image))  # (3, H, W)

    def pixels(self, image: Any) -> torch.Tensor:
        """Resized and cropped, as a (3, H, W) tensor of the image's own type: uint8 for PIL
        images and uint8 tensors, float (in [0, 1]) for float tensors."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        s = self.spec
        if hasattr(image, "convert") and getattr(image, "mode", "RGB") != "RGB":
            image = image.convert("RGB")
        if s.resize:
            mode = InterpolationMode(s.interpolation)
            image = F.resize(image, [s.resize], interpolation=mode, antialias=s.antialias)
        if s.crop:
            image = F.center_crop(image, [s.crop])
        if not isinstance(image, torch.Tensor):
            image = F.pil_to_tensor(image)
        return image

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) :meth:`pixels` gives an image of this size (torchvision's rule:
        the shorter side resized, the longer in proportion, then the centre crop)."""
        s = self.spec
        if s.crop:
            return s.crop, s.crop
        if s.resize:
            short, long = sorted((width, height))
            resized = (s.resize, int(s.resize * long / short))
            return resized if width <= height else resized[::-1]
        return width, height

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """(..., 3, H, W) pixels -> float32 in [0, 1] -> ``(x - mean) / std`` per channel."""
        from torchvision.transforms import functional as F

        x = F.convert_image_dtype(pixels, torch.float)
        return F.normalize(x, mean=list(self.spec.mean), std=list(self.spec.std))

    def std(self) -> torch.Tensor:
        return torch.tensor(self.spec.std).view(1, -1, 1, 1)  # (1, 3, 1, 1)


class LibraryTransform:
    """A library's own preprocessing behind :class:`ImageTransform`'s interface: ``steps``
    turns an image into a (3, H, W) tensor, uint8 pixels that :meth:`normalize` scales to
    [0, 1] and normalises with ``mean`` / ``std`` on the batch's device (timm's prefetcher
    path), or, with ``normalized``, the model's finished input (a Hugging Face processor).
    ``size`` is the fixed (width, height) of every output, or None: probed per input size."""

    def __init__(
        self,
        steps: Callable[[Any], Any],
        record: dict[str, Any],
        mean: tuple[float, ...],
        std: tuple[float, ...],
        size: tuple[int, int] | None = None,
        normalized: bool = False,
    ) -> None:
        self.steps, self.record, self.size, self.normalized = steps, record, size, normalized
        self.mean, self.stds = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    def __call__(self, image: Any) -> torch.Tensor:
        return self.normalize(self.pixels(image))  # (3, H, W)

    def describe(self) -> dict[str, Any]:
        return self.record

    def pixels(self, image: Any) -> torch.Tensor:
        if hasattr(image, "convert") and getattr(image, "mode", "RGB") != "RGB":
            image = image.convert("RGB")
        out = self.steps(image)
        return torch.from_numpy(np.ascontiguousarray(out)) if isinstance(out, np.ndarray) else out

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.normalized:
            return pixels.float()
        from torchvision.transforms import functional as F

        x = F.convert_image_dtype(pixels, torch.float)
        return F.normalize(x, mean=list(self.mean), std=list(self.stds))

    def std(self) -> torch.Tensor:
        return torch.tensor(self.stds).view(1, -1, 1, 1)  # (1, 3, 1, 1)

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) of :meth:`pixels` for an image of this size."""
        return self.size or self._probed(width, height)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one transform per process
    def _probed(self, width: int, height: int) -> tuple[int, int]:
        from PIL import Image

        shape = self.pixels(Image.new("RGB", (width, height))).shape  # (3, H, W)
        return int(shape[-1]), int(shape[-2])


class TransformedImages(Dataset):
    """``(pixels, label, index)`` of a split (:meth:`ImageTransform.pixels`, not yet
    normalised): the index travels with its sample."""

    def __init__(self, data: Dataset, index: np.ndarray, transform: Any) -> None:
        self.data, self.index, self.transform = data, index, transform

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        image, label = self.data[i]
        return self.transform.pixels(image), int(label), int(self.index[i])


def collate_images(
    items: list[tuple[torch.Tensor, int, int]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack ``(inputs (B, 3, H, W), labels (B,), index (B,))``; unequal sizes raise. Images
    of one type stay in it (uint8 pixels stay uint8); a mix becomes float in [0, 1]."""
    sizes = sorted({tuple(image.shape) for image, _, _ in items})
    if len(sizes) > 1:
        raise EtnError(
            f"Images of one batch have the sizes {sizes[:3]}; the model needs one size. Set "
            "crop = N (and resize) in the pipeline's [backbone] table."
        )
    images = [image for image, _, _ in items]
    if len({image.dtype for image in images}) > 1:
        from torchvision.transforms.functional import convert_image_dtype

        images = [convert_image_dtype(image, torch.float) for image in images]
    inputs = torch.stack(images)
    labels = torch.tensor([label for _, label, _ in items], dtype=torch.int64)
    index = torch.tensor([i for _, _, i in items], dtype=torch.int64)
    return inputs, labels, index
