"""The evaluation settings are declared once (madsl.runner.plan.settings): the `eval` command's options,
a spec's `eval:` keys, a sweep file's `train:` keys, the identity defaults, the `eval:` part of
`madsl schema`, `cli_overrides`' keywords and docs/runner.md's table all come from that table."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from madsl.cli import evaluate as eval_cli
from madsl.errors import MadslError
from madsl.lang.declare import Number
from madsl.runner.plan import overrides, protocols, settings, sweep
from madsl.runner.plan.evaluation import cli_overrides
from madsl.runner.plan.settings import SETTINGS, Setting, check_value
from madsl.runner.train.options import IDENTITY_DEFAULTS, train_config_identity
from madsl.schema import spec_schema

DOCS = Path(__file__).resolve().parent.parent / "docs" / "runner.md"


def _eval_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    eval_cli.add_parser(parser.add_subparsers())
    return parser._subparsers._group_actions[0].choices["eval"]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def test_every_surface_comes_from_the_declaration():
    flags = _flags(_eval_parser())
    assert {s.flag for s in SETTINGS if s.flag} <= flags
    assert set(settings.EVAL_SECTION.names) == {s.key for s in SETTINGS} | {"task"}
    assert {f.name for f in dataclasses.fields(overrides.Overrides)} == {s.field for s in SETTINGS}
    assert set(sweep.SWEEP_FILE.by_name["train"].kind.names) == {s.key for s in SETTINGS if s.in_sweep}
    assert dict(IDENTITY_DEFAULTS) == {
        s.field: s.identity_default for s in SETTINGS if s.identity_default is not settings.ALWAYS
    }
    eval_properties = spec_schema()["properties"]["eval"]["properties"]
    assert set(eval_properties) == set(settings.EVAL_SECTION.names)
    assert protocols.PROTOCOLS.keys() == set(settings.PROTOCOL_NAMES)


def test_the_docs_table_lists_every_setting_once():
    """docs/runner.md's "Overriding knobs" table: a row per setting, naming its flag and its key."""
    text = DOCS.read_text()
    lines = text[text.index("| command line | spec `eval:` key | what |") :].splitlines()[2:]
    table = "\n".join(lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))])
    for setting in SETTINGS:
        assert f"`{setting.flag}" in table, f"{setting.flag} is missing from docs/runner.md's settings table"
        assert re.search(rf"`{setting.key}:", table), f"eval: key {setting.key} is missing from the table"


def test_a_new_setting_is_one_declaration(monkeypatch):
    """A toy setting added to the table becomes a flag of `madsl eval`, an `eval:` key a spec may
    write (checked, located), a field of Overrides and a schema entry, with no other file touched."""
    toy = Setting(
        "warmup",
        "warmup",
        "warm-up epochs (a toy setting of this test)",
        Number(integer=True, minimum=0),
        flag="--warmup",
        text=settings.positive_int_text,
        identity_default=0,
    )
    table = (*SETTINGS, toy)
    monkeypatch.setattr(settings, "SETTINGS", table)
    monkeypatch.setattr(eval_cli, "SETTINGS", table)
    monkeypatch.setattr(settings, "BY_KEY", {s.key: s for s in table})
    monkeypatch.setattr(overrides, "BY_KEY", {s.key: s for s in table})
    monkeypatch.setattr(settings, "EVAL_SECTION", settings.eval_section())
    monkeypatch.setattr(overrides, "EVAL_SECTION", settings.EVAL_SECTION)
    with_warmup = dataclasses.make_dataclass(
        "Overrides",
        [
            (
                s.field,
                object,
                dataclasses.field(default_factory=dict) if s.field == "settings" else dataclasses.field(default=None),
            )
            for s in table
        ],
        bases=(overrides._Knobs,),
    )
    monkeypatch.setattr(overrides, "Overrides", with_warmup)

    args = _eval_parser().parse_args(["spec.mad", "--warmup", "3"])
    assert args.warmup == 3
    assert overrides.overrides_from_spec_eval({"warmup": 2}).warmup == 2
    with pytest.raises(MadslError, match=r"eval.warmup: expected a non-negative integer, got -1"):
        overrides.overrides_from_spec_eval({"warmup": -1})
    assert settings.eval_schema()["properties"]["warmup"]["type"] == "integer"


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("lr", [1e-3, 0.001], "is given twice"),
        ("lr", 0, "expected a positive number"),
        ("epochs", [2], "expected an integer"),
        ("seed", 2**32, "at most"),
        ("optimizer", "sgd", "unknown optimizer 'sgd'"),
        ("stop_acc", 1.0, "expected a number below 1"),
        ("protocol", "papr", "unknown protocol 'papr'"),
        ("set", ["seq_len"], "expected a mapping"),
        ("tasks", [""], "expected task names"),
    ],
)
def test_one_check_a_setting_wherever_it_is_written(key, value, message, tmp_path):
    """The same check answers a value in a Python call (naming the flag) and in a spec's eval:
    (located at the value, naming the key)."""
    with pytest.raises(MadslError, match=message) as called:
        cli_overrides(**{key: value})
    assert settings.BY_KEY[key].source in str(called.value)
    with pytest.raises(MadslError, match=message) as written:
        overrides.overrides_from_spec_eval({key: value})
    assert f"eval.{key}" in str(written.value)


