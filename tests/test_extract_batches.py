"""Extraction's one resume logic (``etn_cli.stages.extract_batches``): the batches a process
still has to run, for a single process resuming from its journal and for a torchrun rank
reusing the pieces a killed run finished. Rows read again on the way must be the ones on disk.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from etn_cli.errors import EtnError
from etn_cli.stages.extract_batches import batches_in, remaining_batches, tail_loader
from etn_cli.store.writing.pieces import Layout
from etn_cli.store.writing.writer import ShardWriter


def loader_batches(rows: int, batch: int) -> list[tuple]:
    """``(inputs, labels, index)`` batches of a split of ``rows`` rows, as a backbone yields."""
    index = np.arange(rows)
    return [(index[s : s + batch], index[s : s + batch] % 3, index[s : s + batch])
            for s in range(0, rows, batch)]  # fmt: skip


def test_a_reused_piece_read_through_must_still_hold_its_rows() -> None:
    layout = Layout(60, 4, 8, 2)
    pieces = layout.pieces(1)  # five pieces; the second one a killed run finished
    rest, reused = [pieces[0], *pieces[2:]], pieces[1]
    batches = loader_batches(60, 4)
    index = np.arange(reused.first_row, reused.stop_row)
    found = [b[2].tolist() for b in batches_in(iter(batches), rest, [(reused, index)])]
    wanted = [batches[n][2].tolist() for p in rest for n in range(p.first_batch, p.stop_batch)]
    assert found == wanted
    swapped = list(batches)  # the loader now yields two of the reused piece's batches swapped
    first = reused.first_batch
    swapped[first], swapped[first + 1] = swapped[first + 1], swapped[first]
    with pytest.raises(EtnError, match="in another order; the interrupted shards were discarded"):
        list(batches_in(iter(swapped), rest, [(reused, index)], "split 'test'"))


def test_a_loader_that_ends_before_the_journaled_batches_is_not_resumed(tmp_path: Path) -> None:
    appended = [(b[0][:, None] * 1.0, np.ones((8, 3)), b[1], b[2]) for b in loader_batches(40, 8)]
    with pytest.raises(KeyboardInterrupt), ShardWriter(tmp_path / "s", {}, 8, resume={}) as w:
        for batch in appended[:3]:
            w.append(*batch)
        raise KeyboardInterrupt
    with pytest.raises(EtnError, match="found 16 rows in another order"):
        with ShardWriter(tmp_path / "s", {}, 8, resume={}) as writer:
            assert writer.resumed_batches == 3
            list(remaining_batches(loader_batches(16, 8), writer))
    assert list(tmp_path.iterdir()) == []


def test_a_whole_sequential_loader_is_read_as_it_is_and_a_block_as_a_slice() -> None:
    loader = DataLoader(torch.arange(23), batch_size=4)
    assert tail_loader(loader, 0, 0) is loader  # nothing to skip: no copy, no Subset
    layout = Layout(23, 4, 8, 2)
    block = [b.tolist() for b in batches_in(loader, layout.pieces(1))]
    assert block == [b.tolist() for b in list(loader)[3:]]
