"""The CUDA lane (skipped without a GPU; `scripts/gpu_check.sh` runs it): the fused
kernels against the CPU references, forward and backward; the pure-PyTorch GPU
paths used without the `cuda` extra; a bf16 training step of every paper spec; step
mode equal to the parallel forward on the device.

Kernel tests that need the extra skip when its library does not import, so the lane
also checks an install without it (the chunked fallbacks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from madsl.kernels import cuda  # noqa: E402
from madsl.kernels.gla import gla_chunked, gla_fla_chunk, gla_recurrent  # noqa: E402
from madsl.kernels.selective_scan_chunked import selective_scan_chunked  # noqa: E402
from madsl.kernels.selective_scan_cpu import selective_scan_cpu  # noqa: E402
from madsl.kernels.selective_scan_reference import selective_scan_reference  # noqa: E402
from tests.layer_helpers import make, run_steps  # noqa: E402

DEVICE = torch.device("cuda")
PAPER_SPECS = sorted(Path(__file__).resolve().parents[1].joinpath("specs", "paper").glob("*.mad"))


@pytest.fixture(autouse=True)
def one_triton_config(monkeypatch):
    """Triton's autotuned kernels (fla's) run their first configuration instead of compiling and
    timing every one: on a cold cache that took minutes a shape on an H100, past a device call's
    limit. Every configuration computes the same thing, and that is what this lane checks (speed
    is the benchmarks'). MADSL_TRITON_AUTOTUNE=1 keeps the autotuning."""
    if os.environ.get("MADSL_TRITON_AUTOTUNE") == "1":
        return
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # no Triton: nothing autotunes
        return
    prune = Autotuner.prune_configs
    monkeypatch.setattr(Autotuner, "prune_configs", lambda self, kwargs: prune(self, kwargs)[:1])


def _scan_inputs(batch=2, d_inner=64, d_state=4, length=300, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen) * scale + shift

    inputs = [
        rand(batch, d_inner, length),
        rand(batch, d_inner, length, scale=0.5, shift=-1.0),
        -torch.rand(d_inner, d_state, generator=gen) - 0.5,
        rand(batch, d_state, length),
        rand(batch, d_state, length),
        rand(d_inner),
        rand(batch, d_inner, length),
        rand(d_inner, scale=0.5),
    ]
    return [x.to(device=device, dtype=dtype).requires_grad_() for x in inputs]


def _scan_and_grads(scan, inputs):
    out, last = scan(*inputs, delta_softplus=True, return_last_state=True)
    weights = torch.linspace(-1, 1, out.shape[-1], device=out.device)
    grads = torch.autograd.grad((out.float() * weights).sum(), inputs)
    return [out, last, *grads]


def _assert_all_close(got, want, atol, rtol):
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float().cpu(), w.float().cpu(), atol=atol, rtol=rtol)


def _assert_relative_rms(got, want, ratio):
    """||got - want|| / ||want|| per tensor, as fla's own tests compare its Triton kernels:
    their fp32 dots run in TF32, so elementwise tolerances fail on long sums."""
    for g, w in zip(got, want):
        g, w = g.detach().double().cpu(), w.detach().double().cpu()
        assert g.shape == w.shape
        assert float((g - w).norm() / w.norm().clamp(min=1e-12)) <= ratio


# --- kernel parity ---------------------------------------------------------------------------
def test_mamba_ssm_selective_scan_matches_cpu_scan():
    scan_fn = cuda.selective_scan_fn()
    if scan_fn is None:
        pytest.skip("mamba-ssm not installed")
    cpu = _scan_and_grads(selective_scan_cpu, _scan_inputs())
    _assert_all_close(_scan_and_grads(scan_fn, _scan_inputs(device=DEVICE)), cpu, atol=2e-3, rtol=2e-3)


def test_chunked_scan_on_gpu_matches_cpu_reference_float64():
    want = _scan_and_grads(selective_scan_reference, _scan_inputs(length=100, dtype=torch.float64))
    got = _scan_and_grads(selective_scan_chunked, _scan_inputs(length=100, dtype=torch.float64, device=DEVICE))
    _assert_all_close(got, want, atol=1e-9, rtol=1e-7)


