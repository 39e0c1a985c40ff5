"""The user's knobs on top of a protocol (`Overrides`), and a spec's `eval:` section read
as them: checked key by key, each error located at its key or value in the spec file.

Precedence of every knob: command line > the spec's `eval:` section > protocol.

`Overrides` has one field per setting of `madsl.runner.plan.settings` (the table every
evaluation setting is declared in, once). Apart from the plan (`madsl.runner.plan.runs`)
because a spec's `eval:` section is checked on its own, long before anything is planned:
`madsl check` runs `check_spec_eval` without tasks, torch or numpy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Mapping, Sequence

from madsl.errors import Collector, MadslError, did_you_mean
from madsl.lang.declare import Where
from madsl.runner.plan.settings import BY_KEY, EVAL_SECTION, SETTINGS
from madsl.runner.plan.task_settings import apply_setting_overrides, check_setting_keys


class _Knobs:
    """The methods of Overrides (its fields come from madsl.runner.plan.settings)."""

    def over(self, lower: "Overrides") -> "Overrides":
        """These overrides on top of `lower` (ours win; settings merge key by key)."""
        merged = dataclasses.replace(lower)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "settings":
                merged.settings = {**lower.settings, **value}
            elif value is not None:
                setattr(merged, f.name, value)
        return merged


# Knobs a user sets on top of a protocol, one field a setting of madsl.runner.plan.settings (its
# `field`); None / empty means "not set".
Overrides = dataclasses.make_dataclass(
    "Overrides",
    [(s.field, Any, field(default_factory=dict) if s.field == "settings" else field(default=None)) for s in SETTINGS],
    bases=(_Knobs,),
    namespace={"__module__": __name__},
)
Overrides.__doc__ = "Knobs a user sets on top of a protocol (madsl.runner.plan.settings); None / empty: not set."


def spec_eval_where(source_map: Any = None, spec_file: str | None = None) -> Where:
    """Where things of a spec's `eval:` section are written (the Spec's source map), for located
    errors; without a source map (a Spec built from data), just the spec's file."""
    return Where(source_map, ("eval",), spec_file)


def overrides_from_spec_eval(
    section: Mapping[str, Any] | None,
    spec_file: str | None = None,
    source_map: Any = None,
    task_names: Sequence[str] | None = None,
) -> Overrides:
    """The `eval:` section of a spec as Overrides. Unknown keys and bad values (types, ranges,
    protocol names, and task names when `task_names` is given) are errors, located at the key
    or value in the spec file when `source_map` (the Spec's) is given. Each key is a setting of
    madsl.runner.plan.settings (`task:` an alias of `tasks:`), read as the declared section
    `EVAL_SECTION`."""
    section = dict(section or {})
    where = spec_eval_where(source_map, spec_file)
    if "tasks" in section and "task" in section:
        raise MadslError("eval: give either tasks: or task:, not both", where.key("task"))
    out = Overrides()
    for key, value in EVAL_SECTION.check(section, where, "eval").items():
        setattr(out, BY_KEY["tasks" if key == "task" else key].field, value)
    task_key = "tasks" if "tasks" in section else "task"
    if out.tasks is not None and task_names is not None:
        known = ("all", *task_names)
        for i, name in enumerate(out.tasks):
            if name not in known:
                at = where.value(task_key, i) if isinstance(section[task_key], list) else where.value(task_key)
                raise MadslError(
                    f"eval.{task_key}: unknown task {name!r}",
                    at,
                    expected=", ".join(known),
                    hint=did_you_mean(name, known),
                )
    return out


def check_spec_eval(section: Mapping[str, Any] | None, spec_file: str | None = None, source_map: Any = None) -> None:
    """Every error of a spec's `eval:` section that shows without the tasks (unknown keys, types,
    ranges, protocol, precision, conventions; task names and `set:` knobs need the tasks, which
    `plan_spec` has), each key checked on its own and all raised together, in file order.
    Light: `madsl check` runs it without torch or numpy."""
    section = dict(section or {})
    errors = Collector(spec_file)
    for key, value in section.items():
        with errors.check():
            overrides_from_spec_eval({key: value}, spec_file, source_map)
    if not errors:  # what only the keys together can break (tasks: and task: both given)
        with errors.check():
            overrides_from_spec_eval(section, spec_file, source_map)
    errors.raise_any()


def check_spec_settings(tasks: Sequence, settings: Mapping[str, Any], source: str, where: Where) -> None:
    """A spec's `eval.set` against the tasks evaluated: every knob is one of theirs, of its type;
    errors at the knob (unknown) or its value (wrong type) in the spec file."""
    for knob, value in settings.items():
        try:
            check_setting_keys(tasks, {knob: value}, source)
        except MadslError as err:
            raise err.relocated(where.key("set", knob)) from None
        for task in tasks:
            try:
                apply_setting_overrides(task, task.baseline, {knob: value}, source)
            except MadslError as err:
                raise err.relocated(where.value("set", knob)) from None
