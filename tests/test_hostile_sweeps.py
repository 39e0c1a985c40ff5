"""Sweep files and specs as a hostile pull request writes them: they read only their own tree,
the work they ask for is capped before it is done, and `madsl check`'s exit status never
misreports (1 is a violated budget and nothing else).

- every file a spec or sweep file names (`specs:`, `extends:`) resolves inside the naming
  file's folder, $MADSL_SPEC_ROOT or the bundled specs, or is refused at its entry unread;
  a named file that is not a spec is refused by name, none of its lines or values printed;
- a sweep's variants, each variant's layers and a plan's runs are counted before the work;
- wrong types are located errors (exit 2), and integers in float notation keep the integer
  limit, so that every canonical form parses back to the same spec."""

from __future__ import annotations

import builtins
import contextlib
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madsl.cli import main
from madsl.errors import MadslError
from madsl.runner.plan import sweep as sweeps
from madsl.runner.plan.sweep import load_sweep
from madsl.spec import load_spec, spec_from_topology

REPO = Path(__file__).resolve().parent.parent
HYENA = REPO / "specs" / "paper" / "hyena-sg.mad"
SECRET = "hunter2"
PROFILE = dict(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@contextlib.contextmanager
def files_opened():
    """Every path opened while inside (resolved), to show that a refused file was never read."""
    opened: list[Path] = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)):
            with contextlib.suppress(OSError, ValueError):
                opened.append(Path(os.fsdecode(file)).resolve())
        return real_open(file, *args, **kwargs)

    builtins.open = spy
    try:
        yield opened
    finally:
        builtins.open = real_open


@pytest.fixture
def tree(tmp_path):
    """study/ holds the sweep file and a spec; outside/ (its sibling) a secret the study must not read."""
    study, outside = tmp_path / "study", tmp_path / "outside"
    (study / "sub").mkdir(parents=True)
    outside.mkdir()
    (study / "hyena-sg.mad").write_text(HYENA.read_text())
    (study / "sub" / "hyena-sg.mad").write_text(HYENA.read_text())
    secret = outside / "secret.yaml"
    secret.write_text(f"name: {SECRET}\ndim: [{SECRET}]\ntopology: {SECRET}\n")  # would print if read as a spec
    (outside / "x.mad").write_text(f"name: {SECRET}\ndim: [{SECRET}]\ntopology: {SECRET}\n")
    return study, outside


def sweep_file(study: Path, *entries: str, extra: str = "", protocol: str = "smoke") -> Path:
    path = study / "study.yaml"
    path.write_text(f"protocol: {protocol}\nspecs:\n" + "".join(f"  - '{e}'\n" for e in entries) + extra)
    return path


def refused(path: Path) -> MadslError:
    with pytest.raises(MadslError) as info:
        load_sweep(path)
    return info.value


# --- the read policy --------------------------------------------------------------------------

HOSTILE_ENTRIES = [
    ("/etc/passwd", "may not name an absolute path"),
    ("{outside}/secret.yaml", "may not name an absolute path"),
    ("../outside/secret.yaml", "may not leave this sweep file's directory"),
    ("../x.yaml", "may not leave this sweep file's directory"),
    ("sub/../../outside/x.mad", "may not leave this sweep file's directory"),
    ("/proc/*/cwd/*.mad", "may not name an absolute path"),
    ("../outside/*.yaml", "may not leave this sweep file's directory"),
    ("../*/*.mad", "may not leave this sweep file's directory"),
    ("*/../../outside/*.mad", "climbs out with '..' after a wildcard"),
    ("~/secret.yaml", "may not name an absolute path"),
    ("bundled:../../../etc/passwd", "no bundled spec"),
]


@pytest.mark.parametrize("entry, message", HOSTILE_ENTRIES)
def test_a_sweep_entry_outside_its_tree_is_refused_at_its_line_and_column_unread(tree, entry, message):
    study, outside = tree
    path = sweep_file(study, "hyena-sg.mad", entry.format(outside=outside))
    with files_opened() as opened:
        err = refused(path)
    assert message in err.message, err.render()
    assert (err.location.file, err.location.line, err.location.column) == (str(path), 4, 5), err.render()
    assert SECRET not in err.render() and "root:" not in err.render()
    assert not [p for p in opened if p.is_relative_to(outside) or p == Path("/etc/passwd")], opened


