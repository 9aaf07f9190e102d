"""Configs are data: frozen dataclasses with defaults, built from TOML tables or keyword
arguments, with unknown keys and wrong types rejected at the boundary."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from etn_cli.errors import EtnError, did_you_mean

C = TypeVar("C")


def build_config(cls: type[C], values: dict[str, Any], where: str) -> C:
    """Instantiate the frozen dataclass ``cls`` from ``values``, checking names and types.

    ``where`` names the place in the user's input for the error message, e.g.
    ``"pipelines/digits.toml [[heads]] 'etn'"``.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    for key in values:
        if key not in fields:
            hint = did_you_mean(key, fields)
            raise EtnError(
                f"Unknown key {key!r} in {where}.{hint} Allowed keys: {', '.join(fields)}"
            )
    coerced = {
        key: coerce(value, hints[key], f"{where} key {key!r}") for key, value in values.items()
    }
    for key, value in coerced.items():
        check_range(key, value, where)
    return cls(**coerced)


def _within(low: float, high: float, open_low: bool = False) -> Callable[[Any], bool]:
    """``low < v <= high`` (``open_low``) or ``low <= v <= high``, finite."""
    if open_low:
        return lambda v: low < v <= high and math.isfinite(v)
    return lambda v: low <= v <= high and math.isfinite(v)


# Every number is bounded by what can run: a scale of 1e308 overflows the first square, a
# count of 2**62 allocates exabytes or never ends. The bounds sit far beyond any setting in
# use (the paper's largest scale is ODIN's T = 1000, its longest run 200 epochs).
SCALE_LIMIT = 1e6
SEED_LIMIT = 2**32  # numpy's legacy seeding takes no more; torch's takes 2**64
POSITIVE = (_within(0, SCALE_LIMIT, open_low=True), "a number in (0, 1e6]")
NON_NEGATIVE = (_within(0, SCALE_LIMIT), "a number in [0, 1e6]")
# a Gamma or Gaussian prior's variance: below 1e-12 its shape mode^2/variance overflows float32
# (ETN's loss turns NaN in its first epoch at 1e-40; fits at 1e-20)
VARIANCE = (_within(1e-12, SCALE_LIMIT), "a number in [1e-12, 1e6]")
EPOCH_LIMIT = 100_000
EPOCHS = (_within(1, EPOCH_LIMIT), f"an integer in 1 .. {EPOCH_LIMIT:,}")
BATCH_LIMIT = 2**20
BATCH = (_within(1, BATCH_LIMIT), f"an integer in 1 .. {BATCH_LIMIT:,}")
DRAW_LIMIT = 10_000  # Monte Carlo draws, passes, members: each a full prediction of every row
DRAWS = (_within(1, DRAW_LIMIT), f"an integer in 1 .. {DRAW_LIMIT:,}")
ROW_LIMIT = 2**31  # rows, neighbours, classes: an int32 index holds them
ROWS = (_within(1, ROW_LIMIT - 1), "an integer in 1 .. 2**31 - 1")
PERCENT = (lambda v: 0 <= v <= 100, "a percentage in [0, 100]")
# a layer's or a feature map's size: beyond these, one weight matrix alone takes gigabytes
SIZE_LIMIT = 65_536
SIZE = (_within(1, SIZE_LIMIT), f"an integer in 1 .. {SIZE_LIMIT:,}")
DEPTH_LIMIT = 32
# any other number (an absolute threshold, a shift, a layer index): finite and within these
OTHER_INT = (lambda v: -ROW_LIMIT < v < ROW_LIMIT, "an integer within +-2**31")
OTHER_FLOAT = (_within(-SCALE_LIMIT, SCALE_LIMIT), "a number in [-1e6, 1e6]")


