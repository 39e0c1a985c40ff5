"""`madsl data`: a generated split written to .npz (the runner's arrays) or printed; bad input exits 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from madsl.cli import main
from madsl.tasks import get_task


def test_npz_holds_the_runners_arrays_the_setting_and_the_vocabulary(tmp_path, capsys):
    out = tmp_path / "sub" / "sc.npz"
    assert (
        main(
            [
                "data",
                "selective-copying",
                "--conventions",
                "mad-lab",
                "--split",
                "train",
                "--seed",
                "4",
                "--set",
                "seq_len=64",
                "--set",
                "num_tokens_to_copy=8",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    task = get_task("selective-copying", "mad-lab")
    expected = task.generate({"seq_len": 64, "num_tokens_to_copy": 8}, "train", 4)
    with np.load(out) as npz:
        assert np.array_equal(npz["inputs"], expected.inputs) and np.array_equal(npz["targets"], expected.targets)
        info = json.loads(str(npz["info"]))
    assert info["settings"]["seq_len"] == 64 and info["conventions"] == "mad-lab" and info["split"] == "train"
    assert info["vocab"] == {"data": [0, 14], "blank": [14, 15], "copy": [15, 16]} and info["vocab_size"] == 16
    assert not [p for p in out.parent.iterdir() if p.name != "sc.npz"]  # no temporary file left


def test_shared_arrays_are_written_and_text_prints_rows(tmp_path, capsys):
    out = tmp_path / "mem.npz"
    assert main(["data", "memorization", "-o", str(out), "-q"]) == 0
    with np.load(out) as npz:
        assert "facts" in npz.files and len(npz["facts"]) == 128
    assert main(["data", "in-context-recall", "--format", "text", "--rows", "2", "--set", "seq_len=16"]) == 0
    text = capsys.readouterr().out
    assert text.count("inputs:") == 2 and "keys [0, 8)" in text and "-- row 1" in text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["data", "compresion", "-o", "x.npz"], "did you mean 'compression'"),
        (["data", "compression"], "nowhere to write"),
        (["data", "compression", "--set", "seq_ln=3", "-o", "x.npz"], "no setting 'seq_ln'"),
        (["data", "compression", "--set", "seq_len=x", "-o", "x.npz"], "must be an integer"),
        (
            ["data", "selective-copying", "--conventions", "mad-lab", "--set", "num_tokens_to_copy=128", "-o", "x.npz"],
            "bad setting for selective-copying (conventions mad-lab)",
        ),
    ],
)
def test_bad_input_is_a_clear_error_exit_2(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x.npz").exists()


def test_an_output_that_is_a_directory_is_refused_before_generating(tmp_path, capsys):
    assert main(["data", "compression", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
