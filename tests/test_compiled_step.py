"""The stacked step and evaluation compiled into fused kernels (`MADSL_COMPILE_STACKED=1`,
madsl.runner.batched.compile): opt-in, and a group trained so ends as the eager group does.

One tiny spec with attention (SDPA's member fold) and Hyena (its long convolutions), each
with a SwiGLU: one compile of a step and one of an evaluation batch. Inductor's CPU
compile is the cost (its C++ kernels, each compiled by gcc): without vectorised kernels and
compile workers, about 40 s of CPU time cold, less with inductor's on-disk cache warm; the
CUDA device compiles Triton kernels instead, so what is tested here is the trace and the
fused step's arithmetic, not the CPU's vector code.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._inductor.config as inductor_config
from torch.utils._python_dispatch import TorchDispatchMode

from madsl.runner.batched.grid import execute_group
from madsl.runner.batched.stacked import StackedMembers
from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
from madsl.runner.store.files import StoreFiles
from madsl.spec import load_spec

torch.set_num_threads(1)
TINY_SPEC = "name: compile-tiny\ndim: 32\ntopology: A-Sg:H-Sg\n"
TINY_SETTING = {"seq_len": 24, "num_train_examples": 24, "num_test_examples": 16}


def _group(tmp_path, db: str):
    path = tmp_path / "tiny.mad"
    path.write_text(TINY_SPEC)
    cli = cli_overrides(
        protocol="baseline",
        tasks=["in-context-recall"],
        settings=TINY_SETTING,
        lr=[1e-3, 5e-4],
        wd=[0.0, 0.1],
        epochs=2,
        batch_size=8,
    )
    [group] = plan_evaluation(StoreFiles(tmp_path / db), [(load_spec(path), str(path))], cli, device="cpu").work(
        batch_grid=True
    )
    group.stack = True  # the CUDA default
    return group


class _ComputingOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def test_compiled_stacked_steps_are_opt_in(monkeypatch):
    monkeypatch.delenv("MADSL_COMPILE_STACKED", raising=False)
    from madsl.runner.batched import compile as stacked_compile

    assert not stacked_compile.requested()
    monkeypatch.setenv("MADSL_COMPILE_STACKED", "1")
    assert stacked_compile.requested()


@pytest.fixture
def lean_inductor():
    """Inductor's CPU compile without vector kernels and compile workers (see the module docstring)."""
    with inductor_config.patch({"cpp.vec_isa_ok": False, "compile_threads": 1}):
        yield


def test_a_compiled_stacked_group_ends_as_the_eager_group(tmp_path, monkeypatch, lean_inductor):
    """Two epochs of four members, every step and evaluation batch compiled (fewer ops
    dispatched than eager: fused), equal to the eager group's results to fp32 rounding."""
    steps = {True: [], False: []}  # per mode, the ops each step dispatched
    step = StackedMembers.step

    def counted(self, x, y):
        with _ComputingOps() as ops:
            step(self, x, y)
        steps[self.compiled].append(ops.count)

    monkeypatch.setattr(StackedMembers, "step", counted)
    results = {}
    for compiled in (False, True):
        monkeypatch.setenv("MADSL_COMPILE_STACKED", "1" if compiled else "0")
        events = []
        execute_group(_group(tmp_path, f"{compiled}.db"), events.append, lambda: False)
        assert not [e for e in events if e.kind == "failed"], [e.data["error"] for e in events if e.kind == "failed"]
        results[compiled] = {e.run_id: e.data["result"] for e in events if e.kind == "finished"}
    assert len(steps[True]) == len(steps[False]) == 6  # 2 epochs of 3 steps, stacked both ways
    assert max(steps[True][1:]) < min(steps[False]) / 2  # compiled: fused kernels, matmuls and SDPA dispatched
    assert results[True].keys() == results[False].keys() and len(results[True]) == 4
    for run_id, eager in results[False].items():
        got = results[True][run_id]
        for got_epoch, eager_epoch in zip(got["history"], eager["history"], strict=True):
            for key in ("train_loss", "eval_loss"):
                assert got_epoch[key] == pytest.approx(eager_epoch[key], rel=1e-5), (run_id, key)
            # an argmax may flip on a near tie: at most one of the evaluation's scored tokens
            assert got_epoch["eval_acc"] == pytest.approx(eager_epoch["eval_acc"], abs=1 / 16), run_id


def test_a_step_calling_a_kernel_of_the_cuda_extra_runs_eagerly(monkeypatch):
    """mamba-ssm's, causal-conv1d's and fla's kernels (pybind and Triton calls) cannot be
    traced: where a layer would call one, a warning, and the eager step from then on."""
    from madsl.kernels import cuda
    from madsl.runner.batched import compile as stacked_compile

    monkeypatch.setattr(cuda, "_fla_op", lambda module, name: lambda *args: args)  # "installed"
    calls = []

    def step(x):
        calls.append("traced")
        kernel = cuda.fla_op("gla", "chunk_gla", "madsl's chunked GLA")
        x.add_(kernel(x)[0])

    compiled = stacked_compile.CompiledInPlace(step, "training step")
    with pytest.warns(
        RuntimeWarning,
        match=r"MADSL_COMPILE_STACKED: this group's training step runs eagerly: "
        r"gla\.chunk_gla, a kernel of the cuda extra",
    ):
        assert compiled(torch.ones(3)) is False
    assert calls == ["traced"] and not compiled.usable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled(torch.ones(3)) is False  # once refused, no second trace, no second warning
    assert calls == ["traced"]
    assert cuda.fla_op("gla", "chunk_gla", "") is not None  # the getters are restored after the trace


def test_a_cached_compile_computes_with_its_own_groups_constants(tmp_path, monkeypatch, lean_inductor):
    """Groups whose traced steps differ only in their constants (the members' weight decays,
    frozen weights) share inductor's cached code, each with its own values."""
    from torch._dynamo.utils import counters

    from madsl.runner.batched import compile as stacked_compile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    member_of = torch.arange(3).repeat_interleave(2)
    counters.clear()

    def decaying(decay: torch.Tensor):
        def step(param, lr):  # as the stacked AdamW decays: the decays a constant of the traced graph
            param.mul_((1 - lr * decay).index_select(0, member_of))

        return step

    for decays in ([0.0, 0.1, 0.2], [0.3, 0.0, 0.5]):
        compiled = stacked_compile.CompiledInPlace(decaying(torch.tensor(decays)), "training step")
        param = torch.ones(6)
        assert compiled(param, torch.tensor(0.5))
        assert param.tolist() == pytest.approx([1 - 0.5 * d for d in decays for _ in range(2)])
    assert counters["inductor"]["fxgraph_cache_hit"] == 1  # the second group's from the cache


def test_a_step_that_traces_into_too_many_ops_runs_eagerly(monkeypatch):
    """A recurrence unrolled step by step (Mamba's CPU scan: 15,000 ops) would take inductor
    many minutes: a warning, and the eager step."""
    from madsl.runner.batched import compile as stacked_compile

    monkeypatch.setattr(stacked_compile, "MAX_TRACED_OPS", 8)

    def recurrence(state):
        for _ in range(10):  # unrolled by the trace: 10 ops
            state.mul_(0.5)

    compiled = stacked_compile.CompiledInPlace(recurrence, "training step")
    state = torch.ones(2)
    with pytest.warns(RuntimeWarning, match=r"training step runs eagerly: it traces into 10 ops \(over 8"):
        assert compiled(state) is False
    assert state.tolist() == [1.0, 1.0]  # traced on a copy: the caller's tensors untouched, for its eager step
