"""Issue 36, token data: what a folder names stays inside it, token files are checked by their
bytes on every open (remembered in an untrusted cache), `data prepare` streams documents in
bounded memory with the same output as before, and bad input is a located error (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from madsl.cli import main
from madsl.corpus import checked, encode, open_tokens, prepare
from madsl.corpus.info import TokenInfo
from madsl.errors import MadslError

TEXT = "Über alles: naïve café ☕ and the cat sat on the mat.\n" * 40


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MADSL_CACHE_DIR", str(tmp_path / "cache"))


def run(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def prepared(tmp_path, name="data"):
    (tmp_path / "doc.txt").write_text(TEXT, encoding="utf-8")
    prepare([tmp_path / "doc.txt"], "bytes", tmp_path / name)
    return tmp_path / name


def test_a_link_in_a_text_folder_that_leads_out_is_refused_unread(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "secret.txt").write_text("SECRET\n" * 20)
    for target in ("/etc/passwd", "../secret.txt"):
        (folder / "evil").unlink(missing_ok=True)
        os.symlink(target, folder / "evil")
        code, err = run(["data", "prepare", str(folder), "--tokenizer", "bytes", "-o", str(tmp_path / "out")], capsys)
        assert code == 2 and f"{folder / 'evil'}: a symbolic link that leads out of" in err
        assert not (tmp_path / "out").exists()
    (folder / "evil").unlink()
    os.symlink("a.txt", folder / "b.txt")  # inside the folder: read, as a document of its own
    info = prepare([folder], "bytes", tmp_path / "out")
    assert info.sources[0]["documents"] == 2 and info.sources[0]["bytes"] == 2 * len(TEXT.encode())
    os.symlink("nowhere", folder / "dead")
    with pytest.raises(MadslError, match="dead: a symbolic link that leads nowhere"):
        prepare([folder], "bytes", tmp_path / "out2")


@pytest.mark.parametrize("empty", ["text", "-o", "--tokenizer"])
def test_an_empty_path_argument_is_an_error_not_the_current_folder(empty, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.txt").write_text(TEXT, encoding="utf-8")
    args = {"text": "here.txt", "-o": "out", "--tokenizer": "bytes", empty: ""}
    code, err = run(["data", "prepare", args["text"], "--tokenizer", args["--tokenizer"], "-o", args["-o"]], capsys)
    assert code == 2 and "the path is empty" in err and not (tmp_path / "out").exists()


def test_a_url_tokenizer_is_echoed_as_written_and_nothing_is_downloaded(tmp_path, capsys):
    (tmp_path / "doc.txt").write_text(TEXT, encoding="utf-8")
    code, err = run(
        [
            "data",
            "prepare",
            str(tmp_path / "doc.txt"),
            "--tokenizer",
            "https://example.com/tok.json",
            "-o",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    assert code == 2 and "https://example.com/tok.json: a URL" in err and "nothing is downloaded" in err
    assert "download the tokenizer.json and name the local file" in err


def test_the_output_folder_cannot_lie_inside_a_text_folder(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT, encoding="utf-8")
    for out in (folder / "tokens", folder):
        code, err = run(["data", "prepare", str(folder), "--tokenizer", "bytes", "-o", str(out), "--force"], capsys)
        assert code == 2 and "lies inside the text folder" in err
    assert os.listdir(folder) == ["a.txt"]


def rewrite_info(folder, **changes) -> None:
    data = json.loads((folder / "tokens.json").read_text())
    info = TokenInfo(**{**data, **changes, "sources": tuple(data["sources"])}).with_hash()
    (folder / "tokens.json").write_text(json.dumps(info.to_json()))


def test_token_files_are_checked_by_their_bytes_on_every_open(tmp_path):
    folder = prepared(tmp_path)
    train = np.fromfile(folder / "train.bin", dtype="<u2")
    open_tokens(folder)
    np.roll(train, 1).tofile(folder / "train.bin")  # other tokens, the same size, after a cached open
    with pytest.raises(MadslError, match="its bytes are not those tokens.json records") as err:
        open_tokens(folder)
    assert err.value.location.file == str(folder / "train.bin")
    train[5:] = 65535
    train.tofile(folder / "train.bin")
    rewrite_info(
        folder,
        files_sha256={
            **json.loads((folder / "tokens.json").read_text())["files_sha256"],
            "train.bin": checked.hashlib.sha256(train.tobytes()).hexdigest(),
        },
    )
    with pytest.raises(MadslError, match="train.bin: token 5 is id 65,535, outside the vocabulary of 256"):
        open_tokens(folder)
    folder = prepared(tmp_path, "again")
    rewrite_info(folder, vocab_size=10)  # the JSON's own hash recomputed: only the ids tell
    with pytest.raises(MadslError, match=r"train.bin: token 0 is id \d+, outside the vocabulary of 10"):
        open_tokens(folder)


def test_a_study_whose_token_files_changed_is_refused_before_training(tmp_path):
    from madsl.scaling.api import plan_study_file

    folder = prepared(tmp_path, "tokens")
    study = tmp_path / "study.yaml"
    study.write_text(
        "name: s\ndata: tokens\nseq_len: 16\narchitectures: {t: bundled:paper/mh-attention-sg}\n"
        "budgets: [1e8]\nsizes: [{dim: 8}, {dim: 16}]\nrecipe: {batch_size: 2, eval_tokens: 64}\n"
    )
    plan_study_file(study, tmp_path / "r.db")
    train = np.fromfile(folder / "train.bin", dtype="<u2")
    train[::-1].tofile(folder / "train.bin")
    with pytest.raises(MadslError, match="its bytes are not those tokens.json records"):
        plan_study_file(study, tmp_path / "r.db")


def test_the_check_is_remembered_and_the_cache_is_untrusted(tmp_path, monkeypatch):
    folder = prepared(tmp_path)
    scans = []
    real = checked.scan_file
    monkeypatch.setattr(checked, "scan_file", lambda *a: scans.append(a[0].name) or real(*a))
    open_tokens(folder)
    assert scans == []  # prepare remembered what it wrote
    open_tokens(folder, verify=True)
    assert scans == ["train.bin", "val.bin"]
    cache = tmp_path / "cache" / checked.CACHE_NAME
    for garbage in (
        "{{{",
        "[" * 100_000,
        '{"format": 1, "files": {"a": 1}}',
        '{"format": NaN}',
        '{"format": ' + "9" * 5000 + "}",
        " " * (checked.MAX_BYTES + 1),
    ):
        cache.write_text(garbage)
        scans.clear()
        assert len(open_tokens(folder).train) > 0 and scans == ["train.bin", "val.bin"]  # checked again
    cache.unlink()
    cache.mkdir()
    assert len(open_tokens(folder).train) > 0  # a cache that cannot be read or written is no error
    monkeypatch.setenv("MADSL_CACHE_DIR", "/proc/madsl-cache")
    assert len(open_tokens(folder).train) > 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("[" * 100_000, "nested deeper than the JSON reader goes"),
        ('{"vocab_size": ' + "9" * 5000 + "}", r"not a tokens.json \(Exceeds the limit"),
        ('{"vocab_size": NaN}', "NaN is not a JSON number"),
        (" " * (17 << 20), "larger than 16 MiB"),
        ("fifo", "not a regular file"),
        ("link", "a symbolic link that leads out of"),
    ],
)
def test_a_malformed_tokens_json_is_a_located_error(text, message, tmp_path):
    folder = prepared(tmp_path)
    (folder / "tokens.json").unlink()
    if text == "fifo":
        os.mkfifo(folder / "tokens.json")  # before: read() waited forever
    elif text == "link":
        (tmp_path / "elsewhere.json").write_text("{}")
        os.symlink(tmp_path / "elsewhere.json", folder / "tokens.json")
    else:
        (folder / "tokens.json").write_text(text)
    with pytest.raises(MadslError, match=message) as err:
        open_tokens(folder)
    assert err.value.location.file == str(folder / "tokens.json")


def test_a_token_file_that_links_out_of_its_folder_is_refused(tmp_path):
    folder = prepared(tmp_path)
    os.replace(folder / "val.bin", tmp_path / "val.bin")
    os.symlink(tmp_path / "val.bin", folder / "val.bin")
    with pytest.raises(MadslError, match="val.bin: a symbolic link that leads out of"):
        open_tokens(folder)
    rewrite_info(folder, vocab_size=10**30, dtype="uint32")
    with pytest.raises(MadslError, match="vocab_size is 1000000000000000000000000000000"):
        open_tokens(folder)


def test_bytes_are_streamed_in_chunks_with_the_same_output_and_offsets(tmp_path, monkeypatch):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "books" / "b.txt").write_text(TEXT[:301], encoding="utf-8")
    whole = prepare([tmp_path / "books"], "bytes", tmp_path / "whole")
    monkeypatch.setattr(encode, "BYTES_CHUNK", 7)  # cuts characters of 2 and 3 bytes
    assert prepare([tmp_path / "books"], "bytes", tmp_path / "chunked").hash == whole.hash
    for name in ("train.bin", "val.bin", "tokens.json"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "chunked" / name).read_bytes()
    data = TEXT.encode()
    (tmp_path / "bad.txt").write_bytes(data[:100] + b"\xe9" + data[100:])
    with pytest.raises(MadslError, match="byte 0xe9 at offset 100"):
        prepare([tmp_path / "bad.txt"], "bytes", tmp_path / "o1")
    (tmp_path / "bad.txt").write_bytes(data[:333] + b"\0")
    with pytest.raises(MadslError, match="NUL byte at offset 333"):
        prepare([tmp_path / "bad.txt"], "bytes", tmp_path / "o2")
    (tmp_path / "bad.txt").write_bytes(data + "☕".encode()[:2])
    with pytest.raises(MadslError, match=f"byte 0xe2 at offset {len(data):,}"):
        prepare([tmp_path / "bad.txt"], "bytes", tmp_path / "o3")


def tokenizers_of_every_kind(tmp_path):
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    sample = [TEXT, "words on lines\n  indented\n\n\tand tabs\r\n" * 20]
    made = {}
    for kind in ("byte-level", "sentencepiece", "metaspace", "words"):
        if kind == "words":
            vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(sorted(set(" ".join(sample).split())))}}
            tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
            tok.pre_tokenizer = pre_tokenizers.Whitespace()
        else:
            tok = Tokenizer(models.BPE(unk_token="<unk>" if kind == "sentencepiece" else None))
            if kind == "byte-level":
                tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
                tok.decoder = decoders.ByteLevel()
            elif kind == "sentencepiece":  # Llama 2's: a prefix marker added to each input, no pre-tokenizer
                tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
                # (trained on words, as sentencepiece's pieces never hold a line break with other text)
                tok.pre_tokenizer = pre_tokenizers.Sequence(
                    [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Metaspace(prepend_scheme="never")]
                )
            else:
                tok.pre_tokenizer = pre_tokenizers.Metaspace()  # keeps "end.\nNext" one word
            alphabet = pre_tokenizers.ByteLevel.alphabet() if kind == "byte-level" else []
            tok.train_from_iterator(
                sample, trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet, special_tokens=["<unk>"])
            )
        if kind == "sentencepiece":
            tok.pre_tokenizer = None
        tok.save(str(tmp_path / f"{kind}.json"))
        made[kind] = tok
    return made


def test_a_long_document_is_encoded_in_pieces_as_it_is_encoded_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(encode, "PIECE_CHARS", 1500)  # TEXT x 10 (20 kB) is ~14 pieces
    monkeypatch.setattr(encode, "CONTEXT_CHARS", 200)
    text = "".join(f"{TEXT[:n]}\n   and {n} more\n\n\tx{n}y z\r\n" for n in range(0, 2000, 200)) * 2
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    for kind, tok in tokenizers_of_every_kind(tmp_path).items():
        encoded = tok.encode(text, add_special_tokens=False)
        train = int(len(encoded.ids) * 0.9)
        info = prepare([tmp_path / "long.txt"], tmp_path / f"{kind}.json", tmp_path / kind)
        data = open_tokens(tmp_path / kind)
        assert list(data.train) + list(data.val) == encoded.ids, kind
        assert len(data.train) == train and info.train_bytes == len(text[: encoded.offsets[train][0]].encode())


def test_a_tokenizer_whose_ids_change_where_text_is_cut_is_refused(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, normalizers

    monkeypatch.setattr(encode, "PIECE_CHARS", 1500)
    tokenizers_of_every_kind(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "byte-level.json"))
    tok.normalizer = normalizers.Strip()  # strips each piece's ends: not the document's ids
    tok.save(str(tmp_path / "strip.json"))
    (tmp_path / "long.txt").write_text(TEXT * 10, encoding="utf-8")
    with pytest.raises(MadslError, match="strip.json encodes the text differently when it is cut at byte") as err:
        prepare([tmp_path / "long.txt"], tmp_path / "strip.json", tmp_path / "out")
    assert err.value.location.file == str(tmp_path / "long.txt")
    (tmp_path / "unbroken.txt").write_text("x" * (encode.MAX_PIECE_CHARS + 10))
    with pytest.raises(MadslError, match="characters without a line break or space from byte 0"):
        prepare([tmp_path / "unbroken.txt"], tmp_path / "byte-level.json", tmp_path / "out")


def test_a_normalizer_that_expands_text_is_refused_before_encoding(tmp_path):
    from tokenizers import Tokenizer, normalizers

    tokenizers_of_every_kind(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "byte-level.json"))
    tok.normalizer = normalizers.Replace("a", "b" * 1000)  # 60 KB of text reached 4.9 GB
    tok.save(str(tmp_path / "expand.json"))
    (tmp_path / "doc.txt").write_text(TEXT * 25, encoding="utf-8")
    with pytest.raises(MadslError, match="expand.json: its normalizer turns") as err:
        prepare([tmp_path / "doc.txt"], tmp_path / "expand.json", tmp_path / "out")
    assert err.value.location.file == str(tmp_path / "expand.json")


PEAK = """
import sys
from madsl.cli import main
code = main(["data", "prepare", sys.argv[1], "--tokenizer", "bytes", "-o", sys.argv[2], "-q"])
peak = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print(code, peak)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from /proc (Linux)")
def test_preparing_a_large_document_peaks_far_below_its_size(tmp_path):
    line = ("lorem ipsum dolor sit amet " * 3 + "☕\n").encode()
    with open(tmp_path / "big.txt", "wb") as f:
        f.writelines(line * ((1 << 20) // len(line)) for _ in range(40))  # ~40 MB: held whole, it peaked at ~550 MB
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(tmp_path / "big.txt"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
    )
    code, peak_kib = map(int, done.stdout.split())  # VmHWM: since exec (ru_maxrss counts the forking parent's)
    assert code == 0 and peak_kib < 250 * 1024, peak_kib
