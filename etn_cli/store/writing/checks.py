"""Boundary checks on feature arrays, shared by the shard writer and the reader.

Each check raises :class:`EtnError` with one line: which array, where it came from, what was
expected, what was found and how to fix it. ``where`` reads naturally after "in", for example
"shard test/shard-00003.h5" or "the batch appended to split 'test'".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from etn_cli.errors import EtnError

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))


def to_numpy(value: Any) -> np.ndarray:
    """Return a numpy view or copy of a numpy array or torch tensor (any device, bfloat16 too).

    Torch is never imported here: a tensor is recognised by its ``detach`` method, so the reading
    stages keep their fast start-up.
    """
    if hasattr(value, "detach"):
        value = value.detach()
        if str(value.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            value = value.float()
        value = value.cpu().numpy()
    return np.asarray(value)


def as_float(array: np.ndarray, what: str, where: str) -> np.ndarray:
    """Check a floating dtype; keep float16/float32 as they are, narrow float64 to float32."""
    check_dtype(array.dtype, True, what, where)
    return array if array.dtype in FLOAT_DTYPES else array.astype(np.float32)


def as_int64(array: np.ndarray, what: str, where: str) -> np.ndarray:
    """Check an integer dtype and return the values as int64."""
    check_dtype(array.dtype, False, what, where)
    return array.astype(np.int64, copy=False)


def check_dtype(dtype: np.dtype, floating: bool, what: str, where: str) -> None:
    """Require a floating dtype (hidden states, logits) or an integer one (labels, index)."""
    if floating and not np.issubdtype(dtype, np.floating):
        raise EtnError(
            f"{what} in {where} have dtype {dtype}; expected float32 or float16. "
            "Convert them with .astype('float32')."
        )
    if not floating and not np.issubdtype(dtype, np.integer):
        raise EtnError(
            f"{what} in {where} have dtype {dtype}; expected integers (int64). "
            "Convert them with .astype('int64')."
        )


def check_ndim(shape: tuple[int, ...], ndim: int, what: str, where: str) -> None:
    """Check that an array of ``shape`` has ``ndim`` axes: (N,) or (N, width)."""
    if len(shape) != ndim:
        expected = "1-D (N,)" if ndim == 1 else "2-D (N, width)"
        raise EtnError(
            f"{what} in {where} have shape {tuple(shape)}; expected {expected}. "
            "Pool or flatten them to one row per sample."
        )


def check_finite(array: np.ndarray, what: str, where: str, first_row: int, fix: str) -> None:
    """Reject NaN or infinite values, naming their count and the rows that hold them.

    ``first_row`` is the position of ``array[0]`` in the unit named by ``where``, so the reported
    rows are the ones a user would look up.
    """
    if np.isfinite(array.sum()):  # a NaN or inf anywhere makes the sum non-finite; no copy
        return
    finite = np.isfinite(array)
    if finite.all():  # the sum overflowed, the values are fine
        return
    bad_rows = np.flatnonzero(~finite.reshape(len(array), -1).all(axis=1)) + first_row
    span = f"row {bad_rows[0]}" if len(bad_rows) == 1 else f"rows {bad_rows[0]}..{bad_rows[-1]}"
    raise EtnError(f"{what} in {where} contain {_count_bad(array)} ({span}). {fix}")


def check_unique_index(index: np.ndarray, where: str, fix: str) -> None:
    """Each row must carry the distinct position of its sample in the source split."""
    ordered = np.sort(index)
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    if len(repeated) == 0:
        return
    examples = ", ".join(str(value) for value in repeated[:3])
    raise EtnError(
        f"Index in {where} repeats {len(repeated)} value(s) (e.g. {examples}); expected each "
        f"sample's position in its source split to appear once. {fix}"
    )


def checked_batch(
    hidden: Any,
    logits: Any,
    labels: Any,
    index: Any,
    layers: dict[str, Any],
    where: str,
    widths: dict[str, int] | None,
) -> dict[str, np.ndarray]:
    """One batch as numpy arrays of checked dtypes and shapes: hidden (B, D), logits (B, C),
    labels (B,), index (B,) and ``layers/<name>`` (B, D_l), with the column ``widths`` of the
    batches before it (None for the first)."""
    batch = {
        "hidden": as_float(to_numpy(hidden), "Hidden states", where),  # (B, D)
        "logits": as_float(to_numpy(logits), "Logits", where),  # (B, C)
        "labels": as_int64(to_numpy(labels), "Labels", where),  # (B,)
        "index": as_int64(to_numpy(index), "Index", where),  # (B,)
    }
    for name, array in layers.items():
        if not name or "/" in name or name.startswith("."):
            raise EtnError(
                f"Layer name {name!r} cannot name an HDF5 dataset; expected a plain name such as "
                "'block6'. Rename the layer."
            )
        batch[f"layers/{name}"] = as_float(to_numpy(array), describe(f"layers/{name}"), where)
    _check_batch_shapes(batch, where, widths)
    return batch


def _check_batch_shapes(
    batch: dict[str, np.ndarray], where: str, widths: dict[str, int] | None
) -> None:
    shapes = {key: array.shape for key, array in batch.items()}
    wanted = {key: 1 if key in ("labels", "index") else 2 for key in batch}
    if any(len(shapes[key]) != ndim for key, ndim in wanted.items()):
        raise EtnError(
            f"Arrays in {where} have shapes {shapes}; expected 2-D hidden, logits and layers "
            "and 1-D labels and index. Pool or flatten them to one row per sample."
        )
    if len({shape[0] for shape in shapes.values()}) > 1:
        raise EtnError(
            f"Arrays in {where} have shapes {shapes}; expected the same number of rows in "
            "each. Pass one row per sample to every argument."
        )
    found = {key: shape[1] for key, shape in shapes.items() if len(shape) == 2}
    if widths is not None and found != widths:
        raise EtnError(
            f"Columns in {where} are {found} but earlier batches had {widths}; "
            "expected every batch of a split to share them. Keep the backbone and layers fixed."
        )


def _count_bad(array: np.ndarray) -> str:
    nan = int(np.isnan(array).sum())
    inf = int(np.isinf(array).sum())
    parts = [f"{nan} NaN"] if nan else []
    parts += [f"{inf} infinite"] if inf else []
    return " and ".join(parts) + (" value" if nan + inf == 1 else " values")


def describe(dataset: str) -> str:
    """Name a shard dataset for an error message: "layers/l6" -> "Hidden states of layer 'l6'"."""
    names = {"hidden": "Hidden states", "logits": "Logits", "labels": "Labels", "index": "Index"}
    if dataset in names:
        return names[dataset]
    return f"Hidden states of layer {dataset.removeprefix('layers/')!r}"