def test_fla_chunk_gla_matches_recurrence():
    if cuda.chunk_gla() is None:
        pytest.skip("flash-linear-attention not installed")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 200, d) * 0.5 for d in (32, 32, 48))
    log_decay = F.logsigmoid(torch.randn(2, 4, 200, 32) + 3) / 4
    inputs = [x.requires_grad_() for x in (q, k, v, log_decay)]
    on_device = [x.detach().to(DEVICE).requires_grad_() for x in inputs]

    def run(fn, xs):
        o, final = fn(*xs)
        grads = torch.autograd.grad((o.float() * o.detach().float().sign()).sum(), xs)
        return [o, final, *grads]

    _assert_relative_rms(run(gla_fla_chunk, on_device), run(gla_recurrent, inputs), ratio=5e-3)
    _assert_all_close(run(gla_chunked, on_device), run(gla_recurrent, inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["mamba", "gla", "attention", "hyena", "multihead_hyena", "hyena_experts", "moe"])
def test_layer_on_device_matches_cpu_forward_and_backward(name):
    """Each primitive's CUDA dispatch (mamba_inner_fn / fla / SDPA / cuFFT) in fp32 against its CPU path."""
    torch.manual_seed(0)
    _, layer = make(name, 128)
    x = torch.randn(4, 96, 128)

    def run(module, device):
        module = module.to(device)
        module.zero_grad(set_to_none=True)
        xd = x.detach().to(device, copy=True).requires_grad_()  # never x itself (to("cpu") returns it)
        y = module(xd)
        y.square().mean().backward()
        return [y, xd.grad, *(p.grad for p in module.parameters() if p.grad is not None)]

    want = run(layer, "cpu")
    _assert_all_close(run(layer, DEVICE), want, atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize(
    "name, params",
    [
        ("mamba2", {"d_state": 16}),
        ("retention", {}),
        ("linear_attention", {"normalize": True}),
        ("delta_net", {"gated": True}),
        ("delta_net", {"gated": False}),
        ("rwkv", {"version": 5}),
        ("rwkv", {"version": 6}),
    ],
)
def test_fla_backed_layer_on_device_matches_cpu_forward_and_backward(name, params):
    """The layers that train through fla's chunk kernels (chunk_simple_gla, chunk_(gated_)delta_rule,
    RWKV's chunk_gla) against their CPU chunked forms; TF32 inside fla's dots, hence the
    relative-RMS criterion."""
    torch.manual_seed(0)
    _, layer = make(name, 128, **params)
    x = torch.randn(4, 96, 128)

    def run(module, device):
        module = module.to(device)
        module.zero_grad(set_to_none=True)
        xd = x.detach().to(device, copy=True).requires_grad_()
        y = module(xd)
        y.square().mean().backward()
        return [y, xd.grad, *(p.grad for p in module.parameters() if p.grad is not None)]

    want = run(layer, "cpu")
    _assert_relative_rms(run(layer, DEVICE), want, ratio=5e-3)


@pytest.fixture
def exact_fp32_matmuls():
    """TF32 off for the test (the runner turns it on for the process): a test of the algebra, not
    of TF32's 10-bit rounding (which put linear attention's normalised outputs 3e-3 apart on an H100)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize(
    "name",
    ["mamba", "gla", "attention", "hyena", "multihead_hyena", "mamba2", "delta_net", "retention", "linear_attention"],
)
def test_step_mode_equals_parallel_forward_on_device(name, exact_fp32_matmuls):
    torch.manual_seed(0)
    _, layer = make(name, 128)
    layer = layer.to(DEVICE).eval()
    x = torch.randn(2, 40, 128, device=DEVICE)
    with torch.no_grad():
        parallel = layer(x)
        stepped, _ = run_steps(layer, x)
    torch.testing.assert_close(stepped, parallel, atol=1e-3, rtol=1e-3)


# --- training --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec_path", PAPER_SPECS, ids=[p.stem for p in PAPER_SPECS])
def test_bf16_training_step_of_every_paper_spec(spec_path):
    import madsl
    from madsl.runner.train.optim import build_optimizer

    model = madsl.compile(str(spec_path), vocab_size=64, max_seq_len=128, device=DEVICE)
    optimizer = build_optimizer(model, 1e-3, 0.1, DEVICE)
    tokens = torch.randint(0, 64, (8, 128), device=DEVICE)
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        (loss + model.aux_loss()).backward()
        optimizer.step()
        losses.append(float(loss))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_bf16_smoke_eval_on_device(tmp_path):
    from madsl.runner.api import evaluate

    summary = evaluate(
        [str(PAPER_SPECS[0].with_name("mamba.mad"))],
        tasks=["memorization"],
        protocol="smoke",
        device="cuda",
        precision="auto",
        db=tmp_path / "r.db",
    )
    assert not summary["failed"]


@pytest.mark.parametrize("spec_name", ["attention-sg.mad", "hyena-sg.mad", "mamba.mad", "gla-sg.mad"])
def test_grid_group_on_device_equals_the_unbatched_runs(tmp_path, monkeypatch, spec_name):
    """Grid batching on the device: every family stacked (vmap, member folds into SDPA, the
    scans, causal-conv1d and fla; stacked AdamW) to fp32/TF32 rounding, against each member's
    unbatched run on the same device (Mamba unbatched takes mamba_inner_fn, stacked its parts).
    No op of the stacked step falls back to vmap's loop over the members (its "performance
    drop" warning, an error here: the CUDA dispatch of an op, such as a fused norm, can lack the
    batching rule its CPU path has)."""
    import warnings

    from madsl.runner.batched.stacked import StackedMembers
    from madsl.runner.execute.jobs import execute_job
    from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
    from madsl.runner.store.files import StoreFiles
    from madsl.spec import load_spec

    path = Path(__file__).resolve().parents[1] / "specs" / "paper" / spec_name
    cli = cli_overrides(
        protocol="baseline",
        tasks=["in-context-recall"],
        lr=[1e-3, 1e-4],
        wd=[0.0, 0.1],
        epochs=2,
        batch_size=16,
        precision="fp32",
        settings={"seq_len": 64, "num_train_examples": 64, "num_test_examples": 32},
    )
    stacked_steps = []
    step = StackedMembers.step
    monkeypatch.setattr(
        StackedMembers, "step", lambda self, *a: stacked_steps.append(len(self.states)) or step(self, *a)
    )

    def results(db, batched):
        plan = plan_evaluation(StoreFiles(tmp_path / db), [(load_spec(path), str(path))], cli, device="cuda")
        events = []
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="There is a performance drop")
            for job in plan.work(batch_grid=batched):
                assert not batched or job.stack  # on CUDA groups stack where the layers allow
                execute_job(job, events.append, lambda: False)
        assert not [e for e in events if e.kind == "failed"], [e.data["error"] for e in events if e.kind == "failed"]
        return {e.run_id: e.data["result"]["history"] for e in events if e.kind == "finished"}

    batched, alone = results("a.db", True), results("b.db", False)
    assert stacked_steps == [4] * 8  # 2 epochs of 4 steps, all four members in the stack
    assert batched.keys() == alone.keys() and len(batched) == 4
    for run_id, history in alone.items():
        for got, want in zip(batched[run_id], history):
            for key in ("train_loss", "eval_loss"):
                assert got[key] == pytest.approx(want[key], rel=1e-3), (run_id, key)


@pytest.mark.parametrize(
    "spec_name, precision",
    [
        ("attention-sg.mad", "bf16"),
        ("hyena-sg.mad", "bf16"),
        ("mamba.mad", "bf16"),
        ("mamba.mad", "fp32"),
        ("gla-sg.mad", "bf16"),
        ("../modern/rwkv6-sg.mad", "bf16"),
    ],
)  # fla's chunk_gla
def test_cuda_graphs_replay_the_stacked_step_to_the_same_results(tmp_path, monkeypatch, spec_name, precision):
    """`--cuda-graphs`: after three eager warm-up steps the stacked step (and evaluation batch)
    is captured once and replayed (no fallback warning), and the members' results equal those
    of the same group trained without graphs (the same kernels; the learning rates and Adam's
    bias corrections reach the graph through its buffers, so they change every step)."""
    import warnings

    from madsl.runner.execute.jobs import execute_job
    from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
    from madsl.runner.store.files import StoreFiles
    from madsl.spec import load_spec

    path = (Path(__file__).resolve().parents[1] / "specs" / "paper" / spec_name).resolve()
    cli = cli_overrides(
        protocol="baseline",
        tasks=["in-context-recall"],
        lr=[1e-3, 1e-4],
        wd=[0.0, 0.1],
        epochs=2,
        batch_size=16,
        precision=precision,
        settings={"seq_len": 64, "num_train_examples": 64, "num_test_examples": 32},
    )
    replays = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or replay(graph))

    def results(db, graphs):
        plan = plan_evaluation(StoreFiles(tmp_path / db), [(load_spec(path), str(path))], cli, device="cuda")
        events = []
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="CUDA graphs off")
            warnings.filterwarnings("error", message="There is a performance drop")  # no vmap fallback loop
            for job in plan.work(batch_grid=True, cuda_graphs=graphs):
                assert job.stack and job.graphs == graphs
                execute_job(job, events.append, lambda: False)
        assert not [e for e in events if e.kind == "failed"], [e.data for e in events if e.kind == "failed"]
        return {e.run_id: e.data["result"]["history"] for e in events if e.kind == "finished"}

    graphed = results("a.db", True)
    # 8 steps (2 epochs of 4): 3 warm-up, then captured and replayed 5 times; 4 evaluation batches
    # (2 an epoch, the training batch size under the baseline protocol's conventions): 3 warm-up, 1 replay
    assert len(replays) == 5 + 1
    eager = results("b.db", False)
    assert graphed.keys() == eager.keys() and len(graphed) == 4
    # Replayed and eager steps agree to rounding (the losses to 1e-4), not bit for bit; accuracy
    # counts argmaxes, and one of the 774 scored tokens whose top logits were tied or that close
    # flipped (on an H100, for attention, Hyena and Mamba, in fp32 too): two flips are allowed.
    for run_id, history in eager.items():
        for got, want in zip(graphed[run_id], history):
            for key in ("train_loss", "eval_loss"):
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (run_id, key)
            assert got["eval_acc"] == pytest.approx(want["eval_acc"], abs=2.5 / 774), run_id


def test_the_plans_time_estimate_on_cuda_is_the_groups_at_the_gpus_measured_rate(tmp_path, monkeypatch):
    """`madsl eval`'s plan on CUDA: the training rate is measured on the GPU (wall clock, the
    device synchronized), once, and cached; a stacked group (graph-replayed) is costed as what
    trains, one step of its members, shared out among its runs."""
    from madsl.runner.plan import cost, rate_measure
    from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
    from madsl.runner.plan.rate import RateBook
    from madsl.runner.store.files import StoreFiles
    from madsl.spec import load_spec

    monkeypatch.setenv("MADSL_CACHE_DIR", str(tmp_path / "cache"))
    path = (Path(__file__).resolve().parents[1] / "specs" / "paper" / "attention-sg.mad").resolve()
    cli = cli_overrides(
        protocol="baseline",
        tasks=["in-context-recall"],
        lr=[1e-3, 1e-4],
        wd=[0.0, 0.1],
        epochs=2,
        batch_size=16,
        precision="bf16",
        settings={"seq_len": 64, "num_train_examples": 64, "num_test_examples": 32},
    )
    plan = plan_evaluation(StoreFiles(tmp_path / "r.db"), [(load_spec(path), str(path))], cli, device="cuda")
    [group] = plan.work(batch_grid=True, cuda_graphs=True)
    assert group.stack and group.graphs
    rates = RateBook.default()
    costs = cost.estimate(plan.jobs, set(), rates, work=[group])
    assert len(costs) == 4 and len({c.seconds for c in costs}) == 1 and costs[0].seconds > 0
    [described] = rates.describe()
    assert described["device"].startswith("cuda: ") and {"attention", "swiglu", "rest"} <= set(
        described["measured_now"]
    )
    monkeypatch.setattr(rate_measure, "measure_family", lambda *args: pytest.fail("measured again"))
    assert cost.estimate(plan.jobs, set(), RateBook.default(), work=[group]) == costs  # from the cache


# --- member folds on the device: each CUDA kernel under vmap runs once for all members -------
MEMBERS = 3


def _vmap_equals_loop(fn, args, atol=1e-4, rtol=1e-4):
    """vmap(fn) over the members (leading axis) against a loop, outputs and input gradients; no
    vmap fallback loop ("performance drop" warning) on the way."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="There is a performance drop")
        got = torch.func.vmap(fn)(*args)
    loop = [fn(*(a[m] for a in args)) for m in range(MEMBERS)]
    got = got if isinstance(got, tuple) else (got,)
    want = tuple(torch.stack(o) for o in zip(*loop)) if isinstance(loop[0], tuple) else (torch.stack(loop),)
    weights = [torch.randn_like(w.float()) for w in want]
    leaves = [a for a in args if a.requires_grad]
    grads = torch.autograd.grad(sum((g.float() * w).sum() for g, w in zip(got, weights) if g.requires_grad), leaves)
    expected = torch.autograd.grad(sum((g.float() * w).sum() for g, w in zip(want, weights) if g.requires_grad), leaves)
    _assert_all_close(got + grads, want + expected, atol=atol, rtol=rtol)


