"""madsl.corpus and `madsl data prepare`: text -> train.bin/val.bin/tokens.json, nanoGPT folders,
the checks before training, deterministic batches; bad data is a MadslError naming the file."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import pickle

import numpy as np
import pytest

from madsl.cli import main
from madsl.corpus import BUNDLED, open_tokens, prepare, resolve_tokens, train_batch, unigram_entropy, val_windows
from madsl.corpus.sources import BUNDLED_DIR
from madsl.errors import MadslError

TEXT_A = "Über alles: naïve café ☕\n" * 7
TEXT_B = "the cat sat on the mat\n" * 11
TEXT_C = "All the world's a stage.\n" * 5


def corpus(tmp_path):
    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text(TEXT_B, encoding="utf-8")
    (folder / "sub" / "a.txt").write_text(TEXT_A, encoding="utf-8")
    single = tmp_path / "play.txt"
    single.write_text(TEXT_C, encoding="utf-8")
    return folder, single


def split_bytes(text: str, fraction: float = 0.1) -> tuple[bytes, bytes]:
    data = text.encode("utf-8")
    train = int(len(data) * (1 - fraction))
    return data[:train], data[train:]


def test_bytes_prepare_splits_each_document_and_records_counts(tmp_path):
    folder, single = corpus(tmp_path)
    info = prepare([single, folder], "bytes", tmp_path / "out")
    documents = [TEXT_C, TEXT_B, TEXT_A]  # sources in the order named; a folder's files in path order
    parts = [split_bytes(text) for text in documents]
    data = open_tokens(tmp_path / "out")
    assert bytes(np.asarray(data.train, dtype=np.uint8)) == b"".join(train for train, _ in parts)
    assert bytes(np.asarray(data.val, dtype=np.uint8)) == b"".join(val for _, val in parts)
    assert data.train.dtype == np.dtype("<u2") and data.vocab_size == 256 and info.dtype == "uint16"
    total = sum(len(text.encode()) for text in documents)
    assert info.train_tokens + info.val_tokens == total == info.train_bytes + info.val_bytes
    assert [(s["name"], s["documents"], s["bytes"]) for s in info.sources] == [
        ("play.txt", 1, len(TEXT_C.encode())),
        ("books", 2, len((TEXT_A + TEXT_B).encode())),
    ]
    assert data.info == info and info.tokenizer == "bytes" and info.split == "per-document"
    copy = pickle.loads(pickle.dumps(data))  # as sent to a worker: the folder, mapped again
    assert len(pickle.dumps(data)) < 2000 and np.array_equal(copy.train, data.train) and copy.hash == data.hash
    assert data.bits_per_byte(math.log(2)) == pytest.approx(info.val_tokens / info.val_bytes)
    assert sorted(os.listdir(tmp_path / "out")) == ["tokens.json", "train.bin", "val.bin"]


def test_the_hash_depends_on_the_text_only_not_on_where_it_lies(tmp_path, monkeypatch):
    folder, single = corpus(tmp_path)
    first = prepare([single, folder], "bytes", tmp_path / "one")
    monkeypatch.chdir(tmp_path)
    again = prepare(["play.txt", "books"], "bytes", "two")
    assert again.hash == first.hash
    for name in ("train.bin", "val.bin", "tokens.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    (folder / "b.txt").write_text(TEXT_B.replace("cat", "bat"), encoding="utf-8")
    assert prepare([single, folder], "bytes", tmp_path / "one").hash != first.hash  # rewritten in place
    assert prepare([single, folder], "bytes", "three", val_fraction=0.2).hash != first.hash


def byte_level_bpe(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT_A, TEXT_B, TEXT_C], trainer)
    tokenizer.save(str(path))
    return Tokenizer.from_file(str(path))


def test_a_tokenizer_file_encodes_and_decodes_back_to_the_text(tmp_path):
    tokenizer = byte_level_bpe(tmp_path / "tok.json")
    text = TEXT_A + TEXT_B
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    info = prepare([tmp_path / "doc.txt"], tmp_path / "tok.json", tmp_path / "out", val_fraction=0.25)
    data = open_tokens(tmp_path / "out", verify=True)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert list(data.train) + list(data.val) == ids and len(data.train) == int(len(ids) * 0.75)
    assert tokenizer.decode(list(map(int, data.train))) + tokenizer.decode(list(map(int, data.val))) == text
    assert info.vocab_size == tokenizer.get_vocab_size() and info.dtype == "uint16"
    assert info.tokenizer == "tok.json"
    assert info.tokenizer_sha256 == hashlib.sha256((tmp_path / "tok.json").read_bytes()).hexdigest()
    assert info.train_bytes + info.val_bytes == len(text.encode()) and 0 < info.val_bytes < len(text.encode())


def test_a_vocabulary_over_65536_ids_is_written_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 70_000)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "words.json"))
    (tmp_path / "doc.txt").write_text("w69999 w1 w65536 zz " * 10, encoding="utf-8")
    info = prepare([tmp_path / "doc.txt"], tmp_path / "words.json", tmp_path / "out")
    data = open_tokens(tmp_path / "out")
    assert info.dtype == "uint32" and info.vocab_size == 70_000 and data.train.dtype == np.dtype("<u4")
    assert list(data.train[:4]) == [69999, 1, 65536, 0]


def nanogpt_folder(tmp_path, ids, dtype=np.uint16):
    folder = tmp_path / "nano"
    folder.mkdir(exist_ok=True)
    np.asarray(ids[:-10], dtype=dtype).tofile(folder / "train.bin")
    np.asarray(ids[-10:], dtype=dtype).tofile(folder / "val.bin")
    return folder


def test_a_nanogpt_folder_opens_with_its_dtype_and_vocabulary_declared(tmp_path):
    ids = np.arange(100) % 50
    folder = nanogpt_folder(tmp_path, ids)
    (folder / "meta.pkl").write_bytes(b"not a pickle: never read")
    with pytest.raises(MadslError, match="meta.pkl") as err:
        open_tokens(folder)
    assert str(folder) in str(err.value) and "dtype" in str(err.value)
    data = open_tokens(folder, dtype="uint16", vocab_size=50)
    assert list(data.train) == list(ids[:-10]) and list(data.val) == list(ids[-10:])
    assert data.info.tokenizer is None and data.bits_per_byte(1.0) is None
    assert open_tokens(folder, dtype=np.uint16, vocab_size=50).hash == data.hash
    nanogpt_folder(tmp_path, (ids + 1) % 50)
    assert open_tokens(folder, dtype="uint16", vocab_size=50).hash != data.hash


def damage(kind, tmp_path):
    """A folder with one thing wrong, the arguments that open it, and the file the error must name."""
    folder = nanogpt_folder(tmp_path, np.arange(100) % 50)
    declared = {"dtype": "uint16", "vocab_size": 50}
    if kind == "empty":
        (folder / "val.bin").write_bytes(b"")
        return folder, declared, folder / "val.bin", "empty"
    if kind == "truncated":
        (folder / "train.bin").write_bytes((folder / "train.bin").read_bytes()[:-1])
        return folder, declared, folder / "train.bin", "not a whole number"
    if kind == "over the vocabulary":
        ids = np.arange(90) % 50
        ids[37] = 50
        np.asarray(ids, dtype=np.uint16).tofile(folder / "train.bin")
        return folder, declared, folder / "train.bin", "token 37 is id 50, outside the vocabulary of 50"
    if kind == "wrong dtype declared":  # uint16 ids read as uint32 pair into ids far outside the vocabulary
        return folder, {"dtype": "uint32", "vocab_size": 50}, folder / "train.bin", "outside the vocabulary"
    if kind == "missing":
        (folder / "val.bin").unlink()
        return folder, declared, folder / "val.bin", "missing"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["empty", "truncated", "over the vocabulary", "wrong dtype declared", "missing"])
def test_bad_token_files_are_refused_naming_the_file(kind, tmp_path):
    folder, declared, named, message = damage(kind, tmp_path)
    with pytest.raises(MadslError, match=message) as err:
        open_tokens(folder, **declared)
    assert err.value.location.file == str(named) and str(named) in str(err.value)


def prepared(tmp_path):
    _, single = corpus(tmp_path)
    prepare([single], "bytes", tmp_path / "out")
    return tmp_path / "out"


def test_a_prepared_folder_that_disagrees_with_its_tokens_json_is_refused(tmp_path):
    folder = prepared(tmp_path)
    with pytest.raises(MadslError, match="the files hold dtype uint16, not the uint32 declared"):
        open_tokens(folder, dtype="uint32")
    info = json.loads((folder / "tokens.json").read_text())
    (folder / "tokens.json").write_text(json.dumps({**info, "train_tokens": info["train_tokens"] + 1}))
    with pytest.raises(MadslError, match="hash does not match") as err:
        open_tokens(folder)
    assert err.value.location.file == str(folder / "tokens.json")
    (folder / "tokens.json").write_text("{not json")
    with pytest.raises(MadslError, match="not JSON"):
        open_tokens(folder)
    (folder / "tokens.json").write_text(json.dumps(info))
    train = (folder / "train.bin").read_bytes()
    (folder / "train.bin").write_bytes(train[:-2])
    with pytest.raises(MadslError, match="but tokens.json says"):
        open_tokens(folder)
    (folder / "train.bin").write_bytes(train[:-2] + b"\x41\x00")  # same size, other bytes
    with pytest.raises(MadslError, match="not those tokens.json records") as err:
        open_tokens(folder)  # every open checks the bytes (issue 36: same size, other tokens)
    assert err.value.location.file == str(folder / "train.bin")


def test_require_tokens_names_the_split_too_short_for_one_window(tmp_path):
    data = open_tokens(prepared(tmp_path))
    data.require_tokens(len(data.val))
    with pytest.raises(MadslError, match="fewer than the") as err:
        data.require_tokens(len(data.val) + 1)
    assert err.value.location.file == str(data.path / "val.bin")


def test_train_batches_depend_on_seed_and_step_only():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = train_batch(tokens, 8, 16, seed=3, step=5)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int64
    assert np.array_equal(y, x + 1)  # y is x shifted by one (the tokens are their positions)
    assert np.array_equal(np.diff(x, axis=1), np.ones((8, 15)))  # contiguous windows
    x_again, _ = train_batch(tokens, 8, 16, seed=3, step=5)
    assert np.array_equal(x, x_again)
    assert not np.array_equal(x, train_batch(tokens, 8, 16, seed=3, step=6)[0])
    assert not np.array_equal(x, train_batch(tokens, 8, 16, seed=4, step=5)[0])
    starts = np.concatenate([train_batch(np.arange(18), 64, 16, 0, s)[0][:, 0] for s in range(4)])
    assert set(starts.tolist()) == {0, 1}  # every window fits, the last target included
    with pytest.raises(MadslError, match="fewer than the 18"):
        train_batch(np.arange(17), 1, 17, 0, 0)


def test_val_windows_are_fixed_contiguous_and_counted():
    tokens = np.arange(100, dtype=np.uint16)
    x, y, scored = val_windows(tokens, 16, None)
    assert x.shape == (6, 16) and scored == 96 and np.array_equal(x.ravel(), np.arange(96))
    assert np.array_equal(y, x + 1)
    x2, _, scored2 = val_windows(tokens, 16, max_tokens=40)
    assert scored2 == 32 and np.array_equal(x2, x[:2])
    with pytest.raises(MadslError, match="fewer than one window"):
        val_windows(tokens, 16, max_tokens=10)


def test_unigram_entropy_is_in_nats_per_token():
    assert unigram_entropy(np.array([0, 1, 2, 3] * 5, dtype=np.uint16)) == pytest.approx(math.log(4))
    assert unigram_entropy(np.array([7, 7, 7], dtype=np.uint16)) == 0.0


def test_bundled_tinyshakespeare_is_prepared_once_and_reused(tmp_path):
    data = resolve_tokens("bundled:tinyshakespeare", tmp_path / "cache")
    assert data.info.train_tokens + data.info.val_tokens == 1_115_394 and data.info.val_tokens == 111_540
    assert data.path.parent == tmp_path / "cache" and data.path.name.startswith("tinyshakespeare-")
    stamp = (data.path / "train.bin").stat().st_mtime_ns
    again = resolve_tokens("bundled:tinyshakespeare", tmp_path / "cache")
    assert again.hash == data.hash and (again.path / "train.bin").stat().st_mtime_ns == stamp
    assert os.listdir(tmp_path / "cache") == [data.path.name]
    assert 3.0 < unigram_entropy(data.train) < math.log(256)
    assert resolve_tokens(str(data.path), tmp_path).hash == data.hash
    with pytest.raises(MadslError, match="did you mean 'tinyshakespeare'"):
        resolve_tokens("bundled:tinyshakespear", tmp_path / "cache")


def test_the_command_prints_what_it_wrote(tmp_path, capsys):
    _, single = corpus(tmp_path)
    assert main(["data", "prepare", str(single), "--tokenizer", "bytes", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    info = json.loads((tmp_path / "out" / "tokens.json").read_text())
    assert f"{info['train_tokens']:,} tokens" in out and info["hash"] in out and "vocabulary 256" in out
    assert (
        main(["data", "prepare", str(single), "--tokenizer", "bytes", "-o", str(tmp_path / "out"), "--format", "json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["hash"] == info["hash"]


def bad_inputs(tmp_path):
    (tmp_path / "binary.txt").write_bytes(b"abc\x00def")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "ok.txt").write_text("some text here, enough of it\n" * 3)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.md").write_text("mine")
    return [
        (["binary.txt"], [], "binary.txt: a binary file"),
        (["latin1.txt"], [], "latin1.txt: not UTF-8 text (byte 0xe9 at offset 3)"),
        (["missing.txt"], [], "missing.txt: no such file or folder"),
        (["ok.txt"], ["--tokenizer", "nope.json"], "nope.json: no such tokenizer file"),
        (["ok.txt"], ["--tokenizer", "ok.txt"], "ok.txt: not a tokenizer file"),
        (["ok.txt"], ["-o", "full"], "-o full: the folder holds 1 entry"),
        (["ok.txt"], ["--val-fraction", "1.5"], "--val-fraction 1.5: not a fraction"),
        (["ok.txt", "ok.txt"], [], "ok.txt: named twice"),
    ]


def test_bad_input_exits_2_with_the_file_named_and_no_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for texts, options, message in bad_inputs(tmp_path):
        argv = ["data", "prepare", *texts, "--tokenizer", "bytes", "-o", "out", *options]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
        assert not (tmp_path / "out").exists()
    assert main(["data", "prepare", "ok.txt", "--tokenizer", "bytes", "-o", "full", "--force"]) == 0
    assert sorted(os.listdir(tmp_path / "full")) == ["notes.md", "tokens.json", "train.bin", "val.bin"]


def test_the_task_command_still_works_beside_prepare(tmp_path, capsys):
    assert main(["data", "compression", "--set", "seq_len=64", "-o", str(tmp_path / "c.npz")]) == 0
    with np.load(tmp_path / "c.npz") as npz:
        assert npz["inputs"].shape[1] == 64
    with pytest.raises(SystemExit):
        main(["data", "--help"])
    assert "madsl data prepare TEXT..." in capsys.readouterr().out
    assert main(["data", "-q", "--split", "train", "prepare", "-o", str(tmp_path / "x.npz")]) == 2
    assert "`prepare` comes first" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_every_bundled_corpus_is_shipped_with_its_checksum(name):
    text = gzip.decompress((BUNDLED_DIR / BUNDLED[name].file).read_bytes())
    assert hashlib.sha256(text).hexdigest() == BUNDLED[name].sha256
    assert text.isascii() and len(text) > 1_000_000
    assert f"## {BUNDLED[name].file}" in (BUNDLED_DIR / "README.md").read_text()
