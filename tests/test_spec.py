"""Spec files: schema, extends, symbols, overrides, and located errors for bad input."""

import random
from pathlib import Path

import pytest

from madsl import account, load_spec
from madsl.errors import MadslError

GOOD = """\
name: test
dim: 128
topology: (H-MoE:mA-MoE)
layers:
  mA: {heads: 16, head_dim: 8}
budget:
  fixed_state: 2048
"""


def write(tmp_path: Path, text: str, name: str = "spec.mad") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path, text) -> MadslError:
    with pytest.raises(MadslError) as info:
        spec = load_spec(write(tmp_path, text))
        account(spec)
    return info.value


def test_good_spec_loads(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.name == "test" and spec.dim == 128
    assert account(spec).totals["fixed_state"] == 2048


@pytest.mark.parametrize(
    "text,message,line,column",
    [
        ("name: x\ndim: 128\ntopology: (Hy:A)x2\n", "unknown layer 'Hy'", 3, 12),
        ("name: x\ndim: 128\ntopology: '(H:Ax)x2'\n", "unknown layer 'Ax'", 3, 15),
        ("name: x\ndim: 128\ntopology: (H:A)x0\n", "at least 1", 3, 17),
        ("name: x\ndim: 128\ntopolgy: H\n", "unknown key 'topolgy'", 3, 1),
        ("name: x\ndim: 128\n", "missing required key 'topology'", 1, 1),
        ("name: x\ndim: -4\ntopology: H\n", "dim must be a positive integer", 2, 6),
        ("name: x\ndim: wide\ntopology: H\n", "dim must be an integer", 2, 6),
        ("name: x\ndim: 128\ntopology: Sg\n", "channel mixer", 3, 11),
        ("name: x\ndim: 128\ntopology: H-mA\n", "after '-' comes a channel mixer", 3, 13),
        ("name: x\ndim: 128\ntopology: A{heads=3}\n", "does not divide", 3, 19),
        ("name: x\ndim: 128\ntopology: A{hedas=4}\n", "no parameter 'hedas'", 3, 13),
        ("name: x\ndim: 128\ntopology: A\nlayers:\n  A: {heads: 3}\n", "does not divide", 5, 14),
        ("name: x\ndim: 128\ntopology: A\nlayers:\n  A: {heads: four}\n", "must be an int", 5, 14),
        ("name: x\ndim: 128\ntopology: A\nlayers:\n  A: {hedas: 4}\n", "no parameter 'hedas'", 5, 7),
        ("name: x\ndim: 128\ntopology: X\nlayers:\n  X: {heads: 4}\n", "needs `primitive:` or `base:`", 5, 3),
        ("name: x\ndim: 128\ntopology: X\nlayers:\n  X: {primitive: atention}\n", "unknown primitive", 5, 18),
        ("name: x\ndim: 128\ntopology: H\nbudget:\n  fixed_sate: 4096\n", "unknown budget", 5, 3),
        ("name: x\ndim: 128\ntopology: H\nbudget:\n  params: lots\n", "budget.params", 5, 11),
        ("name: x\ndim: 128\ntopology: H\nnorm: batch\n", "norm must be one of", 4, 7),
        ("name: x\ndim: 128\ndim: 64\ntopology: H\n", "duplicate key 'dim'", 3, 1),
        ("name: x\ndim: 128\ntopology: H#a:A:H#a{order=3}\n", "tag #a is used for different layers", 3, 17),
        ("name: x\n dim: 128\ntopology: H\n", "invalid YAML", 2, 5),
        ("name: x\ndim: 128\ntopology: H\nchannel_mixer: Sgg\n", "unknown channel mixer", 4, 16),
        ("name: x\ndim: 128\ntopology: He{expert_width=8}\n", "must equal dim", 3, 27),
        ("- a\n- b\n", "a spec must be a YAML mapping", 1, 1),
        # symbols under layers: that the topology does not use are checked too
        ("name: x\ndim: 128\ntopology: H\nlayers:\n  Mb: {d_state: 0}\n", "layers.Mb: mamba: d_state", 5, 17),
        ("name: x\ndim: 128\ntopology: H\nlayers:\n  A: {heads: 3}\n", "does not divide", 5, 14),
        ("name: x\ndim: 128\ntopology: H-none{x=1}\n", "none (no channel mixer) takes no parameters", 3, 18),
        ("name: x\ndim: 128\ntopology: H-none#a\n", "none (no channel mixer) takes no tag", 3, 13),
    ],
)
def test_bad_specs_give_located_errors(tmp_path, text, message, line, column):
    err = error_of(tmp_path, text)
    assert message in err.message, err.render()
    assert err.location.file.endswith("spec.mad")
    assert (err.location.line, err.location.column) == (line, column), err.render()
    assert err.location.source_line is not None
    assert "^" in err.render()


def test_errors_inside_a_topology_also_give_the_column_in_the_string(tmp_path):
    err = error_of(tmp_path, "name: x\ndim: 128\ntopology: (H:Ax)x2\n")
    assert err.location.topology_column == 4 and "column 4 of the topology" in err.render()


def test_did_you_mean(tmp_path):
    assert "did you mean 'H'" in error_of(tmp_path, "name: x\ndim: 128\ntopology: Hy:A\n").render()
    assert "did you mean 'topology'" in error_of(tmp_path, "name: x\ndim: 128\ntopolgy: H\n").render()
    assert "did you mean 'heads'" in error_of(tmp_path, "name: x\ndim: 128\ntopology: A{hedas=2}\n").render()


def test_extends_merges_layers_and_locates_errors_in_the_right_file(tmp_path):
    write(tmp_path, "name: base\ndim: 128\ntopology: (H:A)x2\nlayers:\n  A: {heads: 4}\n", "base.mad")
    child = write(tmp_path, "name: child\nextends: base.mad\nlayers:\n  A: {bias: true}\n", "child.mad")
    spec = load_spec(child)
    assert spec.name == "child" and spec.symbols["A"].params["heads"] == 4 and spec.symbols["A"].params["bias"]
    write(tmp_path, "name: bad\nextends: base.mad\ntopology: (H:Q)x2\n", "bad.mad")
    with pytest.raises(MadslError) as info:
        load_spec(tmp_path / "bad.mad")
    assert info.value.location.file.endswith("bad.mad") and info.value.location.line == 3


def test_extends_cycle_and_missing(tmp_path):
    write(tmp_path, "name: a\nextends: b.mad\n", "a.mad")
    write(tmp_path, "name: b\nextends: a.mad\n", "b.mad")
    with pytest.raises(MadslError, match="cycle"):
        load_spec(tmp_path / "a.mad")
    write(tmp_path, "name: c\nextends: nope.mad\n", "c.mad")
    with pytest.raises(MadslError, match="does not exist"):
        load_spec(tmp_path / "c.mad")


def test_new_symbols_by_primitive_and_base(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            "name: x\ndim: 64\ntopology: Big:Wide\nlayers:\n"
            "  Big: {primitive: attention, heads: 2}\n  Wide: {base: Big, heads: 4}\n",
        )
    )
    rows = account(spec).layers
    assert [r.config["heads"] for r in rows if r.role == "sequence"] == [2, 4]