def test_links_that_lead_out_of_the_tree_are_refused_unread(tree):
    study, outside = tree
    (study / "link.yaml").symlink_to(outside / "secret.yaml")
    (study / "linked").symlink_to(outside)
    for entry, message in [
        ("link.yaml", "resolves to"),
        ("linked/*.yaml", "searches"),
        ("*/*.mad", "through a link that leads out"),
        ("linked/x.mad", "resolves to"),
    ]:
        path = sweep_file(study, entry)
        with files_opened() as opened:
            err = refused(path)
        assert message in err.message and "may not leave" in err.message, err.render()
        assert (err.location.line, err.location.column) == (3, 5) and SECRET not in err.render()
        assert not [p for p in opened if p.is_relative_to(outside)], (entry, opened)


def test_the_cli_refuses_a_hostile_sweep_with_exit_2_and_no_secret(tree, capsys):
    study, outside = tree
    path = sweep_file(study, "../outside/secret.yaml")
    assert main(["eval", str(path), "--dry-run", "--db", str(study / "r.db")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3:5" in err and SECRET not in err and "Traceback" not in err
    assert not (study / "r.db").exists()


def test_inside_the_tree_paths_globs_links_and_madsl_spec_root_work(tree, monkeypatch):
    study, outside = tree
    (study / "sub" / "notes.txt").write_text("not a spec, and a glob skips it\n")
    (study / "inner.mad").symlink_to(study / "sub" / "hyena-sg.mad")  # a link that stays inside is fine
    sweep = load_sweep(sweep_file(study, "sub/../hyena-sg.mad", "sub/*", "inner.mad"))
    assert [Path(v.path).resolve() for v in sweep.variants] == [
        (study / "hyena-sg.mad").resolve(),
        (study / "sub" / "hyena-sg.mad").resolve(),
    ]
    assert len(load_sweep(sweep_file(study, "bundled:paper/*-sg")).variants) == 13
    (outside / "shared.mad").write_text(HYENA.read_text())
    with pytest.raises(MadslError, match="may not leave"):
        load_sweep(sweep_file(study, "../outside/shared.mad"))
    monkeypatch.setenv("MADSL_SPEC_ROOT", str(outside))
    assert len(load_sweep(sweep_file(study, "../outside/shared.mad")).variants) == 1


@pytest.mark.parametrize(
    "secrets",
    [f"password: {SECRET}\n", f"- password\n- {SECRET}\n", f"password: [{SECRET}\n", f"name: x\ntoken: {SECRET}\n"],
)
def test_a_named_yaml_file_that_is_not_a_spec_is_refused_without_a_line_of_it(tree, secrets):
    study, _ = tree
    (study / "ci-secrets.yaml").write_text(secrets)
    err = refused(sweep_file(study, "ci-secrets.yaml"))
    assert "is not a spec" in err.message and (err.location.line, err.location.column) == (3, 5)
    assert SECRET not in err.render() and "password" not in err.render()
    (study / "leak.mad").write_text("name: leak\nextends: ci-secrets.yaml\n")
    with pytest.raises(MadslError) as info:
        load_spec(study / "leak.mad")
    assert "extends names ci-secrets.yaml, which is not a spec" in info.value.message
    assert (info.value.location.line, info.value.location.column) == (2, 10)
    assert SECRET not in info.value.render() and "password" not in info.value.render()


def test_check_of_a_spec_extending_a_secrets_file_exits_2_without_the_secret(tree, capsys):
    study, _ = tree
    (study / "ci-secrets.yaml").write_text(f"password: {SECRET}\n")
    (study / "leak.mad").write_text("name: leak\nextends: ci-secrets.yaml\n")
    for fmt in ("text", "json", "github", "line"):
        assert main(["check", str(study / "leak.mad"), "--format", fmt]) == 2
        out = capsys.readouterr()
        assert SECRET not in out.out + out.err and "Traceback" not in out.err


def test_a_missing_key_points_into_the_extending_spec_not_at_a_line_of_what_it_extends(tree):
    study, _ = tree
    (study / "base.yaml").write_text(f"description: {SECRET}\n")  # spec keys only: it reads as a spec
    (study / "child.mad").write_text("name: child\nextends: base.yaml\n")
    with pytest.raises(MadslError) as info:
        load_spec(study / "child.mad")
    assert SECRET not in info.value.render()
    assert {one.location.file for one in info.value.diagnostics} == {str(study / "child.mad")}


# --- caps before work ---------------------------------------------------------------------------


def test_a_ten_million_variant_sweep_is_refused_in_well_under_a_second(tree):
    study, _ = tree
    axes = ["dim", "layers.H.order", "layers.H.filter_states", "layers.Sg.inner", "seq_len", "vocab", "norm"]
    vary = "vary:\n" + "".join(f"  {axis}: [{', '.join(str(i) for i in range(1, 11))}]\n" for axis in axes)
    path = sweep_file(study, "hyena-sg.mad", extra=vary)
    with files_opened() as opened:
        start = time.perf_counter()
        err = refused(path)
        seconds = time.perf_counter() - start
    assert seconds < 1.0, seconds
    assert "10,000,000 variants" in err.message and f"at most {sweeps.MAX_VARIANTS:,}" in err.message
    assert err.location.line == 4  # vary:
    assert (study / "hyena-sg.mad").resolve() not in opened  # no spec read, no variant built


def test_the_variant_count_includes_every_spec_a_glob_names(tree, monkeypatch):
    study, _ = tree
    monkeypatch.setattr(sweeps, "MAX_VARIANTS", 3)
    err = refused(sweep_file(study, "hyena-sg.mad", "sub/*.mad", extra="vary:\n  dim: [64, 128]\n"))
    assert "4 variants (2 spec(s) x 2 dim)" in err.message and "at most 3" in err.message


def test_a_variant_past_the_layer_cap_is_refused_quickly_at_its_value(tree):
    study, _ = tree
    path = sweep_file(study, "hyena-sg.mad", extra="vary:\n  topology: ['(H:A)x2', '(H:A)x512']\n")
    start = time.perf_counter()
    err = refused(path)
    assert time.perf_counter() - start < 10  # accounting and planning it took minutes and GBs
    assert "expands to 2,048 layers" in err.message and f"at most {sweeps.MAX_VARIANT_LAYERS:,}" in err.message
    assert (err.location.line, err.location.column) == (5, 25), err.render()


def test_the_caps_pass_real_studies():
    """Every bundled spec is within the layer cap, and the paper protocol on a handful of specs
    is far within the run cap."""
    import glob

    deepest = max(sweeps.layer_count(load_spec(p)) for p in glob.glob(str(REPO / "specs/**/*.mad"), recursive=True))
    assert deepest * 3 <= sweeps.MAX_VARIANT_LAYERS
    assert 396 * 27 * 4 < sweeps.MAX_RUNS and 27 * 64 < sweeps.MAX_VARIANTS


def test_the_runs_of_a_plan_are_counted_and_capped_before_planning(tree, monkeypatch):
    from madsl.runner.plan.evaluation import cli_overrides

    study, _ = tree
    sweep = load_sweep(sweep_file(study, "bundled:paper/*-sg"))
    assert sweeps.check_planned_runs(sweep, cli_overrides(protocol="paper"), sweep.variants) == 13 * 396
    lrs = [i * 1e-5 for i in range(1, 300)]
    planned = []
    monkeypatch.setattr("madsl.runner.plan.evaluation.plan_spec", lambda *a, **k: planned.append(a) or _one_run())
    with pytest.raises(MadslError, match=r"plans 513,084 runs \(13 variants\); a plan holds at most 100,000"):
        sweeps.check_planned_runs(sweep, cli_overrides(protocol="paper", lr=lrs), sweep.variants)
    assert all(len(cli.lrs) == 1 for _, _, cli in planned)  # one lr planned per spec, the rest counted


def _one_run():
    class Plan:
        runs = [None] * 66  # the paper protocol's settings, planned with one lr, wd and seed

    return Plan()


def test_the_cli_refuses_a_sweep_past_the_run_cap_before_planning(tree, capsys):
    study, _ = tree
    lrs = ", ".join(str(i * 1e-6) for i in range(1, 800))  # x 66 settings x 2 wd = 105,468 runs
    path = sweep_file(study, "hyena-sg.mad", extra=f"train: {{lr: [{lrs}]}}\n", protocol="paper")
    start = time.perf_counter()
    assert main(["eval", str(path), "--dry-run", "--db", str(study / "r.db")]) == 2
    err = capsys.readouterr().err
    assert "a plan holds at most 100,000" in err and "Traceback" not in err
    assert time.perf_counter() - start < 30


def test_train_values_must_be_finite(tree):
    study, _ = tree
    err = refused(sweep_file(study, "hyena-sg.mad", extra="train: {lr: [inf]}\n"))
    assert "train.lr: expected a number" in err.message


# --- madsl check: exit 1 is a budget verdict, nothing else ---------------------------------------


@pytest.mark.parametrize("value", ["[Sg]", "{Sg: 1}", "[]", "{}", "1.5", "true"])
def test_check_of_a_wrong_typed_channel_mixer_exits_2_located(tmp_path, capsys, value):
    spec = tmp_path / "s.mad"
    spec.write_text(f"name: s\ndim: 64\ntopology: H:A\nchannel_mixer: {value}\nbudget: {{params: 1}}\n")
    for fmt in ("text", "json", "line"):
        assert main(["check", str(spec), "--format", fmt]) == 2
        out = capsys.readouterr()
        assert "Traceback" not in out.err and "channel_mixer must be a string or none" in out.out + out.err
        assert f"{spec}:4:16" in out.out + out.err or '"line": 4' in out.out


def test_a_failure_of_madsl_on_a_spec_is_exit_2_never_budget_violated(tmp_path, capsys, monkeypatch):
    import madsl.graph

    def broken(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(madsl.graph, "account", broken)
    assert main(["check", str(HYENA)]) == 2
    err = capsys.readouterr().err
    assert "madsl failed while checking" in err and "TypeError" in err and "Traceback" not in err


# --- integers in float notation, and canonical forms that parse back ----------------------------


@pytest.mark.parametrize(
    "text", ["H-Sg{inner=1e99}", "H-Sg{inner=1.0e99}", "H-Sg{inner=-1e99}", "H{filter_states=1e19}", "A{heads=9.3e18}"]
)
def test_an_integer_in_float_notation_keeps_the_integer_limit(text):
    with pytest.raises(MadslError, match="must be an integer of at most 9,223,372,036,854,775,807"):
        spec_from_topology(text)


def test_an_integer_parameter_in_yaml_float_notation_keeps_the_limit_and_check_exits_2(tmp_path, capsys):
    spec = tmp_path / "s.mad"
    # (PyYAML reads 1.0e99, without a sign, as a string)
    spec.write_text("name: s\ndim: 64\ntopology: H\nlayers:\n  Sg: {inner: 1.0e+99}\n")
    assert main(["check", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:5:15" in err and "must be an integer of at most" in err


@pytest.mark.parametrize(
    "written, canonical",
    [
        ("H-Sg{inner=1e3}", "H-Sg{inner=1000}"),
        ("H-Sg{inner=1.5e3}", "H-Sg{inner=1500}"),
        ("H-Sg{inner=2e3}", "H-Sg{inner=2000}"),
        ("A{heads=2.0}:A{heads=2}", "2A{heads=2}"),
        ("A{rotary_base=20000}", "A{rotary_base=20000.0}"),
        ("H-Sg{inner=9.2e18}", "H-Sg{inner=9200000000000000000}"),
    ],
)
def test_canonical_forms_parse_back_to_the_same_spec(tmp_path, written, canonical):
    spec = spec_from_topology(written, dim=64)
    assert spec.canonical() == canonical
    again = spec_from_topology(spec.canonical(), dim=64)
    assert again.identity() == spec.identity() and again.canonical() == spec.canonical()
    path = tmp_path / "s.mad"
    path.write_text(f"name: s\ndim: 64\ntopology: '{written}'\nlayers:\n  H: {{order: 3.0}}\n")
    from_file = load_spec(path)
    assert load_spec(path, overrides={"topology": from_file.canonical()}).identity() == from_file.identity()


# --- properties (Hypothesis, as tests/test_properties.py) ---------------------------------------

_TMP = tempfile.TemporaryDirectory(prefix="madsl-hostile-")  # removed when the test run ends
_ROOT = Path(_TMP.name)
_STUDY, _OUTSIDE = _ROOT / "study", _ROOT / "outside"
(_STUDY / "sub").mkdir(parents=True)
_OUTSIDE.mkdir()
(_STUDY / "a.mad").write_text("name: a\ndim: 32\ntopology: H:A\n")
(_STUDY / "sub" / "b.mad").write_text("name: b\ndim: 32\ntopology: Mb\n")
(_STUDY / "notes.yaml").write_text(f"token: {SECRET}\n")
(_OUTSIDE / "c.mad").write_text(f"name: {SECRET}\ndim: 32\ntopology: H\n")
(_STUDY / "out").symlink_to(_OUTSIDE)

segments = st.sampled_from(
    [
        "a.mad",
        "sub",
        "b.mad",
        "..",
        ".",
        "*",
        "*.mad",
        "?.mad",
        "[ab].mad",
        "**",
        "out",
        "outside",
        "c.mad",
        "notes.yaml",
        "study",
        "/",
        "~",
        "bundled:paper",
        "mamba",
        "*-sg",
        "x.yaml",
        "/proc",
        "cwd",
        str(_OUTSIDE),
    ]
)


@st.composite
def entries(draw) -> str:
    parts = draw(st.lists(segments, min_size=1, max_size=5))
    return "/".join(parts).replace("//", "/")


@settings(max_examples=80, **PROFILE)
@given(st.lists(entries(), min_size=1, max_size=3))
def test_any_specs_entry_reads_only_the_tree_or_is_refused_at_its_entry(listed):
    path = _STUDY / "study.yaml"
    path.write_text("specs:\n" + "".join(f"  - '{e}'\n" for e in listed))
    with files_opened() as opened:
        start = time.perf_counter()
        try:
            sweep = load_sweep(path)
        except MadslError as err:
            assert err.location.file == str(path) and err.location.line and err.location.line >= 2, err.render()
            assert SECRET not in err.render()
        else:
            assert sweep.variants
        assert time.perf_counter() - start < 10
    assert not [p for p in opened if p.is_relative_to(_OUTSIDE.resolve())], opened
    assert all(p.is_relative_to(_ROOT.resolve()) or p.is_relative_to(REPO) for p in opened), opened


@settings(max_examples=40, **PROFILE)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 2))
def test_the_variant_cap_is_exact_and_refuses_before_any_spec_is_read(sizes, specs):
    path = _STUDY / "study.yaml"
    # norm first: its values are not norms, so the first variant is refused at once where the count passes
    axes = ["norm", "dim", "seq_len", "vocab", "tie_embeddings", "channel_mixer", "topology", "layers.H.order"]
    vary = "".join(f"  {axis}: [{', '.join(str(900 + i) for i in range(n))}]\n" for axis, n in zip(axes, sizes))
    path.write_text("specs: [a.mad" + (", sub/b.mad" if specs == 2 else "") + "]\nvary:\n" + vary)
    count = specs
    for n in sizes:
        count *= n
    with files_opened() as opened:
        try:
            load_sweep(path)
        except MadslError as err:
            if count > sweeps.MAX_VARIANTS:  # counted per spec first (before the glob), then in all
                per_spec = count // specs
                assert f"{per_spec if per_spec > sweeps.MAX_VARIANTS else count:,} variants" in err.message
                assert (_STUDY / "a.mad").resolve() not in opened
                return
            assert "at most" not in err.message or "variants" not in err.message, err.message
            return
    assert count <= sweeps.MAX_VARIANTS


def _integer_notation(value: int, form: str) -> str:
    return {"int": str(value), "dot": f"{value}.0", "exp": f"{value:e}".replace("+", ""), "big": f"{value}e0"}[form]


@settings(max_examples=60, **PROFILE)
@given(
    st.sampled_from([("H-Sg", "inner"), ("A", "heads"), ("H", "filter_states"), ("Mb", "d_state")]),
    st.one_of(st.integers(1, 4096), st.integers(2**62, 2**64), st.sampled_from([10**99, 10**30, 2**63])),
    st.sampled_from(["int", "dot", "exp", "big"]),
)
def test_integer_parameters_in_any_notation_are_refused_or_print_a_canonical_form_that_parses_back(layer, value, form):
    symbol, param = layer
    text = f"{symbol}{{{param}={_integer_notation(value, form)}}}"
    try:
        spec = spec_from_topology(text, dim=64)
    except MadslError as err:
        err.render()
        return
    printed = spec.canonical()
    again = spec_from_topology(printed, dim=64)
    assert again.identity() == spec.identity() and again.canonical() == printed, (text, printed)


def test_check_refuses_a_symlinked_spec_found_in_a_folder_or_glob(tmp_path, capsys):
    """`madsl check specs/` in a pull request: a found `evil.mad -> /etc/passwd` is refused by name,
    not read (its first line used to be printed in the error)."""
    from madsl.cli import main

    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "ok.mad").write_text("name: ok\ntopology: H-Sg\ndim: 32\n")
    secret = tmp_path / "secret.yaml"
    secret.write_text("password: hunter2\n")
    (folder / "evil.mad").symlink_to(secret)
    for item in (str(folder), str(folder / "*.mad")):
        assert main(["check", item]) == 2
        err = capsys.readouterr().err
        assert "evil.mad: a symbolic link that leads out of" in err and "hunter2" not in err
        assert "Traceback" not in err
    (folder / "evil.mad").unlink()
    (folder / "inner.mad").symlink_to(folder / "ok.mad")  # a link inside the folder is fine
    assert main(["check", str(folder), "-q"]) == 0
