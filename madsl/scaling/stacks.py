"""A study's runs as jobs: runs of one model and step shape grouped into stacks (trained as one
stacked model, madsl.runner.pretrain.stacked), where stacking pays; the plan's rows told which
stack each run trains in and how many epochs it makes over the data.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from madsl.errors import MadslError, option
from madsl.scaling.study import group_lrs, group_seeds

# runs in one stack: more members hold more memory for no more gain (benchmarks/stacked_pretrain.py)
MAX_STACK = 8
# On a CPU a stack pays only where a step's fixed costs outweigh its arithmetic: 4 members of width 8
# step 1.24x (1.98x at 8 x 32 tokens) as fast as one by one, widths 16-24 break even and 32-64 lose
# 2-14 % (batched matmuls block worse than single ones; benchmarks/RESULTS.md, 2026-11-28)
CPU_STACK_MAX_DIM = 16
# epochs over the training split past which a run's loss is data-constrained: repeating data up to
# ~4 times costs little against fresh data (Muennighoff et al. 2023, "Scaling Data-Constrained
# Language Models"), past it a compute-optimal fit is biased
MAX_EPOCHS = 4


def stacking(execution: Any, where: Any) -> tuple[bool, int | None]:
    """Whether same-shape runs train as stacks (by default with the local executors; --no-batch:
    alone), and the widest model stacked (on a CPU, CPU_STACK_MAX_DIM; --batch-grid: any)."""
    if where.ray is not None and execution.batch_grid:
        raise MadslError(
            f"{option('batch_grid')}: stacked pretraining runs with the local executors only (Ray runs each run alone)",
            hint=f"drop {option('batch_grid')}, or use {option('executor')} local",
        )
    on_cpu = not str(where.runs_on).startswith("cuda")
    return where.ray is None and execution.batch_grid is not False, (
        CPU_STACK_MAX_DIM if on_cpu and execution.batch_grid is None else None
    )


def run_labels(plan: Any) -> list[str]:
    """Each run's label, with its learning rate where its budget has a ladder and its seed where
    the budget has replicates."""
    study = plan.study
    groups = {group.flops: group for group in study.budgets}
    return [
        run.label(len(group_lrs(study, groups[run.budget])) > 1, group_seeds(study, groups[run.budget]) > 1)
        for run in plan.runs
    ]


def show_stacks(cost: dict, plan: Any, groups: list[list[int]], batch: bool, max_dim: int | None) -> None:
    """The plan's rows with each run's seed, the stack it trains in (s1, s2, ...; None: alone) and
    the epochs it makes over the training split; a warning for each run past MAX_EPOCHS."""
    cost["stacked"] = batch
    cost["stack_max_dim"] = max_dim
    numbered = [members for members in groups if len(members) > 1]
    stack_of = {i: f"s{k + 1}" for k, members in enumerate(numbered) for i in members}
    split = plan.tokens.info.tokens("train")
    for index, (row, run) in enumerate(zip(cost["runs"], plan.runs)):
        row.update(seed=run.settings.seed, stack=stack_of.get(index), epochs=run.tokens / max(split, 1))
    cost["stacks"] = [[cost["runs"][i]["run_id"] for i in members] for members in numbered]
    repeated = [row for row in cost["runs"] if row["epochs"] > MAX_EPOCHS]
    cost.setdefault("warnings", []).extend(
        [
            f"{len(repeated)} of {len(cost['runs'])} runs see the training split ({split:,} tokens) more than "
            f"{MAX_EPOCHS} times (up to {max(r['epochs'] for r in repeated):.1f}): their losses are data-"
            "constrained, not compute-optimal (use more text, or smaller budgets)"
        ]
        if repeated
        else []
    )


def stacks(plan: Any, batch: bool = True, max_dim: int | None = None) -> list[list[int]]:
    """The study's runs (indices of plan.runs) grouped into stacks: runs of one model (its spec
    hash) and of the settings a step shares (length, batch size, precision, evaluation windows,
    betas) train as one stacked model (madsl.runner.pretrain.stacked), at most MAX_STACK
    together; a run of its own shape is a stack of one. `batch` False: every run alone; a model
    wider than `max_dim` (where given): its runs alone."""
    groups: dict[tuple, list[int]] = {}
    for index, run in enumerate(plan.runs):
        s = run.settings
        shape = (run.spec.hash, s.seq_len, s.batch_size, s.precision, s.eval_tokens, s.beta1, s.beta2)
        alone = not batch or (max_dim is not None and run.spec.dim > max_dim)
        groups.setdefault((index,) if alone else shape, []).append(index)
    return [members[i : i + MAX_STACK] for members in groups.values() for i in range(0, len(members), MAX_STACK)]


def jobs_of(plan: Any, db: str | os.PathLike, execution: Any, groups: list[list[int]]) -> list[Any]:
    from madsl.runner.pretrain.job import PretrainJob, PretrainStackJob
    from madsl.runner.store.files import StoreFiles

    files, labels = StoreFiles(db), run_labels(plan)
    runs = [
        PretrainJob(
            run_id=run_id,
            spec=run.spec,
            settings=run.settings,
            data_dir=str(plan.data_dir),
            checkpoint_path=str(files.checkpoint_path(run_id)),
            data_dtype=plan.study.data_dtype,
            data_vocab=plan.study.data_vocab,
            device=execution.device,
            label=label,
            checkpoint_every_s=execution.checkpoint_every,
        )
        for run, run_id, label in zip(plan.runs, plan.run_ids, labels)
    ]
    jobs = []
    for members in groups:
        if len(members) == 1:
            jobs.append(runs[members[0]])
            continue
        first = plan.runs[members[0]]
        stack_id = "stack-" + hashlib.sha256("".join(plan.run_ids[i] for i in members).encode()).hexdigest()[:16]
        label = f"{first.arch} {first.size}: {len(members)} runs stacked"
        jobs.append(PretrainStackJob(stack_id, [runs[i] for i in members], execution.device, label))
    return jobs
