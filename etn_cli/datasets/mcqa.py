"""Multiple-choice QA datasets of the paper: RACE and OpenBookQA (in-distribution) and the MMLU
subsets used as OOD sets (paper, Supp. Table "MMLU domains and their corresponding subsets",
after Yang et al. 2024), plus a seeded synthetic ``tiny_mcqa`` for tests and demos.

Each split is read from files under ``[data] root`` in the schema of :mod:`mcqa_files`::

    <root>/race/{train,validation,test}.{jsonl,parquet}     (or <split>-*.parquet shards)
    <root>/obqa/{train,validation,test}.{jsonl,parquet}     (``dev`` is read as validation)
    <root>/mmlu/<subject>/{test,validation,dev}.{jsonl,parquet}
    <root>/mmlu/data/{test,val,dev}/<subject>_<split>.csv   (MMLU's original release)

A Hugging Face download is found where it lands: ``hf download ehovy/race --repo-type dataset
--local-dir <root>/race`` leaves ``race/all/<split>-*.parquet`` (``obqa/main/...`` for
``allenai/openbookqa``, ``mmlu/<subject>/<split>-*.parquet`` for ``cais/mmlu``), and without
``--local-dir`` the files are read from the hub cache's snapshot (``datasets--ehovy--race/
snapshots/<refs/main>/all/``). When a split has no files in either place and the Hugging Face
``datasets`` library is installed, it is read from the hub datasets ``ehovy/race`` (``all``),
``allenai/openbookqa`` (``main``) and ``cais/mmlu`` (one config per subject), honouring
``HF_DATASETS_OFFLINE`` and the HF cache. ``Split.data[i]`` is ``(Question, answer index)``;
the backbone renders the prompt, so the prompt template belongs to the backbone's fingerprint.
``Split.index`` is the question's position in its source split (for MMLU groups: in the
subjects concatenated in table order).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset as TorchDataset

from etn_cli.datasets.base import DatasetSource, Split, datasets
from etn_cli.datasets.mcqa_files import SUFFIXES, Question, read_questions
from etn_cli.datasets.settings import refuse_options
from etn_cli.errors import EtnError
from etn_cli.store.fingerprint import file_sha256

READER_VERSION = 1
NUM_CHOICES = 4
MMLU_GROUPS = {
    "mmlu_cs": (
        "college_computer_science",
        "computer_security",
        "high_school_computer_science",
        "machine_learning",
    ),
    "mmlu_eng": ("electrical_engineering",),
    "mmlu_math": ("college_mathematics", "high_school_mathematics", "abstract_algebra"),
}
# The paper's main text (Sec. 5.1 "LLM Datasets") names mathematics, computer science and
# *health*; its Supp. table lists engineering instead and gives no health subjects. For that
# reading, MMLU's own "health" subcategory (hendrycks/test, categories.py):
MMLU_MAIN_TEXT_GROUPS = {
    "mmlu_health": (
        "anatomy",
        "clinical_knowledge",
        "college_medicine",
        "human_aging",
        "medical_genetics",
        "nutrition",
        "professional_medicine",
        "virology",
    ),
}
MMLU_CSV_SPLITS = {"test": "test", "validation": "val", "dev": "dev"}


class QuestionSet(TorchDataset):
    """``data[i] == (questions[i], questions[i].answer)``."""

    def __init__(self, questions: list[Question]) -> None:
        self.questions = questions

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, i: int) -> tuple[Question, int]:
        return self.questions[i], self.questions[i].answer

    def select(self, positions: list[int]) -> QuestionSet:
        """The questions at ``positions``, still a question set (a seeded sample, a held-out
        calibration part)."""
        return QuestionSet([self.questions[i] for i in positions])

    @property
    def labels(self) -> np.ndarray:
        """The answers (N,) as labels, -1 where a file gives none."""
        return np.asarray([q.answer for q in self.questions], dtype=np.int64)


@dataclass(frozen=True)
class Part:
    """One file set of a dataset: a folder under the root and its Hugging Face name."""

    folder: str
    hf: tuple[str, str]  # (hub dataset, config) for the `datasets` library
    mmlu_subject: str | None = None  # also look for MMLU's original CSV files


class MCQASource(DatasetSource):
    """A multiple-choice QA dataset made of one or more :class:`Part` s, read in order."""

    parts: ClassVar[tuple[Part, ...]]
    aliases: ClassVar[dict[str, tuple[str, ...]]] = {}  # split -> other file stems to try

    def __init__(self, root: str | None = None, **options: Any) -> None:
        refuse_options(self.name, "mcqa", options)
        super().__init__(root)
        self._loaded: dict[str, tuple[list[Question], dict[str, Any]]] = {}

    def load_split(self, split: str) -> Split:
        questions, fp = self._read(split)
        index = np.arange(len(questions), dtype=np.int64)
        return Split(self.name, split, QuestionSet(questions), index, NUM_CHOICES, fp)

    def split_fingerprint(self, split: str) -> dict[str, Any]:
        return self._read(split)[1]

    def _read(self, split: str) -> tuple[list[Question], dict[str, Any]]:
        if split not in self.splits:
            raise EtnError(
                f"Dataset {self.name!r} has no split {split!r}. "
                f"Available splits: {', '.join(self.splits)}. Use one of them."
            )
        if split not in self._loaded:
            questions: list[Question] = []
            sources = []
            for part in self.parts:
                part_questions, source = self._read_part(part, split)
                questions += part_questions
                sources.append(source)
            fp = {
                "dataset": self.name,
                "split": split,
                "sources": sources,
                "num_choices": NUM_CHOICES,
                "reader_version": READER_VERSION,
            }
            self._loaded[split] = (questions, fp)
        return self._loaded[split]

    def _read_part(self, part: Part, split: str) -> tuple[list[Question], dict[str, Any]]:
        tried = self.candidates(part, split)
        for files in tried:
            if files and all(f.is_file() for f in files):
                questions = [q for f in files for q in read_questions(f, NUM_CHOICES)]
                root = Path(self.root or ".")
                hashes = {shown_path(f, root): file_sha256(f) for f in files}
                return questions, {"part": part.folder, "files": hashes}
        from_hub = read_hf(part, split)
        if from_hub is not None:
            return from_hub
        looked = ", ".join(str(files[0]) for files in tried if files) or "nothing: no [data] root"
        raise EtnError(
            f"Dataset {self.name!r} split {split!r}: no files found (looked for {looked}) and the "
            "Hugging Face `datasets` library is not installed. Put the split there in the "
            "schema of docs/own-data.md ('Multiple-choice questions'; set [data] root), or "
            "`pip install datasets` to read "
            f"{part.hf[0]} ({part.hf[1]}) from the Hugging Face hub."
        )

    def candidates(self, part: Part, split: str) -> list[list[Path]]:
        """File sets to try in order: ``<split>.jsonl``, ``<split>.parquet``, parquet shards,
        then MMLU's original CSV; the first that exists is read."""
        stems = (split, *self.aliases.get(split, ()))
        tried = []
        if self.root is not None:
            folder = Path(self.root) / part.folder
            for stem in stems:
                tried += [[folder / f"{stem}{suffix}"] for suffix in SUFFIXES[:2]]
                tried.append(sorted(folder.glob(f"{stem}-*.parquet")))
                # `hf download <repo> --repo-type dataset --local-dir <root>/<folder>` keeps
                # the repository's layout: one folder per config (race/all/test-*.parquet)
                tried.append(sorted((folder / part.hf[1]).glob(f"{stem}-*.parquet")))
            if part.mmlu_subject is not None and split in MMLU_CSV_SPLITS:
                csv_split = MMLU_CSV_SPLITS[split]
                name = f"{part.mmlu_subject}_{csv_split}.csv"
                tried.append([Path(self.root) / "mmlu" / "data" / csv_split / name])
        snapshot = hub_cache_snapshot(part.hf[0])  # `hf download` without --local-dir
        if snapshot is not None:
            tried += [sorted((snapshot / part.hf[1]).glob(f"{stem}-*.parquet")) for stem in stems]
        return tried


