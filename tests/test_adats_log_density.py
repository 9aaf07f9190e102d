"""AdaTS's class log-densities as one matrix product equal the term-by-term (B, C, K) form."""

from __future__ import annotations

import pytest
import torch

from etn_cli.heads.adats import AdaTS


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_the_expanded_log_density_and_its_gradients_equal_the_direct_form(dtype, tol):
    head = AdaTS(latent_dim=4, widths=(8,), temperature_widths=(6,))
    head._build(5, 7)
    vae = head.module_.to(dtype)
    with torch.no_grad():  # prior scales spread over a decade, means away from zero
        vae.prior_scale_raw.copy_(torch.linspace(-2, 2, 28, dtype=dtype).reshape(7, 4))
        vae.prior_mean.mul_(5)
    u = torch.randn(9, 4, dtype=dtype, generator=torch.Generator().manual_seed(0))
    u.requires_grad_(True)
    params = [u, vae.prior_mean, vae.prior_scale_raw]
    weights = torch.randn(9, 7, dtype=dtype)
    expanded, direct = vae.log_density(u), vae.log_density_direct(u)
    scale = direct.abs().max()
    torch.testing.assert_close(expanded / scale, direct / scale, rtol=0, atol=tol)
    for got, want in zip(
        torch.autograd.grad((expanded * weights).sum(), params),
        torch.autograd.grad((direct * weights).sum(), params),
        strict=True,
    ):
        top = want.abs().max()
        torch.testing.assert_close(got / top, want / top, rtol=0, atol=tol)
