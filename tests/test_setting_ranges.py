"""Every numeric setting of every head is range-checked before any work (issue 31.6): the test
walks the registry, finds each setting whose type holds a number (an int, a float, a list of
them, or one of those or None), and tries a value outside its range, which must be refused in
one line naming it. A new numeric setting without an entry here fails the test, so none is
added unchecked. NaN and infinity are refused for every float setting."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from tiny_pipeline import write_pipeline

from etn_cli.config import build_config
from etn_cli.errors import EtnError
from etn_cli.heads import heads

# setting -> a value outside its range; (head, setting) where one name means different things
OUT_OF_RANGE: dict[str | tuple[str, str], object] = {
    "seed": 2**32, "epochs": 0, "lr": -1.0, "batch_size": 0, "mc_samples": 0, "members": 0,
    "passes": 0, "prior_mode": 0.0, "prior_variance": 1e-300, "temperature": 0.0,
    "kl_weight": -1.0, "weight_decay": -1.0, "p": 1.0, "nu": 1.0, "warmup_fraction": 1.0,
    "momentum": 1.0, "a_init": 0.0, "b_init": 0.0, "sigma_init": 0.0, "length_scale": 0.0,
    "ridge": 0.0, "prior": 0.0, "prior_lr": 0.0, "lr_decay": 0.0, "memory_limit_gib": 0.0,
    "beta": -1.0, "gradient_penalty": -1.0, "odir_weight": -1.0, "width": 100_000,
    "widths": [512, 0], "temperature_widths": [100_000], "depth": 50, "latent_dim": 0,
    "centroid_size": 0, "random_features": 100_000, "prior_steps": 0, "k": 0, "top_m": 0,
    "dim": -1, "percentile": 101.0, "lower_percentile": -1.0, "upper_percentile": 101.0,
    "sparsity": 100.0, "mean_field_factor": -1.0, "lr_milestones": [-5, 1000],
    ("duq", "gamma"): 1.0, ("gen", "gamma"): 0.0, ("vra", "gamma"): math.inf,
    "lower": math.nan, "upper": math.inf, "norm_weight": -1.0,
}  # fmt: skip


def numeric(hint: object) -> str | None:
    """``"float"``, ``"int"`` or None: whether a setting's type holds a number."""
    args = typing.get_args(hint) or (hint,)
    inner = [a for arg in args for a in (typing.get_args(arg) or (arg,))]
    if float in inner:
        return "float"
    return "int" if int in inner else None


def numeric_settings() -> list[tuple[str, str, str]]:
    """``(head, setting, "int" | "float")`` for every numeric setting of every head."""
    found = []
    for name in heads.names():
        config = heads.get(name).Config
        hints = typing.get_type_hints(config)
        for field in dataclasses.fields(config):
            kind = numeric(hints[field.name])
            if kind is not None:
                found.append((name, field.name, kind))
    return found


SETTINGS = numeric_settings()


def test_the_registry_has_numeric_settings_to_check() -> None:
    assert len(SETTINGS) > 100 and {h for h, _, _ in SETTINGS} >= {"etn", "sngp", "duq"}


@pytest.mark.parametrize(
    ("head", "setting", "kind"), SETTINGS, ids=[f"{h}.{s}" for h, s, _ in SETTINGS]
)
def test_every_numeric_setting_refuses_a_value_out_of_its_range(head, setting, kind) -> None:
    bad = OUT_OF_RANGE.get((head, setting), OUT_OF_RANGE.get(setting, "missing"))
    assert bad != "missing", f"add an out-of-range value of {head}.{setting} to OUT_OF_RANGE"
    with pytest.raises(EtnError, match=setting) as caught:
        heads.get(head)(**{setting: bad})
    assert "\n" not in str(caught.value)
    if kind == "float":
        for value in (math.nan, math.inf):
            with pytest.raises(EtnError, match=setting):
                heads.get(head)(**{setting: value})


@pytest.mark.parametrize(
    ("setting", "phrase"),
    [
        ("heads.sngp.mean_field_factor=-1", "'mean_field_factor' must be a number in [0, 1e6]"),
        ("heads.duq.lr_milestones=[-5, 1000]", "'lr_milestones' must be each of its numbers"),
        ("heads.etn.width=100000", "'width' must be an integer in 1 .. 65,536"),
        ("heads.etn.depth=50", "'depth' must be an integer in 1 .. 32"),
        ("seeds=[18446744073709551616]", "each in 0 .. 2**32 - 1"),
        ("heads.etn.prior_mode=1e308", "'prior_mode' must be a number in (0, 1e6]"),
        ("heads.etn.mc_samples=4611686018427387904", "'mc_samples' must be an integer in 1"),
        ("heads.duq.length_scale=1e308", "'length_scale' must be a number in (0, 1e6]"),
        ("heads.etn.epochs=4611686018427387904", "'epochs' must be an integer in 1 .. 100,000"),
    ],
)
def test_the_issue_s_settings_are_one_line_and_exit_2_before_any_work(
    setting: str, phrase: str, tmp_path: Path
) -> None:
    heads = ("etn", "sngp", "duq")
    no_ood = {"backbone": {"epochs": None}, "data": {"ood": None}}
    pipeline = write_pipeline(tmp_path, "ranges", heads=heads, **no_ood)
    command = [sys.executable, "-m", "etn_cli", "run", str(pipeline), "-d", str(tmp_path / "d")]
    done = subprocess.run([*command, "--set", setting], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert phrase in done.stderr
    assert not [p for p in (tmp_path / "d").rglob("*") if p.is_file()]


def config_classes() -> dict[str, type]:
    """Every settings dataclass a pipeline or a head fills: heads, backbones and their
    [finetune] settings, dataset options, [data], [features] and [conformal]."""
    from etn_cli.backbones import BACKBONES
    from etn_cli.datasets import OPTIONS
    from etn_cli.planning.pipeline import ConformalSpec, DataSpec, FeaturesSpec

    found = {f"head {name}": heads.get(name).Config for name in heads.names()}
    found |= {f"backbone {n}": c for n, (_, c, _) in BACKBONES.items()}
    found |= {f"[finetune] {n}": f for n, (_, _, f) in BACKBONES.items() if f is not None}
    found |= {f"dataset {n}": c for n, c in OPTIONS.items()}
    return found | {"[data]": DataSpec, "[features]": FeaturesSpec, "[conformal]": ConformalSpec}


HUGE = [
    (where, cls, field.name, value)
    for where, cls in config_classes().items()
    for field in dataclasses.fields(cls)
    if (kind := numeric(typing.get_type_hints(cls)[field.name]))
    for value in ((1e308, -1e308) if kind == "float" else (2**62, -(2**62)))
]


@pytest.mark.parametrize(
    ("where", "cls", "setting", "value"), HUGE, ids=[f"{w}.{s}={v:g}" for w, _, s, v in HUGE]
)
def test_every_numeric_setting_refuses_a_huge_value_in_one_line(where, cls, setting, value):
    hints = typing.get_type_hints(cls)
    required = {  # fields without a default get a name, as a pipeline gives them
        f.name: "x"
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    listed = typing.get_origin(hints[setting]) is tuple or "tuple" in str(hints[setting])
    with pytest.raises(EtnError, match=setting) as caught:
        build_config(cls, required | {setting: [value] if listed else value}, where)
    assert "\n" not in str(caught.value)
