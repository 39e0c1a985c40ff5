"""Text classification on a labelled set of the user's (seed 004's IMDB setting): `madsl data
prepare-labelled` (madsl.corpus.labelled), the text-classification task that reads its folder and
the pooled head (madsl.runner.train.heads). The set is made here: short texts whose class is the
mood of one word among filler, tokenized by a word-level tokenizer.json trained here with the
`tokenizers` library (nothing is downloaded)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from madsl.cli import main  # noqa: E402

GOOD, BAD = "good great fine lovely superb".split(), "bad awful poor dull terrible".split()
FILLER = "the movie was a film and it plot actor scene story".split()


def make_texts(folder: Path, train: int = 192, test: int = 64, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for split, rows in (("train", train), ("test", test)):
        with open(folder / f"{split}.jsonl", "w") as f:
            for _ in range(rows):
                label = rng.randint(0, 1)
                words = [rng.choice(FILLER) for _ in range(rng.randint(3, 14))]
                words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if label else BAD))
                f.write(json.dumps({"text": " ".join(words), "label": label}) + "\n")
    return folder


def make_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([" ".join(GOOD + BAD + FILLER)], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tokenizer.save(str(path))
    return path


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    texts, tokenizer = make_texts(tmp_path / "texts"), make_tokenizer(tmp_path / "tokenizer.json")
    assert main(["data", "prepare-labelled", str(texts), "--tokenizer", str(tokenizer), "--seq-len", "16",
                 "-o", str(tmp_path / "tokens"), "-q"]) == 0  # fmt: skip
    return tmp_path / "tokens"


TINY = "name: tiny\ndim: 32\ntopology: H-Sg:A-Sg\n"
RUN = ["--task", "text-classification", "--protocol", "smoke", "--epochs", "12", "--batch-size", "16"]


def test_a_small_model_learns_the_set_and_its_run_is_identified_by_the_datas_bytes(tmp_path, prepared, capsys):
    spec = tmp_path / "tiny.mad"
    spec.write_text(TINY)
    db = tmp_path / "results.db"
    args = ["eval", str(spec), *RUN, "--set", f"data={prepared}", "--db", str(db), "--format", "json", "-q"]
    capsys.readouterr()
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    [run_id] = out["run_ids"]
    assert out["scores"][0]["score"] > 0.8  # chance is 0.5: the mood word is read
    info = json.loads((prepared / "labelled.json").read_text())
    assert info["counts"]["train"] == {"examples": 192, "tokens": int((np.load(prepared / "train.npy") >= 0).sum()),
                                       "truncated": 0}  # fmt: skip
    # the same data under another folder name trains nothing new only if the bytes agree: change one label
    labels = np.load(prepared / "test-labels.npy")
    labels[0] = 1 - labels[0]
    np.save(prepared / "test-labels.npy", labels)
    assert main(args) == 2
    assert "do not hash to labelled.json's hash" in capsys.readouterr().err
    texts = tmp_path / "texts"
    lines = (texts / "test.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "label": 1 - first["label"]})
    (texts / "test.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["data", "prepare-labelled", str(texts), "--tokenizer", str(tmp_path / "tokenizer.json"),
                 "--seq-len", "16", "-o", str(prepared), "--force", "-q"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(args) == 0
    [other] = json.loads(capsys.readouterr().out)["run_ids"]
    assert other != run_id  # new bytes, a new run (not the old one's cached result)


def test_padding_after_a_text_leaves_its_pooled_logits_as_they_are() -> None:
    """A causal backbone's outputs for a text's tokens cannot see what follows them: the pooled
    head gives a text the same logits alone as beside a longer one in a padded batch."""
    import madsl
    from madsl.runner.train.heads import TaskModel

    torch.manual_seed(0)
    backbone = madsl.compile(madsl.spec_from_topology("H-Sg:A-Sg:Mb-Sg", dim=32, vocab=40))
    model = TaskModel(backbone, "pooled", num_classes=3).eval()
    short = torch.tensor([[5, 9, 2, 7]])
    batch = torch.tensor([[5, 9, 2, 7, -1, -1, -1], [3, 3, 8, 1, 0, 4, 6]])
    with torch.no_grad():
        alone, padded = model(short), model(batch)
        assert torch.allclose(alone[0], padded[0], atol=1e-6)
        assert not torch.allclose(padded[0], padded[1], atol=1e-3)
        # the mean counts the text's own tokens only: padding read as tokens would move it
        unmasked = model.classifier(model.backbone.features(tokens=batch.clamp(min=0)).mean(1))
        assert (unmasked[0] - padded[0]).abs().max() > 1e-3


def test_the_seed004_setting_a_frozen_pretrained_backbone_trains_its_classifier_alone(tmp_path, prepared, capsys):
    """GPT-Neo's whole model (embedding, positions, blocks) from a checkpoint, frozen, read by the
    pooled head: training leaves every imported tensor bit for bit as it was. The set is prepared
    for the checkpoint's embedding of 61 rows (--vocab-size), more than the tokenizer's ids."""
    from hf_checkpoints import gpt_neo

    import madsl

    texts, tokenizer = tmp_path / "texts", tmp_path / "tokenizer.json"
    assert main(["data", "prepare-labelled", str(texts), "--tokenizer", str(tokenizer), "--seq-len", "16",
                 "--vocab-size", "61", "-o", str(prepared), "--force", "-q"]) == 0  # fmt: skip
    assert main(["data", "prepare-labelled", str(texts), "--tokenizer", str(tokenizer), "--seq-len", "16",
                 "--vocab-size", "8", "-o", str(tmp_path / "few")]) == 2  # fmt: skip
    assert "fewer rows than the tokenizer's" in capsys.readouterr().err

    gpt_neo(tmp_path / "neo-ckpt", layers=2)
    assert main(["import", str(tmp_path / "neo-ckpt"), "--out", str(tmp_path / "neo"), "-q"]) == 0
    imported = json.loads((tmp_path / "neo" / "config.json").read_text())["spec"]
    spec = {**imported, "name": "frozen-neo"}
    parts = ["embedding", "positions", "final_norm", *imported["layers"]]
    spec["init"] = [{"from": "neo", "layers": parts, "freeze": True}]
    (tmp_path / "frozen.mad").write_text(json.dumps(spec))
    db = tmp_path / "results.db"
    args = ["eval", str(tmp_path / "frozen.mad"), *RUN, "--set", f"data={prepared}", "--db", str(db)]
    capsys.readouterr()
    assert main([*args, "--keep", "best", "--format", "json", "-q"]) == 0
    [run_id] = json.loads(capsys.readouterr().out)["run_ids"]
    assert main(["export", run_id[:12], "-o", str(tmp_path / "run"), "--db", str(db), "-q"]) == 0
    trained, saved = madsl.load_run(tmp_path / "run"), madsl.compiler.load(tmp_path / "neo")
    backbone = {k: v for k, v in trained.backbone.state_dict().items()}
    for name, tensor in saved.state_dict().items():
        if name != "head.weight":  # the vocabulary's output layer: the pooled head reads features instead
            assert torch.equal(backbone[name], tensor), name
    assert trained.classifier.weight.abs().sum() > 0


def test_bad_sets_are_refused_by_file_and_line_and_nothing_is_written(tmp_path, capsys) -> None:
    texts, tokenizer = make_texts(tmp_path / "texts"), make_tokenizer(tmp_path / "tokenizer.json")
    base = ["data", "prepare-labelled", str(texts), "--tokenizer", str(tokenizer), "-o", str(tmp_path / "out")]
    assert main([*base, "--seq-len", "6"]) == 2
    err = capsys.readouterr().err
    assert "train.jsonl:1:" in err and "--truncate" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert main([*base, "--seq-len", "6", "--truncate", "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    full = int((np.load(tmp_path / "out" / "train.npy")[:, -1] >= 0).sum())
    assert 0 < counts["train"]["truncated"] <= full  # a truncated text fills its row
    for line, message in (
        ('{"text": "good", "label": 1}\nnot json\n', "train.jsonl:2:1: not JSON"),
        ('{"text": "good", "label": "1"}\n', "label '1' is not a class number"),
        ('{"text": "", "label": 0}\n', "text must be a non-empty string"),
        ('{"text": "good", "label": 1, "id": 3}\n', "exactly the keys text and label"),
        ('{"text": "good", "label": 2}\n{"text": "bad", "label": 0}\n', "no training text has label 1"),
    ):
        (texts / "train.jsonl").write_text(line)
        assert main([*base, "--seq-len", "16", "-o", str(tmp_path / "bad")]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    (texts / "train.jsonl").unlink()
    (texts / "train.jsonl").symlink_to(texts / "test.jsonl")
    assert main([*base, "--seq-len", "16", "-o", str(tmp_path / "bad")]) == 2
    assert "a symbolic link" in capsys.readouterr().err


def test_a_prepared_folder_is_read_as_untrusted_input(tmp_path, prepared, capsys) -> None:
    from madsl.tasks import get_task

    task = get_task("text-classification")
    assert task.data_shape({"data": str(prepared)}) == (16, 192, 64)
    assert main(["data", "text-classification", "--set", f"data={prepared}", "--format", "text", "--rows", "1"]) == 0
    assert "target:  class " in capsys.readouterr().out  # the prepared rows, padding shown as '.'
    (prepared / "test.npy").rename(tmp_path / "elsewhere.npy")
    (prepared / "test.npy").symlink_to(tmp_path / "elsewhere.npy")
    with pytest.raises(Exception, match="test.npy is a symbolic link"):
        task.generate({"data": str(prepared)}, "test", 0)
    (prepared / "test.npy").unlink()
    tokens = np.load(tmp_path / "elsewhere.npy")
    tokens[0, -1], tokens[0, 1] = 3, -1  # a token after padding
    np.save(prepared / "test.npy", tokens)
    with pytest.raises(Exception, match="a token after padding"):
        task.generate({"data": str(prepared)}, "test", 0)
    spec = tmp_path / "tiny.mad"
    spec.write_text(TINY)
    assert main(["eval", str(spec), *RUN, "--set", f"data={tmp_path / 'missing'}", "--db", str(tmp_path / "r.db")]) == 2
    assert "not a folder" in capsys.readouterr().err
