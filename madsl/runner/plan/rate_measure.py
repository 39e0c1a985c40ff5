"""Measuring a device's training rate (what madsl.runner.plan.rate_model describes): a layer
family's line, the rest of a model, the threads' speedup. Imports torch; called only where a rate
is missing from the cache or asked for again (`--measure-rate`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from typing import Any, Callable, Iterator

from madsl.runner.common.choices import TRAIN_FORWARDS
from madsl.runner.plan.rate_cache import MAX_REST_S, MAX_STARTUP_S, plausible_ranges
from madsl.runner.plan.rate_model import (
    BATCHES,
    RATE_LENGTH,
    RATE_WIDTH,
    RATE_WIDTHS,
    REFERENCE_TOPOLOGY,
    REFERENCE_VOCAB,
    REST_VOCABS,
    REST_WIDTHS,
    SPEEDUP_STEPS,
    TIMED_STEPS,
    DeviceRates,
    Line,
    Measured,
    Outside,
    Progress,
    clock,
    cores_free,
    family_primitive,
    load_average,
    now,
    rate_family,
)


def layer_flops(account: Any, width: int | None = None) -> list[tuple]:
    """(family, forward FLOPs of one sequence, width) of each layer of an accounting, in stack
    order (rate_model.rate_family: the family whose rate times it)."""
    return [(rate_family(row.primitive, row.config), float(row.flops), width) for row in account.layers]


def measure_into(book: DeviceRates, device: Any, families: list[str], progress: Progress | None) -> None:
    """Measure `families` into `book`, and the rest of a model (with the reference model's own
    families) and, on a CPU run by several threads, their speedup, where `book` has none."""
    from madsl.lang.spec import spec_from_topology

    reference = spec_from_topology(REFERENCE_TOPOLOGY, dim=RATE_WIDTH)
    reference_families = (
        []
        if book.rest is not None
        else [f for f in dict.fromkeys(f for f, *_ in _reference_layers(reference)) if f not in book.families]
    )
    todo = list(dict.fromkeys([*families, *reference_families]))
    total = len(todo) + (book.rest is None) + (book.startup is None)
    with _torch_threads(device, 1):
        for done, family in enumerate(todo):
            if progress is not None:
                progress(f"measuring this machine's training rate: {family}", done, total)
            try:
                book.families[family] = _plausible(measure_family(family, device), book)
            except Exception as err:  # noqa: BLE001 - a family that cannot train here has no rate, said so
                if _out_of_memory(err):
                    raise
                book.failed[family] = f"{type(err).__name__}: {str(err).strip()[:200]}"
            book.measured_now.add(family)
        model_seconds = None
        if book.rest is None:
            if progress is not None:
                progress("measuring this machine's training rate: a whole model", len(todo), total)
            book.rest, model_seconds = measure_model(book, reference, device)
            if book.rest is not None:
                book.rest = replace(book.rest, value=min(book.rest.value, MAX_REST_S))
            book.measured_now.add("rest")
    if model_seconds is not None and device.type == "cpu" and book.threads > 1:
        load = load_average()
        # busy cores make the speedup read low (or take long to read): 1 then, an upper bound of the time
        book.threads_speedup = (
            measure_speedup(reference, device, book.threads, model_seconds)
            if cores_free(load, book.threads)
            else Measured(1.0, now(), load)
        )
        book.measured_now.add("threads_speedup")
    if book.startup is None:
        if progress is not None:
            progress("measuring this machine's training rate: a process's start-up", total - 1, total)
        book.startup = measure_startup(book.threads)
        if book.startup is not None:
            book.measured_now.add("startup")
    _release(device)


# What every madsl process does before its first training step: its imports (torch, the runner)
# and its first optimizer, whose construction imports torch._dynamo (about 1.7 s of CPU here)
STARTUP_CODE = (
    "import torch, madsl.cli, madsl.runner.execute.jobs; torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])"
)


def measure_startup(threads: int) -> Measured | None:
    """The CPU seconds (user + system) a new Python process takes to import what a madsl run
    imports and build its first optimizer, on `threads` threads: what each process of a plan's
    runs pays once (the plan's own process, and each worker process), measured in a child process
    (this one has imported all of it already; its files are in the page cache, as a run finds
    them). None where the child cannot run (the plan then has no start-up, and measures again)."""
    import os
    import resource
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        subprocess.run([sys.executable, "-c", STARTUP_CODE], env=env, check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(min(seconds, MAX_STARTUP_S), now(), load_average())


def measure_family(family: str, device: Any) -> Line:
    """A family's lines at each width of RATE_WIDTHS it takes (rate_model's docstring; a width its
    default heads do not divide is passed over); its width-128 line is the Line's own numbers."""
    from madsl.primitives.base import ConfigError

    takes = []
    for width in RATE_WIDTHS:
        try:
            family_primitive(family, width)
        except ConfigError:
            continue
        takes.append(width)
    if not takes:
        family_primitive(family, RATE_WIDTHS[-1])  # raises: the family builds at no measured width
    points = tuple((width, *_family_line(family, device, width)) for width in takes)
    _, overhead, rate = min(points, key=lambda point: abs(point[0] - RATE_WIDTH))
    return Line(overhead, rate, now(), load_average(), points)


