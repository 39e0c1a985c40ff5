"""The Mamba layer (madsl/layers/mamba.py) and its CPU selective scan
(madsl/kernels/selective_scan_cpu.py): parameter parity with the accounting and with
mamba-ssm's layout, initialisation, step == forward, and the fused scan against the
plain recurrence, mamba-ssm's reference formula and finite differences."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F

from madsl.kernels.selective_scan import selective_scan
from madsl.kernels.selective_scan_cpu import selective_scan_cpu
from madsl.kernels.selective_scan_reference import selective_scan_reference
from madsl.lang.stdlib import primitive
from madsl.layers.mamba import Mamba

torch.set_num_threads(1)


def mamba(dim: int, **config) -> Mamba:
    return primitive("mamba", dim, **config).build()


CONFIGS = [
    dict(d_state=4, d_conv=4, expand=2, dt_rank=None, bias=False, conv_bias=False),  # MAD defaults
    dict(d_state=16, d_conv=4, expand=2, dt_rank=None, bias=True, conv_bias=True),  # mamba-ssm-like
    dict(d_state=3, d_conv=2, expand=1, dt_rank=5, bias=False, conv_bias=True),
    dict(d_state=2, d_conv=1, expand=3, dt_rank=1, bias=True, conv_bias=False),
]


# --- the layer --------------------------------------------------------------------------


def test_parameter_names_and_shapes_follow_mamba_ssm():
    dim, d_state, d_conv = 40, 5, 3
    module = mamba(dim, d_state=d_state, d_conv=d_conv, expand=2, dt_rank=None, bias=True, conv_bias=True)
    d_inner, rank = 80, math.ceil(dim / 16)
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    assert shapes == {
        "in_proj.weight": (2 * d_inner, dim),
        "in_proj.bias": (2 * d_inner,),
        "conv1d.weight": (d_inner, 1, d_conv),
        "conv1d.bias": (d_inner,),
        "x_proj.weight": (rank + 2 * d_state, d_inner),
        "dt_proj.weight": (d_inner, rank),
        "dt_proj.bias": (d_inner,),
        "A_log": (d_inner, d_state),
        "D": (d_inner,),
        "out_proj.weight": (dim, d_inner),
        "out_proj.bias": (dim,),
    }
    assert module.conv1d.groups == d_inner and module.conv1d.padding == (d_conv - 1,)
    plain = dict(mamba(dim, bias=False, conv_bias=False).named_parameters())
    assert "x_proj.bias" not in plain and "in_proj.bias" not in plain and "conv1d.bias" not in plain


def test_initialisation_as_mamba_ssm():
    torch.manual_seed(0)
    module = mamba(64, d_state=4, d_conv=4, expand=2, dt_rank=None, bias=False, conv_bias=False)
    expected_A_log = torch.log(torch.arange(1, 5, dtype=torch.float32)).repeat(128, 1)
    assert torch.equal(module.A_log.data, expected_A_log)
    assert torch.equal(module.D.data, torch.ones(128))
    bound = module.dt_rank**-0.5
    assert module.dt_proj.weight.abs().max() <= bound and module.dt_proj.weight.abs().max() > 0.5 * bound
    dt = F.softplus(module.dt_proj.bias.double())  # the bias is the inverse softplus of dt
    assert dt.min() >= 0.001 * (1 - 1e-4) and dt.max() <= 0.1 * (1 + 1e-4)
    assert dt.log().std() > 0.5  # log-uniform over two decades, not constant
    assert module.dt_proj.bias._no_reinit
    assert module.A_log._no_weight_decay and module.D._no_weight_decay


def test_forward_shape_and_causality():
    torch.manual_seed(0)
    module = mamba(16)
    x = torch.randn(2, 12, 16)
    y = module(x)
    assert y.shape == x.shape
    x2 = x.clone()
    x2[:, 7] += 1.0
    y2 = module(x2)
    assert torch.equal(y[:, :7], y2[:, :7]) and not torch.allclose(y[:, 7:], y2[:, 7:])


def _perturbed(module: Mamba) -> Mamba:
    """Move parameters away from their structured init so that tests see every term."""
    with torch.no_grad():
        module.A_log.add_(0.3 * torch.randn_like(module.A_log))
        module.D.add_(torch.randn_like(module.D))
        module.dt_proj.bias.add_(1.0)
        for p in (module.conv1d.bias, module.in_proj.bias, module.out_proj.bias):
            if p is not None:
                p.normal_()
    return module


def test_layer_gradients_match_plain_recurrence(monkeypatch):
    mamba_module = sys.modules[Mamba.__module__]
    torch.manual_seed(0)
    module = _perturbed(mamba(16, d_state=4, d_conv=3, expand=2, dt_rank=None, bias=True, conv_bias=True)).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 9, 16, dtype=torch.float64)

    def grads():
        loss = (module(x) * weight).sum()
        return torch.autograd.grad(loss, [x, *module.parameters()])

    fused = grads()
    monkeypatch.setattr(mamba_module, "selective_scan", selective_scan_reference)
    plain = grads()
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)


def test_no_cuda_libraries_imported_eagerly(monkeypatch):
    """Importing the layer and the kernel afresh does not even try to import mamba-ssm,
    triton or causal-conv1d (attempts are recorded and blocked). The original modules
    are restored afterwards."""
    import importlib
    import importlib.abc

    import madsl.kernels
    import madsl.layers

    blocked = ("mamba_ssm", "triton", "causal_conv1d")
    attempts = []

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                attempts.append(name)
                raise ImportError(f"{name} imported at module import time")
            return None

    for name in list(sys.modules):
        if name.split(".")[0] in blocked:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Blocker(), *sys.meta_path])
    for package, name in ((madsl.layers, "mamba"), (madsl.kernels, "selective_scan")):
        monkeypatch.delitem(sys.modules, f"{package.__name__}.{name}")
        monkeypatch.setattr(package, name, getattr(package, name))  # restored afterwards
    fresh = importlib.import_module("madsl.layers.mamba")
    assert fresh.Mamba is not Mamba  # really re-imported
    assert not attempts


# --- the scan ---------------------------------------------------------------------------
def _scan_inputs(batch, d_inner, d_state, length, dtype=torch.float32, layer_layout=True, seed=0):
    """Inputs of selective_scan; layer_layout: (batch, channels, L) views of (batch, L,
    channels) storage, as the layer passes them; else contiguous (batch, channels, L)."""
    gen = torch.Generator().manual_seed(seed)

    def seq(channels, scale=1.0, shift=0.0):
        shape = (batch, length, channels) if layer_layout else (batch, channels, length)
        x = torch.randn(*shape, generator=gen, dtype=dtype) * scale + shift
        return (x.transpose(1, 2) if layer_layout else x).requires_grad_()

    u, delta = seq(d_inner), seq(d_inner, 0.5, -1.0)
    A = (-torch.rand(d_inner, d_state, generator=gen, dtype=dtype) - 0.5).requires_grad_()
    B, C = seq(d_state), seq(d_state)
    D = torch.randn(d_inner, generator=gen, dtype=dtype).requires_grad_()
    z = seq(d_inner)
    delta_bias = (0.5 * torch.randn(d_inner, generator=gen, dtype=dtype)).requires_grad_()
    return [u, delta, A, B, C, D, z, delta_bias]


def _mamba_ssm_formula(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    """mamba-ssm's selective_scan_ref (real A, B and C of shape (batch, N, L)), written
    out independently: materialised exp(delta A) and delta B u, then the recurrence."""
    delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for i in range(u.shape[2]):
        h = deltaA[:, :, i] * h + deltaB_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, i]))
    out = torch.stack(ys, dim=2) + u * D[:, None]
    return out * F.silu(z), h


@pytest.mark.parametrize("delta_softplus", [True, False])
def test_scan_matches_mamba_ssm_formula(delta_softplus):
    inputs = _scan_inputs(2, 6, 3, 10, torch.float64, layer_layout=False)
    out, last = selective_scan_cpu(*inputs, delta_softplus=delta_softplus, return_last_state=True, chunk_len=4)
    expected_out, expected_last = _mamba_ssm_formula(*inputs, delta_softplus=delta_softplus)
    torch.testing.assert_close(out, expected_out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(last, expected_last, atol=1e-12, rtol=1e-10)
    ref_out, ref_last = selective_scan_reference(*inputs, delta_softplus=delta_softplus, return_last_state=True)
    torch.testing.assert_close(ref_out, expected_out, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("layer_layout", [True, False])
@pytest.mark.parametrize("chunk_len", [1, 3, None])
@pytest.mark.parametrize("optional", ["all", "none"])
def test_scan_forward_backward_match_reference(layer_layout, chunk_len, optional):
    u, delta, A, B, C, D, z, delta_bias = _scan_inputs(3, 8, 4, 11, layer_layout=layer_layout)
    if optional == "none":
        D = z = delta_bias = None
    args = [u, delta, A, B, C, D, z, delta_bias]
    kwargs = dict(delta_softplus=optional == "all")
    out = selective_scan_cpu(*args, **kwargs, chunk_len=chunk_len)
    expected = selective_scan_reference(*args, **kwargs)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert out.shape == u.shape and out.dtype == u.dtype

    grad_out = torch.randn_like(out)
    leaves = [x for x in args if x is not None]
    grads = torch.autograd.grad(out, leaves, grad_out)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)
    for g, e, x in zip(grads, expected_grads, leaves):
        assert g.shape == x.shape
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk_len", [2, None])
def test_scan_gradcheck_float64(chunk_len):
    inputs = _scan_inputs(2, 3, 2, 7, torch.float64, layer_layout=False)
    assert torch.autograd.gradcheck(lambda *a: selective_scan_cpu(*a, delta_softplus=True, chunk_len=chunk_len), inputs)


def test_scan_saves_no_per_step_states():
    batch, d_inner, d_state, length, chunk_len = 2, 8, 4, 256, 16
    inputs = _scan_inputs(batch, d_inner, d_state, length)
    out = selective_scan_cpu(*inputs, delta_softplus=True, chunk_len=chunk_len)
    saved = out.grad_fn.saved_tensors
    # Nothing of size batch*L*d_inner*d_state: inputs, (batch, L, d_inner) sequences and
    # one state per chunk only.
    assert max(t.numel() for t in saved if t is not None) == batch * length * d_inner
    starts = [t for t in saved if t is not None and t.dim() == 5]  # (chunks, batch, groups, d_state, d_inner)
    assert len(starts) == 1 and starts[0].shape[0] == length // chunk_len


def test_dispatch_uses_cpu_kernel_on_cpu():
    inputs = _scan_inputs(1, 4, 2, 5)
    out = selective_scan(*inputs, delta_softplus=True)
    assert type(out.grad_fn).__name__ == "SelectiveScanCPUBackward"
