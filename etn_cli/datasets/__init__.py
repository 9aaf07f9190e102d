"""Dataset sources; importing this package registers every built-in dataset."""

from etn_cli.datasets import digits, image_list, imagenet, mcqa, tiny_mcqa, vision  # noqa: F401
from etn_cli.datasets.base import DatasetSource, Split, datasets

__all__ = ["DatasetSource", "Split", "datasets", "digits"]
