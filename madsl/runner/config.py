"""An evaluation's configuration: what its runs train and how they execute, as one frozen record.

    settings    the settings of madsl.runner.plan.settings by key (protocol, tasks, set, lr, ...):
                they decide what the runs compute, and enter their identities
    execution   the options of madsl.runner.execute.options (db, workers, device, ...): where and
                how the runs execute, no result changes with them

`madsl.evaluate(specs, config)` takes one; `madsl.evaluate(specs, protocol="quick", workers=2)`
builds it from keywords (`EvalConfig.from_keywords`), and the command line from its options.
Either way each name is checked against its declaration: an unknown name is a TypeError that
lists the known ones, a bad value a MadslError naming the setting as its caller wrote it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from madsl.runner.execute.options import BY_NAME as OPTIONS_BY_NAME
from madsl.runner.execute.options import Execution
from madsl.runner.plan.settings import BY_KEY as SETTINGS_BY_KEY

ALIASES = {"settings_overrides": "set"}  # the Python API's earlier name of a setting


@dataclass(frozen=True)
class EvalConfig:
    settings: Mapping[str, Any] = field(default_factory=dict)
    execution: Any = field(default_factory=Execution)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.settings) - set(SETTINGS_BY_KEY))
        if unknown:
            raise TypeError(f"unknown setting(s) {', '.join(unknown)}; the settings are " + ", ".join(SETTINGS_BY_KEY))
        if not isinstance(self.execution, Execution):
            raise TypeError(f"execution must be an Execution, got {type(self.execution).__name__}")

    @classmethod
    def from_keywords(cls, **keywords: Any) -> "EvalConfig":
        """Settings and execution options given by name, in one namespace (their names differ)."""
        settings, execution = {}, {}
        for name, value in keywords.items():
            key = ALIASES.get(name, name)
            if key in SETTINGS_BY_KEY:
                settings[key] = value
            elif key in OPTIONS_BY_NAME:
                execution[key] = value
            else:
                raise TypeError(
                    f"evaluate() got an unknown argument {name!r}; the settings are "
                    + ", ".join(SETTINGS_BY_KEY)
                    + "; the execution options are "
                    + ", ".join(OPTIONS_BY_NAME)
                )
        return cls(settings=settings, execution=Execution(**execution))

    def replace(self, **keywords: Any) -> "EvalConfig":
        """This configuration with some settings or options given anew."""
        other = EvalConfig.from_keywords(**keywords)
        given = {
            f.name: getattr(other.execution, f.name)
            for f in dataclasses.fields(Execution)
            if f.name in {ALIASES.get(k, k) for k in keywords}
        }
        return EvalConfig({**self.settings, **other.settings}, dataclasses.replace(self.execution, **given))
