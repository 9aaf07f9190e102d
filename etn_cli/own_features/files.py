"""The documented file format for features computed outside etn: one file per split.

A split is one ``.npz`` (``numpy.savez``), ``.safetensors`` or ``.h5`` / ``.hdf5`` file with

==================  ========  =======================================================
name                shape     meaning
==================  ========  =======================================================
``hidden``          (N, D)    float: the input of the classifier's final linear layer
``logits``          (N, C)    float: the classifier's output
``labels``          (N,)      int: class indices (optional in an OOD split: -1)
``index``           (N,)      int, optional: each row's id in its source (default 0..N-1)
``layers/<name>``   (N, D_l)  float, optional: pooled earlier layers (for ``dmm``)
``weight``          (C, D)    float, optional: the final layer, ``logits = hidden @ W.T + b``
``bias``            (C,)      float, optional (zeros when ``weight`` comes alone)
==================  ========  =======================================================

(``layers.<name>`` is accepted for ``layers/<name>`` in ``.npz`` and ``.safetensors`` files.)
A file with other names, wrong shapes or dtypes, or non-finite values is refused with one line
naming the file, the array and the fix. Nothing in a file is ever unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.sizes import check_declared

SUFFIXES = (".npz", ".safetensors", ".h5", ".hdf5")
REQUIRED = ("hidden", "logits")
OPTIONAL = ("labels", "index", "weight", "bias")
FIX = "See docs/own-data.md ('Features you computed yourself') for the format."


@dataclass
class FeatureFile:
    """One split's arrays, checked."""

    path: Path
    hidden: np.ndarray  # (N, D) float32
    logits: np.ndarray  # (N, C) float32
    labels: np.ndarray | None  # (N,) int64, None when the file has none
    index: np.ndarray  # (N,) int64
    layers: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (N, D_l)
    weight: np.ndarray | None = None  # (C, D)
    bias: np.ndarray | None = None  # (C,)


def is_feature_file(path: Path) -> bool:
    return path.suffix.lower() in SUFFIXES


def raw_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the file by name (``layers.x`` renamed ``layers/x``), nothing checked
    but the sizes their headers declare (:mod:`etn_cli.store.sizes`), before any is read."""
    suffix = path.suffix.lower()
    readers = {".npz": npz_arrays, ".safetensors": safetensors_arrays, ".h5": _hdf5_arrays}
    reader = readers.get(".h5" if suffix == ".hdf5" else suffix)
    if reader is None:
        raise EtnError(f"Expected a {', '.join(SUFFIXES)} file of features, got {path}.")
    try:
        arrays = reader(path)
    except read_errors() as err:
        raise EtnError(
            f"Cannot read the features in {path} ({type(err).__name__}: {str(err)[:80]}); "
            f"expected a readable {suffix} file. {FIX}"
        ) from None
    return {_layer_name(name): np.asarray(array) for name, array in arrays.items()}


def read_errors() -> tuple[type[BaseException], ...]:
    """What the numpy, zip, safetensors and HDF5 readers raise on a damaged file."""
    import tokenize
    import zipfile
    import zlib

    from safetensors import SafetensorError

    return (
        OSError, ValueError, KeyError, TypeError, EOFError, RuntimeError, NotImplementedError,
        zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, SafetensorError, UnicodeError,
        SyntaxError, tokenize.TokenError,  # numpy parses an .npy header as a Python literal
    )  # fmt: skip


def npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """The ``.npy`` members of a ``numpy.savez`` archive, read by numpy's format reader, which
    refuses object arrays: nothing in the file is ever unpickled. Each member's header is read
    first and its declared size checked against the bytes that hold it."""
    import zipfile

    size = path.stat().st_size
    with zipfile.ZipFile(path) as archive:
        arrays = {}
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            packed = info.compress_type != zipfile.ZIP_STORED
            check_declared(info.file_size, size, packed, info.filename, path, FIX)
            with archive.open(info) as handle:
                declared = npy_declared_bytes(handle)
                check_declared(declared, info.file_size, False, info.filename, path, FIX)
            with archive.open(info) as handle:
                name = info.filename.removesuffix(".npy")
                arrays[name] = np.lib.format.read_array(handle, allow_pickle=False)
    return arrays


def npy_declared_bytes(handle) -> int:
    """The bytes an ``.npy`` header declares for its array (header included)."""
    major, _ = np.lib.format.read_magic(handle)
    read_header = {1: np.lib.format.read_array_header_1_0, 2: np.lib.format.read_array_header_2_0}
    if major not in read_header:
        raise ValueError(f"unsupported .npy format version {major}")
    shape, _, dtype = read_header[major](handle, max_header_size=10_000)
    if dtype.hasobject:
        raise ValueError("an object array, which etn never unpickles")
    return handle.tell() + int(np.prod(shape, dtype=object)) * dtype.itemsize


def safetensors_arrays(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file (its reader checks every offset against the
    file's size before it reads)."""
    from safetensors.numpy import load_file

    return load_file(str(path))