def test_identity_names_an_option_only_off_its_default():
    assert train_config_identity({"lr": 1e-3, "optimizer": "adamw", "stop_acc": None}) == {"lr": 1e-3}
    assert train_config_identity({"lr": 1e-3, "optimizer": "adam"}) == {"lr": 1e-3, "optimizer": "adam"}


def test_errors_name_the_setting_as_its_caller_wrote_it(capsys, tmp_path):
    """The library's errors name a setting by its Python name; the command line's by its flag
    (madsl.errors.option, set while a command runs), with no other code for either."""
    from madsl.cli import main
    from madsl.errors import speaking
    from madsl.runner.api import evaluate

    with pytest.raises(MadslError) as raised:
        check_value(settings.BY_KEY["patience"], 0)
    assert raised.value.message.startswith("patience: expected an integer at least 1")
    with speaking({"patience": "--patience"}):
        with pytest.raises(MadslError, match="--patience: expected an integer at least 1"):
            check_value(settings.BY_KEY["patience"], 0)
    with pytest.raises(MadslError) as raised:
        evaluate(["specs/paper/hyena-sg.mad"], db=tmp_path / "r.db", checkpoint_every=-1, dry_run=True)
    assert raised.value.message.startswith("checkpoint_every: expected a non-negative number")
    spec = str(Path(__file__).resolve().parent.parent / "specs" / "paper" / "hyena-sg.mad")
    assert main(["eval", spec, "--db", str(tmp_path / "r.db"), "--device", "cpu", "--cuda-graphs", "--dry-run"]) == 2
    assert "--cuda-graphs needs a CUDA device" in capsys.readouterr().err
    with pytest.raises(MadslError) as raised:  # the command's words end with it
        evaluate([spec], db=tmp_path / "r.db", device="cpu", cuda_graphs=True, dry_run=True)
    assert raised.value.message.startswith("cuda_graphs needs a CUDA device")


def test_the_library_prints_nothing(tmp_path, capfd):
    """`madsl.evaluate` in a script writes nothing to the terminal; a reporter receives progress."""
    from runner_helpers import TOY_TASKS, standin_factory

    from madsl.runner.api import evaluate
    from madsl.runner.execute.coordinator import Reporter

    events = []

    class Recorder(Reporter):
        def planned(self, total, already_done):
            events.append(("planned", total))

        def ended(self, job, status, detail=""):
            events.append(("ended", status))

    summary = evaluate(
        ["specs/paper/hyena-sg.mad"],
        tasks=["toy-previous"],
        protocol="smoke",
        epochs=1,
        db=tmp_path / "r.db",
        model_factory=standin_factory,
        task_registry=TOY_TASKS,
        reporter=Recorder(),
    )
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert summary["done"] == 1 and events == [("planned", 1), ("ended", "done")]


def test_one_configuration_carries_what_runs_train_and_how_they_execute(tmp_path):
    """`madsl.evaluate(specs, config)`: an EvalConfig of the settings (by key) and the execution
    options (a frozen Execution), or the same as keywords; every name is checked against its
    declaration, and the eval command's execution flags are the options' own."""
    import dataclasses

    from madsl.runner.api import evaluate
    from madsl.runner.config import EvalConfig
    from madsl.runner.execute.options import OPTIONS, Execution

    config = EvalConfig.from_keywords(protocol="smoke", lr=1e-3, workers=2, db=tmp_path / "r.db", dry_run=True)
    assert config.settings == {"protocol": "smoke", "lr": 1e-3}
    assert (config.execution.workers, config.execution.dry_run, config.execution.device) == (2, True, "auto")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.execution.workers = 3
    with pytest.raises(TypeError, match="unknown argument 'worker'.*the execution options are db, workers"):
        EvalConfig.from_keywords(worker=2)
    with pytest.raises(TypeError, match="a config or keywords, not both"):
        evaluate(["specs/paper/hyena-sg.mad"], config, workers=1)
    assert config.replace(workers=1, epochs=2).execution.workers == 1
    assert config.replace(workers=1, epochs=2).settings["epochs"] == 2
    plan = evaluate(["specs/paper/hyena-sg.mad"], config.replace(tasks=["memorization"]))
    assert plan["plan"]["runs"] == 1
    assert [f.name for f in dataclasses.fields(Execution)] == [option.name for option in OPTIONS]
    assert {option.flag for option in OPTIONS} <= _flags(_eval_parser())
