"""``etn status --prompt``: the exact text an LLM pipeline asks, and the answer tokens it reads.

The prompt is the adaptation split's first question rendered with the backbone's template,
``choice_line`` and letters; the answer tokens are the ids whose logits are the classes. Once
the split is extracted they are read from its manifest (``example_prompt``,
``answer_tokens``), so what is shown is what was used; before, they are rendered from the
pipeline (reading the tokenizer, never the model). Nothing is written.
"""

from __future__ import annotations

from typing import Any

from etn_cli.errors import EtnError
from etn_cli.store.writing.manifest import load_manifest, split_is_complete


def prompt_record(plan: Any) -> dict[str, Any]:
    """``example_prompt``, ``answer_tokens`` (letter -> id) and where they were read."""
    if plan.backbone is None:
        raise EtnError(f"{plan.pipeline.path} has no backbone that renders prompts.")
    unit = plan.adapt
    if split_is_complete(unit.path):
        manifest = load_manifest(unit.path)
        if "example_prompt" in manifest:
            return {**manifest, "from": f"the manifest of {unit.path.name}"}
    from etn_cli.planning.plan import open_source

    split = open_source(plan.pipeline, unit.dataset).load_split(unit.split)
    record = plan.backbone.build().manifest_extras(split)
    if not record:
        raise EtnError(
            f"Backbone {plan.backbone.name!r} reads no prompts; --prompt shows an LLM's prompt."
        )
    return {**record, "from": "the pipeline (not extracted yet)"}


def render_prompt(plan: Any) -> str:
    record = prompt_record(plan)
    tokens = ", ".join(f"{letter} = {i}" for letter, i in record["answer_tokens"].items())
    rule = "-" * 72
    return (
        f"example prompt ({plan.adapt.dataset}:{plan.adapt.split} #0, from {record['from']}):\n"
        f"{rule}\n{record['example_prompt']}\n{rule}\n"
        f"answer tokens: {tokens} ({record.get('answer_token_variant', '')})"
    )
