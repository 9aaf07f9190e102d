"""Every documented command works as written, and every refusal leads somewhere: each case a
new user met (issue 28), through the installed ``etn`` entry point in a subprocess. A refusal
is one ``error:`` line naming the real cause and the fix, exit status 2, nothing written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import STAMP
from test_cli_conventions import write_shards
from tiny_pipeline import calibrated_pair, causal_lm, questions, tiny_pipeline

REPO = Path(__file__).resolve().parents[1]
ETN = [shutil.which("etn")] if shutil.which("etn") else [sys.executable, "-m", "etn_cli"]


def etn(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ETN, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
        timeout=600,
    )


def refused(done: subprocess.CompletedProcess, *phrases: str) -> str:
    """The one ``error:`` line of a refusal (exit 2), checked to hold every phrase."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for phrase in phrases:
        assert phrase in errors[0], (phrase, errors[0])
    return errors[0]


# ---------------------------------------------------------------------- the digits default
TWO_ETNS = tiny_pipeline("two-etns", heads=calibrated_pair(2))


@pytest.mark.slow  # a whole digits run and predict: about 15 s
def test_the_default_head_is_the_etn_whose_label_it_is_not_also_etn_plus_ts(tmp_path: Path) -> None:
    import etn_cli

    pipeline, data = tmp_path / "two.toml", tmp_path / "data"
    pipeline.write_text(TWO_ETNS)
    assert etn("run", pipeline, "-d", data, "-q").returncode == 0
    done = etn("predict", pipeline, "digits:test", "-d", data, "-o", tmp_path / "p.parquet")
    assert done.returncode == 0 and "316 rows written" in done.stdout, done.stderr
    head = etn_cli.load_head(pipeline=pipeline, head="etn", data_dir=data)
    model = etn_cli.EvidentialModel.from_pipeline(pipeline, data_dir=data)  # head="etn"
    assert head.config.calibrate == model.head.config.calibrate == "none"
    calibrated = etn_cli.load_head(pipeline=pipeline, head="ETN + TS", data_dir=data)
    assert calibrated.config.calibrate == "temperature"


def test_predict_on_a_fresh_data_directory_builds_nothing_and_says_what_to_run(
    tmp_path: Path,
) -> None:
    data, out = tmp_path / "fresh", tmp_path / "p.parquet"
    digits = REPO / "pipelines" / "digits.toml"
    done = etn("predict", digits, "digits:test", "--head", "etn", "-d", data, "-o", out)
    refused(done, "Head 'ETN' (seed 0)", "is not trained", "Run `etn train")
    missing = refused(etn("predict", digits, "/nonexistent", "-d", data, "-o", out))
    assert "Input /nonexistent does not exist" in missing and "mmlu" not in missing
    assert not data.exists() and not out.exists()  # no digits CNN trained, nothing written


def test_an_unknown_ood_dataset_is_named_before_any_complaint_about_groups(tmp_path: Path) -> None:
    digits, data = REPO / "pipelines" / "digits.toml", tmp_path / "data"
    done = etn("run", digits, "--set", 'data.ood=["digits_unsen"]', "-d", data, "--dry-run")
    line = refused(
        done, "[data] ood: Unknown dataset 'digits_unsen'", "Did you mean: digits_unseen"
    )
    assert "groups" not in line
    done = etn("run", digits, "--set", 'data.ood=["digits_noise"]', "-d", data, "--dry-run")
    refused(done, "[data.groups] semantic lists ['digits_unseen']", "--set 'data.groups={}'")
    done = etn(*["run", digits, "--set", 'data.ood=["digits_noise"]', "--set", "data.groups={}"],
               *["-d", data, "--dry-run"])  # fmt: skip
    assert done.returncode == 0 and "would build" in done.stdout, done.stderr
    assert not data.exists()


def test_a_dry_run_refuses_a_device_as_the_run_does(tmp_path: Path) -> None:
    digits, data = REPO / "pipelines" / "digits.toml", tmp_path / "data"
    for command in (["run", "--dry-run"], ["run"]):
        refused(etn(*command, digits, "--set", "device=tpu", "-d", data), "Unknown device 'tpu'")
    assert not data.exists()


# --------------------------------------------------------------- your own model and data
def copy_examples(folder: Path) -> Path:
    folder.mkdir()
    for path in (REPO / "examples").iterdir():
        if path.suffix in (".toml", ".py"):
            shutil.copy(path, folder / path.name)
    return folder


