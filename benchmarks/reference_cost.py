"""What the MAD reference implementation (mad-lab) takes for the same runs on this device.

The anchor for `protocol_cost.py`: a MAD user who does not use madsl trains with mad-lab's
`train.py` (PyTorch Lightning, one run at a time). This script runs that code unchanged, one
run per task at mad-lab's own baseline setting (configs/tasks/*.yml, the settings madsl's
tasks share), built and trained exactly as `python train.py --task T --layers ...` does
(`MADConfig` and `MADModelConfig` from the same arguments, `train.train` with its defaults:
bf16, CSV logs, best and last checkpoints), for `--epochs` epochs. A Lightning callback added
to the Trainer marks each epoch's start (device synchronized); an epoch is its training, its
validation and its checkpoints, as madsl's runner times one. The first epoch pays one-time
costs (CUDA context, kernels, autotuning) and is reported apart; the steady epoch is the mean
of the others.

The projection is mad-lab's own paper protocol (`mad.configs.make_benchmark_mad_configs`:
every task's baseline and difficulty changes, the 3 x 2 lr x wd grid, 200 epochs, no early
stopping), each run's epochs scaled from its task's steady baseline epoch linearly in
training tokens (train examples x sequence length), as `protocol_cost.py` projects madsl's
unbatched runs. Compare it with protocol_cost's "total, measured per shape" on the same
device (what `madsl eval` does by default) and its unbatched "total" (the same linear
projection of madsl's own runs).

mad-lab needs CUDA for most of its layers, and imports some libraries at the top of modules
that the measured layers never call: flash-attn (its attention layers are flash-attn's MHA)
and transformers (an activation table for gated linear attention). Where these are not
installed, each is replaced by a stand-in module whose names raise if used, so Hyena and
Mamba train with mad-lab's own code; attention then reports that it needs flash-attn.

    python benchmarks/reference_cost.py --mad-lab PATH              # hyena-sg and mamba, every task
    python benchmarks/reference_cost.py --mad-lab PATH --models hyena-sg --tasks in-context-recall --epochs 3

PATH is a checkout of github.com/athms/mad-lab (its mad/, configs/ and train.py);
`scripts/gpu_check_offline.sh --prepare-reference PATH` puts it and the wheels of its
dependencies into .gpu/reference/ for a machine without network access.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

# The MAD paper's two-block architectures in mad-lab's layer names (its configs/layers/*.yml):
# width 128, each sequence mixer followed by a SwiGLU, Mamba without one (App. B.3).
MODELS = {
    "attention-sg": ["attention", "swiglu", "attention", "swiglu"],
    "hyena-sg": ["hyena", "swiglu", "hyena", "swiglu"],
    "mamba": ["mamba", "mamba", "mamba", "mamba"],
}
TASKS = (
    "in-context-recall",
    "noisy-in-context-recall",
    "fuzzy-in-context-recall",
    "selective-copying",
    "compression",
    "memorization",
)
PROTOCOL_EPOCHS = 200


def _stand_in_module(name: str) -> types.ModuleType:
    """An empty module registered as `name`, with a spec (libraries probe for optional packages with
    importlib.util.find_spec, which refuses a module without one)."""
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
    return sys.modules[name]


def _stand_in(name: str, attributes: dict[str, str]) -> None:
    """Register module `name` (and its parents) whose `attributes` raise when called: for a
    library mad-lab imports at the top of a module but the measured layers never use."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        _stand_in_module(".".join(parts[:depth]))
    module = sys.modules[name]
    for attribute, library in attributes.items():

        def unavailable(*args, _what=f"{name}.{attribute}", _library=library, **kwargs):
            raise RuntimeError(f"{_what} needs {_library}, which is not installed here")

        setattr(
            module, attribute, type(attribute, (), {"__init__": unavailable}) if attribute[0].isupper() else unavailable
        )


