"""Specs compile to torch models whose parameter counts equal the accounting, and that train."""

import glob
import math
import subprocess
import sys

import pytest
import torch

import madsl
from madsl.compiler import load, save
from madsl.lang import stdlib

torch.set_num_threads(1)

PAPER_SPECS = sorted(glob.glob("specs/paper/*.mad"))


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("path", PAPER_SPECS)
def test_every_paper_spec_compiles_with_exact_parameter_parity(path):
    spec = madsl.load_spec(path)
    model = madsl.compile(spec, vocab_size=16, max_seq_len=64)
    assert n_params(model) == madsl.account(spec, vocab=16).totals["params"]
    logits = model(torch.randint(0, 16, (2, 32)))
    assert logits.shape == (2, 32, 16) and torch.isfinite(logits).all()


def test_the_model_is_built_from_the_plan_the_accounting_reads():
    """One plan: the compiler builds each layer from the primitive its graph node holds."""
    from madsl.graph import account_plan, layer_nodes

    spec = madsl.spec_from_topology("(H#a:A)x2:[H | mA]:(Mb:Mb){residual=gated}", dim=32)
    model = madsl.compile(spec, vocab_size=8)
    assert account_plan(spec, model.plan).totals["params"] == n_params(model)
    built = [id(m) for modules in model.named_layers.values() for m in modules]
    nodes = layer_nodes(model.plan)  # 4 + 4 Sg, H + mA + Sg, 2 Mb
    assert len(nodes) == 13 and len(set(built)) == 13 - sum(n["row"].shared for n in nodes) == 12


@pytest.mark.parametrize(
    "topology",
    [
        "A",
        "mA",
        "H",
        "mH",
        "He",
        "Mb",
        "Alg",
        "mAlg",
        "H-MoE",
        "A{heads=4,bias=true}",
        "Mb{bias=true,conv_bias=true}",
        "H{order=3}",
        'H{filter="hyena"}',
        "[H | mA]-Sg",
        "H#a:A:H#a",
        "(A:2Mb){residual=gated}",
        "(A:Mb){residual=add}",
        "A-none",
        "Alg{key_dim=16}",
        "mH{filter=hyena}",
        # a tag used as a parallel branch and as a block's own mixer: one layer; the block's part has its own norm
        "[H#a | A]:H#a",
        "H#a:[H#a | A]",
        "[A | H#a]-Sg:H#a-Sg:H#a",
    ],
)
def test_parameter_parity_for_every_primitive_and_form(topology):
    spec = madsl.spec_from_topology(topology, dim=64 if "He" not in topology else 128)
    model = madsl.compile(spec, vocab_size=11)
    assert n_params(model) == madsl.account(spec, vocab=11).totals["params"]
    assert model(torch.randint(0, 11, (1, 17))).shape == (1, 17, 11)


def test_untied_head_and_layernorm_parity(tmp_path):
    path = tmp_path / "s.mad"
    path.write_text("name: s\ndim: 32\ntopology: (H:A)x2\ntie_embeddings: false\nnorm: layer\nvocab: 20\n")
    spec = madsl.load_spec(path)
    assert n_params(madsl.compile(spec)) == madsl.account(spec).totals["params"]


def test_shared_tags_are_one_module():
    model = madsl.compile(madsl.spec_from_topology("H#a:A:H#a", dim=32), vocab_size=8)
    blocks = list(model.body)
    assert blocks[0].mixer is blocks[2].mixer


def test_a_tag_shared_by_a_parallel_branch_and_a_blocks_mixer_shares_the_layer_not_the_blocks_norm():
    model = madsl.compile(madsl.spec_from_topology("[H#a | A]:H#a:H#a", dim=32), vocab_size=8)
    parallel, alone, again = (block.mixer for block in model.body)
    assert parallel.branches[0] is alone.layer is again.layer  # one Hyena, its weights shared
    assert alone is again and alone.norm is not parallel.norm  # the standalone uses share their own pre-norm


def test_initialisation_is_deterministic_in_the_seed():
    spec = madsl.spec_from_topology("H:mA", dim=32)
    a, b = madsl.compile(spec, vocab_size=8, seed=3), madsl.compile(spec, vocab_size=8, seed=3)
    c = madsl.compile(spec, vocab_size=8, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))


# ---- learning what needs the sequence mixer ------------------------------------------------------
# Each sequence repeats a random pair of tokens (a b a b ...): the next token is the one two
# positions back, and independent of the current one. A model without sequence mixing can do
# no better than chance, cross-entropy ln(V); a working mixer learns the copy.
VOCAB, LENGTH = 16, 16
CHANCE = math.log(VOCAB)


