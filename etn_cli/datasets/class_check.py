"""The ID splits' classes against the backbone's outputs, checked before anything is extracted.

A folder of 5 class folders read by a 10-class model, or a test folder whose class folders
differ from the adaptation folder's, gives labels that silently mean something else; a
question with more choices than the model has answer letters cannot be asked. The splits'
fingerprints (computed while planning) say what each split holds, so these checks read no data:

* ``num_classes`` (class folders, a ``classes`` list) must equal the backbone's class count;
* ``labels_max`` (image lists without a class list) must lie below it;
* ``max_choices`` (multiple-choice files) must not exceed the answer letters;
* the adaptation and test splits must name the same classes in the same order.

OOD splits are not checked: their labels are never used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from etn_cli.errors import EtnError


def check_id_classes(plan: Any, backbone: Any) -> None:
    """One line naming the split's files when the ID splits do not fit ``backbone``."""
    sources = {u.role: (u.fingerprint or {}).get("source", {}) for u in (plan.adapt, plan.test)}
    if not any(_declares_classes(fp) for fp in sources.values()):
        return  # datasets of a fixed label space (digits, CIFAR, ImageNet, RACE): nothing to do
    data = plan.pipeline.data
    root = plan.pipeline.resolve(data.root) if data.root else None
    outputs = backbone.num_classes
    advice = getattr(backbone, "letters_advice", None)  # how an LLM can take more choices
    for role, fp in sources.items():
        where = str(root / fp["split"]) if root else str(fp.get("split"))
        fp = {**fp, "where": where}
        check_split_classes(fp, outputs, f"the {role} split", backbone.name, advice)
        sources[role] = fp
    adapt, test = (sources[role].get("classes") for role in ("adapt", "test"))
    if adapt and test and adapt != test:
        raise EtnError(
            f"The adapt split ({_where(sources['adapt'])}) has the classes {_shown(adapt)} but the "
            f"test split ({_where(sources['test'])}) has {_shown(test)}; expected the same classes "
            "in the same order. Give both the same class folders, or list them with classes = "
            "[...] under [data.options.<dataset>]."
        )


def check_planned_classes(plan: Any) -> None:
    """:func:`check_id_classes` before any work, where the backbone knows its class count
    without building its model (an LLM's answer letters): what a run would refuse after
    loading the model, a dry run and a run's up-front check refuse already."""
    spec = plan.backbone
    if spec is not None and spec.planned_num_classes is not None:
        check_id_classes(plan, spec.build())  # the class count without the model


def check_split_classes(
    fp: dict[str, Any],
    outputs: int,
    role: str,
    backbone: str,
    advice: Callable[[int], str] | None = None,
) -> None:
    """One split's labels against ``outputs``; ``advice(n)`` says what lets the backbone take
    questions of ``n`` choices (the letters its tokenizer has as single tokens)."""
    where = _where(fp)
    classes, top, choices = fp.get("num_classes"), fp.get("labels_max"), fp.get("max_choices")
    if (classes is None and top == -1) or fp.get("labelled") is False:
        raise EtnError(
            f"{role.capitalize()} ({where}) has no labels; expected labelled data for the "
            "adapt and test splits (one sub-folder per class, a label per image-list line, an "
            "answer per question). Unlabelled data belongs in ood = [...]."
        )
    if classes is not None and classes != outputs:
        raise EtnError(
            f"{role.capitalize()} ({where}) has {classes} classes ({_shown(fp.get('classes'))}) "
            f"but the {backbone} backbone has {outputs} outputs; expected one class per output. "
            "Fix the class folders or the classes list, or num_classes / the checkpoint."
        )
    if classes is None and top is not None and top >= outputs:
        raise EtnError(
            f"{role.capitalize()} ({where}) has label {top} but the {backbone} backbone has "
            f"{outputs} outputs; expected labels in 0..{outputs - 1}. Fix the labels."
        )
    if choices is not None and choices > outputs:
        fix = advice(choices) if advice else f"Give [backbone] letters = [...] {choices} letters."
        raise EtnError(
            f"{role.capitalize()} ({where}) has questions with {choices} choices but the "
            f"backbone has {outputs} answer letters; expected at most one choice per letter. {fix}"
        )


def _declares_classes(fp: dict[str, Any]) -> bool:
    return any(fp.get(key) is not None for key in ("num_classes", "labels_max", "max_choices"))


def _where(fp: dict[str, Any]) -> str:
    return str(fp.get("where") or fp.get("split", "?"))


def _shown(classes: Any) -> str:
    if not classes:
        return "none"
    names = [str(c) for c in classes]
    return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
