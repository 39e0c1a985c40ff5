"""madsl's flash-linear-attention paths on the CPU: fla's own Triton kernels, run in Triton's
interpreter (tests/triton_interpreter.py), against madsl's CPU forms.

On a GPU these paths (`gla_fla_chunk`, `decay_parallel`, `delta_parallel`, the layers that train
through them, and their member folds under vmap) are what trains; tests/test_cuda.py checks them
there. Here the same wrappers call the same kernels, so what the wrappers own (layouts, scale and
gate conventions, the initial state, the fold of members into the batch) is checked on every
CPU run. The interpreter is numpy's float32 arithmetic, not the GPU's TF32 dots, so the tolerances
are fp32 ones, stated as relative RMS errors (`_assert_close`). Small shapes: the interpreter runs
each program instance in Python.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
import triton_interpreter
from layer_helpers import make

if not triton_interpreter.available():
    pytest.skip(
        "Triton is not installed, or TRITON_INTERPRET is not 1 (tests/conftest.py sets it without CUDA)",
        allow_module_level=True,
    )

from madsl.kernels import gla as gla_kernels
from madsl.kernels import linear_recurrence
from madsl.kernels.gla import gla_fla_chunk, gla_recurrent

MEMBERS = 3
if gla_kernels.fla_chunk_gla() is None:
    pytest.skip("flash-linear-attention is not importable", allow_module_level=True)


def _route_to_fla(monkeypatch, use_fla: bool) -> None:
    """madsl's dispatch sending CPU tensors to fla as it sends CUDA ones (float64 still takes the
    exact paths), or, with use_fla False, to madsl's chunked CPU forms."""
    import madsl.layers.gla as gla_layer

    for module, name in ((gla_kernels, "fla_applies"), (gla_layer, "fla_applies"), (linear_recurrence, "_fla_applies")):
        monkeypatch.setattr(module, name, lambda x: use_fla and x.dtype != torch.float64)


@pytest.fixture(autouse=True)
def fla_on_the_cpu(monkeypatch):
    """The interpreter's bridges, and fla serving CPU tensors."""
    triton_interpreter.bridge(monkeypatch)
    _route_to_fla(monkeypatch, True)


def _grads(outputs, inputs):
    weights = [torch.linspace(-1, 1, o.numel()).reshape(o.shape) for o in outputs]
    return list(torch.autograd.grad(sum((o * w).sum() for o, w in zip(outputs, weights)), inputs))


def _assert_close(got, want, rms=1e-4, worst=1e-2):
    """Each tensor within `rms` relative RMS error of its reference (how fla's own tests compare
    kernels: elementwise tolerances fail on the odd element a normaliser amplifies, by amounts that
    differ with the CPU's and BLAS's summation order), and no element off by more than `worst` of
    the reference's largest magnitude (a layout or convention bug is off by O(1) there)."""
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"tensor {index}: shape {tuple(g.shape)} against {tuple(w.shape)}"
        g, w = g.float(), w.float()
        scale = w.abs().max().clamp_min(1e-12)
        error = ((g - w).norm() / w.norm().clamp_min(1e-12)).item()
        assert error <= rms, f"tensor {index}: relative RMS error {error:.1e} > {rms:.0e}"
        largest = ((g - w).abs().max() / scale).item()
        assert largest <= worst, f"tensor {index}: an element off by {largest:.1e} of the largest value"


@pytest.mark.parametrize("with_state", [False, True])
def test_fla_chunk_gla_matches_the_recurrence(with_state):
    """gla_fla_chunk (fla's chunk_gla: layout, scale 1, gates, the initial and final state) against
    madsl's token-by-token recurrence, forward and backward; a length that is not a chunk's multiple."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 70, d, generator=gen) * 0.5 for d in (16, 16, 8))
    log_decay = F.logsigmoid(torch.randn(2, 2, 70, 16, generator=gen) + 3) / 4
    state = torch.randn(2, 2, 16, 8, generator=gen) if with_state else None
    inputs = [x.requires_grad_() for x in (q, k, v, log_decay)]

    def run(fn):
        o, final = fn(*inputs, initial_state=state)
        return [o, final, *_grads([o, final], inputs)]

    _assert_close(run(gla_fla_chunk), run(gla_recurrent))


@pytest.mark.parametrize("gated", [False, True])
def test_fla_decay_and_delta_kernels_match_the_chunked_forms(gated):
    """decay_parallel (fla's chunk_simple_gla) and delta_parallel (chunk_delta_rule /
    chunk_gated_delta_rule) against madsl's chunked forms."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 70, 16, generator=gen) * 0.5 for _ in range(3))
    k = F.normalize(k, dim=-1)
    log_decay = F.logsigmoid(torch.randn(2, 2, 70, generator=gen) + 3) if gated else None
    beta = torch.rand(2, 2, 70, generator=gen)
    inputs = [x.requires_grad_() for x in (q, k, v, beta, *([log_decay] if gated else []))]
    decay = inputs[4] if gated else None

    def run(decay_fn, delta_fn):
        outputs = [decay_fn(q, k, v, decay), delta_fn(q, k, v, inputs[3], decay)]
        return [*outputs, *_grads(outputs, inputs)]

    fla = run(linear_recurrence.decay_parallel, linear_recurrence.delta_parallel)
    chunked = run(lambda *a: linear_recurrence.decay_chunked(*a)[0], lambda *a: linear_recurrence.delta_chunked(*a)[0])
    _assert_close(fla, chunked)