# Settings whose range is the same wherever they appear (heads, backbones, [data], [finetune]):
# checked before any work, so a bad value is one line instead of an untrained head or a
# traceback halfway through a run. A number without an entry is held to OTHER_INT/OTHER_FLOAT.
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "epochs": EPOCHS,
    "lr": POSITIVE,
    "batch_size": BATCH,
    "mc_samples": DRAWS,
    "members": (_within(1, 1_000), "an integer in 1 .. 1,000"),
    "passes": DRAWS,
    "prior_mode": POSITIVE,
    "prior_variance": VARIANCE,
    "temperature": POSITIVE,
    "kl_weight": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "p": (lambda v: 0 <= v < 1, "a probability in [0, 1)"),
    "seed": (lambda v: 0 <= v < SEED_LIMIT, "an integer in 0 .. 2**32 - 1"),
    # ETN's Student-t degrees of freedom: its variance nu / (nu - 2) and the fused objective
    # need nu > 1 (the paper's 1e4 is near-Gaussian)
    "nu": (lambda v: 1 < v <= 1e8 and math.isfinite(v), "a number in (1, 1e8]"),
    "warmup_fraction": (lambda v: 0 <= v < 1, "a fraction of the epochs in [0, 1)"),
    "momentum": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    # initial values, scales and rates of the other heads and scorers
    "a_init": POSITIVE,
    "b_init": POSITIVE,
    "sigma_init": POSITIVE,
    "length_scale": POSITIVE,
    "ridge": POSITIVE,
    "prior": POSITIVE,
    "prior_lr": POSITIVE,
    "lr_decay": POSITIVE,
    "memory_limit_gib": POSITIVE,
    "beta": NON_NEGATIVE,
    "gradient_penalty": NON_NEGATIVE,
    "odir_weight": NON_NEGATIVE,
    "odin_temperature": POSITIVE,
    "odin_epsilon": NON_NEGATIVE,
    "lora_alpha": POSITIVE,
    # sizes and counts
    "width": SIZE,
    "widths": SIZE,  # every layer of the list
    "temperature_widths": SIZE,
    "depth": (lambda v: 1 <= v <= DEPTH_LIMIT, f"an integer in 1 .. {DEPTH_LIMIT}"),
    "latent_dim": SIZE,
    "centroid_size": SIZE,
    "channels": SIZE,
    "hidden": SIZE,
    "lora_rank": SIZE,
    "resize": SIZE,
    "crop": SIZE,
    "image_size": SIZE,
    "max_length": (_within(1, 2**20), "an integer in 1 .. 1,048,576"),
    "num_classes": ROWS,
    "size": ROWS,
    "fit_rows": ROWS,
    "shard_rows": ROWS,
    "workers": (_within(0, 256), "an integer in 0 .. 256"),
    # SNGP keeps an M x M covariance: 16,384 features is already a gigabyte
    "random_features": (lambda v: 1 <= v <= 16_384, "an integer in 1 .. 16,384"),
    "mean_field_factor": NON_NEGATIVE,  # lambda of p(y) = softmax(z / sqrt(1 + lambda var))
    "lr_milestones": EPOCHS,  # every epoch of the list
    "prior_steps": EPOCHS,
    "k": ROWS,
    "top_m": ROWS,
    "dim": (_within(0, SIZE_LIMIT), f"an integer in 0 .. {SIZE_LIMIT:,} (0: the paper's rule)"),
    "percentile": PERCENT,
    "lower_percentile": PERCENT,
    "upper_percentile": PERCENT,
    "sparsity": (lambda v: 0 <= v < 100, "a percentage in [0, 100)"),
    # [conformal]: the miscoverage, the calibration share of a split, RAPS's regulariser
    "alpha": (lambda v: 0 < v < 1, "a probability in (0, 1), e.g. 0.1"),
    "holdout": (lambda v: 0 < v < 1, "a share in (0, 1), e.g. 0.2"),
    "penalty": NON_NEGATIVE,
    "k_reg": (_within(0, ROW_LIMIT - 1), "an integer in 0 .. 2**31 - 1"),
}


def check_range(key: str, value: Any, where: str) -> None:
    """One line naming the key, the value, the allowed range and the place, if out of range:
    a number outside its rule in :data:`RANGES` (each number of a list; a key without one is
    held to :data:`OTHER_INT` or :data:`OTHER_FLOAT`), or any number that is not finite."""
    items = value if isinstance(value, tuple | list) else (value,)
    numbers = [v for v in items if isinstance(v, int | float) and not isinstance(v, bool)]
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        raise EtnError(f"{where} key {key!r} must be finite, got {value!r}. Fix the value.")
    if not numbers:
        return
    fallback = OTHER_FLOAT if any(isinstance(v, float) for v in numbers) else OTHER_INT
    ok, expected = RANGES.get(key, fallback)
    if not all(ok(v) for v in numbers):
        each = "each of its numbers " if items is value else ""
        raise EtnError(
            f"{where} key {key!r} must be {each}{expected}, got {value!r}. Fix the value."
        )


def coerce(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against a simple type hint, converting int -> float and list -> tuple."""
    shaped = SHAPED.get(typing.get_origin(hint))
    if shaped is not None:
        return shaped(value, hint, where)
    if hint is type(None):
        if value is None:
            return None
        raise EtnError(f"{where} expected nothing, got {value!r}.")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any or (isinstance(hint, type) and _is_instance(value, hint)):
        return value
    raise EtnError(
        f"{where} expected {_name(hint)}, got {value!r} ({type(value).__name__}). "
        "Fix the value's type."
    )


def _union(value: Any, hint: Any, where: str) -> Any:
    for option in typing.get_args(hint):
        try:
            return coerce(value, option, where)
        except EtnError:
            continue
    raise EtnError(f"{where} expected {_name(hint)}, got {value!r}. Fix the value's type.")


def _literal(value: Any, hint: Any, where: str) -> Any:
    if value in typing.get_args(hint):
        return value
    allowed = ", ".join(repr(a) for a in typing.get_args(hint))
    raise EtnError(f"{where} expected one of {allowed}, got {value!r}.")


def _tuple(value: Any, hint: Any, where: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise EtnError(f"{where} expected a list, got {value!r}. Write it as [a, b, ...].")
    item = typing.get_args(hint)[0]
    return tuple(coerce(v, item, where) for v in value)


SHAPED = {typing.Union: _union, types.UnionType: _union, typing.Literal: _literal, tuple: _tuple}


def _is_instance(value: Any, hint: type) -> bool:
    if hint is int and isinstance(value, bool):
        return False
    return isinstance(value, hint)


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def config_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples become lists)."""
    return {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()
    }