def _learns_the_copy(model, max_steps: int = 150) -> float:
    """Train until the loss (mean of the last 5 steps) is below 0.6 ln(V); return it / ln(V)."""
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(0)
    recent: list[float] = []
    for _ in range(max_steps):
        tokens = torch.randint(0, VOCAB, (16, 2), generator=data).repeat(1, LENGTH // 2)
        logits = model(tokens[:, :-1])
        # positions 2.. have the token two back in view
        loss = torch.nn.functional.cross_entropy(logits[:, 1:].reshape(-1, VOCAB), tokens[:, 2:].reshape(-1))
        optimizer.zero_grad()
        (loss + model.aux_loss()).backward()
        optimizer.step()
        recent = (recent + [loss.item()])[-5:]
        if len(recent) == 5 and sum(recent) / 5 < 0.6 * CHANCE:
            break
    return sum(recent) / len(recent) / CHANCE


def _mixer_spec(name: str) -> madsl.Spec:
    """Two layers of the primitive at width 32, at the settings the contract test checks there."""
    from test_contract import _at_width

    from madsl.spec import spec_from_data

    params = _at_width(stdlib.primitives()[name], 32).config()
    return spec_from_data(
        {"name": f"two-{name}", "dim": 32, "topology": "X:X", "layers": {"X": {"primitive": name, **params}}}
    )


SEQUENCE_PRIMITIVES = sorted(n for n, e in stdlib.primitives().items() if e.cls.role != "channel")


@pytest.mark.parametrize("name", SEQUENCE_PRIMITIVES)
def test_training_learns_what_needs_the_sequence_mixer(name):
    model = madsl.compile(_mixer_spec(name), vocab_size=VOCAB, max_seq_len=LENGTH)
    assert _learns_the_copy(model) < 0.6


class _NoMixing(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)  # the block's residual then passes x through: an identity mixer


def test_the_learning_test_fails_when_the_sequence_mixer_is_identity():
    """The control for the test above: with every sequence mixer replaced by identity, the
    embedding and channel mixers alone stay at chance."""
    model = madsl.compile(_mixer_spec("hyena"), vocab_size=VOCAB, max_seq_len=LENGTH)
    for block in model.body:
        block.mixer = _NoMixing()
    assert _learns_the_copy(model, max_steps=60) > 0.9


def test_save_and_load_round_trip(tmp_path):
    model = madsl.compile("specs/paper/striped-hyena-moe.mad", vocab_size=16)
    save(model, tmp_path / "m")  # a folder: model.safetensors + config.json (tests/test_model_file.py)
    again = load(tmp_path / "m")
    tokens = torch.randint(0, 16, (2, 10))
    assert torch.equal(model(tokens), again(tokens))


def test_cli_emit_torch(tmp_path):
    out = tmp_path / "mamba"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "madsl",
            "compile",
            "specs/paper/mamba.mad",
            "--emit",
            "torch",
            "--vocab",
            "16",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert n_params(load(out)) == madsl.account(madsl.load_spec("specs/paper/mamba.mad"), vocab=16).totals["params"]
    proc = subprocess.run(
        [sys.executable, "-m", "madsl", "compile", "specs/paper/mamba.mad", "--emit", "torch"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_compile_errors_are_located():
    with pytest.raises(madsl.MadslError):
        madsl.compile(madsl.spec_from_topology("H"))  # no vocabulary


def test_freeze_named_layers():
    model = madsl.compile(madsl.spec_from_topology("2A:(2Mb){residual=gated}", dim=32), vocab_size=8)
    frozen = model.freeze(["Mb"])
    mamba_params = sum(p.numel() for m in model.named_layers["Mb"] for p in m.parameters())
    assert frozen == mamba_params > 0
    assert all(not p.requires_grad for m in model.named_layers["Mb"] for p in m.parameters())
    assert all(p.requires_grad for m in model.named_layers["A"] for p in m.parameters())
    with pytest.raises(KeyError, match="did you mean|layers:"):
        model.freeze(["Mx"])


BUNDLED_SPECS = sorted(glob.glob("specs/**/*.mad", recursive=True))


@pytest.mark.parametrize("path", [p for p in BUNDLED_SPECS if p not in PAPER_SPECS])
def test_every_bundled_spec_meets_its_budget_compiles_and_plans(path):
    from madsl.lang.budget import check
    from madsl.runner.plan.evaluation import plan_spec

    spec = madsl.load_spec(path)
    assert check(madsl.account(spec).totals, spec.budget) == []
    params = madsl.account(spec, seq_len=64, vocab=16).totals["params"]  # as built: layers may follow the length
    # the 750M-parameter topologies are built on the meta device: shapes only, no memory, no init
    with torch.device("meta" if params > 50_000_000 else "cpu"):
        model = madsl.compile(spec, vocab_size=16, max_seq_len=64)
    assert n_params(model) == params
    plan = plan_spec(spec, path)  # its eval: section is what `madsl eval SPEC` runs
    assert plan.runs
    if "eval" in spec.data and "tasks" in spec.data["eval"]:
        assert {run.task for run in plan.runs} == set(spec.data["eval"]["tasks"])


def test_induction_specs_plan_training_at_256_and_evaluation_far_beyond():
    from madsl.runner.plan.evaluation import plan_spec

    for path in ("specs/induction/mamba.mad", "specs/induction/attention-rope.mad"):
        (run,) = plan_spec(madsl.load_spec(path), path).runs
        assert run.task == "induction-heads" and run.settings["seq_len"] == 256
        assert max(run.train.eval_lengths) >= 2**14 and 256 in run.train.eval_lengths