@pytest.mark.parametrize(
    "name, params",
    [
        ("gla", {}),
        ("mamba2", {"d_state": 16}),
        ("retention", {}),
        ("linear_attention", {"normalize": True}),
        ("delta_net", {"gated": True}),
        ("delta_net", {"gated": False}),
        ("rwkv", {"version": 5}),
        ("rwkv", {"version": 6}),
    ],
)
def test_fla_backed_layer_matches_its_cpu_form(name, params, monkeypatch):
    """Each layer that trains through fla on a GPU: its fla path against its chunked CPU path,
    forward, input gradient and every parameter's gradient."""
    torch.manual_seed(0)
    _, layer = make(name, 32, **params)
    x = torch.randn(2, 40, 32)

    def run(use_fla: bool):
        _route_to_fla(monkeypatch, use_fla)
        layer.zero_grad(set_to_none=True)
        xd = x.clone().requires_grad_()
        y = layer(xd)
        y.square().mean().backward()
        return [y, xd.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]

    with_fla = run(True)
    _assert_close(with_fla, run(False))


def test_fla_kernels_fold_the_members_into_one_call():
    """Under vmap (grid-batched training) fla's kernels, which have no vmap rule, take every member
    in one call with the members folded into the batch: equal to a loop over members, no fallback."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(MEMBERS, 1, 2, 40, 16, generator=gen).requires_grad_() for _ in range(3))
    gates = F.logsigmoid(torch.randn(MEMBERS, 1, 2, 40, 16, generator=gen) + 2).requires_grad_()
    decay = F.logsigmoid(torch.randn(MEMBERS, 1, 2, 40, generator=gen) + 2).requires_grad_()
    beta = torch.rand(MEMBERS, 1, 2, 40, generator=gen).requires_grad_()
    cases = [
        (lambda q, k, v, g: gla_fla_chunk(q, k, v, g)[0], [q, k, v, gates]),
        (linear_recurrence.decay_parallel, [q, k, v, decay]),
        (
            lambda q, k, v, b, g: linear_recurrence.delta_parallel(q, F.normalize(k, dim=-1), v, b, g),
            [q, k, v, beta, decay],
        ),
    ]
    for fn, args in cases:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="There is a performance drop")
            stacked = torch.func.vmap(fn)(*args)
        looped = torch.stack([fn(*(a[m] for a in args)) for m in range(MEMBERS)])
        _assert_close([stacked, *_grads([stacked], args)], [looped, *_grads([looped], args)])


def _relative_rms(got, want) -> list[float]:
    return [((g.float() - w.float()).norm() / w.float().norm().clamp_min(1e-12)).item() for g, w in zip(got, want)]


@pytest.mark.parametrize(
    "name, params",
    [
        ("gla", {}),
        ("mamba2", {"d_state": 16}),
        ("retention", {}),
        ("linear_attention", {"normalize": True}),
        ("delta_net", {"gated": True}),
        ("delta_net", {"gated": False}),
        ("rwkv", {"version": 6}),
    ],
)
def test_fla_backed_layer_under_16_bit_autocast(name, params, monkeypatch):
    """As the runner trains on a GPU (`--precision bf16`): under autocast the projections hand fla
    16-bit tensors beside float32 gates and products, and fla takes operands of one dtype and, in
    16 bits, of even widths. Each output and gradient is as close to the float32 result as the
    chunked path's under the same autocast (at most twice its error, or 1 %).
    float16 stands in for bfloat16: Triton's interpreter (numpy) has no bfloat16 arithmetic, and
    fla's checks treat the two alike."""
    torch.manual_seed(0)
    _, layer = make(name, 32, **params)
    x = torch.randn(2, 40, 32)

    def run(use_fla: bool, dtype: torch.dtype | None):
        _route_to_fla(monkeypatch, use_fla)
        layer.zero_grad(set_to_none=True)
        xd = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            y = layer(xd)
        y.float().square().mean().backward()
        return [y, xd.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]

    exact = run(False, None)
    fla_errors = _relative_rms(run(True, torch.float16), exact)
    chunked_errors = _relative_rms(run(False, torch.float16), exact)
    for index, (fla, chunked) in enumerate(zip(fla_errors, chunked_errors)):
        assert fla <= max(2 * chunked, 1e-2), f"tensor {index}: fla {fla:.1e} against the chunked path's {chunked:.1e}"
