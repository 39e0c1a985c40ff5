"""A spec's `init:` (issue 42): layers that start from a saved model's weights, frozen or not.

The saved models are made here (madsl.compiler.save of a compiled spec); the checks: weights
copied use by use with their norms, located errors for every bad entry (nothing copied), the
identity by the weights' bytes, frozen counts equal in the accounting and the model, and a run
that trains only what is not frozen (frozen tensors bit-identical after `madsl eval`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import madsl
from madsl.cli import main
from madsl.compiler import compile_spec, save
from madsl.errors import MadslError
from madsl.graph import account
from madsl.lang.spec import load_spec, spec_from_data
from madsl.weights.init import frozen_parameters

torch.set_num_threads(1)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _saved(folder: Path, topology: str = "(Mb:A)x2", dim: int = 16, seed: int = 3, name: str = "backbone"):
    """A saved model (compiled with `seed`) in folder/name, and the model itself."""
    source = _write(folder, f"{name}.mad", f"name: {name}\ndim: {dim}\ntopology: '{topology}'\n")
    model = compile_spec(source, vocab_size=16, seed=seed)
    save(model, folder / name)
    return model


HYBRID = """name: hybrid
dim: 16
topology: '(Mb | A){{split=res, combine=res}} : Mb : A'
init:
  - from: backbone
    layers: {layers}
    freeze: {freeze}