def test_default_channel_mixer_and_mamba_takes_none(tmp_path):
    spec = load_spec(write(tmp_path, "name: x\ndim: 128\ntopology: H:Mb\n"))
    assert [r.symbol for r in account(spec).layers] == ["H", "Sg", "Mb"]
    spec = load_spec(write(tmp_path, "name: x\ndim: 128\ntopology: H:A-MoE\nchannel_mixer: none\n"))
    assert [r.symbol for r in account(spec).layers] == ["H", "A", "MoE"]
    assert spec.canonical() == "H:A-MoE"
    assert load_spec(write(tmp_path, "name: x\ndim: 128\ntopology: H-Sg:H\n")).canonical() == "2H"


VALID_FOR_FUZZ = """\
name: fuzz
dim: 128
topology: (2H-Sg:[mA | Mb]:A{heads=4})x2
layers:
  A: {heads: 16, head_dim: 8}
budget:
  params: 2M ± 50%
  fixed_state: {max: 100000}
"""


def test_hundreds_of_malformed_specs_never_crash(tmp_path):
    """Random edits of a valid spec: each either loads or gives a located MadslError; nothing else escapes."""
    rng = random.Random(0)
    alphabet = "():[]{}|#-=,xX×0123456789 \nHAMbSgoe'\"%±k"
    located = 0
    for i in range(400):
        chars = list(VALID_FOR_FUZZ)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(chars))
            op = rng.random()
            if op < 0.4:
                del chars[pos]
            elif op < 0.7:
                chars.insert(pos, rng.choice(alphabet))
            else:
                chars[pos] = rng.choice(alphabet)
        path = write(tmp_path, "".join(chars), f"fuzz{i}.mad")
        try:
            account(load_spec(path))
        except MadslError as err:
            assert err.location.file == str(path), err.render()
            assert err.location.line is not None, err.render()
            located += 1
    assert located > 100


