"""Dataset sources; importing this package registers every built-in dataset."""

from etn_cli.datasets import (  # noqa: F401
    digits,
    image_folder,
    image_list,
    imagenet,
    mcqa,
    mcqa_jsonl,
    tiny_mcqa,
    vision,
)
from etn_cli.datasets.base import DatasetSource, Split, datasets

__all__ = ["DatasetSource", "Split", "datasets", "digits"]
