"""One small interface for every post-hoc method (pytorch-ood's fit/predict on features,
scikit-learn's estimators): settings in ``__init__``, learned state on names ending in ``_``,
``fit`` returns ``self``, ``predict`` returns probabilities plus named uncertainty scores."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.torch import load_file, save

from etn_cli.config import build_config, config_dict
from etn_cli.errors import EtnError
from etn_cli.heads import heads as heads  # the registry, for the modules that register
from etn_cli.heads.calibration import apply_temperature, fit_temperature
from etn_cli.heads.facts import HEAD_FORMAT  # in every key: torch-free
from etn_cli.heads.scorers.threads import one_thread
from etn_cli.heads.settings import HeadConfig
from etn_cli.store.artefacts.headfiles import seal_head_files


@dataclass
class Prediction:
    """What a head says about N samples.

    ``scores`` maps score names (``mp``, ``um``, ``mi``, ``de``, ``md``, ``energy``) to (N,)
    arrays; a score a head cannot define is absent, never zero. ``alpha`` is the Dirichlet
    concentration of evidential heads (averaged over MC draws where there are draws).
    """

    probs: np.ndarray  # (N, C)
    scores: dict[str, np.ndarray]
    alpha: np.ndarray | None = None  # (N, C)
    predictions: np.ndarray | None = None  # (N,) set by Head.predict

    def __post_init__(self) -> None:
        if self.predictions is None:
            self.predictions = self.probs.argmax(axis=1)


def predicted_class(probs: np.ndarray, logits: torch.Tensor) -> np.ndarray:
    """``argmax`` of the probabilities, exact ties broken by the logits."""
    tied = probs >= probs.max(axis=1, keepdims=True)  # (N, C)
    return np.where(tied, host(logits.double()), -np.inf).argmax(axis=1)


def host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array, from whatever device computed them."""
    return t.detach().cpu().numpy()


NOT_STATE_HOLDERS = (type, ModuleType, FunctionType, MethodType, BuiltinFunctionType)


