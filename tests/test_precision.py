"""Precision: bf16 autocast of every primitive against fp32 (CPU autocast), the parts
that must stay float32 inside it, `model.to(torch.bfloat16)`, precision in run
identities, and bad input.

Tolerance of bf16 autocast against fp32: relative L2 error at most 3e-2 for the
output, the input gradient and all parameter gradients together (bf16 keeps 8 bits
of mantissa: single matmuls land near 4e-3; the measured worst, GLA, is 1e-2).
"""

import sqlite3

import pytest
import torch

from madsl.errors import MadslError
from madsl.kernels.fftconv import fft_causal_conv, toeplitz_causal_conv
from madsl.kernels.gla import gla_chunked
from madsl.kernels.selective_scan_chunked import selective_scan_chunked
from madsl.kernels.selective_scan_cpu import selective_scan_cpu
from madsl.runner.store.results import RunIdentity
from madsl.runner.train import precision
from tests.layer_helpers import make

TOLERANCE = 3e-2
FILTERS = ("modal", "s4d", "rational", "conv1d", "fno", "ckconv", "hyena")
CASES = [
    ("attention", {}),
    ("multihead_hyena", {}),
    ("hyena_experts", {}),
    ("mamba", {}),
    ("gla", {}),
    ("swiglu", {}),
    ("moe", {}),
] + [("hyena", {"filter": f}) for f in FILTERS]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def _forward_backward(module, x, weights, bf16: bool):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = module(x)
    (y.float() * weights).sum().backward()  # backward outside autocast, as the training loop does
    grads = torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None])
    return y.detach(), x.grad, grads


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}-{o.get('filter', '')}" for n, o in CASES])
def test_bf16_autocast_is_close_to_fp32(name, overrides):
    torch.manual_seed(0)
    _, module = make(name, 128, **overrides)
    x, weights = torch.randn(2, 64, 128), torch.randn(2, 64, 128)
    reference = _forward_backward(module, x, weights, bf16=False)
    mixed = _forward_backward(module, x, weights, bf16=True)
    assert all(p.dtype == torch.float32 for p in module.parameters())  # master weights untouched
    for what, got, want in zip(("output", "input gradient", "parameter gradients"), mixed, reference):
        assert _rel(got, want) < TOLERANCE, (what, _rel(got, want))


def test_delicate_kernels_ignore_autocast():
    """Scans, GLA and the long convolutions give the same float32 numbers inside a bf16
    autocast as outside it (they switch it off)."""
    torch.manual_seed(0)
    u, delta, z = torch.randn(2, 8, 40), torch.randn(2, 8, 40) - 1, torch.randn(2, 8, 40)
    A, B, C, D = -torch.rand(8, 4) - 0.5, torch.randn(2, 4, 40), torch.randn(2, 4, 40), torch.randn(8)
    q, k, v = torch.randn(2, 2, 40, 8), torch.randn(2, 2, 40, 8), torch.randn(2, 2, 40, 8)
    log_decay = torch.nn.functional.logsigmoid(torch.randn(2, 2, 40, 8))
    h = torch.randn(8, 40)
    calls = [
        lambda: selective_scan_cpu(u, delta, A, B, C, D, z, delta_softplus=True),
        lambda: selective_scan_chunked(u, delta, A, B, C, D, z, delta_softplus=True),
        lambda: gla_chunked(q, k, v, log_decay)[0],
        lambda: fft_causal_conv(u, h),
        lambda: toeplitz_causal_conv(u, h),
    ]
    for call in calls:
        plain = call()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = call()
        assert mixed.dtype == torch.float32
        torch.testing.assert_close(mixed, plain, rtol=0, atol=0)


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}-{o.get('filter', '')}" for n, o in CASES])
def test_model_to_bfloat16_is_supported_and_filters_stay_float32(name, overrides):
    """`module.to(torch.bfloat16)` trains: filters keep float32 parameters (their FFT
    and generation need them), everything else becomes bf16. Pure bf16 weights are
    coarser than autocast's: 3x the tolerance, and MoE's routing may flip for a few tokens."""
    torch.manual_seed(0)
    _, module = make(name, 128, **overrides)
    x = torch.randn(2, 64, 128)
    with torch.no_grad():
        reference = module(x)
    module.to(torch.bfloat16)
    for pname, p in module.named_parameters():
        expected = (torch.float32, torch.complex64) if "filter" in pname and "short" not in pname else (torch.bfloat16,)
        assert p.dtype in expected, (pname, p.dtype)
    y = module(x.bfloat16())
    assert y.dtype == torch.bfloat16
    y.float().square().mean().backward()
    assert all(
        p.grad is not None and torch.isfinite(p.grad.float()).all()
        for p in module.parameters()
        if p.requires_grad and p.grad is not None
    )
    if name != "moe":
        assert _rel(y.detach(), reference) < 3 * TOLERANCE


