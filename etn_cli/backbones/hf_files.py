"""Finding a Hugging Face causal LM, its tokenizer and a peft adapter on disk, and naming their
content cheaply for the feature fingerprint.

A model is a local folder (``config.json``, ``*.safetensors``, tokenizer files) or a hub id.
A hub id is resolved to a commit of the Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``);
only its small files are fetched at plan time, the weights when the model is first loaded.
``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) means cache only. A hub commit names its
content; a local folder is named by the sha256 of its files, memoised by size, times and inode in
the backbone cache so that only the first plan reads the weights in full.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etn_cli.errors import EtnError
from etn_cli.store.content import FileMemo, memo_at
from etn_cli.store.fingerprint import file_sha256

HASHED_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".tiktoken", ".py", ".jinja")
SMALL_FILES = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.py", "*.jinja"]
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def is_offline() -> bool:
    """True when the user switched the Hugging Face hub off (read at call time, not import)."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(n, "").strip().upper() in {"1", "ON", "YES", "TRUE"} for n in names)


@dataclass(frozen=True)
class ModelLocation:
    """Where a model's files are: ``folder`` holds config and tokenizer (a hub snapshot or the
    user's folder); ``repo_id`` and ``commit`` are set for hub models."""

    name: str  # as the user wrote it
    folder: Path
    repo_id: str | None = None
    commit: str | None = None

    @property
    def load_from(self) -> str:
        return self.repo_id or str(self.folder)


def locate_model(model: str, revision: str | None, download: bool | None = None) -> ModelLocation:
    """A local folder if one exists at ``model``, otherwise a hub id resolved in the cache:
    fetched from the hub unless it is off (``download`` None), or only with ``download``."""
    path = Path(model).expanduser()
    if path.is_dir():
        if revision is not None:
            raise EtnError(
                f"revision = {revision!r} applies to hub ids, but model {model!r} is a local "
                "folder. Remove revision from [backbone]."
            )
        return ModelLocation(model, path.resolve())
    if not REPO_ID.match(model):
        raise EtnError(
            f"Model folder {path} does not exist and {model!r} is not a Hugging Face hub id. "
            "Point model at a folder with config.json and *.safetensors, or use an id such as "
            "'meta-llama/Llama-3.1-8B'."
        )
    folder = hub_snapshot(model, revision, download)
    return ModelLocation(model, folder, model, folder.name)


def hub_snapshot(repo_id: str, revision: str | None, download: bool | None = None) -> Path:
    """The cache snapshot folder of ``repo_id`` at ``revision`` with its small files, from the
    cache alone when the hub is off or ``download`` is False."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}@{revision or 'main'}"
    try:
        return Path(
            snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=SMALL_FILES,
                local_files_only=is_offline() or download is False,
            )
        )
    except LocalEntryNotFoundError:
        why = "download is false" if download is False else "the hub is off or unreachable"
        hint = ", set download = true in [backbone]," if download is False else ""
        raise EtnError(
            f"Model {at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}. "
            f"Run `hf download {repo_id}` where there is internet (same HF_HOME){hint} or set "
            "model to a local folder."
        ) from None
    except GatedRepoError:
        raise EtnError(
            f"Model {repo_id} is gated: accept its licence on huggingface.co, then log in with "
            "`hf auth login` (or set HF_TOKEN) and run again."
        ) from None
    except RepositoryNotFoundError:
        raise EtnError(
            f"Model {repo_id} was not found on the Hugging Face hub (or needs a token). "
            "Check the id, or log in with `hf auth login`."
        ) from None
    except RevisionNotFoundError:
        raise EtnError(f"Model {repo_id} has no revision {revision!r}. Fix revision.") from None
    except HfHubHTTPError as err:
        raise EtnError(f"The Hugging Face hub refused {at}: {err}. Try again later.") from None


def read_model_config(
    location: ModelLocation, trust_remote_code: bool, kind: str = "causal LM"
) -> dict[str, Any]:
    """``config.json``, refusing models that need their repository's code unless trusted."""
    path = location.folder / "config.json"
    if not path.is_file():
        raise EtnError(
            f"Expected a Hugging Face model folder with config.json at {location.folder}, found "
            "none. Point model at the folder that holds config.json and *.safetensors."
        )
    from etn_cli.store.artefacts.headfiles import read_json_object

    config = read_json_object(path, "Point model at a Hugging Face model folder.")
    from transformers import CONFIG_MAPPING, __version__

    model_type = config.get("model_type")
    if model_type in CONFIG_MAPPING or trust_remote_code:
        return config
    if config.get("auto_map"):
        raise EtnError(
            f"Model {location.name} needs custom code from its repository (config.json "
            f"auto_map, model_type {model_type!r}); etn never runs such code unless asked. "
            "If you trust it, set trust_remote_code = true in [backbone]."
        )
    raise EtnError(
        f"Model {location.name} has model_type {model_type!r}, which transformers {__version__} "
        f"does not know. Upgrade transformers or use a supported {kind}."
    )


HashMemo = FileMemo  # sha256 of model files, remembered in the backbone cache


def hash_memo(path: Path) -> FileMemo:
    """The process's sha256 memo kept in ``path`` (read from it the first time). Planning only
    reads it: it is saved once the model has loaded, so that a run refused while planning (a
    malformed question file, say) leaves the data directory as it was."""
    return memo_at(path, "sha256")


def folder_hashes(folder: Path, memo: HashMemo) -> dict[str, str]:
    """sha256 of every config, tokenizer, code and weight file directly inside ``folder``
    (new ones are remembered in ``memo``, written by its :meth:`HashMemo.save`)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in HASHED_SUFFIXES)
    return {p.name: memo.sha256(p) for p in files}


def check_adapter_folder(path: str | Path) -> Path:
    """A peft adapter folder with ``adapter_config.json`` and safetensors weights."""
    folder = Path(path).expanduser()
    if not (folder / ADAPTER_CONFIG).is_file():
        raise EtnError(
            f"Expected a peft adapter folder with {ADAPTER_CONFIG} at {folder}, found none. "
            "Point adapter at the folder written by peft's save_pretrained or `etn finetune`."
        )
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise EtnError(
            f"Adapter folder {folder} has no {ADAPTER_WEIGHTS}; etn loads weights only from "
            "safetensors. Re-save the adapter with save_pretrained(safe_serialization=True)."
        )
    return folder.resolve()


def adapter_fingerprint(folder: Path) -> dict[str, str]:
    """The adapter's content (its path does not matter)."""
    return {
        "config_sha256": file_sha256(folder / ADAPTER_CONFIG),
        "weights_sha256": file_sha256(folder / ADAPTER_WEIGHTS),
    }


def load_tokenizer(location: ModelLocation, trust_remote_code: bool) -> Any:
    """The model's tokenizer, padding on the left; a missing pad token borrows EOS."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(location.folder), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except (OSError, ValueError) as err:
        raise EtnError(
            f"Could not load the tokenizer of {location.name} from {location.folder}: "
            f"{first_line(err)}. The folder needs tokenizer.json (or the model's tokenizer files)."
        ) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise EtnError(
                f"The tokenizer of {location.name} has neither a pad nor an EOS token; etn needs "
                "one to pad batches. Add a pad_token to its tokenizer_config.json."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
