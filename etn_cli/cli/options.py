"""Options shared by the ``etn`` commands, the entry point's error handling and the choices
a person types (formats, metrics, listings), each checked with a "did you mean".

Kept apart from :mod:`etn_cli.cli.app` so the commands read as a list of what etn does.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from etn_cli.errors import UsageError, choose
from etn_cli.progress import write_line
from etn_cli.store.storage import DATA_DIR_ENV, default_data_dir

FORMATS = ("table", "markdown", "csv", "json", "latex")
FORMAT_ALIASES = {"md": "markdown", "tex": "latex", "text": "table"}


def check_format(value: str) -> str:
    return choose(value, FORMATS, "format", FORMAT_ALIASES)


DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        "-d",
        metavar="DIR",
        help=f"Where features, heads, metrics and reports live (env {DATA_DIR_ENV}; "
        "default ~/.cache/etn).",
        show_default=False,
    ),
]
Device = Annotated[
    str | None,
    typer.Option(
        "--device",
        metavar="DEVICE",
        help="cpu, cuda, cuda:1 … (default: the pipeline's `device`, else auto).",
    ),
]
PipelineArg = Annotated[
    Path,
    typer.Argument(
        metavar="PIPELINE",
        help="A pipeline file (my.toml) or a shipped pipeline's name (digits: `etn ls pipelines`).",
    ),
]
Force = Annotated[bool, typer.Option("--force", help="Redo finished units (new copy swapped in).")]
FailFast = Annotated[
    bool,
    typer.Option(
        "--fail-fast", help="Stop at the first head that fails (else the others still run)."
    ),
]
Quiet = Annotated[
    bool, typer.Option("--quiet", "-q", help="Print only errors, repairs and the results.")
]
Verbose = Annotated[
    bool, typer.Option("--verbose", "-v", help="Also say why each unit runs or is skipped.")
]
Overrides = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Repeatable: override the pipeline file, e.g. heads.etn.epochs=5, "
        "seeds=[0], data.batch_size=128.",
        show_default=False,
    ),
]
Only = Annotated[
    str | None,
    typer.Option(
        "--only",
        metavar="HEADS",
        help="Comma-separated head names or labels to keep, e.g. etn,map.",
    ),
]
FormatOption = Annotated[
    str,
    typer.Option(
        "--format",
        "-f",
        metavar="FORMAT",
        help="table (terminal), markdown, csv, json or latex (md/tex too).",
    ),
]


def resolve_data_dir(data_dir: Path | None) -> Path:
    """The data directory a command uses: ``--data-dir``, else :func:`default_data_dir`."""
    path = (data_dir or default_data_dir()).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(
            f"The data directory {path} is a file, not a folder. Pass --data-dir with a folder "
            f"(or set {DATA_DIR_ENV})."
        )
    return path


DEVICES = re.compile(r"auto|(cpu|cuda|mps)(:\d+)?")
# torch's other device types: a name torch knows, on which etn does not run
OTHER_TORCH_DEVICES = ("xpu", "meta", "hip", "ve", "fpga", "maia", "xla", "lazy", "vulkan")
OTHER_TORCH_DEVICES += ("hpu", "mtia", "privateuseone", "ipu", "mkldnn", "opengl", "opencl")
OTHER_TORCH_DEVICES += ("ideep",)


def check_device_name(device: str) -> str:
    """``device`` if it names a device etn runs on (``auto``, ``cpu``, ``cuda``, ``cuda:N``,
    ``mps``), refused in the words :func:`etn_cli.stages.distributed.resolve_device` uses otherwise;
    whether this machine has it is for that function (it imports torch), this one does not."""
    if DEVICES.fullmatch(device):
        return device
    kind, _, index = device.partition(":")
    if kind in OTHER_TORCH_DEVICES and (not index or index.isdigit()):
        raise UsageError(f"Device {device!r}: etn runs on cpu, cuda or mps, not {kind}.")
    raise UsageError(
        f"Unknown device {device!r}. Use cpu, cuda, cuda:N, mps or auto (the default)."
    )


def only_heads(only: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (only or "").split(",") if n.strip())
    if only is not None and not names:
        raise UsageError("--only expects head names separated by commas, e.g. --only etn,map.")
    return names


def one_line(err: Exception) -> str:
    """A usage error of typer's click as one line: its message and where to find help."""
    message = " ".join(err.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(err, "ctx", None)
    command = ctx.command_path if ctx is not None else "etn"
    return f"error: {message} (see `{command} -h`)"


def fail(message: str, code: int) -> None:
    write_line(f"error: {message}")
    sys.exit(code)


def error_lines(message: str) -> list[str]:
    """A domain error as lines for stderr: its text as one line, and each item of a list of
    problems (a line indented by two spaces, as planning and the input checks write them) as
    a line of its own."""
    head, items = [], []
    for line in message.split("\n"):
        (items if line.startswith("  ") and line.strip() else head).append(line.strip())
    return [" ".join(part for part in head if part), *items]