# --- the runner ------------------------------------------------------------------------------
def test_fp32_identity_is_unchanged_and_bf16_is_a_different_run():
    before = {
        "lr": 1e-3,
        "wd": 0.0,
        "epochs": 2,
        "batch_size": 128,
        "seed": 0,
        "min_lr": 1e-5,
        "early_stop_acc": 0.99,
        "eval_lengths": (),
        "freeze": (),
    }
    ids = {
        p: RunIdentity("s", "t", {}, precision.train_config_identity({**before, "precision": p}), "v").run_id
        for p in ("fp32", "bf16")
    }
    assert ids["fp32"] == RunIdentity("s", "t", {}, before, "v").run_id
    assert ids["bf16"] != ids["fp32"]


def test_precision_resolution_and_bad_input(monkeypatch):
    assert precision.resolve_precision("auto", "cpu") == "fp32"
    assert precision.resolve_precision("bf16", "cpu") == "bf16"
    with pytest.raises(MadslError, match="unknown precision 'fp16x'"):
        precision.resolve_precision("fp16x", "cpu")
    # a CUDA GPU without bf16 (before Ampere)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert precision.resolve_precision("auto", "cuda") == "fp32"
    with pytest.raises(MadslError, match="does not support bfloat16"):
        precision.resolve_precision("bf16", "cuda")


def test_cli_and_spec_reject_unknown_precision(tmp_path):
    from tests.test_cli import madsl

    proc = madsl("eval", "specs/paper/hyena-sg.mad", "--precision", "fp16x", "--db", str(tmp_path / "r.db"), check_rc=2)
    assert "fp16x" in proc.stderr
    spec = tmp_path / "s.mad"
    spec.write_text("name: s\ntopology: H:Sg\ndim: 32\neval:\n  protocol: smoke\n  precision: fp16x\n")
    proc = madsl("eval", str(spec), "--db", str(tmp_path / "r.db"), check_rc=2)
    assert "s.mad:6:14" in proc.stderr and "fp16x" in proc.stderr


def test_bf16_smoke_eval_trains_and_is_its_own_run(tmp_path):
    from madsl.runner.api import evaluate

    db = tmp_path / "r.db"
    common = dict(tasks=["memorization"], protocol="smoke", db=db, epochs=3, lr=1e-2)
    evaluate(["specs/paper/hyena-sg.mad"], precision="bf16", **common)
    evaluate(["specs/paper/hyena-sg.mad"], precision="fp32", **common)  # not "auto": bf16 on a GPU
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT run_id, status FROM runs").fetchall()
        losses = conn.execute("SELECT run_id, epoch, train_loss FROM epochs ORDER BY run_id, epoch").fetchall()
    assert len(runs) == 2 and all(status == "done" for _, status in runs)
    for run_id, _ in runs:
        curve = [loss for rid, _, loss in losses if rid == run_id]
        assert len(curve) == 3 and curve[-1] < curve[0]
