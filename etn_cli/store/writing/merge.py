"""Merge the pieces every rank of a torchrun extraction wrote (:mod:`.pieces`) into one split.

The merge links a piece that is a whole shard into the split folder as it is, writes each shard
that several ranks share from their pieces, checks the split's index and writes one manifest.
Shards end where a single process ends them and :func:`write_shard` is deterministic, so the
split, its shards and their sha256 equal a single-process run's.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from etn_cli.errors import EtnError
from etn_cli.store.atomic import new_partial, publish
from etn_cli.store.fingerprint import file_sha256
from etn_cli.store.writing.checks import check_unique_index
from etn_cli.store.writing.manifest import SHARD_NAME, build_manifest, load_manifest, save_manifest
from etn_cli.store.writing.pieces import Layout, Piece, pieces_folder
from etn_cli.store.writing.shardfile import open_shard, read_index, write_shard

RETRY = "Run the same torchrun command again; finished pieces are reused."


def merge_pieces(
    split_dir: Path,
    layout: Layout,
    fingerprint: dict[str, Any],
    provenance: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Build the split folder from every rank's pieces, publish it and delete the pieces;
    return its manifest. Call it holding the split's lock, once every rank has succeeded."""
    folder = pieces_folder(split_dir)
    groups = layout.shards()
    found = [[piece_manifest(folder, piece) for piece in group] for group in groups]
    columns, widths = _agreed_columns([m for group in found for m in group], split_dir)
    partial = new_partial(split_dir)
    try:
        shards, indices = [], []
        for number, (group, manifests) in enumerate(zip(groups, found, strict=True)):
            entry, index = _merge_shard(folder, group, manifests, columns, partial, number)
            shards.append(entry)
            indices.append(index)
        fix = "Each sample's position in its source split must appear once; nothing was written."
        check_unique_index(np.concatenate(indices), f"split {split_dir.name!r}", fix)
        manifest = build_manifest(fingerprint, shards, *widths, provenance)
        manifest.update(extra)
        save_manifest(partial, manifest)
        publish(partial, split_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    return manifest


def piece_manifest(folder: Path, piece: Piece) -> dict[str, Any]:
    """The manifest of a finished piece, checked to hold one shard of the piece's rows."""
    manifest = load_manifest(folder / piece.name)
    shards = manifest["shards"]
    whole = (len(shards), manifest["rows"]) == (1, piece.rows)
    if manifest.get("piece") != piece.record() or not whole:
        raise EtnError(
            f"Expected piece {piece.name} of {folder.name} to hold one shard of {piece.rows} "
            f"rows, found {len(shards)} shard(s) of {manifest['rows']} rows. {RETRY}"
        )
    return manifest


def _agreed_columns(
    manifests: list[dict[str, Any]], split_dir: Path
) -> tuple[list[str], tuple[int, int, list[str]]]:
    """The column order the pieces were written in and (hidden size, classes, layers), which
    every piece must share (ranks that loaded different backbones would not)."""
    shapes = {
        repr((m.get("columns"), m["hidden_size"], m["num_classes"], m["layers"])) for m in manifests
    }
    if len(shapes) != 1:
        raise EtnError(
            f"The ranks' pieces of {split_dir.name} disagree on their columns ({sorted(shapes)}); "
            "expected one backbone on every rank. Check that every node loads the same model."
        )
    first = manifests[0]
    return first["columns"], (first["hidden_size"], first["num_classes"], first["layers"])


def _merge_shard(
    folder: Path,
    group: list[Piece],
    manifests: list[dict[str, Any]],
    columns: list[str],
    partial: Path,
    number: int,
) -> tuple[dict[str, Any], np.ndarray]:
    """Shard ``number`` of the split in ``partial``: a whole piece's file linked as it is, or
    the pieces of several ranks written as one shard; its manifest entry and index (R,)."""
    name = SHARD_NAME.format(number)
    pairs = zip(group, manifests, strict=True)
    files = [folder / piece.name / found["shards"][0]["file"] for piece, found in pairs]
    rows = sum(piece.rows for piece in group)
    if len(group) == 1:
        _link(files[0], partial / name)
        entry = {"file": name, "rows": rows, "sha256": manifests[0]["shards"][0]["sha256"]}
        return entry, read_index(partial / name)
    parts = [_read_columns(file, columns) for file in files]
    arrays = {key: np.concatenate([part[key] for part in parts]) for key in columns}
    write_shard(partial / name, arrays)
    return {"file": name, "rows": rows, "sha256": file_sha256(partial / name)}, arrays["index"]


def _read_columns(path: Path, columns: list[str]) -> dict[str, np.ndarray]:
    """Every dataset of one shard as stored (dtype kept), so a rewrite gives the same bytes."""
    with open_shard(path, f"piece {path.parent.name}/{path.name}") as handle:
        return {key: handle[key][()] for key in columns}


def _link(source: Path, target: Path) -> None:
    """Hard-link ``source`` as ``target`` (the piece keeps its file until the split is
    published, so a kill during the merge loses nothing); copy where links are refused."""
    try:
        os.link(source, target)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):
            raise
        shutil.copyfile(source, target)
