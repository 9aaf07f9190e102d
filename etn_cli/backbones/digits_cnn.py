"""``digits_cnn``: the small CNN that plays the "pretrained" backbone of the offline default.

Trained with cross-entropy on the ``digits`` train split by stage zero of ``etn extract`` (the unit
driver builds :meth:`DigitsCNNBackbone.build_cache` once, as ``etn finetune`` builds a fine-tuned
backbone), then cached as safetensors in ``cache_dir/digits_cnn-<key>/``; the key hashes the
config, the train split's fingerprint and :data:`CODE_VERSION`. ``meta.json`` records the weights'
sha256 (and is sealed by its own); planning reads it for the fingerprint and builds nothing, and
the weights are checked against it when the model is loaded, at first use. Training is seeded,
single-threaded and deterministic, and runs in float64; the weights are then rounded to float32.
Processors differ in the last bits of their float kernels, which a float32 training run compounds
over its 240 steps (one thread against two, as a stand-in for another processor: weights 1.5e-6
apart, and README tables that moved by tenths of a point between machines); in float64 such
differences stay far below float32's resolution (one and two threads: bitwise-identical rounded
weights), and the features are computed in float64 from those weights and rounded the same way. The
hidden state is the input of the final linear layer, hence ``logits == hidden @ W.T + b``.

Two extract-time options add per-sample arrays to the shards (``Backbone.extract_batch``):
``layers`` stores the outputs of named modules, pooled, for the Dirichlet meta-model, and
``odin`` stores ODIN's logits at the perturbed input (Liang et al. 2018). Neither changes the
trained weights, so neither enters the weights' cache key; both enter the fingerprint.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import nn
from torch.utils.data import DataLoader

from etn_cli.backbones.base import Backbone, backbones
from etn_cli.backbones.digits_recipe import (
    CODE_VERSION,
    META_FILE,
    NOT_BUILT,
    WEIGHTS_FILE,
    cache_key,
    check_layers,
    digits_fingerprint,
    recorded_sha256,
)
from etn_cli.backbones.settings import DigitsCNNConfig as Config
from etn_cli.backbones.torchvision_hooks import named_layers, pool
from etn_cli.datasets.base import Split
from etn_cli.datasets.digits import ID_CLASSES, Digits
from etn_cli.errors import DamagedArtefact, EtnError


class DigitsCNN(nn.Module):
    """conv-ReLU-conv-ReLU-pool, then a hidden layer, dropout and the linear classifier."""

    def __init__(self, config: Config, num_classes: int) -> None:
        super().__init__()
        c = config.channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c, c, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c * 4 * 4, config.hidden),
            nn.ReLU(),
        )
        self.dropout = nn.Dropout(config.dropout)  # kept by name for an MC-dropout baseline
        self.classifier = nn.Linear(config.hidden, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.features(x))  # (B, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.forward_features(x))  # (B, C)


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """Seed, one thread and deterministic kernels inside; the caller's RNG and settings after."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)  # a fixed reduction order, whatever the machine's core count
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(previous[0], warn_only=warn_only)
            torch.set_num_threads(previous[1])


@torch.inference_mode()
def accuracy(model: nn.Module, split: Split) -> float:
    inputs, labels = split.data.tensors  # (N, 1, 8, 8), (N,)
    logits = model.eval()(inputs.to(next(model.parameters()).dtype))  # (N, C)
    return (logits.argmax(dim=1) == labels).float().mean().item()


def train_model(config: Config, train: Split) -> DigitsCNN:
    """Cross-entropy training with Adam from a seeded initialisation and a seeded data order,
    in float64; the weights are returned rounded to float32 (see the module docstring)."""
    with deterministic(config.seed):
        model = DigitsCNN(config, len(ID_CLASSES)).double()
        order = torch.Generator().manual_seed(config.seed)
        loader = DataLoader(train.data, batch_size=config.batch_size, shuffle=True, generator=order)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        model.train()
        for _ in range(config.epochs):
            for inputs, labels in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(inputs.double()), labels).backward()
                optimizer.step()
    return model.float().eval()


