"""Reading the one pickle format etn cannot avoid, without executing anything: CIFAR's batches.

The official CIFAR-10/100 "python version" files are pickled dicts of numpy arrays, lists and
strings, which torchvision reads with ``pickle.load``. A pickle can name any callable, so inside
:func:`arrays_only_unpickling` torchvision's CIFAR reader gets an unpickler that rebuilds only
numpy arrays and dtypes (and the bytes helper they use) and refuses every other global, the way
``torch.load(weights_only=True)`` does for checkpoints.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from types import SimpleNamespace
from typing import IO, Any

ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how protocol 2 spells bytes
}


class ArraysOnlyUnpickler(pickle.Unpickler):
    """Rebuilds containers, strings, numbers and numpy arrays; refuses any other class."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name}: only numpy arrays are expected in this file"
        )


def load_arrays_only(file: IO[bytes], **options: Any) -> Any:
    """``pickle.load`` with :class:`ArraysOnlyUnpickler`; ``options`` such as ``encoding``."""
    return ArraysOnlyUnpickler(file, **options).load()


@contextlib.contextmanager
def arrays_only_unpickling() -> Iterator[None]:
    """Make torchvision's CIFAR reader unpickle through :func:`load_arrays_only` inside."""
    import torchvision.datasets.cifar as cifar

    original = cifar.pickle
    cifar.pickle = SimpleNamespace(load=load_arrays_only, UnpicklingError=pickle.UnpicklingError)
    try:
        yield
    finally:
        cifar.pickle = original