def import_mad_lab(path: Path) -> tuple[types.ModuleType, list[str]]:
    """mad-lab's train module, imported from a checkout at `path` (its configs are read relative
    to the working directory, so this changes into it); and the libraries stood in for."""
    stood_in = []
    if importlib.util.find_spec("flash_attn") is None:
        _stand_in("flash_attn.modules.mha", {"MHA": "flash-attn"})
        stood_in.append("flash-attn")
    if importlib.util.find_spec("transformers") is None:
        _stand_in_module("transformers")
        # gated linear attention's table of activations; empty: that layer is not measured
        _stand_in_module("transformers.activations").ACT2FN = {}
        stood_in.append("transformers")
    os.chdir(path)
    sys.path.insert(0, str(path))
    return importlib.import_module("train"), stood_in


def missing_requirement(model: str, stood_in: list[str]) -> str | None:
    """Why mad-lab cannot train `model` here, or None."""
    if model == "attention-sg" and "flash-attn" in stood_in:
        return "mad-lab's attention is flash-attn's MHA, and flash-attn is not installed"
    if model == "mamba":
        if importlib.util.find_spec("selective_scan_cuda") is None:
            return "mad-lab's Mamba needs mamba-ssm's compiled selective_scan_cuda, which is not importable"
        try:
            from importlib.metadata import version

            causal_conv1d = version("causal-conv1d")
        except Exception:  # not installed as a distribution: a build on the path
            causal_conv1d = (
                getattr(importlib.import_module("causal_conv1d"), "__version__", "0")
                if importlib.util.find_spec("causal_conv1d")
                else None
            )
        if causal_conv1d is None or tuple(int(p) for p in causal_conv1d.split(".")[:2]) >= (1, 5):
            return (
                f"mad-lab's Mamba calls causal-conv1d's C++ functions as version 1.4 defines them (found: "
                f"{causal_conv1d or 'none'}; 1.5 added an output argument)"
            )
    return None