def _hdf5_arrays(path: Path) -> dict[str, np.ndarray]:
    import h5py

    size = path.stat().st_size
    arrays: dict[str, np.ndarray] = {}

    def read(name: str, item: object) -> None:
        if isinstance(item, h5py.Dataset):
            declared = int(np.prod(item.shape or (), dtype=object)) * item.dtype.itemsize
            check_declared(declared, size, item.compression is not None, name, path, FIX)
            arrays[name] = item[()]

    with h5py.File(path, "r") as handle:
        handle.visititems(read)
    return arrays


def _layer_name(name: str) -> str:
    return "layers/" + name.removeprefix("layers.") if name.startswith("layers.") else name


def read_feature_file(path: Path) -> FeatureFile:
    """The arrays of ``path``, checked against the format (module docstring)."""
    path = Path(path)
    arrays = raw_arrays(path)
    unknown = sorted(k for k in arrays if k not in REQUIRED + OPTIONAL and "/" not in k)
    unknown += sorted(k for k in arrays if "/" in k and not k.startswith("layers/"))
    missing = [k for k in REQUIRED if k not in arrays]
    if unknown or missing:
        raise EtnError(
            f"{path} holds {sorted(arrays)}; expected hidden and logits, optionally labels, "
            f"index, weight, bias and layers/<name> (unknown: {unknown}, missing: {missing}). "
            f"{FIX}"
        )
    hidden = floating(arrays["hidden"], 2, "hidden", path)  # (N, D)
    logits = floating(arrays["logits"], 2, "logits", path)  # (N, C)
    n, d, c = len(hidden), hidden.shape[1], logits.shape[1]
    if d < 1 or c < 2:
        raise EtnError(
            f"{path} holds hidden states of width {d} and {c} logits per row; expected at least "
            f"1 and 2 (a classifier's features and its class scores). {FIX}"
        )
    rows(logits, n, "logits", path)
    labels = integers(arrays["labels"], n, "labels", path) if "labels" in arrays else None
    index = integers(arrays["index"], n, "index", path) if "index" in arrays else np.arange(n)
    layers = {k.removeprefix("layers/"): floating(a, 2, k, path) for k, a in arrays.items()
              if k.startswith("layers/")}  # fmt: skip
    for name, layer in layers.items():
        rows(layer, n, f"layers/{name}", path)
    weight, bias = classifier_arrays(arrays, d, c, path)
    return FeatureFile(path, hidden, logits, labels, index.astype(np.int64), layers, weight, bias)


def classifier_arrays(
    arrays: dict[str, np.ndarray], d: int | None, c: int | None, path: Path
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``weight`` (C, D) and ``bias`` (C,) when the file has them (bias zeros if absent)."""
    if "weight" not in arrays:
        if "bias" in arrays:
            raise EtnError(f"{path} has a bias but no weight; give both or neither. {FIX}")
        return None, None
    weight = floating(arrays["weight"], 2, "weight", path)
    c, d = (c or weight.shape[0]), (d or weight.shape[1])
    bias = floating(arrays["bias"], 1, "bias", path) if "bias" in arrays else np.zeros(c)
    if weight.shape != (c, d) or bias.shape != (c,):
        raise EtnError(
            f"The classifier in {path} has weight {weight.shape} and bias {bias.shape}; expected "
            f"({c}, {d}) and ({c},) to match hidden (N, {d}) and logits (N, {c}). {FIX}"
        )
    return weight, bias.astype(np.float32)


def read_classifier_file(
    path: Path, d: int | None = None, c: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` (C, D) and ``bias`` (C,) of a classifier file (or of a split file with them);
    with ``d`` and ``c``, checked against the features' widths."""
    weight, bias = classifier_arrays(raw_arrays(path), d, c, path)
    if weight is None or bias is None:
        raise EtnError(
            f"The classifier file {path} holds no 'weight' (C, D) array; expected weight and "
            "bias, e.g. numpy.savez(path, weight=W, bias=b)."
        )
    return weight, bias


def floating(array: np.ndarray, ndim: int, name: str, path: Path) -> np.ndarray:
    if not np.issubdtype(array.dtype, np.floating) or array.ndim != ndim:
        raise EtnError(
            f"{name} in {path} is {array.dtype} of shape {array.shape}; expected a {ndim}-D "
            f"float array. {FIX}"
        )
    bad = int((~np.isfinite(array)).sum())
    if bad:
        raise EtnError(
            f"{name} in {path} holds {bad} non-finite values (NaN or inf); expected finite "
            "numbers. Recompute them in float32."
        )
    return array.astype(np.float32, copy=False)


def integers(array: np.ndarray, n: int, name: str, path: Path) -> np.ndarray:
    if not np.issubdtype(array.dtype, np.integer) or array.shape != (n,):
        raise EtnError(
            f"{name} in {path} is {array.dtype} of shape {array.shape}; expected {n} integers "
            f"(one per row of hidden). {FIX}"
        )
    return array.astype(np.int64, copy=False)


def rows(array: np.ndarray, n: int, name: str, path: Path) -> None:
    if len(array) != n:
        raise EtnError(
            f"{name} in {path} has {len(array)} rows but hidden has {n}; expected one row per "
            f"sample in every array. {FIX}"
        )