def test_the_examples_before_their_standins_say_how_to_write_them(tmp_path: Path) -> None:
    examples = copy_examples(tmp_path / "examples")
    for name, cause in (
        ("images", "[data] root folder"),
        ("questions", "[data] root folder"),
        ("features", "Feature folder"),
    ):
        done = etn("run", f"examples/{name}.toml", "-d", tmp_path / "data", cwd=tmp_path)
        refused(done, cause, "does not exist", "`python examples/standins.py` writes stand-ins")
    assert not (tmp_path / "data").exists() and sorted(p.name for p in examples.iterdir())


def tiny_pngs(folder: Path, count: int, seed: int = 0) -> list[Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        shade = (seed * 37 + i * 11) % 256
        path = folder / f"img{seed}-{i}.png"
        Image.new("RGB", (16, 16), (shade, 255 - shade, 128)).save(path)
        paths.append(path)
    return paths


BACKBONE = """
name = "mine"
seeds = [0]
[backbone]
name = "torchvision"
model = "resnet18"
weights = "none"
num_classes = {classes}
resize = 16
crop = 16
[[heads]]
name = "map"
"""


def test_a_class_count_found_after_planning_is_an_error_line_with_exit_2(tmp_path: Path) -> None:
    pytest.importorskip("torchvision")
    for split in ("adapt", "test"):
        for name in ("cat", "dog"):
            tiny_pngs(tmp_path / "images" / split / name, 2)
    pipeline = tmp_path / "mine.toml"
    pipeline.write_text(
        BACKBONE.format(classes=3) + '[data]\nid = "image_folder"\nroot = "images"\n'
    )
    done = etn("run", pipeline, "-d", tmp_path / "data")
    line = refused(done, f"error: {pipeline}: ", "has 2 classes", "has 3 outputs")
    assert "FAILED" not in line and not list((tmp_path / "data").glob("features/*/*"))


def readme_block(start: str) -> str:
    """The fenced block of docs/own-data.md that begins with ``start``."""
    readme = (REPO / "docs" / "own-data.md").read_text()
    at = readme.index(start)
    return readme[at : readme.index("```", at)]


def test_one_image_list_is_split_as_the_readme_shows_and_refused_in_both_roles(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torchvision")
    root = tmp_path / "my_openood"
    images = tiny_pngs(root / "images" / "cifar", 10) + tiny_pngs(root / "images" / "far", 4, 1)
    lines = [f"{p.relative_to(root / 'images')} {i % 2}" for i, p in enumerate(images[:10])]
    (root / "all.txt").write_text("\n".join(lines) + "\n")
    (root / "far.txt").write_text("".join(f"far/{p.name} -1\n" for p in images[10:]))
    split = readme_block("import random\nfrom pathlib import Path")
    subprocess.run([sys.executable, "-c", split], cwd=tmp_path, check=True)
    adapt = (root / "adapt.txt").read_text().splitlines()
    test = (root / "test.txt").read_text().splitlines()
    assert len(adapt) == 2 and sorted(adapt + test) == sorted(lines)
    data_table = readme_block('[data]\nid = "image_list"')
    pipeline = tmp_path / "mine.toml"
    pipeline.write_text(BACKBONE.format(classes=2) + data_table)
    done = etn("run", pipeline, "-d", tmp_path / "data", "--dry-run")
    assert done.returncode == 0 and "would build" in done.stdout, done.stderr
    both = data_table.replace('test = "test.txt"', 'test = "adapt.txt"')
    pipeline.write_text(BACKBONE.format(classes=2) + both)
    refused(etn("run", pipeline, "-d", tmp_path / "data"), "adapt and test both read", "adapt.txt")


# ------------------------------------------------------------------------- answer letters
def five_choices(folder: Path) -> Path:
    from llm_fixtures import write_jsonl

    records = [
        {"question": f"{a} plus {b}?", "choices": [str(a + b + k) for k in range(5)], "answer": "A"}
        for a, b in ((1, 2), (2, 3), (3, 4), (4, 1), (2, 2), (3, 1))
    ]
    write_jsonl(folder / "adapt.jsonl", records)
    write_jsonl(folder / "test.jsonl", records[::-1])
    return folder


@pytest.mark.parametrize(
    "spare",
    ["ABCDEFGHIJ", pytest.param("ABCD", marks=pytest.mark.slow)],  # the second: about 20 s
    ids=["stand-in", "four-letter-tokenizer"],
)
def test_the_two_letter_errors_say_the_one_thing_that_works(tmp_path: Path, spare: str) -> None:
    """5-choice questions: the stand-in LM has single tokens for A to J, so both errors (too
    few letters; a letter that is no single token) say to set A to E; a tokenizer with only
    four letter tokens makes both name five letters it does have (here the digits 1 to 5),
    never one error sending the user to the other. Following the advice plans."""
    pytest.importorskip("transformers")
    from llm_fixtures import make_llama

    model = make_llama(tmp_path / "llm", letters=tuple(spare))
    five_choices(tmp_path / "questions")
    pipeline = tmp_path / "five.toml"

    def dry_run(letters: list[str]) -> subprocess.CompletedProcess:
        pipeline.write_text(
            tiny_pipeline("five", backbone=causal_lm(model, letters=letters), data=questions())
        )
        return etn("run", pipeline, "-d", tmp_path / "data", "--dry-run")

    works = list("ABCDE") if spare == "ABCDEFGHIJ" else list("12345")
    tried = [list("ABCD")] + ([list("ABCDE")] if spare == "ABCD" else [])
    for letters in tried:
        refused(dry_run(letters), f"Set letters = {works} in [backbone]: each is one token here")
    done = dry_run(works)
    assert done.returncode == 0 and "would build" in done.stdout, done.stderr
    assert not (tmp_path / "data").exists()


def test_letter_advice_without_enough_single_tokens_keeps_the_letters_there_are() -> None:
    """With four single-token letters and none of the other sets, the advice is to keep those
    four and leave out the questions with more choices (as both errors then say)."""
    from etn_cli.backbones.lm_forward import letters_advice
    from etn_cli.backbones.prompts import resolve_template

    class FourLetters:  # words as tokens; of the single characters only A-D are known
        unk_token_id = 0

        def __call__(self, text: str) -> dict:
            return {"input_ids": [self.token(word) for word in text.split()]}

        def token(self, word: str) -> int:
            if len(word) == 1:
                return ord(word) if word in "ABCD" else self.unk_token_id
            return 1000 + sum(map(ord, word))

        def decode(self, ids: list[int]) -> str:
            return chr(ids[0]) if ids[0] < 1000 else "?"

    template = resolve_template("default", "{letter}. {text}")
    advice = letters_advice(FourLetters(), template, ("A", "B", "C", "D"), 5)
    assert "has 4: set letters = ['A', 'B', 'C', 'D'] and leave out the questions with" in advice


# ------------------------------------------------------------------------------ the terminal
FEATURES = """
name = "own"
seeds = [0, 1]
[features]
adapt = "mine/adapt"
test = "mine/test"
ood = ["mine/far"]
[[heads]]
name = "etn"
epochs = 3
[[heads]]
name = "map"
"""


def test_on_a_terminal_a_run_prints_one_line_per_finished_unit(tmp_path: Path) -> None:
    """Under a pseudo-terminal: no time stamps, a ``started`` line only for a unit that ran
    longer than 2 s, and a closing line within 100 columns."""
    import pty

    for name, n, shift, seed in (("adapt", 60, 0, 0), ("test", 90, 0, 1), ("far", 60, 2, 2)):
        write_shards(tmp_path / "mine" / name, np.random.default_rng(seed), n, shift)
    (tmp_path / "own.toml").write_text(FEATURES)
    screen, terminal = pty.openpty()
    done = subprocess.run(
        [*ETN, "run", "own.toml", "-d", "data"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=terminal,
        env={**os.environ, "COLUMNS": "100"},
        timeout=600,
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(screen, 65536)
        except OSError:  # the terminal closed: everything is read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(screen)
    assert done.returncode == 0
    lines = [line.strip("\r") for line in b"".join(chunks).decode().split("\n") if line.strip()]
    assert not any(STAMP.match(line) for line in lines), lines
    units = [line for line in lines if re.match(r"^\[\s*\d+/\d+\] ", line)]
    finished = [line for line in units if ": done in " in line]
    started = {line.split(": started")[0] for line in units if line.endswith(": started")}
    assert len(finished) == 6, lines  # ETN x 2 seeds and MAP, trained and scored
    slow = {line.split(": done in ")[0] for line in finished if float(line.split()[-2]) >= 2}
    assert started <= slow, (started, slow)
    assert lines[-1].startswith("ok own.toml (") and len(lines[-1]) <= 100, lines[-1]