def test_hundreds_of_malformed_topologies_never_crash():
    """Random strings over the topology alphabet: each parses and accounts, or gives a located MadslError."""
    from madsl import spec_from_topology

    rng = random.Random(1)
    tokens = [
        "H",
        "A",
        "mA",
        "Mb",
        "Sg",
        "MoE",
        "Hy",
        "(",
        ")",
        "[",
        "]",
        "|",
        ":",
        "-",
        "x",
        "×",
        "2",
        "0",
        "12",
        "{",
        "}",
        "=",
        ",",
        "heads",
        "residual",
        "gated",
        "#",
        "a",
        " ",
        "none",
        "4.5",
        "'s'",
        "*",
    ]
    failures = 0
    for _ in range(500):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 12)))
        try:
            account(spec_from_topology(text, dim=64))
        except MadslError as err:
            assert err.location.line is not None and err.location.column is not None, (text, err.render())
            assert "^" in err.render()
            failures += 1
    assert failures > 300


@pytest.mark.parametrize("style", ["|", ">"])
def test_errors_inside_block_scalar_topologies_point_into_the_file(tmp_path, style):
    err = error_of(tmp_path, f"name: x\ndim: 128\ntopology: {style}\n  (H:A)x2\n  :Hy\n")
    assert (err.location.line, err.location.column) == (5, 4), err.render()


def test_errors_in_a_topology_inherited_through_extends_point_into_the_parent_block_scalar(tmp_path):
    write(tmp_path, "name: base\ndim: 128\ntopology: >\n  (H:A)x2 :\n  H : Hy\n", "base.mad")
    err = error_of(tmp_path, "name: child\nextends: base.mad\n")
    assert err.location.file.endswith("base.mad") and (err.location.line, err.location.column) == (5, 7), err.render()
    assert err.location.source_line == "  H : Hy"


def test_yaml_anchors_and_merge_keys_load_and_locate_like_safe_load(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            "name: x\ndim: 128\ntopology: A:Wide\nlayers:\n  A: &att {heads: 4}\n"
            "  Wide: {<<: *att, primitive: attention, heads: 8}\n",
        )
    )
    assert spec.symbols["A"].params["heads"] == 4 and spec.symbols["Wide"].params["heads"] == 8
    err = error_of(
        tmp_path,
        "name: x\ndim: 128\ntopology: A\nlayers:\n  A: &att {heads: 4}\n"
        "  B: {<<: *att, heads: 3, primitive: attention}\n  C: {base: B}\ntopology: B\n",
    )
    assert "duplicate key 'topology'" in err.message and err.location.line == 8


def test_a_list_as_a_mapping_key_is_a_located_error(tmp_path):
    err = error_of(tmp_path, "name: x\ndim: 128\ntopology: H\n? [a, b]\n: 1\n")
    assert "a key must be a plain value" in err.message and (err.location.line, err.location.column) == (4, 3)


def test_unquoted_parallel_topology_gets_a_quoting_hint(tmp_path):
    err = error_of(tmp_path, "name: x\ndim: 128\ntopology: [H | mA]\n")
    assert "quote the topology" in err.render()


# --- what extends: may name (docs/language.md, "extends") --------------------------------


def extends_error(tmp_path, ref: str) -> MadslError:
    err = error_of(tmp_path, f"name: x\nextends: {ref}\n")
    assert err.location.file.endswith("spec.mad") and (err.location.line, err.location.column) == (2, 10), err.render()
    return err


@pytest.mark.parametrize("ref", ["/etc/passwd", "../../../../../../../etc/passwd", "~/base.mad"])
def test_extends_refuses_absolute_paths_and_escapes_without_echoing_the_file(tmp_path, ref):
    err = extends_error(tmp_path, ref)
    assert "root:" not in err.render() and "expected: a relative path" in err.render()


def test_extends_refuses_a_symlink_that_leads_out_of_the_spec_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write(outside, "name: secret\ndim: 64\ntopology: H\n", "secret.mad")
    inside = tmp_path / "specs"
    inside.mkdir()
    (inside / "base.mad").symlink_to(outside / "secret.mad")
    err = error_of(inside, "name: x\nextends: base.mad\n")
    assert "may not leave this spec's directory" in err.message and "name: secret" not in err.render()
    assert "MADSL_SPEC_ROOT" in err.render()