def baseline_arguments(task: str) -> dict:
    """mad-lab's baseline setting of `task` as train.py's arguments (its defaults, then the yml)."""
    import yaml

    with open(f"configs/tasks/{task}.yml") as handle:
        return dict(yaml.safe_load(handle)["baseline"])


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Standard output and error of this process, file descriptors included (Lightning's loggers
    and progress bars hold their own references to the streams), into `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as handle:
        os.dup2(handle.fileno(), 1), os.dup2(handle.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


class EpochClock:
    """A Lightning callback's hooks: the time (device synchronized) at each epoch's start and at
    the end of fitting, so that epoch i took marks[i + 1] - marks[i]."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def _mark(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.marks.append(time.perf_counter())

    def on_train_epoch_start(self, trainer, module) -> None:
        self._mark()

    def on_fit_end(self, trainer, module) -> None:
        self._mark()

    @property
    def epochs(self) -> list[float]:
        return [after - before for before, after in zip(self.marks, self.marks[1:])]


def timed_run(
    train_module: types.ModuleType, layers: list[str], task: str, epochs: int, precision: str, workdir: Path
) -> tuple[list[float], float]:
    """One mad-lab run as `python train.py --task TASK --layers LAYERS --epochs EPOCHS` trains it:
    its epochs' seconds, and the seconds before the first epoch (data generation, model, Trainer)."""
    import pytorch_lightning as pl
    from mad.configs import MADConfig, MADModelConfig

    arguments = {
        "task": task,
        "layers": layers,
        "epochs": epochs,
        "precision": precision,
        "data_path": str(workdir / "data"),
        **baseline_arguments(task),
    }
    if task == "compression":  # train.py's own rule: compression needs the autoencoder backbone
        arguments["backbone"] = "autoencoder"
    mad_config = MADConfig()
    mad_config.update_from_kwargs(arguments)
    model_config = MADModelConfig()
    model_config.update_from_kwargs(arguments)

    clock = EpochClock()
    callback = type(
        "EpochClockCallback",
        (pl.Callback,),
        {
            "on_train_epoch_start": lambda self, trainer, module: clock.on_train_epoch_start(trainer, module),
            "on_fit_end": lambda self, trainer, module: clock.on_fit_end(trainer, module),
        },
    )()

    class ClockedTrainer(pl.Trainer):  # train.py builds pl.Trainer(...) itself: add the clock to it
        def __init__(self, *args, callbacks=None, **kwargs):
            super().__init__(*args, callbacks=[*(callbacks or []), callback], **kwargs)

    started = time.perf_counter()
    original, pl.Trainer = pl.Trainer, ClockedTrainer
    log = workdir / f"{task}.log"
    try:
        with output_to(log):  # its progress bars, warnings and prints
            model = model_config.build_model_from_registry()
            train_module.train(model=model, mad_config=mad_config, log_path=str(workdir / f"logs-{task}"))
    except Exception as error:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        raise RuntimeError(
            f"{type(error).__name__}: {error}" + (f" (last output: {lines[-1][:200]})" if lines else "")
        ) from error
    finally:
        pl.Trainer = original
    if not clock.marks:
        raise RuntimeError(f"{task}: no epoch was timed")
    return clock.epochs, clock.marks[0] - started


def protocol_hours(steady: dict[str, float]) -> tuple[float, int]:
    """mad-lab's paper protocol (its own list of runs) projected from each task's steady
    baseline epoch, linearly in training tokens; and the number of runs projected."""
    from mad.configs import make_benchmark_mad_configs

    def tokens(config) -> float:
        return float(config.num_train_examples) * float(config.seq_len)

    baselines: dict[str, float] = {}
    for task in steady:
        arguments = baseline_arguments(task)
        baselines[task] = float(arguments["num_train_examples"]) * float(arguments["seq_len"])
    seconds, runs = 0.0, 0
    for config in make_benchmark_mad_configs():
        if config.task in steady:
            seconds += steady[config.task] * tokens(config) / baselines[config.task] * PROTOCOL_EPOCHS
            runs += 1
    return seconds / 3600, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mad-lab", type=Path, required=True, help="a checkout of athms/mad-lab")
    parser.add_argument("--models", nargs="+", default=["hyena-sg", "mamba"], choices=sorted(MODELS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--epochs", type=int, default=3, help="epochs a run (the first is not steady; at least 2)")
    parser.add_argument("--precision", default="bf16", help="Lightning's precision (mad-lab's default: bf16)")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error(f"--epochs must be at least 2 (the first epoch is not steady), got {args.epochs}")
    if not (args.mad_lab / "train.py").is_file() or not (args.mad_lab / "mad").is_dir():
        parser.error(f"{args.mad_lab} is not a mad-lab checkout (no train.py and mad/ there)")
    # mad-lab's final evaluation reloads its best checkpoint, which holds its MADConfig: torch 2.6
    # made torch.load refuse such files by default; its documented switch restores the old default
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    import torch

    train_module, stood_in = import_mad_lab(args.mad_lab.resolve())
    import pytorch_lightning as pl

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(
        f"mad-lab on {device}: torch {torch.__version__}, pytorch_lightning {pl.__version__}, precision "
        f"{args.precision}, {args.epochs} epochs a run"
        + (f"; stood in for: {', '.join(stood_in)}" if stood_in else ""),
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            missing = missing_requirement(name, stood_in)
            if missing:
                print(f"\n{name}: not measured: {missing}", flush=True)
                continue
            print(f"\n{name} (mad-lab layers {' '.join(MODELS[name])})", flush=True)
            steady: dict[str, float] = {}
            for task in args.tasks:
                try:
                    epochs, setup = timed_run(
                        train_module, MODELS[name], task, args.epochs, args.precision, Path(tmp) / name
                    )
                except RuntimeError as error:
                    print(f"  {task:26s} failed in mad-lab: {error}", flush=True)
                    continue
                steady[task] = sum(epochs[1:]) / len(epochs[1:])
                print(
                    f"  {task:26s} steady epoch {steady[task]:7.2f} s   first {epochs[0]:6.2f} s   "
                    f"before it {setup:6.1f} s   ({', '.join(f'{e:.2f}' for e in epochs)})",
                    flush=True,
                )
            if steady:
                hours, runs = protocol_hours(steady)
                print(
                    f"  {'paper protocol':26s} {hours:8.2f} device-hours: {runs} runs of {PROTOCOL_EPOCHS} epochs, "
                    f"no early stop, one run at a time ({', '.join(steady)})",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