"""


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_each_use_takes_the_saved_uses_weights_and_frozen_ones_do_not_train(tmp_path):
    saved = _saved(tmp_path)
    spec = _write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb, embedding]", freeze="true"))
    model = compile_spec(spec, vocab_size=16, seed=0)
    fresh = compile_spec(spec_from_data({**load_spec(spec).data, "init": []}), vocab_size=16, seed=0)
    for mine, theirs in zip(model.named_layers["Mb"], saved.named_layers["Mb"]):
        assert _same(mine, theirs) and not any(p.requires_grad for p in mine.parameters())
    assert torch.equal(model.embedding.weight, saved.embedding.weight)
    # the second use has a pre-norm of its own in both models: it comes along, and freezes
    norms = [m.norm for m in model.modules() if getattr(m, "layer", None) is model.named_layers["Mb"][1]]
    assert norms and not any(p.requires_grad for p in norms[0].parameters())
    for mine, theirs in zip(model.named_layers["A"], fresh.named_layers["A"]):  # the rest: the seed's init
        assert _same(mine, theirs) and all(p.requires_grad for p in mine.parameters())
    assert frozen_parameters(model) == account(load_spec(spec), vocab=16).totals["frozen_params"] > 0


@pytest.mark.parametrize(
    "topology, layers",
    [
        ("(Mb:A)x2", "[Mb, A]"),
        ("Mb#a : A : Mb#a : A", "['#a', embedding]"),
        ("[Mb | A] : Mb : A", "[Mb, Sg]"),
        ("(2Mb | A:A){split=gated, combine=gated}", "[Mb]"),
    ],
)
def test_the_accounting_counts_what_the_model_freezes(tmp_path, topology, layers):
    _saved(tmp_path, topology)
    spec = _write(
        tmp_path,
        "s.mad",
        f"name: s\ndim: 16\ntopology: '{topology}'\n"
        f"init:\n  - from: backbone\n    layers: {layers}\n    freeze: true\n",
    )
    totals = account(load_spec(spec), vocab=16).totals
    model = compile_spec(spec, vocab_size=16)
    assert totals["frozen_params"] == frozen_parameters(model) > 0
    assert totals["trainable_params"] == totals["params"] - totals["frozen_params"]


def test_initialised_but_not_frozen_layers_train_and_count_as_trainable(tmp_path):
    saved = _saved(tmp_path)
    spec = _write(tmp_path, "hybrid.mad", HYBRID.format(layers="Mb", freeze="false"))
    model = compile_spec(spec, vocab_size=16)
    assert all(_same(m, s) for m, s in zip(model.named_layers["Mb"], saved.named_layers["Mb"]))
    assert frozen_parameters(model) == 0 and "frozen_params" not in account(load_spec(spec)).totals


def test_the_identity_follows_the_weights_bytes_not_the_folder(tmp_path):
    _saved(tmp_path)
    spec = _write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb]", freeze="true"))
    first = load_spec(spec).hash
    (tmp_path / "elsewhere").mkdir()
    os.rename(tmp_path / "backbone", tmp_path / "elsewhere" / "backbone")
    moved = _write(
        tmp_path, "moved.mad", HYBRID.format(layers="[Mb]", freeze="true").replace("backbone", "elsewhere/backbone")
    )
    assert load_spec(moved).hash == first
    thawed = _write(
        tmp_path, "thawed.mad", HYBRID.format(layers="[Mb]", freeze="false").replace("backbone", "elsewhere/backbone")
    )
    assert load_spec(thawed).hash != first  # freezing changes what trains
    _saved(tmp_path / "elsewhere", seed=4)  # other weights at the same path
    assert load_spec(moved).hash != first
    scratch = _write(
        tmp_path, "scratch.mad", "name: hybrid\ndim: 16\ntopology: '(Mb | A){split=res, combine=res} : Mb : A'\n"
    )
    assert "init" not in load_spec(scratch).identity()  # specs without init keep their identities


@pytest.mark.parametrize(
    "entry, message",
    [
        ("{from: backbone, layers: [Mbb]}", "the spec has no layer 'Mbb' to initialise"),
        ("{from: backbone, layers: [Mb], frozen: true}", "unknown key 'frozen'"),
        ("{layers: [Mb]}", "missing 'from'"),
        ("{from: /etc, layers: [Mb]}", "may not name an absolute path"),
        ("{from: ../outside, layers: [Mb]}", "may not leave this spec's directory"),
        ("{from: backbone, layers: [Mb], freeze: yes please}", "freeze must be true or false"),
        ("{from: backbone, layers: []}", "layers must list names"),
    ],
)
def test_a_bad_entry_is_a_located_error(tmp_path, entry, message):
    home = tmp_path / "specs"
    home.mkdir()
    (home / "empty").mkdir()
    (tmp_path / "outside").mkdir()
    _saved(home)
    spec = _write(home, "bad.mad", f"name: bad\ndim: 16\ntopology: '(Mb:A)x2'\ninit:\n  - {entry}\n")
    with pytest.raises(MadslError, match=message) as err:
        load_spec(spec)
    assert err.value.location.file == str(spec) and err.value.location.line in (5, 6)


def test_a_folder_without_the_weights_is_an_error_where_they_are_read_not_for_the_accounting(tmp_path):
    (tmp_path / "empty").mkdir()
    spec = _write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb]", freeze="true").replace("backbone", "empty"))
    loaded = load_spec(spec)  # a CI gate accounts it without the weights
    assert account(loaded, vocab=16).totals["frozen_params"] > 0
    for read in (lambda: compile_spec(loaded, vocab_size=16), lambda: loaded.hash):
        with pytest.raises(MadslError, match=r"init\[0\]\.from: empty holds no config\.json") as err:
            read()
        assert err.value.location.line == 5


def test_a_mismatch_with_the_saved_model_names_the_layer_and_tensor(tmp_path):
    _saved(tmp_path, dim=32)  # twice as wide
    spec = _write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb]", freeze="true"))
    with pytest.raises(MadslError, match=r"init\[0\]: Mb \(use 1[^)]*\): tensor '[A-Za-z_.]+' is \[") as err:
        compile_spec(spec, vocab_size=16)
    assert err.value.location.line == 5
    _saved(tmp_path, topology="Mb:A")  # one use of Mb where the spec has two
    with pytest.raises(MadslError, match="the spec uses Mb 2 time.s., the saved model only 1"):
        compile_spec(spec, vocab_size=16)


def test_a_spec_with_fewer_uses_takes_the_saved_models_first_ones(tmp_path):
    saved = _saved(tmp_path, topology="(Mb:A)x3")  # three uses of Mb; the spec has two
    model = compile_spec(_write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb]", freeze="true")), vocab_size=16)
    assert [_same(mine, saved.named_layers["Mb"][k]) for k, mine in enumerate(model.named_layers["Mb"])] == [True] * 2


def test_a_link_out_of_the_saved_models_folder_is_refused(tmp_path):
    _saved(tmp_path)
    secret = tmp_path / "secret.safetensors"
    os.replace(tmp_path / "backbone" / "model.safetensors", secret)
    (tmp_path / "home").mkdir()
    os.replace(tmp_path / "backbone", tmp_path / "home" / "backbone")
    (tmp_path / "home" / "backbone" / "model.safetensors").symlink_to(secret)
    spec = _write(tmp_path / "home", "hybrid.mad", HYBRID.format(layers="[Mb]", freeze="true"))
    with pytest.raises(MadslError, match="model.safetensors"):
        compile_spec(load_spec(spec), vocab_size=16)


def test_data_without_a_file_cannot_name_weights(tmp_path):
    _saved(tmp_path)
    data = load_spec(_write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb]", freeze="true"))).data
    with pytest.raises(MadslError, match="only a spec file may"):
        spec_from_data(data)


def test_a_saved_model_of_an_initialised_spec_loads_without_its_init(tmp_path):
    _saved(tmp_path)
    model = compile_spec(_write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb]", freeze="true")), vocab_size=16)
    save(model, tmp_path / "out")
    assert "init" not in json.loads((tmp_path / "out" / "config.json").read_text())["spec"]
    assert _same(madsl.compiler.load(tmp_path / "out"), model)


def test_eval_trains_only_what_is_not_frozen(tmp_path, capsys):
    saved = _saved(tmp_path)
    spec = _write(tmp_path, "hybrid.mad", HYBRID.format(layers="[Mb, embedding]", freeze="true"))
    db = tmp_path / "results.db"
    tiny = ["--task", "in-context-recall", "--protocol", "smoke", "--epochs", "2", "--batch-size", "8"]
    tiny += ["--set", "seq_len=32", "--set", "num_train_examples=32", "--set", "num_test_examples=16"]
    assert main(["eval", str(spec), *tiny, "--db", str(db), "--keep", "best", "--format", "json"]) == 0
    [run_id] = json.loads(capsys.readouterr().out)["run_ids"]
    assert main(["export", run_id[:12], "-o", str(tmp_path / "run"), "--db", str(db)]) == 0
    trained = madsl.load_run(tmp_path / "run").backbone
    for mine, theirs in zip(trained.named_layers["Mb"], saved.named_layers["Mb"]):
        assert _same(mine, theirs)  # frozen: bit for bit the saved weights
    assert torch.equal(trained.embedding.weight, saved.embedding.weight)
    untrained = compile_spec(spec, vocab_size=trained.vocab_size, max_seq_len=trained.max_seq_len, seed=0)
    assert not all(_same(a, b) for a, b in zip(trained.named_layers["A"], untrained.named_layers["A"]))


def test_a_hugging_face_checkpoints_layers_frozen_in_a_hybrid(tmp_path, capsys):
    """docs/weights.md's recipe: import a checkpoint, write a hybrid that extends its spec with
    other layers between its own, start those from the checkpoint frozen, and train the rest."""
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_checkpoints import lfm2

    lfm2(tmp_path / "ckpt")
    assert (
        main(
            [
                "import",
                str(tmp_path / "ckpt"),
                "-o",
                str(tmp_path / "lfm2.mad"),
                "--out",
                str(tmp_path / "backbone"),
                "-q",
            ]
        )
        == 0
    )
    hybrid = _write(
        tmp_path,
        "hybrid.mad",
        "extends: lfm2.mad\nname: lfm2-convs-with-mamba\ntopology: (GConv-Sg:Mb-Sg)x2\n"
        "init:\n  - from: backbone\n    layers: [GConv]\n    freeze: true\n",
    )
    saved = madsl.compiler.load(tmp_path / "backbone")
    db = tmp_path / "results.db"
    tiny = ["--task", "in-context-recall", "--protocol", "smoke", "--epochs", "2", "--batch-size", "8"]
    tiny += ["--set", "seq_len=32", "--set", "num_train_examples=32", "--set", "num_test_examples=16"]
    capsys.readouterr()
    assert main(["eval", str(hybrid), *tiny, "--db", str(db), "--keep", "best", "--format", "json"]) == 0
    [run_id] = json.loads(capsys.readouterr().out)["run_ids"]
    assert main(["export", run_id[:12], "-o", str(tmp_path / "run"), "--db", str(db)]) == 0
    trained = madsl.load_run(tmp_path / "run").backbone
    for mine, theirs in zip(trained.named_layers["GConv"], saved.named_layers["GConv"]):
        assert _same(mine, theirs)  # the checkpoint's convolutions, with their norms, as imported
    assert account(load_spec(hybrid)).totals["frozen_params"] == 2 * 4224  # two GConv uses with their norms