def test_extends_refuses_a_file_that_is_not_a_spec_without_printing_it(tmp_path):
    (tmp_path / "notes.txt").write_text("password: hunter2\n")
    assert "must name a spec file" in extends_error(tmp_path, "notes.txt").message
    (tmp_path / "list.yaml").write_text("- password\n- hunter2\n")
    err = extends_error(tmp_path, "list.yaml")
    assert "not a spec" in err.message and "hunter2" not in err.render()


def test_extends_inside_the_tree_and_inside_madsl_spec_root_works(tmp_path, monkeypatch):
    write(tmp_path, "name: base\ndim: 64\ntopology: H:A\n", "base.mad")
    (tmp_path / "exp" / "deep").mkdir(parents=True)
    write(tmp_path / "exp", "name: mid\nextends: deep/../../exp/deep/leaf.mad\n", "mid.mad")
    write(tmp_path / "exp" / "deep", "name: leaf\ndim: 32\ntopology: H\n", "leaf.mad")
    assert load_spec(tmp_path / "exp" / "mid.mad").dim == 32  # '..' that stays inside is fine
    child = write(tmp_path / "exp", "name: child\nextends: ../base.mad\n", "child.mad")
    with pytest.raises(MadslError, match="may not leave"):
        load_spec(child)
    monkeypatch.setenv("MADSL_SPEC_ROOT", str(tmp_path))
    assert load_spec(child).canonical() == "H:A"


def test_extends_a_bundled_spec_by_name(tmp_path):
    spec = load_spec(write(tmp_path, "name: mine\nextends: bundled:paper/mamba\nseq_len: 64\n"))
    assert spec.canonical() == load_spec("specs/paper/mamba.mad").canonical() and spec.seq_len == 64
    # a bundled spec that itself extends a sibling (topologies/*.mad extend base-750m.mad)
    assert load_spec(write(tmp_path, "name: t\nextends: bundled:topologies/d1-4h-4a-x3\n")).dim == 1536
    err = extends_error(tmp_path, "bundled:paper/mambo")
    assert "did you mean 'paper/mamba'" in err.render()
    assert "no bundled spec" in extends_error(tmp_path, "bundled:../../etc/passwd").message


def test_checking_a_file_that_is_not_a_spec_does_not_print_it(tmp_path):
    (tmp_path / "notes.txt").write_text("password hunter2\n")
    with pytest.raises(MadslError) as info:
        load_spec(tmp_path / "notes.txt")
    assert "not a spec file" in info.value.message and "hunter2" not in info.value.render()


def test_a_number_spelled_as_int_or_float_is_one_model_and_one_identity():
    """`heads=2.0` builds the model `heads=2` builds (the primitive reads the int 2), so both are one
    canonical form and one spec identity (one set of run ids); a float parameter written as an
    integer likewise. Bundled specs write the primitive's own types and keep their identities."""
    from madsl.spec import spec_from_data, spec_from_topology

    for written, read in (
        ("A{heads=2.0}", "A{heads=2}"),
        ("A{rotary_base=20000}", "A{rotary_base=20000.0}"),
        ("(A){linear_std=1}", "(A){linear_std=1.0}"),
    ):
        assert spec_from_topology(written).canonical() == read
        assert spec_from_topology(written).identity_text == spec_from_topology(read).identity_text
    as_float = spec_from_data({"name": "a", "dim": 128, "topology": "A", "layers": {"A": {"heads": 2.0}}})
    as_int = spec_from_data({"name": "a", "dim": 128, "topology": "A", "layers": {"A": {"heads": 2}}})
    assert as_float.identity_text == as_int.identity_text


BUNDLED_SPECS = sorted((Path(__file__).resolve().parents[1] / "specs").glob("**/*.mad"))


def test_spec_hash_is_the_hash_the_results_store_has_always_filed_runs_under():
    """`Spec.hash` is the SHA-256 of `Spec.identity()` as canonical JSON (keys sorted, no spaces):
    bit for bit what the runner computed before the hash moved into the language
    (`sha256(canonical_json(spec.identity()))`), for every bundled spec, so no stored run moves."""
    import hashlib
    import json

    assert len(BUNDLED_SPECS) > 100
    for path in BUNDLED_SPECS:
        spec = load_spec(path)
        before = json.dumps(spec.identity(), sort_keys=True, separators=(",", ":"))
        assert spec.identity_text == before, path
        assert spec.hash == hashlib.sha256(before.encode()).hexdigest(), path
    renamed = load_spec(BUNDLED_SPECS[0], overrides={"name": "another", "description": "renamed"})
    assert renamed.hash == load_spec(BUNDLED_SPECS[0]).hash  # the name is not part of the model
