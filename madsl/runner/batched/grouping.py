"""Which runs of a plan train together: grid groups, the runs of one (spec, task setting)
that differ only in learning rate, weight decay or seed (`group_key`), formed from a plan's
jobs and placed on its devices (`group_jobs`), stacked where the device calls for it
(`stacks_on`).

Apart from a group's execution (`madsl.runner.batched.grid`) because this runs when the
plan's work is handed out (`madsl.runner.plan.evaluation`'s `work`), before anything trains.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Hashable, Sequence

from madsl.runner.batched.grid import GroupJob
from madsl.runner.execute.jobs import RunJob

GRID_AXES = ("lr", "wd", "seed")  # what members of a group may differ in


def group_key(job: RunJob, model_key: Hashable) -> tuple:
    """Runs with equal keys form a group: same model, task, setting and training settings but
    for lr, weight decay and seed."""
    from madsl.runner.store.results import canonical_json

    train = {k: v for k, v in asdict(job.train).items() if k not in GRID_AXES}
    return model_key, job.task.name, canonical_json(dict(job.setting)), canonical_json(train), job.data_dir


def group_jobs(
    jobs: Sequence[tuple[Hashable, RunJob]],
    skip_solved_at: float | None = None,
    placement: Sequence[str] | None = None,
    cuda_graphs: bool = False,
) -> list[RunJob | GroupJob]:
    """(model key, job) pairs -> runs and groups, in the order of each group's first run.
    A group's members move to its device (placement: round-robin over groups)."""
    groups: dict[tuple, list[RunJob]] = {}
    for model_key, job in jobs:
        groups.setdefault(group_key(job, model_key), []).append(job)
    out: list[RunJob | GroupJob] = []
    for members in groups.values():
        device = placement[len(out) % len(placement)] if placement else members[0].device
        members = [_on(device, m) for m in members]
        if len(members) == 1 and not cuda_graphs:  # with graphs, a run alone is a stack of one
            out.append(members[0])
            continue
        first = members[0]
        runs = f"{len(members)} runs" if len(members) > 1 else "stacked"
        label = first.label.rsplit(" · lr ", 1)[0] + f" · {runs}"
        out.append(
            GroupJob(
                run_id="group-" + first.run_id,
                members=members,
                device=device,
                label=label,
                skip_solved_at=skip_solved_at,
                stack=stacks_on(device),
                graphs=cuda_graphs,
            )
        )
    return out


def stacks_on(device: str) -> bool:
    """Whether groups on `device` train as one stacked model where their layers allow: on CUDA,
    where six small runs leave the device idle between kernel launches; not on the CPU, where
    it was measured slower than lockstep (docs/gpu.md)."""
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


def _on(device: str, job: RunJob) -> RunJob:
    from dataclasses import replace

    return job if job.device == device else replace(job, device=device)
