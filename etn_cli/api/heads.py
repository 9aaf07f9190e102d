"""The Python API: etn inside your own code, without the command line or the file store.

Three ways in, from the least wiring to the most:

* **Arrays.** Every head (``etn_cli.ETN``, or any name of ``etn_cli.heads.heads``) has
  ``fit(hidden, logits, labels)`` and ``predict(hidden, logits)``. Inputs are numpy arrays or
  torch tensors (any device and float dtype; they are copied to the CPU as float32):
  ``hidden`` (N, D) is the input of the classifier's final layer, ``logits`` (N, C) its output,
  ``labels`` (N,) class indices. ``predict`` returns a :class:`Prediction` of numpy arrays:
  ``probs`` (N, C), ``predictions`` (N,), ``scores`` (``mp``, ``um``, ``mi``, ``de`` … each
  (N,)) and, for evidential heads, the Dirichlet ``alpha`` (N, C).
* **Trained heads.** :func:`load_head` reads what ``etn train`` (or ``Head.save``) wrote:
  ``head.json`` and ``weights.safetensors``; nothing is ever unpickled.
* **One module.** :class:`EvidentialModel` joins a backbone (a torchvision classifier, or a
  Hugging Face causal LM answering multiple-choice questions) and a trained head: one backbone
  pass gives the prediction, its probabilities and its uncertainty scores (paper Sec. 4: the
  head costs almost nothing next to the backbone).

::

    import etn_cli
    head = etn_cli.ETN(prior_mode=10).fit(hidden, logits, labels)
    model = etn_cli.EvidentialModel.from_torchvision(resnet, head, transform=preprocess)
    out = model(images)  # out.predictions, out.probs, out.mp, out.um, out.mi, out.de
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from etn_cli.api.evidential_model import EvidentialModel, EvidentialOutput
from etn_cli.errors import EtnError
from etn_cli.heads import heads
from etn_cli.heads.base import Head, Prediction
from etn_cli.heads.etn import ETN
from etn_cli.stages.trained_heads import find_head_folder, pipeline_head, plan_of, read_head

__all__ = ["ETN", "EvidentialModel", "EvidentialOutput", "Head", "Prediction"]
__all__ += ["load_head", "make_head", "read_head"]


def make_head(name: str, **settings: Any) -> Head:
    """An unfitted head by its registered name: ``make_head("etn", prior_mode=5)``. Unknown
    names and settings raise, naming the valid ones (``etn ls heads`` lists the names)."""
    return heads.get(name)(**settings)


def load_head(
    name_or_path: str | Path | None = None,
    *,
    data_dir: str | Path | None = None,
    pipeline: str | Path | None = None,
    head: str = "etn",
    seed: int = 0,
) -> Head:
    """A trained head, ready for ``predict``:

    * ``load_head("data/heads/etn-<key>")``: its folder;
    * ``load_head("etn-<key>", data_dir="data")``: its folder name under ``<data_dir>/heads``,
      a unique beginning of it (``"etn-3f2a"``), or a head name when one such head exists;
    * ``load_head(pipeline="pipelines/digits.toml", head="etn", seed=0, data_dir="data")``:
      the head ``etn train`` fitted for that pipeline (a file, or a shipped pipeline's name:
      ``pipeline="digits"``); ``head`` is a head name, a label of the report
      (``"ETN (prior_mode=5)"``) or a folder name.

    ``data_dir`` defaults to ``$ETN_DATA_DIR``, else ``~/.cache/etn`` (as the command line's).
    """
    if pipeline is not None:
        if name_or_path is not None:
            raise EtnError("Give load_head a head folder or name, or pipeline=..., not both.")
        return read_head(pipeline_head(plan_of(pipeline, data_dir), head, seed).path)
    if name_or_path is None:
        raise EtnError(
            "load_head needs a head folder, a head name with data_dir=..., or pipeline=... ."
        )
    return read_head(find_head_folder(name_or_path, data_dir))