def _family_line(family: str, device: Any, width: int) -> tuple[float, float]:
    """(overhead seconds, training FLOP/s) of a family's layer at `width`, from its forward +
    backward at the two batch sizes of the device."""
    import torch

    prim = family_primitive(family, width).at_length(RATE_LENGTH)
    flops = max(float(prim.cost(RATE_LENGTH).flops), 1.0)
    torch.manual_seed(0)
    module = prim.build().to(device)
    times = []
    for rows in BATCHES[device.type]:
        h = torch.randn(rows, RATE_LENGTH, width, device=device, requires_grad=True)
        if hasattr(module, "embeddings"):  # a layer that reads the token embeddings (Zs): a model links them
            from madsl.layers.zamba import EmbeddingLink

            module.embeddings = EmbeddingLink()
            module.embeddings.value = torch.randn(rows, RATE_LENGTH, width, device=device)
        if hasattr(module, "kv_from"):  # Hymba's KV consumer (Hb with kv_reuse) reads a producer's keys and values
            from madsl.layers.hymba import KVLink

            heads = (rows, prim.key_value_heads, RATE_LENGTH)
            module.kv_from = KVLink()
            module.kv_from.value = (
                torch.randn(*heads, prim.qk_head_dim, device=device),
                torch.randn(*heads, prim.v_head_dim, device=device),
            )

        def step(h=h) -> None:
            out = module(h)
            (out[0] if isinstance(out, tuple) else out).float().sum().backward()

        # the layer is warm after the first batch size: the larger one's first step is timed too
        times.append(fastest(step, device, TIMED_STEPS, warm_up=not times))
    (small, big), (t_small, t_big) = BATCHES[device.type], times
    per_row = (t_big - t_small) / (big - small)
    if per_row <= 0:  # the smaller batch was no faster: no overhead to tell apart
        per_row, overhead = t_big / big, 0.0
    else:
        overhead = max(0.0, t_small - per_row * small)
    return overhead, TRAIN_FORWARDS * flops / per_row


def _plausible(line: Line, book: DeviceRates) -> Line:
    """A family's line within what the cache admits for its device (rate_cache.plausible_ranges):
    two batch sizes timed almost alike make a slope, and so a rate, beyond any machine's."""
    ranges = plausible_ranges(book.device, book.threads)
    (low, high), (_, longest) = ranges["flops_per_s"], ranges["overhead_s"]

    def held(overhead: float, rate: float) -> tuple[float, float]:
        return min(overhead, longest), min(max(rate, low), high)

    overhead, rate = held(line.overhead_s, line.flops_per_s)
    return replace(
        line, overhead_s=overhead, flops_per_s=rate, points=tuple((w, *held(o, r)) for w, o, r in line.points)
    )


def measure_model(book: DeviceRates, reference: Any, device: Any) -> tuple[Measured | None, float]:
    """The rest of a model (rate_model's docstring): the reference model's training steps at
    REST_WIDTHS x two batch sizes x REST_VOCABS less its layers' lines, fitted; the per-layer-token
    term is the Measured returned, the others `book.outside`. None where a family of the reference
    has no rate; and the seconds of the reference's step at width RATE_WIDTH (the threads'
    speedup is measured against it)."""
    from madsl.lang.spec import spec_from_topology

    step, rows = _model_step(reference, device, REFERENCE_VOCAB)
    seconds = fastest(step, device, TIMED_STEPS)
    if any(family not in book.families for family, *_ in _reference_layers(reference)):
        return None, seconds
    features, rests, totals = [], [], []
    for width in REST_WIDTHS:
        small = spec_from_topology(REFERENCE_TOPOLOGY, dim=width)
        layers = _reference_layers(small)
        for vocab in REST_VOCABS:
            for rows in BATCHES[device.type]:
                step, _ = _model_step(small, device, vocab, rows)
                total = fastest(step, device, TIMED_STEPS)
                tokens = rows * RATE_LENGTH
                in_layers = sum(
                    book.families[f].seconds(TRAIN_FORWARDS * flops * rows, width) for f, flops, _ in layers
                )
                features.append([1.0, tokens * vocab, tokens * len(layers), float(_params(small, vocab))])
                rests.append(total - in_layers)
                totals.append((total, in_layers))
    fixed, per_logit, per_layer_token, per_param = _nonnegative_fit(features, rests)
    ratios = [
        total / max(in_layers + fixed + per_logit * f[1] + per_layer_token * f[2] + per_param * f[3], 1e-9)
        for (total, in_layers), f in zip(totals, features)
    ]
    when, load = now(), load_average()
    book.outside = Outside(fixed, per_logit, per_param, min(ratios), max(ratios), when, load)
    return Measured(per_layer_token, when, load), seconds