def moved(value: Any, device: torch.device, memo: dict[int, Any] | None = None) -> Any:
    """``value`` with every tensor in it on ``device``: tensors, modules (as ``Module.to``),
    parameters, and the dicts, lists, tuples and objects that hold them (a library's too, such
    as laplace-torch's posterior: its attributes are moved, and a ``torch.device`` it recorded
    becomes ``device``). Anything else is returned as it is; shared objects stay shared."""
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, torch.nn.Parameter):
        result: Any = torch.nn.Parameter(value.data.to(device), value.requires_grad)
    elif isinstance(value, torch.Tensor):
        result = value.to(device)
    elif isinstance(value, torch.device):
        result = device
    elif isinstance(value, torch.nn.Module):
        result = value.to(device)
    elif isinstance(value, dict):
        result = type(value)((k, moved(v, device, memo)) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = [moved(v, device, memo) for v in value]
        result = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    elif hasattr(value, "__dict__") and not isinstance(value, NOT_STATE_HOLDERS):
        memo[id(value)] = value  # cycles end here
        for name, item in list(vars(value).items()):
            object.__setattr__(value, name, moved(item, device, memo))
        result = value
    else:
        result = value
    memo[id(value)] = result
    return result


class Head:
    """Base class of every registered head.

    Subclasses implement ``_fit``, ``_predict``, ``_state`` and ``_load_state``; their facts
    (``name``, ``label``, ``family``, ``Config``, the ``needs_*``, ``seed_free``, ``version``,
    ``own_score``) come from their record in :mod:`etn_cli.catalogue`, which
    ``@heads.register`` writes onto the class (the defaults below are for a head of your own).
    ``classifier`` is the backbone's final layer (``weight`` (C, D), ``bias`` (C,)) for heads
    that start from it (``needs_classifier``). A head that estimates ID
    statistics (``needs_id_statistics``: class means, covariances, a bank of neighbours) is fitted
    on the pipeline's ``fit`` split when it has one; a ``seed_free`` head draws nothing at random
    and is fitted for the first seed only. Arrays a head never reads are not scanned for NaN
    (0.2 s at 128,000 x 2,048): its fit arrays when its fit reads no row (``reads_fit_rows``
    False: nothing to learn, or the classifier only), ``hidden`` when it reads only the logits
    (``reads_hidden`` False).
    ``layers`` maps names to extra per-sample arrays (N, D_l) that extract stored when the
    pipeline asked for them: pooled intermediate layers (``needs_layers``) or ODIN's perturbed
    logits; empty otherwise.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    family: ClassVar[str] = "other"  # report grouping: evidential, bayesian, deterministic, posthoc
    Config: ClassVar[type[HeadConfig]] = HeadConfig
    needs_classifier: ClassVar[bool] = False
    needs_layers: ClassVar[bool] = False  # consumes pooled intermediate layers (``layers``)
    needs_id_statistics: ClassVar[bool] = False  # fitted on the ``[data] fit`` split if given
    needs_every_class: ClassVar[bool] = False  # rows of every class in its fit split
    seed_free: ClassVar[bool] = False  # nothing random: one seed stands for all
    reads_fit_rows: ClassVar[bool] = True  # False: fit reads only the sizes of its arrays
    reads_hidden: ClassVar[bool] = True  # False: fit and predict read only the logits
    version: ClassVar[int] = 0  # raised when its results change for the same inputs: a new key
    own_score: ClassVar[str] = "mp"  # the OOD score ``score()`` returns
    higher_means_id: ClassVar[bool] = True  # which way ``own_score`` points

    def __init__(self, **settings: Any) -> None:
        self.config = build_config(self.Config, settings, f"head {self.name!r}")
        self.n_features_: int | None = None
        self.n_classes_: int | None = None
        self.calibration_: dict[str, Any] | None = None  # the fitted temperature's record
        self.selection_: Any = None  # trained heads: the kept checkpoint (training.Training)

    # ----------------------------------------------------------------- public interface
    def to(self, device: str | torch.device) -> Head:
        """Move the fitted state (every attribute ending in ``_``) to ``device``; returns the
        head. The one place a head's state changes device: ``predict`` and ``score`` call it
        for the device they are asked to compute on, and no head moves its own state."""
        device = torch.device(device)
        for name, value in list(vars(self).items()):
            if name.endswith("_"):
                setattr(self, name, moved(value, device))
        return self

    @property
    def keeps_argmax(self) -> bool:
        """Whether the head's transformation keeps the order of the logits (a positive scale
        of them, as the scalar ETN, static scaling and temperature scaling): its predicted
        class is then the classifier's argmax, whatever rounding does to the probabilities."""
        return False

    @property
    def variant(self) -> str:
        """Short variant name for reports (``scalar``, ``vector`` …); empty when there is none."""
        return getattr(self.config, "variant", "")

    @property
    def display_label(self) -> str:
        """``label``, naming a non-default transformation variant: ``ETN (vector)``."""
        variant = self.variant
        return self.label if variant in ("", "scalar") else f"{self.label} ({variant})"

    @property
    def backbone_passes(self) -> int:
        """Backbone forward passes the method needs per sample at inference (the report's
        runtime adds this many times the backbone's measured forward time); 1 for a head on
        the cached features."""
        return 1

    def fit(
        self,
        hidden: Any,
        logits: Any,
        labels: Any,
        *,
        classifier: dict[str, Any] | None = None,
        layers: dict[str, Any] | None = None,
        device: str = "cpu",
    ) -> Head:
        """Fit on adaptation features: ``hidden`` (N, D), ``logits`` (N, C), ``labels`` (N,),
        and optionally ``layers`` (name -> (N, D_l))."""
        rows_read = self.reads_fit_rows or self.config.calibrate != "none"
        h, z = check_features(hidden, logits, scan=self._read_arrays() if rows_read else ())
        y = check_labels(labels, len(h), z.shape[1])
        extra = self._check_layers(layers, len(h))
        if self.needs_classifier and classifier is None:
            raise EtnError(
                f"Head {self.name!r} starts from the backbone's classifier weights, but none were "
                "given. Extract with etn (it stores them) or save classifier.safetensors next to "
                "your shards."
            )
        self.n_features_, self.n_classes_ = h.shape[1], z.shape[1]
        self._fit(h, z, y, classifier=classifier, layers=extra, device=torch.device(device))
        self.to(device)  # the fitted state, wherever ``_fit`` left it, on the fit's device
        if self.config.calibrate == "temperature":
            raw = self._predict_on(device, h, z, extra)
            self.calibration_ = fit_temperature(raw.probs, y.numpy())
        return self

    def predict(
        self,
        hidden: Any,
        logits: Any,
        *,
        layers: dict[str, Any] | None = None,
        device: str = "cpu",
    ) -> Prediction:
        """Probabilities, uncertainty scores and (evidential heads) alpha for N samples."""
        h, z, extra = self._checked_inputs(hidden, logits, layers)
        prediction = self._predict_on(device, h, z, extra)
        if self.keeps_argmax:
            prediction.predictions = host(z.argmax(dim=1))
        else:
            prediction.predictions = predicted_class(prediction.probs, z)
        if self.calibration_ is not None:  # after the argmax; the scores stay the head's own
            temperature = self.calibration_["temperature"]
            prediction.probs = apply_temperature(prediction.probs, temperature)
        return prediction

    def score(
        self,
        hidden: Any,
        logits: Any,
        *,
        layers: dict[str, Any] | None = None,
        device: str = "cpu",
    ) -> np.ndarray:
        """Only the head's own OOD score ``own_score`` (N,), float64, oriented as
        :data:`etn_cli.metrics.score_names.HIGHER_MEANS_ID` says: what a detector is asked for.
        Heads that can skip the probabilities override ``_score``."""
        h, z, extra = self._checked_inputs(hidden, logits, layers)
        device = torch.device(device)
        self.to(device)
        h, z, extra = moved((h, z, extra), device)
        return np.asarray(self._score(h, z, layers=extra, device=device), np.float64)

    def _predict_on(self, device: str | torch.device, h, z, extra) -> Prediction:
        """``_predict`` with the head and its inputs on ``device``."""
        device = torch.device(device)
        self.to(device)
        h, z, extra = moved((h, z, extra), device)
        return self._predict(h, z, layers=extra, device=device)

    def _checked_inputs(
        self, hidden: Any, logits: Any, layers: dict[str, Any] | None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        if self.n_classes_ is None:
            raise EtnError(f"Head {self.name!r} is not fitted. Call fit(...) or load it first.")
        h, z = check_features(hidden, logits, scan=self._read_arrays())
        if h.shape[1] != self.n_features_ or z.shape[1] != self.n_classes_:
            raise EtnError(
                f"Head {self.name!r} was fitted on hidden size {self.n_features_} and "
                f"{self.n_classes_} classes, got {h.shape[1]} and {z.shape[1]}. Use features "
                "from the same backbone."
            )
        return h, z, self._check_layers(layers, len(h))

    def _read_arrays(self) -> tuple[str, ...]:
        """The feature arrays this head reads, which are scanned for NaN."""
        return ("hidden", "logits") if self.reads_hidden else ("logits",)

    def save(self, folder: Path) -> None:
        """Write the head's files into ``folder`` (:meth:`write_files`) and their checksums
        (``checksums.sha256``, the store's, checked when the folder is loaded)."""
        self.write_files(folder)
        seal_head_files(folder)

    def write_files(self, folder: Path) -> None:
        """Write ``head.json`` (name, config, dims) and ``weights.safetensors``."""
        folder = Path(folder)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self._state().items()}
        # serialised in memory, written by Python: a full disk is an OSError said in one line,
        # where safetensors' own writer raises its SafetensorError (and writes mode 0600)
        (folder / "weights.safetensors").write_bytes(save(tensors))
        meta = {
            "format": HEAD_FORMAT,
            "head": self.name,
            "config": config_dict(self.config),
            "n_features": self.n_features_,
            "n_classes": self.n_classes_,
            "calibration": self.calibration_,
            "selection": self.selection_,
        }
        (folder / "head.json").write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, folder: Path) -> Head:
        folder = Path(folder)
        meta = json.loads((folder / "head.json").read_text())
        if meta.get("format", 0) > HEAD_FORMAT:
            raise EtnError(
                f"Head in {folder} has format {meta['format']}; this etn reads format "
                f"{HEAD_FORMAT}. Upgrade etn."
            )
        head = heads.get(meta["head"])(**meta["config"])
        if cls is not Head and not isinstance(head, cls):
            raise EtnError(f"{folder} holds a {meta['head']!r} head, not {cls.name!r}.")
        head.n_features_, head.n_classes_ = meta["n_features"], meta["n_classes"]
        head.calibration_ = meta.get("calibration")
        head.selection_ = meta.get("selection")
        tensors = load_file(folder / "weights.safetensors")
        try:
            head._load_state(tensors)
        except (KeyError, RuntimeError) as err:
            raise EtnError(
                f"Checkpoint {folder / 'weights.safetensors'} does not match head "
                f"{meta['head']!r} ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
                "Retrain it with etn train --force."
            ) from None
        return head

    def _check_layers(self, layers: dict[str, Any] | None, n: int) -> dict[str, torch.Tensor]:
        extra = {name: to_tensor(a, torch.float32) for name, a in (layers or {}).items()}
        for name, t in extra.items():
            if t.ndim != 2 or len(t) != n or not torch.isfinite(t).all():
                raise EtnError(
                    f"Layer {name!r} must be a finite (N, D) array with N = {n} rows, got shape "
                    f"{tuple(t.shape)}. Re-extract the features."
                )
        if self.needs_layers and not extra:
            raise EtnError(
                f"Head {self.name!r} needs intermediate layers, but the features have none. Ask "
                "extract for them with layers = [...] in the pipeline's [backbone] table."
            )
        return extra

    def settings(self) -> dict[str, Any]:
        return dataclasses.asdict(self.config)

    # ----------------------------------------------------------------- for subclasses
    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        raise NotImplementedError

    def _predict(self, h, z, *, layers, device) -> Prediction:
        raise NotImplementedError

    def _score(self, h, z, *, layers, device) -> np.ndarray:
        return self._predict(h, z, layers=layers, device=device).scores[self.own_score]

    def _state(self) -> dict[str, torch.Tensor]:
        return {}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        return None