def train_and_save(config: Config, train: Split, test: Split, folder: Path) -> dict[str, Any]:
    """Train, write the weights into ``folder`` (a private folder the unit driver seals and
    renames into place) and return what ``meta.json`` records about them."""
    started = time.perf_counter()
    model = train_model(config, train)
    (folder / WEIGHTS_FILE).write_bytes(save(model.state_dict()))  # a full disk: an OSError
    return {
        "config": config.training(),
        "train_fingerprint": train.fingerprint,
        "train_accuracy": accuracy(model, train),
        "test_accuracy": accuracy(model, test),
        "train_seconds": round(time.perf_counter() - started, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch_version": torch.__version__,
        "code_version": CODE_VERSION,
    }


@contextlib.contextmanager
def pooled_outputs(modules: dict[str, nn.Module]) -> Iterator[dict[str, torch.Tensor]]:
    """Forward hooks that store each module's pooled output (float32, CPU) into the yielded
    dict while the block runs; the hooks are removed afterwards."""
    outputs: dict[str, torch.Tensor] = {}

    def hook_for(name: str):
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            # pool now: a later in-place operation cannot alter the stored values
            outputs[name] = pool(output, name).float().cpu().clone()

        return hook

    handles = [m.register_forward_hook(hook_for(name)) for name, m in modules.items()]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


@backbones.register("digits_cnn")
class DigitsCNNBackbone(Backbone):
    """The digits CNN behind the backbone interface; builds its weights once per cache key."""

    name = "digits_cnn"
    Config = Config

    def __init__(self, config: Config | None, cache_dir: Path, device: str = "cpu") -> None:
        super().__init__(config if config is not None else Config(), cache_dir, device)
        check_layers(self.config.layers)  # a misspelt layer: refused while planning
        self.folder = self.cache_dir / f"{self.name}-{cache_key(self.config)}"
        self.weights_sha256 = NOT_BUILT
        self._model: DigitsCNN | None = None
        self._layers: dict[str, nn.Module] | None = None

    def cache_folder(self) -> Path:
        return self.folder

    def build_cache(self, folder: Path) -> dict[str, Any]:
        """Train the CNN on the digits ``train`` split into ``folder`` (the unit driver seals
        it with ``meta.json`` and renames it into place)."""
        digits = Digits()
        return train_and_save(
            self.config, digits.load_split("train"), digits.load_split("test"), folder
        )

    def use_cache(self, record: dict[str, Any] | None) -> None:
        """The weights' sha256 that ``meta.json`` records (an older etn's, listing none: the
        file's own), or "not built"; the model is loaded from them at first use."""
        self.weights_sha256 = recorded_sha256(self.folder, record)
        self._model, self._layers = None, None

    @property
    def model(self) -> DigitsCNN:
        """The network, loaded at first use from the weights whose sha256 planning read, on
        the CPU until the first forward pass (:meth:`on_device`)."""
        if self._model is None:
            self._model = self.load()
        return self._model

    @property
    def layer_modules(self) -> dict[str, nn.Module]:
        if self._layers is None:
            self._layers = named_layers(self.model, self.config.layers)
        return self._layers

    def load(self) -> DigitsCNN:
        """The CNN with the weights in :attr:`folder`, checked against their recorded sha256."""
        weights = self.folder / WEIGHTS_FILE
        fix = f"Delete {self.folder} and run again to retrain it."
        if self.weights_sha256 == NOT_BUILT or not weights.is_file():
            raise EtnError(
                f"Expected the trained digits CNN in {self.folder}, found none. Run `etn extract` "
                "or `etn run` on the pipeline (they train it once)."
            )
        data = weights.read_bytes()
        if (found := hashlib.sha256(data).hexdigest()) != self.weights_sha256:
            raise DamagedArtefact(
                self.folder,
                f"{weights} has sha256 {found[:12]}… but {META_FILE} records "
                f"{self.weights_sha256[:12]}…: the file changed or is corrupt. {fix}",
            )
        with torch.random.fork_rng(devices=[]), torch.inference_mode(False):
            # float64 in memory: the float32 weights exactly, every forward pass in float64
            model = DigitsCNN(self.config, len(ID_CLASSES)).double()
        try:
            model.load_state_dict(load(data), strict=True)
        except (SafetensorError, RuntimeError) as err:
            raise EtnError(
                f"Expected a valid digits_cnn checkpoint at {weights}, found an unreadable or "
                f"mismatched file ({err}). {fix}"
            ) from err
        return model.eval()

    def fingerprint(self) -> dict[str, Any]:
        return digits_fingerprint(self.config, self.weights_sha256)

    @property
    def num_classes(self) -> int:
        return len(ID_CLASSES)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden

    def batches(
        self, split: Split, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(inputs (B, 1, 8, 8), labels (B,), index (B,))`` in split order."""
        index = torch.as_tensor(split.index, dtype=torch.int64)  # (N,)
        start = 0
        for inputs, labels in DataLoader(split.data, batch_size=batch_size, shuffle=False):
            if inputs.shape[1:] != (1, 8, 8):
                raise EtnError(
                    f"digits_cnn expects inputs of shape (1, 8, 8), found "
                    f"{tuple(inputs.shape[1:])} in {split.dataset}/{split.split}. "
                    "Pair digits_cnn with a digits dataset."
                )
            stop = start + len(labels)
            yield inputs.float(), labels.long(), index[start:stop]
            start = stop

    def on_device(self) -> DigitsCNN:
        """The model on the backbone's device, moved there at first use (never while planning),
        outside inference mode: ODIN differentiates through its weights."""
        with torch.inference_mode(False):
            return self.model.to(self.device).eval()

    @torch.inference_mode()
    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.on_device()
        hidden = self.model.forward_features(inputs.to(self.device, torch.float64))  # (B, D)
        logits = self.model.classifier(hidden)  # (B, C)
        return hidden.float().cpu(), logits.float().cpu()

    def extract_batch(
        self, inputs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``forward``'s outputs plus the pooled ``layers`` and, with ``odin``, ODIN's logits."""
        with torch.inference_mode(), pooled_outputs(self.layer_modules) as extras:
            hidden, logits = self.forward(inputs)
        if self.config.odin:
            extras["odin"] = self.odin_logits(inputs)
        return hidden, logits, extras

    def odin_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """ODIN's scaled logits at the perturbed input (Liang et al. 2018, Eq. 2), (B, C):

        ``x' = x - eps * sign(-grad_x log S_yhat(x; T))``, ``S(x; T) = softmax(f(x) / T)``,
        ``yhat = argmax f(x)``; returns ``f(x') / T``. The perturbation is taken on the inputs
        as the backbone reads them (pixels in [0, 1] here), without clipping.
        """
        t, eps = self.config.odin_temperature, self.config.odin_epsilon
        self.on_device()
        x = inputs.to(self.device, torch.float64).detach().requires_grad_(True)
        with torch.enable_grad():
            scaled = self.model(x) / t  # (B, C)
            log_s = F.log_softmax(scaled, dim=1)
            top = log_s.gather(1, scaled.argmax(dim=1, keepdim=True)).sum()
            (grad,) = torch.autograd.grad(top, x)
        with torch.inference_mode():
            perturbed = x.detach() - eps * torch.sign(-grad)
            return (self.model(perturbed) / t).float().cpu()

    def classifier(self) -> dict[str, torch.Tensor]:
        layer = self.model.classifier
        return {
            "weight": layer.weight.detach().float().cpu().clone(),  # (C, D)
            "bias": layer.bias.detach().float().cpu().clone(),  # (C,)
        }
