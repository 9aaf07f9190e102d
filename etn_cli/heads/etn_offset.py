"""ETN with a fitted logit offset: the paper's ETN on ``z + c``, one constant ``c`` chosen on
the adaptation loss. Not in the paper; the paper's ETN (``etn``) is unchanged.

**Why.** A backbone trained with cross-entropy fixes its logits only up to an additive
constant: ``softmax(z + c) = softmax(z)``, so where the logits sit on the real line is an
accident of training (bias initialisation, weight decay). ETN's evidence
``alpha = softplus(a (z + c)) + b`` is not invariant to it: the softplus hinge sits at 0, so the
constant decides which logits count as evidence. On the digits default, shifting every logit
by the same constant moves ETN's OOD AUPR(MP) by up to 5 points (docs/methods.md, "When ETN helps",
``studies/when_etn_helps.py``), and the paper's setting (``c = 0``) is not where ETN's own
adaptation loss is lowest.

**What.** ETN is trained as the paper does, on the adaptation logits centred by their overall
mean ``z - z_bar`` (one number for the whole split, which makes the fit independent of the
backbone's offset). Then, with the trained network fixed, ``c`` minimises ETN's adaptation loss
(paper Eq. 8, averaged over the split) on ``z - z_bar + c``: a grid of 41 points over ``[-2 m,
2 m]`` (``m = max |z - z_bar|``) and Brent's method between the best point's neighbours; the MC
draws of that search are fixed by the head's seed (common random numbers), so the loss is a
smooth function of ``c`` and the fit is deterministic. The head predicts on ``z + offset`` with
``offset = c - z_bar``. Only ID data (the adaptation split) chooses it, as temperature scaling
chooses its temperature. Shifting every logit of every split by ``k`` moves the offset by
``-k`` (to 2e-3: each search stops within its tolerance, 1e-3, and the centred logits round
differently in float32): like the softmax, the head no longer depends on the backbone's offset;
a constant shift never changes the scalar variant's predicted class.
(Searching at the initial weights instead fails: with an untrained network the loss can keep
falling towards ``c -> -inf``, where every ``alpha`` is ``b``; retraining the network at the
found offset measured no better on digits.) When the trained network's loss still falls at the
lower end of the grid, there is no interior minimum (a network that gives almost no evidence):
the offset is then only the centring, and a warning says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch

from etn_cli.heads.base import heads
from etn_cli.heads.edl import evidence, expected_dirichlet_log_density
from etn_cli.heads.etn import ETN

OFFSET_TOLERANCE = 1e-3  # in logit units


BLOCK_ELEMENTS = 2**24  # Dirichlet parameters per block of the offset objective (64 MB)


def merged(chunks: list[tuple[torch.Tensor, ...]], rows: int) -> list[tuple[torch.Tensor, ...]]:
    """Consecutive ``(draws (M, n, ...), z (n, C), y (n,))`` chunks joined into blocks of at
    most ``rows`` rows (whole chunks; a larger chunk stays alone): few, large operations per
    objective value instead of one small set per batch."""
    blocks, group, size = [], [], 0
    for chunk in chunks:
        if group and size + len(chunk[1]) > rows:
            blocks.append(group)
            group, size = [], 0
        group.append(chunk)
        size += len(chunk[1])
    blocks.append(group)
    return [(torch.cat([g[0] for g in b], 1), *(torch.cat([g[i] for g in b]) for i in (1, 2)))
            for b in blocks if b]  # fmt: skip


def rng_devices(device: torch.device) -> list[torch.device]:
    """The devices whose random state a seeded block forks: a GPU's too, when it draws there."""
    return [device] if device.type == "cuda" else []


GRID_POINTS = 41


@heads.register("etn_offset")
class OffsetETN(ETN):
    offset_: float = 0.0

    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        centre = float(z.mean())
        super()._fit(h, z - centre, y, classifier=classifier, layers=layers, device=device)
        rows = (t.to(device) for t in (h, z - centre, y))  # where the trained network is
        self.offset_ = self.search_offset(*rows) - centre

    def search_offset(self, h: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> float:
        """The ``c`` minimising the trained network's mean adaptation loss on ``z + c``."""
        from scipy.optimize import minimize_scalar

        objective = self._offset_objective(h, z, y)
        bound = 2 * float(z.abs().max())
        grid = np.linspace(-bound, bound, GRID_POINTS)
        best = int(np.argmin([objective(float(c)) for c in grid]))
        if best == 0:  # still falling at -2m: towards c -> -inf, where every alpha is b
            warnings.warn(
                "ETN (fitted offset): the adaptation loss keeps falling as the offset goes to "
                "-inf (no evidence at all), so no offset is fitted and the logits are only "
                "centred. Train longer (epochs) so that the network gives evidence.",
                stacklevel=2,
            )
            return 0.0
        low, high = grid[max(best - 1, 0)], grid[min(best + 1, GRID_POINTS - 1)]
        found = minimize_scalar(
            objective,
            bounds=(low, high),
            method="bounded",
            options={"xatol": OFFSET_TOLERANCE},
        )
        return float(found.x)

    @torch.no_grad()
    def _offset_objective(
        self, h: torch.Tensor, z: torch.Tensor, y: torch.Tensor
    ) -> Callable[[float], float]:
        """The mean adaptation loss on ``z + c`` as a function of ``c``, up to its KL term
        (which does not depend on ``c``): the network runs and the MC draws of the
        transformation are taken once, fixed by the seed, as :meth:`_mean_loss` takes them."""
        cfg, b = self.config, self.b_
        chunks = []
        with torch.random.fork_rng(devices=rng_devices(h.device)):
            torch.manual_seed(cfg.seed)
            for i in range(0, len(h), cfg.batch_size):
                rows = slice(i, i + cfg.batch_size)
                chunks.append((self.structure.draws(self.net_(h[rows])), z[rows], y[rows]))

        blocks = merged(chunks, BLOCK_ELEMENTS // (cfg.mc_samples * z.shape[1]))

        def objective(c: float) -> float:
            total = torch.zeros((), dtype=torch.float64, device=h.device)  # one read per value
            for a, part, labels in blocks:
                alpha = evidence(self.structure.transform(a, part + c), b)  # (M, n, C)
                total += expected_dirichlet_log_density(alpha, labels, cfg.nu).mean(0).sum()
            return -float(total) / len(h)

        return objective

    @torch.no_grad()
    def _mean_loss(self, h: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> float:
        """The loss (with its KL term) averaged over all rows, in chunks of the batch size,
        with the MC draws fixed by the seed: a smooth function of an offset added to ``z``."""
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        with torch.random.fork_rng(devices=rng_devices(h.device)):
            torch.manual_seed(self.config.seed)
            for i in range(0, len(h), self.config.batch_size):
                rows = slice(i, i + self.config.batch_size)
                total += self.loss(h[rows], z[rows], y[rows]).sum()
        return float(total) / len(h)

    def _predict_chunk(self, h, z):
        return super()._predict_chunk(h, z + self.offset_)

    def _state(self) -> dict[str, torch.Tensor]:
        return super()._state() | {"offset": torch.tensor([self.offset_], dtype=torch.float64)}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        super()._load_state({k: v for k, v in tensors.items() if k != "offset"})
        self.offset_ = float(tensors["offset"][0])
