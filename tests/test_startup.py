"""``etn --help`` and every usage or pipeline-file error answer without importing torch,
h5py, numpy or any head: the entry point runs in a new process and the test reads which
modules it loaded (how fast that is, ``benchmarks/bench_startup.py`` measures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "pipelines" / "digits.toml"
IMAGES = ROOT / "examples" / "images.toml"  # the torchvision backbone
QUESTIONS = ROOT / "examples" / "questions.toml"  # the hf_causal_lm backbone
HEAVY = ("torch", "h5py", "numpy", "safetensors", "xxhash", "polars", "etn_cli.heads.base")
# the entry point as `etn` runs it, then the heavy modules it loaded, as JSON on stdout
PROBE = f"""
import json, runpy, sys
sys.argv = ["etn", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("etn_cli", run_name="__main__")
except SystemExit as exit_:
    code = exit_.code
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def run_etn(*args: str, cwd: Path) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["code"], result["heavy"], done.stderr


def misspelt(tmp_path: Path, old: str, new: str) -> str:
    text = DIGITS.read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def test_help_loads_no_heavy_module(tmp_path: Path) -> None:
    for args in (["--help"], ["run", "--help"], ["report", "--help"], ["ls", "backbones"]):
        code, heavy, _ = run_etn(*args, cwd=tmp_path)
        assert code == 0 and heavy == [], (args, heavy)


REFUSALS = {  # what is wrong -> (how to make it, in the refusal's line)
    "misspelt top-level key": ("seeds = [0, 1, 2]", "seed = [0, 1, 2]", "Did you mean 'seeds'"),
    "misspelt head setting": ("prior_mode = 10", "prior_mod = 10", "Did you mean 'prior_mode'"),
    "unknown head": ('name = "etn_offset"', 'name = "etn_ofset"', "Unknown head 'etn_ofset'"),
    "unknown dataset": ('id = "digits"', 'id = "digit"', "Unknown dataset 'digit'"),
    "unknown backbone": ('name = "digits_cnn"', 'name = "digit_cnn"', "Unknown backbone"),
    "bad head value": ("prior_mode = 10", "prior_mode = -1", "'prior_mode' must be"),
    "misspelt backbone option": ("odin = true", "odinn = true", "Did you mean 'odin'"),
    "bad backbone value": ("odin = true", "odin = 3", "key 'odin' expected bool"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
@pytest.mark.parametrize("command", ["run", "train", "status"])
def test_a_mistake_in_the_pipeline_file_is_refused_before_torch_loads(
    tmp_path: Path, case: str, command: str
) -> None:
    old, new, said = REFUSALS[case]
    bad = misspelt(tmp_path, old, new)
    code, heavy, stderr = run_etn(command, bad, "-d", str(tmp_path / "data"), cwd=tmp_path)
    assert code == 2 and said in stderr and heavy == [], (stderr, heavy)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--set", "heads.etn.epochs=abc"], "expected int"),
        (["--set", "sed=1"], "Unknown key 'sed'"),
        (["--device", "gpu"], "Unknown device 'gpu'"),
        (["--set", "device=tpu"], "Unknown device 'tpu'"),
        (["--only", "etm"], "has no [[heads]] named 'etm'"),
        (["--metric", "aurpc"], "Unknown metric 'aurpc'"),
        (["--format", "xml"], "Unknown format 'xml'"),
        (["--set", "backbone.epochz=3"], "Unknown key 'epochz'"),
        (["--set", "backbone.dropout=1.5"], "0 <= dropout < 1"),
        (["--set", "finetune.epochs=3"], "Backbone 'digits_cnn' has no fine-tuning stage"),
        (["--set", "data.options.digits.size=3"], "Dataset 'digits' takes no options"),
    ],
)
def test_a_bad_option_is_refused_before_torch_loads(
    tmp_path: Path, args: list[str], said: str
) -> None:
    code, heavy, stderr = run_etn("run", str(DIGITS), *args, "-d", str(tmp_path), cwd=tmp_path)
    assert code == 2 and said in stderr and heavy == [], (stderr, heavy)


def test_a_missing_pipeline_file_is_refused_before_torch_loads(tmp_path: Path) -> None:
    code, heavy, stderr = run_etn("run", "nothere.toml", cwd=tmp_path)
    assert code == 2 and "does not exist" in stderr and heavy == [], (stderr, heavy)


@pytest.mark.parametrize(
    "pipeline, option, said",
    [
        (IMAGES, "backbone.modell='resnet18'", "Unknown key 'modell'"),
        (IMAGES, "backbone.dtype='float8'", "key 'dtype' expected one of"),
        (IMAGES, "finetune.epochz=3", "[finetune]. Did you mean 'epochs'"),
        (IMAGES, "data.options.image_folder.clases='x.txt'", "Did you mean 'classes'"),
        (QUESTIONS, "backbone.letterz=['A', 'B']", "Unknown key 'letterz'"),
        (QUESTIONS, "backbone.letters=['A']", "letters must be at least two"),
        (QUESTIONS, "finetune.lora_rnk=4", "Did you mean 'lora_rank'"),
        (QUESTIONS, "data.options.mcqa_jsonl.size=3", "Dataset 'mcqa_jsonl' takes no options"),
        (IMAGES, "data.root='nowhere'", "The [data] root folder"),
        (QUESTIONS, "data.root='nowhere'", "The [data] root folder"),
    ],
)
def test_a_mistake_in_any_backbone_or_dataset_table_is_refused_before_torch_loads(
    tmp_path: Path, pipeline: Path, option: str, said: str
) -> None:
    args = ("run", str(pipeline), "--set", option, "-d", str(tmp_path / "data"))
    code, heavy, stderr = run_etn(*args, cwd=tmp_path)
    assert code == 2 and said in stderr and heavy == [], (stderr, heavy)
    assert len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize(
    "args, said",
    [
        (["--threshold", "mi=abc"], "--threshold expects SCORE@PERCENT"),
        (["--threshold", "mii=0.2"], "--threshold expects SCORE@PERCENT"),
        (["--threshold", "mp@0"], "--threshold expects SCORE@PERCENT"),
        (["--out", "rows.txt"], "--out must end in .parquet or .csv"),
        (["--device", "gpu"], "Unknown device 'gpu'"),
        (["--head", "etm"], "has no head 'etm'. Did you mean: etn"),
        (["--seed", "7"], "has seeds [0, 1, 2], not 7. Pick one."),
    ],
)
def test_a_bad_predict_option_is_refused_before_torch_loads(
    tmp_path: Path, args: list[str], said: str
) -> None:
    command = ("predict", str(DIGITS), "digits:test", *args, "-d", str(tmp_path / "data"))
    code, heavy, stderr = run_etn(*command, cwd=tmp_path)
    assert code == 2 and said in stderr and heavy == [], (stderr, heavy)


@pytest.mark.parametrize(
    "args, said",
    [
        (["run", str(DIGITS), "-d", "afile"], "is a file, not a folder"),
        (["status", str(DIGITS), "-d", "afile"], "is a file, not a folder"),
        (["verify", "-d", "afile"], "is a file, not a folder"),
        (["finetune", str(DIGITS), "-d", "data"], "has no [finetune] table"),
        (["report", "nothere.parquet", "-d", "data"], "Metrics file nothere.parquet does not"),
        (["import", "nothere.npz", "-o", "out"], "No such file: nothere.npz"),
        (["predict", str(DIGITS), "nothere/", "-d", "data"], "Input nothere/ does not exist"),
    ],
)
def test_a_wrong_path_is_refused_before_torch_loads(
    tmp_path: Path, args: list[str], said: str
) -> None:
    (tmp_path / "afile").write_text("not a folder")
    code, heavy, stderr = run_etn(*args, cwd=tmp_path)
    assert code == 2 and said in stderr and heavy == [], (stderr, heavy)


@pytest.mark.parametrize("head", ["etm", "nonsense", "Odin", "ETN + T", "laplace (diag)"])
def test_a_head_refused_before_torch_loads_is_refused_as_the_stage_refuses_it(
    tmp_path: Path, head: str
) -> None:
    """``etn predict --head`` that names no head of the pipeline: the light check's line is the
    stage's; what might name one (a label's beginning, any case) is left to the stage."""
    from etn_cli.errors import EtnError
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.stages.predict_options import check_head_named
    from etn_cli.stages.trained_heads import pipeline_head, plan_of

    pipeline = load_pipeline(DIGITS)
    with pytest.raises(EtnError) as stage:
        pipeline_head(plan_of(DIGITS, tmp_path / "data"), head, 0)
    try:
        check_head_named(pipeline, head)
    except EtnError as light:
        assert str(light) == str(stage.value)
    else:  # left to the stage, whose line must then be about this head
        assert head in str(stage.value)


@pytest.mark.parametrize("head, seed", [("etn", 7), ("etn", -1), ("etn_offset", 3), ("msp", 9)])
def test_a_seed_refused_before_torch_loads_is_refused_as_the_stage_refuses_it(
    tmp_path: Path, head: str, seed: int
) -> None:
    """``etn predict --seed`` the head was not trained with: the stage's line, before torch; a
    head that draws nothing at random (``msp``) takes any seed, there and here."""
    from etn_cli.errors import EtnError
    from etn_cli.planning.pipeline import load_pipeline
    from etn_cli.stages.predict_options import check_head_seed
    from etn_cli.stages.trained_heads import pipeline_head, plan_of

    pipeline = load_pipeline(DIGITS)
    with pytest.raises(EtnError) as stage:  # a seed it lacks, or (msp) not trained yet
        pipeline_head(plan_of(DIGITS, tmp_path / "data"), head, seed)
    if "not trained" in str(stage.value):
        check_head_seed(pipeline, head, seed)  # nothing to refuse
    else:
        with pytest.raises(EtnError) as light:
            check_head_seed(pipeline, head, seed)
        assert str(light.value) == str(stage.value)
