"""``etn import FILE... --out DIR``: features computed elsewhere, as etn's split folders.

Registered on the command line by :mod:`etn_cli.cli`; kept here so the command stays next to
the format it reads (:mod:`etn_cli.own_features.files`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def import_command(
    files: Annotated[
        list[Path], typer.Argument(help="Feature files (.npz, .safetensors, .h5), one per split.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the splits into.")],
    classifier: Annotated[
        Path | None,
        typer.Option(help="A .npz / .safetensors file with weight (C, D) and bias (C,)."),
    ] = None,
) -> None:
    """Turn feature files into split folders (HDF5 shards + manifest), one per file.

    Each file holds hidden (N, D), logits (N, C), labels (N,) and optionally index, layers/<name>,
    weight and bias; every file is checked before anything is written. The folders can then be
    named in a pipeline's [features] table (etn run also imports files named there itself).
    """
    from etn_cli.errors import EtnError
    from etn_cli.own_features.importer import import_files

    missing = [str(p) for p in [*files, *([classifier] if classifier else [])] if not p.is_file()]
    if missing:
        raise EtnError(f"No such file: {', '.join(missing)}. Pass feature files to import.")
    for line in import_files(files, out, classifier):
        typer.echo(line)
