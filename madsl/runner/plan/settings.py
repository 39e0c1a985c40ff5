"""The evaluation settings: what runs train, each setting declared once.

A `Setting` is one knob of `madsl eval` and `madsl.evaluate` that decides what the runs of an
evaluation train: the protocol, the tasks and their settings, the lr x wd grid, epochs, batch
size, seeds, evaluation lengths, frozen layers, precision, conventions and the training
options. Its declaration carries everything about it:

    field       its attribute of `Overrides` (the user's knobs on top of a protocol)
    key         its key in a spec's `eval:` section and a sweep file's `train:` section, and its
                keyword of `cli_overrides` (the Python API's name for it)
    flag        its option of `madsl eval` (None: not on the command line), with the argparse
                arguments that read it (`cli`: action, metavar, choices; `text` parses one word)
    kind        what its value may be (madsl.lang.declare: a number with its bounds, names, a
                choice): it checks a value as written in a spec, a sweep file, a search file or a
                Python call, with a MadslError located where the value is written, and gives the
                value's JSON Schema
    many        whether it takes several values (a list in YAML, a repeated flag)
    in_sweep    whether a sweep file's `train:` may set it
    identity_default  the value every run made before the setting existed had: a run's identity
                names the setting only when off it (`options.train_config_identity`), so older
                run ids stay valid; None where the setting is always part of a run

From this table come `Overrides` (madsl.runner.plan.overrides), the `eval:` keys and their validation
(`overrides_from_spec_eval`), the `eval` command's options (madsl/cli/evaluate.py), the sweep
file's `train:` keys (madsl.runner.plan.sweep), the identity defaults (`IDENTITY_DEFAULTS`), the
`eval:` part of `madsl schema`, and the settings table of docs/runner.md (checked by
tests/test_docs.py). A new setting is one entry here and the code that uses it.

How runs execute (workers, devices, executor, grid batching, CUDA graphs, checkpoints, kept
models) changes no result and is not here: those are arguments of `evaluate`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from madsl.errors import MadslError, option
from madsl.lang.declare import Choice, Custom, Key, Kind, Names, Number, Section, Where
from madsl.runner.common.choices import LM_HEADS, MAX_SEED, METRICS, OPTIMIZERS, PRECISIONS, SCHEDULES
from madsl.runner.common.records import IDENTITY_DEFAULTS as RECORDED_DEFAULTS
from madsl.runner.common.words import (
    finite_text,
    lengths_text,
    non_negative_text,
    positive_int_text,
    positive_text,  # noqa: F401 - madsl.cli.arguments reads it here
    seed_text,
)

# the choices of the training options (madsl.runner.train.options says what each does), the
# precisions and the largest seed are defined once, in madsl.runner.common.choices; a setting's
# identity default, with the TrainSettings field it fills (madsl.runner.common.records)

# the names of madsl.runner.plan.protocols.PROTOCOLS (tests/test_cli.py checks the two agree), here so
# that the command line's choices need not import the protocols
PROTOCOL_NAMES = ("smoke", "quick", "baseline", "paper")
CONVENTIONS = ("mad-lab", "madsl")

ALWAYS = object()  # identity_default of a setting every run's identity names (lr, epochs, ...)


@dataclass(frozen=True)
class Setting:
    field: str
    key: str
    help: str
    kind: Kind
    flag: str | None = None
    cli: Mapping[str, Any] = field(default_factory=dict)
    text: Callable[[str], Any] | None = None
    in_sweep: bool = False
    identity_default: Any = ALWAYS

    @property
    def source(self) -> str:
        """How messages name it: its key, or on the command line its flag (madsl.errors.option)."""
        return option(self.key)

    @property
    def many(self) -> bool:
        """Whether it takes several values (a list in YAML, a repeated flag)."""
        return isinstance(self.kind, Names) or getattr(self.kind, "many", False)

    def check(self, value: Any, where: Where, source: str) -> Any:
        return self.kind.check(value, where, source)

    def declared(self) -> Key:
        """Its declaration as a key of a file (madsl.lang.declare)."""
        return Key(self.key, self.kind, self.help, identity=True)


# --- checks of values as written (spec eval:, sweep train:, Python calls) --------------------


def _task_settings(value: Any, where: Where, source: str) -> dict[str, Any]:
    """Task settings (knob or task.knob -> value); the knobs are checked against the tasks when
    the plan is made."""
    if not isinstance(value, Mapping):
        raise MadslError(
            f"{source}: expected a mapping of task settings (knob: value), got {value!r}",
            where.value(),
            hint="e.g. set: {seq_len: 256}",
        )
    for knob, item in value.items():
        if not isinstance(knob, str) or not knob:
            raise MadslError(f"{source}: a setting name must be a string, got {knob!r}", where.key(knob))
        if item is None or isinstance(item, Mapping):
            raise MadslError(f"{source}.{knob}: expected a value, got {item!r}", where.value(knob))
    return dict(value)


# --- the table -------------------------------------------------------------------------------

_TASK_SETTINGS = Custom(
    _task_settings, {"type": "object", "additionalProperties": {"not": {"type": ["object", "null"]}}}
)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "protocol",
        "protocol",
        "the protocol: smoke (seconds), quick (~10 min per architecture on 2 CPU "
        "cores), baseline (baseline settings, full grid, 200 epochs), paper (every setting; default: the "
        "spec's eval.protocol, else quick)",
        Choice(PROTOCOL_NAMES, "protocol"),
        flag="--protocol",
        cli={"choices": PROTOCOL_NAMES},
    ),
    Setting(
        "tasks",
        "tasks",
        "a task name, or all (the six MAD tasks); repeatable (default: the spec's eval.tasks, else all)",
        Names("task names"),
        flag="--task",
        cli={"action": "append", "metavar": "NAME"},
    ),
    Setting(
        "settings",
        "set",
        "a task setting, e.g. seq_len=512, or TASK.KEY=VALUE for one task; repeatable",
        _TASK_SETTINGS,
        flag="--set",
        cli={"action": "append", "metavar": "KEY=VALUE"},
    ),
    Setting(
        "lrs",
        "lr",
        "learning rate(s) instead of the grid's",
        Number(minimum=0, inclusive=False, many=True),
        flag="--lr",
        cli={"action": "append"},
        text=non_negative_text,
        in_sweep=True,
    ),
    Setting(
        "wds",
        "wd",
        "weight decay(s) instead of the grid's",
        Number(minimum=0, many=True),
        flag="--wd",
        cli={"action": "append"},
        text=non_negative_text,
        in_sweep=True,
    ),
    Setting(
        "epochs",
        "epochs",
        "training epochs instead of the protocol's",
        Number(integer=True, minimum=1),
        flag="--epochs",
        text=positive_int_text,
        in_sweep=True,
    ),
    Setting(
        "batch_size",
        "batch_size",
        "batch size instead of the protocol's",
        Number(integer=True, minimum=1),
        flag="--batch-size",
        text=positive_int_text,
        in_sweep=True,
    ),
    Setting(
        "seeds",
        "seed",
        "seed(s) of data, init and order (0 to 2^32 - 1)",
        Number(integer=True, minimum=0, maximum=MAX_SEED, many=True),
        flag="--seed",
        cli={"action": "append"},
        text=seed_text,
        in_sweep=True,
    ),
    Setting(
        "eval_lengths",
        "eval_lengths",
        "after training, also evaluate the best model at these sequence "
        "lengths (LOW..HIGH: the powers of two from LOW to HIGH, e.g. 64..1048576)",
        # (their range depends on the task: checked against it when the plan is made)
        Number(integer=True, many=True, empty=True),
        flag="--eval-lengths",
        cli={"metavar": "L1,L2,...|LOW..HIGH"},
        text=lengths_text,
    ),
    Setting(
        "freeze",
        "freeze",
        "do not train these layers: a symbol (Mb), a tag (#a) or embedding; repeatable",
        Names("layer names (symbols, #tags or embedding)", unique=True),
        flag="--freeze",
        cli={"action": "append", "metavar": "NAME"},
    ),
    Setting(
        "precision",
        "precision",
        "fp32; bf16 (autocast, float32 master weights; exit 2 where the device has "
        "no bf16); auto: bf16 on a CUDA device with bf16, else fp32 (default: the spec's eval.precision, "
        "else fp32)",
        Choice(PRECISIONS, "precision", "bf16 trains in bfloat16 autocast with float32 master weights"),
        flag="--precision",
        cli={"choices": PRECISIONS},
        identity_default=RECORDED_DEFAULTS["precision"],
    ),
    Setting(
        "conventions",
        "conventions",
        "mad-lab: task layouts, vocabularies, optimizer, schedule, LM head and "
        "accuracy as the reference implementation (athms/mad-lab) has them; madsl: the paper's text (default: "
        "the spec's eval.conventions, else the protocol's: mad-lab for paper and baseline, madsl for quick "
        "and smoke; docs/tasks.md)",
        Choice(CONVENTIONS, "conventions", "mad-lab: the reference implementation's; madsl: the paper's text"),
        flag="--conventions",
        cli={"choices": CONVENTIONS},
        identity_default=RECORDED_DEFAULTS["conventions"],
    ),
    Setting(
        "optimizer",
        "optimizer",
        "adamw: decoupled weight decay, Table B.1's betas; adam: plain torch Adam "
        "(betas 0.9, 0.999), weight decay coupled",
        Choice(OPTIMIZERS, "optimizer", "adamw: decoupled weight decay; adam: plain torch Adam, coupled weight decay"),
        flag="--optimizer",
        cli={"choices": OPTIMIZERS},
        identity_default=RECORDED_DEFAULTS["optimizer"],
    ),
    Setting(
        "schedule",
        "schedule",
        "cosine: decay to the protocol's min lr; constant: the learning rate throughout",
        Choice(SCHEDULES, "schedule", "cosine: decay to min_lr; constant: the learning rate throughout"),
        flag="--schedule",
        cli={"choices": SCHEDULES},
        identity_default=RECORDED_DEFAULTS["schedule"],
    ),
    Setting(
        "metric",
        "metric",
        "the accuracy the stopping rule reads and runs are scored by: macro "
        "(class-averaged, MAD's) or token (share of scored positions right)",
        Choice(METRICS, "metric", "macro: class-averaged accuracy; token: share of scored positions right"),
        flag="--metric",
        cli={"choices": METRICS},
        identity_default=RECORDED_DEFAULTS["metric"],
    ),
    Setting(
        "stop_acc",
        "stop_acc",
        "stop once the eval accuracy exceeds X (default: the protocol's early stop)",
        Number(minimum=0, maximum=1, below=True, hint="training stops once the eval accuracy exceeds it, e.g. 0.99"),
        flag="--stop-acc",
        cli={"metavar": "X"},
        text=finite_text,
        identity_default=RECORDED_DEFAULTS["stop_acc"],
    ),
    Setting(
        "patience",
        "patience",
        "stop after P epochs in a row without an eval-loss improvement of more than --min-delta",
        Number(
            integer=True,
            minimum=1,
            hint="training stops after this many epochs in a row without an eval-loss improvement",
        ),
        flag="--patience",
        cli={"metavar": "P"},
        text=positive_int_text,
        identity_default=RECORDED_DEFAULTS["patience"],
    ),
    Setting(
        "min_delta",
        "min_delta",
        "the eval-loss decrease that counts as an improvement (default 0)",
        Number(minimum=0, hint="the eval-loss decrease that counts as an improvement, e.g. 0.001"),
        flag="--min-delta",
        cli={"metavar": "D"},
        text=non_negative_text,
        identity_default=RECORDED_DEFAULTS["min_delta"],
    ),
    Setting(
        "lm_head",
        "lm_head",
        "conventions: the LM head the conventions give (mad-lab: untied, with a bias); "
        "spec: the spec's own output layer (tied where the spec says so)",
        Choice(LM_HEADS, "lm_head", "conventions: the conventions' LM head; spec: the spec's own output layer"),
        flag="--lm-head",
        cli={"choices": LM_HEADS},
        identity_default=RECORDED_DEFAULTS["lm_head"],
    ),
)

BY_FIELD: Mapping[str, Setting] = {s.field: s for s in SETTINGS}
BY_KEY: Mapping[str, Setting] = {s.key: s for s in SETTINGS}
# a run's identity names these only when off the value they had before they existed
IDENTITY_DEFAULTS: Mapping[str, Any] = {
    s.field: s.identity_default for s in SETTINGS if s.identity_default is not ALWAYS
}
# the training options every run carries by name into its TrainSettings
RUN_OPTIONS: tuple[str, ...] = tuple(
    s.field for s in SETTINGS if s.identity_default is not ALWAYS and s.field not in ("precision", "conventions")
)


def check_value(setting: Setting, value: Any, where: Where | None = None, source: str | None = None) -> Any:
    """`value` of `setting` checked (a MadslError located at `where`, naming `source`, otherwise)."""
    return setting.check(value, where or Where(), source or setting.source)


def eval_section() -> Section:
    """A spec's `eval:` section: the settings as declared keys of a file (madsl.lang.declare), and
    `task:` for one task (an alias of `tasks:`)."""
    keys = [s.declared() for s in SETTINGS]
    keys.insert(2, Key("task", keys[1].kind, "one task (an alias of tasks)", identity=True))
    return Section("eval:", tuple(keys), description="settings for `madsl eval` (docs/runner.md)")


def sweep_train_section() -> Section:
    """A sweep file's `train:` section: the settings a sweep may set."""
    return Section("train:", tuple(s.declared() for s in SETTINGS if s.in_sweep))


EVAL_SECTION = eval_section()
SWEEP_TRAIN_SECTION = sweep_train_section()


def eval_schema() -> dict[str, Any]:
    """The JSON Schema of a spec's `eval:` section."""
    return EVAL_SECTION.schema()