def _members(*shapes, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(MEMBERS, *s, generator=gen).to(DEVICE, dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # memory-efficient kernel; flash
def test_sdpa_fold_on_device(dtype):
    from madsl.kernels.attention import scaled_dot_product_attention

    q, k, v = _members((4, 8, 128, 16), (4, 8, 128, 16), (4, 8, 128, 16), dtype=dtype)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    _vmap_equals_loop(lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v], tol, tol)


def test_mamba_ssm_grouped_scan_and_its_fold_on_device():
    """mamba-ssm's selective_scan_fn with grouped B, C equals madsl's CPU scan; under vmap the
    members fold into its channels (B, C per member as groups)."""
    if cuda.selective_scan_fn() is None:
        pytest.skip("mamba-ssm not installed")
    from madsl.kernels.selective_scan import selective_scan

    inputs = _scan_inputs(d_inner=64)
    grouped = [x.detach() for x in inputs]
    grouped[3], grouped[4] = (torch.randn(2, 4, 4, 300, generator=torch.Generator().manual_seed(1)) for _ in range(2))
    grouped = [x.requires_grad_() for x in grouped]
    on_device = [x.detach().to(DEVICE).requires_grad_() for x in grouped]
    _assert_all_close(
        _scan_and_grads(cuda.selective_scan_fn(), on_device),
        _scan_and_grads(selective_scan_cpu, grouped),
        atol=2e-3,
        rtol=2e-3,
    )
    u, delta, z = _members((2, 32, 200), (2, 32, 200), (2, 32, 200))
    B, C = _members((2, 4, 200), (2, 4, 200))
    A = (-torch.rand(MEMBERS, 32, 4, device=DEVICE) - 0.5).requires_grad_()
    D, bias = _members((32,), (32,))
    _vmap_equals_loop(lambda *a: selective_scan(*a, delta_softplus=True), [u, delta, A, B, C, D, z, bias])


def test_chunked_scan_fold_on_device(monkeypatch):
    import madsl.kernels.selective_scan as scan_module

    monkeypatch.setattr(scan_module.cuda, "selective_scan_fn", lambda: None)  # the fallback without the extra
    u, delta, z = _members((2, 32, 200), (2, 32, 200), (2, 32, 200))
    B, C = _members((2, 4, 200), (2, 4, 200))
    A = (-torch.rand(MEMBERS, 32, 4, device=DEVICE) - 0.5).requires_grad_()
    D, bias = _members((32,), (32,))
    _vmap_equals_loop(lambda *a: scan_module.selective_scan(*a, delta_softplus=True), [u, delta, A, B, C, D, z, bias])


def test_causal_conv1d_fold_on_device():
    if cuda.causal_conv1d_fn() is None:
        pytest.skip("causal-conv1d not installed")
    from madsl.kernels.causal_conv1d import causal_conv1d_silu

    x, weight, bias = _members((2, 64, 100), (64, 4), (64,))
    _vmap_equals_loop(
        lambda x, w, b: causal_conv1d_silu(cuda.causal_conv1d_fn(), x.contiguous(), w, b), [x, weight, bias]
    )


def test_fla_folds_on_device():
    """fla's chunk_gla, chunk_simple_gla and chunk_(gated_)delta_rule: members folded into the batch."""
    if cuda.chunk_gla() is None:
        pytest.skip("flash-linear-attention not installed")
    from madsl.kernels.linear_recurrence import decay_parallel, delta_parallel

    q, k, v = _members((2, 4, 64, 16), (2, 4, 64, 16), (2, 4, 64, 16))
    gates = F.logsigmoid(torch.randn(MEMBERS, 2, 4, 64, 16, device=DEVICE) + 2).requires_grad_()
    decay = F.logsigmoid(torch.randn(MEMBERS, 2, 4, 64, device=DEVICE) + 2).requires_grad_()
    beta = torch.rand(MEMBERS, 2, 4, 64, device=DEVICE).requires_grad_()
    _vmap_equals_loop(lambda q, k, v, g: gla_fla_chunk(q, k, v, g)[0], [q, k, v, gates], 2e-3, 2e-3)
    _vmap_equals_loop(lambda q, k, v, g: decay_parallel(q, k, v, g), [q, k, v, decay], 2e-3, 2e-3)
    _vmap_equals_loop(
        lambda q, k, v, b, g: delta_parallel(q, F.normalize(k, dim=-1), v, b, g), [q, k, v, beta, decay], 2e-3, 2e-3
    )
