"""MC dropout on the cached penultimate features (Gal & Ghahramani, ICML 2016).

The backbone's own classifier ``(W, b)`` reads the last hidden state through dropout, kept
active at test time, for S passes (OpenOOD's DropoutNet, p = 0.5 there)::

    p_s = softmax(W (m_s * h / (1 - p)) + b),   m_s ~ Bernoulli(1 - p)^D,   s = 1..S

MP and MI come from the S probability samples (``sample_scores``): ``mp = max_i mean_s p_si``,
``mi = H[mean_s p_s] - mean_s H[p_s]``. Nothing is trained. The S masks are drawn once from
the head's seed and shared by every row (:func:`keep_masks`): S dropout networks, each applied
to all samples, so a sample gets the same prediction in any batch, chunk or order, on every
device and platform. (Masks keyed on a row's own values, as before, changed when a GPU's
features differed from the CPU's in the last bits: the digits default's MC dropout accuracy
moved by 0.5 point between the two.)
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from etn_cli.heads.base import Head, Prediction, heads
from etn_cli.heads.lastlayer import classifier_tensors
from etn_cli.metrics.scores import sample_scores

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment
MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
CHUNK_ELEMENTS = 2**21  # rows per chunk are chosen so that S * rows * D stays below this


def seed_key(seed: int) -> np.ndarray:
    """The 64-bit key (1,) of a head's masks: BLAKE2b of its seed."""
    digest = hashlib.blake2b(seed.to_bytes(8, "little", signed=True), digest_size=8).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def keep_masks(keys: np.ndarray, passes: int, width: int, p: float) -> np.ndarray:
    """Dropout keep-masks (S, n, D) for n keys: element ``(s, d)`` is kept when the
    ``(s D + d)``-th output of a SplitMix64 stream seeded with the key is at least ``p 2^64``
    (a Bernoulli(1 - p) draw). Pure integer arithmetic: the same on every platform."""
    counter = np.arange(passes * width, dtype=np.uint64).reshape(passes, 1, width) + np.uint64(1)
    x = keys.reshape(1, -1, 1) + counter * GOLDEN  # (S, n, D), wraps modulo 2^64
    x = (x ^ (x >> np.uint64(30))) * MIX[0]
    x = (x ^ (x >> np.uint64(27))) * MIX[1]
    x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)) >= np.uint64(round(p * 2**53))


@heads.register("mcd")
class MCDropout(Head):
    def _fit(self, h, z, y, *, classifier, layers, device) -> None:
        self.weight_, self.bias_ = classifier_tensors(classifier, h.shape[1], z.shape[1])

    @torch.no_grad()
    def _predict(self, h, z, *, layers, device) -> Prediction:
        cfg = self.config
        keep = keep_masks(seed_key(cfg.seed), cfg.passes, h.shape[1], cfg.p)  # (S, 1, D)
        keep = torch.from_numpy(keep).to(h.device)
        rows = max(1, CHUNK_ELEMENTS // (self.config.passes * h.shape[1]))
        parts = [self._chunk(h[i : i + rows], keep) for i in range(0, len(h), rows)]
        probs = np.concatenate([mean for mean, _ in parts])  # (N, C)
        scores = {k: np.concatenate([s[k] for _, s in parts]) for k in parts[0][1]}
        return Prediction(probs, scores)

    def _chunk(self, h: torch.Tensor, keep: torch.Tensor) -> tuple[np.ndarray, dict]:
        p = self.config.p
        dropped = h.double() * keep / (1.0 - p)  # (S, n, D), inverted dropout
        logits = dropped @ self.weight_.double().T + self.bias_.double()  # (S, n, C)
        samples = torch.softmax(logits, dim=-1).cpu().numpy()  # (S, n, C)
        return samples.mean(axis=0), sample_scores(samples)

    def _state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight_, "bias": self.bias_}

    def _load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.weight_, self.bias_ = tensors["weight"], tensors["bias"]
        if self.weight_.shape != (self.n_classes_, self.n_features_):
            raise RuntimeError(f"weight has shape {tuple(self.weight_.shape)}")