def to_tensor(x: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", dtype)
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def check_features(
    hidden: Any, logits: Any, *, scan: tuple[str, ...] = ("hidden", "logits")
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 tensors ``hidden`` (N, D) and ``logits`` (N, C), with matching N, and finite
    where ``scan`` names them (the others are read by no one)."""
    h, z = to_tensor(hidden, torch.float32), to_tensor(logits, torch.float32)
    if h.ndim != 2 or z.ndim != 2:
        raise EtnError(
            f"Expected hidden (N, D) and logits (N, C), got shapes {tuple(h.shape)} and "
            f"{tuple(z.shape)}. Flatten or pool features to one vector per sample."
        )
    if len(h) != len(z) or len(h) == 0:
        raise EtnError(f"Expected the same non-zero number of rows, got {len(h)} and {len(z)}.")
    if z.shape[1] < 2:
        raise EtnError(f"Expected at least 2 classes in logits, got {z.shape[1]}.")
    for name, t in (("hidden", h), ("logits", z)):
        # one reduction: no inf or NaN anywhere (fast path), memory-bound: on one thread
        if name not in scan or bool(torch.isfinite(one_thread_sum(t))):
            continue
        bad = (~torch.isfinite(t)).any(dim=1).nonzero().flatten()
        if len(bad):
            raise EtnError(
                f"{name} contains non-finite values in {len(bad)} rows (first rows "
                f"{bad[:5].tolist()}). Check the backbone or re-extract in float32."
            )
    return h, z


def one_thread_sum(t: torch.Tensor) -> torch.Tensor:
    """``t.sum()`` on one of torch's threads (:mod:`etn_cli.heads.scorers.threads`)."""
    with one_thread():
        return t.sum()


def check_labels(labels: Any, n: int, num_classes: int) -> torch.Tensor:
    y = to_tensor(labels, torch.int64)
    if y.shape != (n,):
        raise EtnError(f"Expected labels of shape ({n},), got {tuple(y.shape)}.")
    with one_thread():
        low, high = (int(y.min()), int(y.max())) if len(y) else (0, 0)
    if low < 0 or high >= num_classes:
        raise EtnError(
            f"Labels must lie in 0..{num_classes - 1} (the logits have {num_classes} classes), "
            f"found {low}..{high}. Map labels to the backbone's classes."
        )
    return y