def shown_path(file: Path, root: Path) -> str:
    """A file's path relative to the root, or from its dataset repository in the hub cache."""
    if file.is_relative_to(root):
        return str(file.relative_to(root))
    parts = file.parts
    at = next((i for i, p in enumerate(parts) if p.startswith("datasets--")), None)
    return str(Path(*parts[at:])) if at is not None else str(file)


def hub_cache_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder ``refs/main`` names in the Hugging Face hub cache for the dataset
    repository ``repo_id`` (where `hf download <repo> --repo-type dataset` puts it), or None."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    repo = Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}"
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


def read_hf(part: Part, split: str) -> tuple[list[Question], dict[str, Any]] | None:
    """The split through the Hugging Face ``datasets`` library, or None if it is not installed."""
    try:
        import datasets as hf_datasets
    except ImportError:
        return None
    path, config = part.hf
    try:
        table = hf_datasets.load_dataset(path, config, split=split)
    except (OSError, ValueError) as err:  # offline and not cached, no access, unknown split
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise EtnError(
            f"Could not read {path} ({config}, split {split}) with the Hugging Face datasets "
            f"library: {reason}. Download it once online (HF_DATASETS_OFFLINE unset), or put "
            "the files under [data] root as docs/own-data.md describes."
        ) from None
    from etn_cli.datasets.mcqa_files import parse_record

    where = f"{path} ({config}) {split}"
    questions = []
    for number, raw in enumerate(table):
        for question in parse_record(dict(raw), f"{where} row {number}"):
            questions.append(question)
    if any(len(q.choices) != NUM_CHOICES for q in questions):
        raise EtnError(f"{where}: expected {NUM_CHOICES} choices per question in every row.")
    source = {
        "part": part.folder,
        "hf_dataset": path,
        "config": config,
        "split": split,
        "hf_fingerprint": getattr(table, "_fingerprint", None),
        "rows": len(questions),
    }
    return questions, source


def register(name: str, parts: tuple[Part, ...], splits: tuple[str, ...], doc: str) -> None:
    """Register one MCQA dataset under ``name``."""
    aliases = {"validation": ("dev",)} if name in ("race", "obqa") else {}
    attrs = {"name": name, "parts": parts, "splits": splits, "aliases": aliases, "__doc__": doc}
    datasets.register(name)(type(f"MCQA_{name}", (MCQASource,), attrs))


def mmlu_part(subject: str) -> Part:
    return Part(f"mmlu/{subject}", ("cais/mmlu", subject), mmlu_subject=subject)


ID_SPLITS = ("train", "validation", "test")
MMLU_SPLITS = ("test", "validation", "dev")
register("race", (Part("race", ("ehovy/race", "all")),), ID_SPLITS, "RACE (middle + high).")
register("obqa", (Part("obqa", ("allenai/openbookqa", "main")),), ID_SPLITS, "OpenBookQA (main).")
for _group, _subjects in (MMLU_GROUPS | MMLU_MAIN_TEXT_GROUPS).items():
    register(_group, tuple(mmlu_part(s) for s in _subjects), MMLU_SPLITS, f"MMLU {_subjects}.")
    for _subject in _subjects:
        register(f"mmlu_{_subject}", (mmlu_part(_subject),), MMLU_SPLITS, f"MMLU {_subject}.")