def _nonnegative_fit(features: list[list[float]], values: list[float]) -> list[float]:
    """Least squares of `values` on `features` with every coefficient >= 0 (each a cost), the
    columns scaled alike first (they span 1 to millions)."""
    import numpy as np
    from scipy.optimize import nnls

    matrix = np.asarray(features, dtype=float)
    scale = np.maximum(np.abs(matrix).max(axis=0), 1e-30)
    coefficients, _ = nnls(matrix / scale, np.asarray(values, dtype=float))
    return [float(c) for c in coefficients / scale]


def _params(spec: Any, vocab: int) -> int:
    from madsl.graph import account

    return int(account(spec, seq_len=RATE_LENGTH, vocab=vocab).totals["params"])


def measure_speedup(reference: Any, device: Any, threads: int, one_thread_seconds: float) -> Measured:
    """How much faster the reference model's step runs on `threads` threads than on one: the
    fastest of SPEEDUP_STEPS in wall-clock time, between 1 and `threads`."""
    with _torch_threads(device, threads):
        step, _ = _model_step(reference, device)
        step()  # the warm-up
        best = math.inf
        for _ in range(SPEEDUP_STEPS):
            started, _cpu = clock()
            step()
            best = min(best, clock()[0] - started)
    return Measured(min(max(one_thread_seconds / max(best, 1e-9), 1.0), float(threads)), now(), load_average())


def fastest(step: Callable[[], None], device: Any, timed: int, warm_up: bool = True) -> float:
    """Seconds of the fastest of `timed` calls of `step` (after one warm-up): on the CPU this
    thread's CPU time (which other work on the machine does not stretch), on CUDA wall-clock time."""
    if warm_up:
        step()
        _synchronize(device)
    best = math.inf
    for _ in range(timed):
        wall, cpu = clock()
        step()
        _synchronize(device)
        wall_end, cpu_end = clock()
        best = min(best, cpu_end - cpu if device.type == "cpu" else wall_end - wall)
    return max(best, 1e-9)


def _model_step(
    reference: Any, device: Any, vocab: int = REFERENCE_VOCAB, rows: int | None = None
) -> tuple[Callable[[], None], int]:
    """A training step of the reference model (as a run trains: AdamW, the gradient's norm
    clipped) on random tokens of `vocab`, `rows` sequences (None: the larger batch), and its rows."""
    import torch
    import torch.nn.functional as F

    from madsl.compiler import compile_spec
    from madsl.runner.train.optim import build_optimizer

    rows = rows or BATCHES[device.type][1]
    model = compile_spec(reference, vocab_size=vocab, max_seq_len=RATE_LENGTH, seed=0).to(device)
    optimizer = build_optimizer(model, 1e-3, 0.0, device)
    x = torch.randint(0, vocab, (rows, RATE_LENGTH), generator=torch.Generator().manual_seed(0)).to(device)

    def step() -> None:
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x.reshape(-1)) + model.aux_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the recipes' default (grad_clip 1.0)
        optimizer.step()

    return step, rows


def _reference_layers(reference: Any) -> list[tuple[str, float]]:
    from madsl.graph import account

    return layer_flops(account(reference, seq_len=RATE_LENGTH, vocab=REFERENCE_VOCAB), reference.dim)


@contextlib.contextmanager
def _torch_threads(device: Any, threads: int) -> Iterator[None]:
    """Torch on `threads` threads while measuring on the CPU, as it was afterwards."""
    import torch

    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _synchronize(device: Any) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _release(device: Any) -> None:
    """A measurement's memory back to the GPU, for the runs."""
    from madsl.runner.train.device import release_device_memory

    release_device_memory()


def _out_of_memory(err: BaseException) -> bool:
    from madsl.runner.train.device import is_out_of_memory

    return is_out_of_memory(err)
