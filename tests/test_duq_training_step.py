"""DUQ's training step: the hand-split gradient and the centroid update (label-gathered maps
where classes outnumber rows) are the same arithmetic as autograd over ``kernel_and_gradient``
and the dense EMA update."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from etn_cli.heads.duq import DUQ, DUQConfig, RBFHead


def _net(dtype: torch.dtype, d: int = 12, c: int = 5, e: int = 3, seed: int = 0) -> RBFHead:
    torch.manual_seed(seed)
    net = RBFHead(d, c, DUQConfig(centroid_size=e, length_scale=0.5)).to(dtype)
    with torch.no_grad():
        net.m.add_(torch.randn_like(net.m))  # centroids away from the initial embeddings
        net.N.add_(torch.rand_like(net.N))
    return net


def _batch(dtype: torch.dtype, d: int = 12, c: int = 5, b: int = 9, seed: int = 1) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(b, d, generator=generator, dtype=dtype) * 0.3
    y = torch.randint(0, c, (b,), generator=generator)
    y[:3] = 2  # repeated classes in one batch
    return x, y, F.one_hot(y, c).to(dtype)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_the_split_gradient_equals_autograd_through_the_input_gradient(dtype, tol):
    net = _net(dtype)
    x, _, onehot = _batch(dtype)
    kernel, grad = net.kernel_and_gradient(x)  # autograd differentiates through grad (in W)
    reference = F.binary_cross_entropy(kernel, onehot) + 0.7 * ((grad.norm(dim=1) - 1) ** 2).mean()
    (expected,) = torch.autograd.grad(reference, net.W)
    assert expected.abs().max() > 0
    net.W.grad = torch.full_like(net.W, 5.0)  # overwritten, not accumulated
    loss = net.loss_and_gradient(x, onehot, 0.7)
    torch.testing.assert_close(loss, reference.detach(), rtol=tol, atol=0)
    scale = expected.abs().max()
    torch.testing.assert_close(net.W.grad / scale, expected / scale, rtol=0, atol=tol)


def test_the_penalty_term_alone_matches_autograd():
    """With the BCE's gradient small next to the penalty's, the ``G^T V`` term is tested."""
    net = _net(torch.float64)
    x, _, onehot = _batch(torch.float64)
    kernel, grad = net.kernel_and_gradient(x)
    penalty = ((grad.norm(dim=1) - 1) ** 2).mean()
    (expected,) = torch.autograd.grad(F.binary_cross_entropy(kernel, onehot) + 1e4 * penalty, net.W)
    net.loss_and_gradient(x, onehot, 1e4)
    torch.testing.assert_close(net.W.grad, expected, rtol=1e-10, atol=1e-12)


def test_the_kernel_alone_is_the_kernel_of_kernel_and_gradient():
    net = _net(torch.float32)
    x, _, _ = _batch(torch.float32)
    torch.testing.assert_close(net.kernel(x), net.kernel_and_gradient(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize("rows", [4, 9])  # below C = 5: gathered maps; from C on: x W
def test_the_centroid_update_equals_the_dense_one_either_way(rows):
    net = _net(torch.float64)
    x, y, onehot = _batch(torch.float64, b=rows)
    n, m = net.N.clone(), net.m.clone()
    with torch.no_grad():
        n_expected = net.gamma * n + (1 - net.gamma) * onehot.sum(0)
        dense = (net.embed(x) * onehot[:, None, :]).sum(0)  # every row under every map
        m_expected = net.gamma * m + (1 - net.gamma) * dense
    net.update_centroids(x, y, onehot)
    torch.testing.assert_close(net.N, n_expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(net.m, m_expected, rtol=1e-12, atol=1e-14)


def test_a_fit_step_follows_the_reference_order_sgd_then_centroids(features_factory):
    """One epoch of one batch equals SGD on autograd's gradient followed by the dense EMA."""
    data = features_factory(n=24, d=6, c=3, seed=0)
    head = DUQ(epochs=1, batch_size=24, centroid_size=4, select="last", momentum=0.0)
    head.fit(data.hidden, data.logits, data.labels)
    fresh = DUQ(epochs=1, batch_size=24, centroid_size=4, select="last", momentum=0.0)
    fresh._build(6, 3)
    net = fresh.net_
    h = torch.from_numpy(data.hidden)
    net.mean.copy_(h.mean(0))
    net.std.copy_(h.std(0).clamp_min(1e-6))
    x = net.standardize(h)
    onehot = F.one_hot(torch.from_numpy(data.labels), 3).float()
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    x, onehot = x[perm], onehot[perm]
    (grad,) = torch.autograd.grad(fresh.loss(x, onehot), net.W)
    with torch.no_grad():
        net.W -= fresh.config.lr * (grad + fresh.config.weight_decay * net.W)
        net.N.mul_(net.gamma).add_((1 - net.gamma) * onehot.sum(0))
        net.m.mul_(net.gamma).add_((1 - net.gamma) * (net.embed(x) * onehot[:, None, :]).sum(0))
    for key, value in net.state_dict().items():
        torch.testing.assert_close(head.net_.state_dict()[key], value, rtol=1e-5, atol=1e-6)
