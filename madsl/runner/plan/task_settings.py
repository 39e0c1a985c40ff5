"""The tasks an evaluation selects (`resolve_task_names`) and their settings as the user
changes them: `KEY=VALUE` or `TASK.KEY=VALUE` knobs (`--set`, a spec's `eval.set`), each
checked against the tasks evaluated and applied with the type of the task's baseline value.

Apart from the protocols and the plan because every surface that takes knobs reads them
here (the command line, a spec's `eval:` section, `madsl data`), and a protocol's own
budget is applied the same way (`madsl.runner.plan.protocols.budgeted_baseline`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from madsl.errors import MadslError, did_you_mean


def parse_set_option(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` (or `TASK.KEY=VALUE`) from the command line; VALUE is read as a file's values are."""
    import yaml

    from madsl.lang.yamlsource import scalar

    if "=" not in text:
        raise MadslError(f"--set {text!r}: expected KEY=VALUE", hint="e.g. --set seq_len=512")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key:
        raise MadslError(f"--set {text!r}: the key is empty", hint="e.g. --set seq_len=512")
    try:
        value = scalar(raw) if raw.strip() else None
    except (yaml.YAMLError, RecursionError):
        value = raw
    if value is None:
        raise MadslError(f"--set {text!r}: the value is empty", hint="e.g. --set seq_len=512")
    return key, value


def _check_value(task_name: str, knob: str, value: Any, baseline_value: Any, source: str) -> Any:
    """Type-check a setting value against the type of the task's baseline value."""
    if baseline_value is None:
        return value
    expected = type(baseline_value)
    if isinstance(value, bool) == isinstance(baseline_value, bool):
        if expected is float and isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, expected):
            return value
        if isinstance(baseline_value, (list, tuple)) and isinstance(value, (list, tuple)):
            return expected(value)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    raise MadslError(
        f"{source} {knob}={value!r}: {task_name}.{knob} must be {names.get(expected, expected.__name__)}",
        hint=f"its baseline value is {baseline_value!r}",
    )


def resolve_task_names(names: Iterable[str] | None, all_tasks: Sequence[str], known: Iterable[str]) -> list[str]:
    """`all` -> the MAD tasks; unknown names are errors with a did-you-mean."""
    known = list(known)
    out: list[str] = []
    for name in names or ("all",):
        if name == "all":
            out.extend(t for t in all_tasks if t not in out)
        elif name in known:
            if name not in out:
                out.append(name)
        else:
            raise MadslError(
                f"unknown task {name!r}", expected="all, " + ", ".join(known), hint=did_you_mean(name, [*known, "all"])
            )
    return out


def apply_setting_overrides(
    task, settings: Mapping[str, Any], overrides: Mapping[str, Any], source: str
) -> dict[str, Any]:
    """Apply `knob` / `task.knob` overrides that concern `task` (type-checked)."""
    out = dict(settings)
    for key, value in overrides.items():
        scope, _, knob = key.rpartition(".")
        if scope and scope != task.name:
            continue
        if knob in task.baseline:
            out[knob] = _check_value(task.name, knob, value, task.baseline[knob], source)
    return out


def check_setting_keys(tasks: Sequence, overrides: Mapping[str, Any], source: str) -> None:
    """Every override key must be a knob of at least one selected task (or of the task it names)."""
    for key in overrides:
        scope, _, knob = key.rpartition(".")
        scoped = [t for t in tasks if t.name == scope] if scope else list(tasks)
        if scope and not scoped:
            names = [t.name for t in tasks]
            raise MadslError(
                f"{source} {key}: task {scope!r} is not among the tasks evaluated",
                expected=", ".join(names),
                hint=did_you_mean(scope, names),
            )
        knobs = sorted({k for t in scoped for k in t.baseline})
        if not any(knob in t.baseline for t in scoped):
            where = scope or ", ".join(t.name for t in scoped)
            raise MadslError(
                f"{source} {key}: no setting {knob!r} in {where}",
                expected="one of " + ", ".join(knobs),
                hint=did_you_mean(knob, knobs),
            )
