"""The GPU code paths, exercised on the CPU: the chunked parallel selective scan (the
CUDA fallback without mamba-ssm) against the sequential reference in float64, forward
and backward; the one-time warning naming the extra; and the plumbing of the CUDA
libraries' calls (argument order and layouts) through stand-ins written to their
documented signatures. tests/test_cuda.py runs the real kernels on a GPU."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from madsl.kernels import cuda
from madsl.kernels.selective_scan_chunked import _largest_safe_chunk, selective_scan_chunked
from madsl.kernels.selective_scan_cpu import selective_scan_cpu
from madsl.kernels.selective_scan_reference import selective_scan_reference
from madsl.lang.stdlib import primitive
from madsl.layers.mamba import Mamba


def _inputs(batch, d_inner, d_state, length, dtype=torch.float64, delta_shift=-1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=gen, dtype=dtype) * scale + shift).requires_grad_()

    u, delta = rand(batch, d_inner, length), rand(batch, d_inner, length, scale=0.5, shift=delta_shift)
    A = (-torch.rand(d_inner, d_state, generator=gen, dtype=dtype) - 0.5).requires_grad_()
    B, C = rand(batch, d_state, length), rand(batch, d_state, length)
    return [u, delta, A, B, C, rand(d_inner), rand(batch, d_inner, length), rand(d_inner, scale=0.5)]


def _forward_backward(scan, inputs, **kwargs):
    out, last = scan(*inputs, delta_softplus=True, return_last_state=True, **kwargs)
    weights = torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    return out, last, grads


@pytest.mark.parametrize("length,chunk_size", [(37, 8), (64, None), (5, 16), (33, 1)])
def test_chunked_scan_equals_reference_float64(length, chunk_size):
    inputs = _inputs(2, 5, 3, length)
    ref = _forward_backward(selective_scan_reference, inputs)
    got = _forward_backward(selective_scan_chunked, inputs, chunk_size=chunk_size)
    torch.testing.assert_close(got[0], ref[0], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(got[1], ref[1], atol=1e-12, rtol=1e-10)
    for g, r in zip(got[2], ref[2]):
        torch.testing.assert_close(g, r, atol=1e-11, rtol=1e-9)


def test_chunked_scan_halves_chunks_under_strong_decay():
    """delta ~ 30 per step: a 64-step chunk would decay by e^-2000; the chunk is halved
    (float32: down to 2 steps) and the result stays finite and equal to the fused scan."""
    inputs = [x.detach().float().requires_grad_() for x in _inputs(2, 4, 3, 64, delta_shift=30.0)]
    delta = F.softplus(inputs[1].detach().transpose(1, 2) + inputs[7].detach())
    assert _largest_safe_chunk(delta, inputs[2].detach(), 64) < 8
    ref = _forward_backward(selective_scan_cpu, inputs)
    got = _forward_backward(selective_scan_chunked, inputs)
    assert all(torch.isfinite(g).all() for g in got[2])
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    for g, r in zip(got[2], ref[2]):
        torch.testing.assert_close(g, r, atol=1e-3, rtol=1e-3)


def test_chunked_scan_float32_matches_fused_cpu_scan():
    inputs = [x.detach().float().requires_grad_() for x in _inputs(3, 16, 4, 200, seed=1)]
    ref = _forward_backward(selective_scan_cpu, inputs)
    got = _forward_backward(selective_scan_chunked, inputs)
    torch.testing.assert_close(got[0], ref[0], atol=2e-5, rtol=1e-4)
    for g, r in zip(got[2], ref[2]):
        torch.testing.assert_close(g, r, atol=1e-3, rtol=1e-3)


def test_missing_extra_warns_once_naming_it(monkeypatch):
    monkeypatch.setattr(cuda, "mamba_ssm_ops", lambda: None)
    cuda.warn_missing.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cuda.selective_scan_fn() is None
        assert cuda.selective_scan_fn() is None
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "pip install 'madsl[cuda]'" in messages[0] and "mamba-ssm" in messages[0]
    cuda.warn_missing.cache_clear()


# --- stand-ins with the libraries' signatures (from their sources) -------------------
def fake_causal_conv1d_fn(
    x,
    weight,
    bias=None,
    seq_idx=None,
    initial_states=None,
    return_final_states=False,
    final_states_out=None,
    activation=None,
):
    """causal_conv1d.causal_conv1d_fn: x (batch, dim, L), weight (dim, width)."""
    assert x.dim() == 3 and weight.dim() == 2 and weight.shape[0] == x.shape[1]
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=weight.shape[1] - 1, groups=x.shape[1])
    out = out[..., : x.shape[-1]]
    return F.silu(out) if activation in ("silu", "swish") else out


def fake_mamba_inner_fn(
    xz,
    conv1d_weight,
    conv1d_bias,
    x_proj_weight,
    delta_proj_weight,
    out_proj_weight,
    out_proj_bias,
    A,
    B=None,
    C=None,
    D=None,
    delta_bias=None,
    B_proj_bias=None,
    C_proj_bias=None,
    delta_softplus=True,
    checkpoint_lvl=1,
):
    """mamba_ssm's mamba_inner_fn (as its mamba_inner_ref): xz (batch, 2*d_inner, L),
    conv1d_weight (d_inner, 1, width); returns (batch, L, dim)."""
    assert B is None and C is None and xz.shape[1] == 2 * conv1d_weight.shape[0]
    length, d_state, rank = xz.shape[-1], A.shape[-1], delta_proj_weight.shape[1]
    x, z = xz.chunk(2, dim=1)
    x = fake_causal_conv1d_fn(x, conv1d_weight[:, 0], conv1d_bias, activation="silu")
    x_dbl = F.linear(x.transpose(1, 2), x_proj_weight)  # (batch, L, rank + 2 d_state)
    delta = (x_dbl[..., :rank] @ delta_proj_weight.t()).transpose(1, 2)
    B = x_dbl[..., rank : rank + d_state].transpose(1, 2)
    C = x_dbl[..., -d_state:].transpose(1, 2)
    y = selective_scan_reference(x, delta, A, B, C, D, z, delta_bias, delta_softplus)
    assert y.shape[-1] == length
    return F.linear(y.transpose(1, 2), out_proj_weight, out_proj_bias)


@pytest.mark.parametrize("bias", [False, True])
def test_mamba_fused_cuda_path_plumbing(monkeypatch, bias):
    """Mamba's mamba_inner_fn call (as on CUDA), through the stand-in: equal to the
    CPU path, forward and parameter gradients, float64."""
    torch.manual_seed(0)
    layer = primitive("mamba", 16, d_state=4, d_conv=4, expand=2, bias=bias, conv_bias=bias).build().double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)

    def grads():
        out = layer(x)
        return [out, *torch.autograd.grad(out.square().sum(), list(layer.parameters()))]

    ref = grads()
    monkeypatch.setattr(Mamba, "_cuda_kernels", lambda self, x: fake_mamba_inner_fn)
    for g, r in zip(grads(), ref):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-8)


def test_mamba_unfused_cuda_path_plumbing(monkeypatch):
    """The CUDA path without mamba_inner_fn (causal-conv1d's conv + the chunked scan):
    equal to the CPU path, float64."""
    import madsl.layers.mamba as mamba_module

    torch.manual_seed(1)
    layer = primitive("mamba", 16, d_state=4, d_conv=3, expand=2, conv_bias=True).build().double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)

    def grads():
        out = layer(x)
        return [out, *torch.autograd.grad(out.square().sum(), list(layer.parameters()))]

    ref = grads()

    monkeypatch.setattr(Mamba, "_cuda_conv", lambda self, x: fake_causal_conv1d_fn)
    monkeypatch.setattr(mamba_module, "selective_scan", selective_scan_chunked)
    for g, r in zip(grads(), ref):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-8)


# --- placement on several devices ------------------------------------------------------
def test_devices_are_checked_and_runs_placed_round_robin(tmp_path):
    from madsl.errors import MadslError
    from madsl.runner.execute.devices import place_devices
    from madsl.runner.plan.evaluation import plan_evaluation
    from madsl.runner.plan.overrides import Overrides
    from madsl.runner.store.results import Store
    from madsl.spec import load_spec
    from tests.test_cli import madsl

    with pytest.raises(MadslError, match="cuda:7 does not exist"):
        place_devices("auto", ["cuda:7"])
    with pytest.raises(MadslError, match="unknown device 'gpu0'"):
        place_devices("auto", ["gpu0"])
    assert place_devices("cpu", None) is None
    proc = madsl("eval", "specs/paper/hyena-sg.mad", "--devices", "cuda:7", "--db", str(tmp_path / "r.db"), check_rc=2)
    assert "cuda:7" in proc.stderr

    store = Store(tmp_path / "p.db")
    spec = load_spec("specs/paper/hyena-sg.mad")
    cli = Overrides(protocol="smoke", tasks=("memorization",), lrs=(1e-3, 1e-2, 3e-2))
    plan = plan_evaluation(store, [(spec, "specs/paper/hyena-sg.mad")], cli, placement=["cpu", "meta"])
    store.close()
    assert [job.device for job in plan.jobs] == ["cpu", "meta", "cpu"]


def test_library_status_says_for_each_library_of_the_cuda_extra_whether_it_imports(monkeypatch):
    """`python -m madsl.kernels.cuda` (the GPU check scripts' first look): one line per library."""
    monkeypatch.setattr(cuda, "mamba_ssm_ops", lambda: (print, print))
    monkeypatch.setattr(cuda, "causal_conv1d_ops", lambda: None)
    monkeypatch.setattr(cuda, "fla_gla_ops", lambda: None)
    assert [line.split() for line in cuda.library_status().splitlines()] == [
        ["mamba-ssm", "imports"],
        ["causal-conv1d", "MISSING"],
        ["flash-linear-attention", "MISSING"],
    ]
