"""The on-disk cache of generated splits."""

from __future__ import annotations

import numpy as np
import pytest

from madsl.tasks import cache, get_task


def test_second_load_reads_the_file_and_returns_the_same_arrays(tmp_path, monkeypatch):
    task = get_task("memorization")
    settings = {"vocab_size": 32, "num_test_examples": 16}
    first = cache.load_or_generate(task, settings, "test", 5, tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"
    generate = type(task).generate

    def only_the_check(self, settings, split, seed):  # the read checks the file against a generation of 2 rows
        if settings["num_test_examples"] > cache.PROBE_ROWS:
            pytest.fail("generated again instead of read")
        return generate(self, settings, split, seed)

    monkeypatch.setattr(type(task), "generate", only_the_check)
    second = cache.load_or_generate(task, settings, "test", 5, tmp_path)
    for a, b in (
        (first.inputs, second.inputs),
        (first.targets, second.targets),
        (first.meta["facts"], second.meta["facts"]),
    ):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    assert second.meta["vocab"] == first.meta["vocab"] and second.meta["settings"] == first.meta["settings"]


def test_real_valued_task_round_trips(tmp_path):
    task = get_task("icl-linear")
    settings = {"num_train_examples": 8, "seq_len": 9}
    first = cache.load_or_generate(task, settings, "train", 0, tmp_path)
    second = cache.load_or_generate(task, settings, "train", 0, tmp_path)
    np.testing.assert_array_equal(first.targets, second.targets)  # NaNs included
    assert second.inputs.dtype == np.float32


def test_key_depends_on_everything_that_determines_the_data(monkeypatch):
    base = cache.cache_key("compression", {"seq_len": 8, "vocab_size": 4}, "train", 0)
    assert base == cache.cache_key("compression", {"vocab_size": 4, "seq_len": 8}, "train", 0)  # order-free
    assert base == cache.cache_key("compression", {"vocab_size": np.int64(4), "seq_len": 8}, "train", 0)
    different = [
        cache.cache_key("memorization", {"seq_len": 8, "vocab_size": 4}, "train", 0),
        cache.cache_key("compression", {"seq_len": 9, "vocab_size": 4}, "train", 0),
        cache.cache_key("compression", {"seq_len": 8, "vocab_size": 4}, "test", 0),
        cache.cache_key("compression", {"seq_len": 8, "vocab_size": 4}, "train", 1),
    ]
    monkeypatch.setattr(cache, "GENERATOR_VERSION", cache.GENERATOR_VERSION + 1)
    different.append(cache.cache_key("compression", {"seq_len": 8, "vocab_size": 4}, "train", 0))
    assert len(set(different + [base])) == 6


def test_baseline_filled_settings_share_a_file(tmp_path):
    task = get_task("compression")
    a = cache.cache_path(task, {"num_train_examples": 4}, "train", 0, tmp_path)
    b = cache.cache_path(task, {**task.baseline, "num_train_examples": 4}, "train", 0, tmp_path)
    assert a == b


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MADSL_CACHE", str(tmp_path / "c"))
    assert cache.default_cache_dir() == tmp_path / "c"
    cache.load_or_generate(get_task("compression"), {"num_train_examples": 4}, "train", 0)
    assert len(list((tmp_path / "c").glob("compression-train-*.npz"))) == 1
    monkeypatch.delenv("MADSL_CACHE")
    assert str(cache.default_cache_dir()).endswith(".cache/madsl")


def test_writes_leave_no_temporary_files_and_bad_files_are_regenerated(tmp_path):
    task = get_task("compression")
    data = cache.load_or_generate(task, {"num_train_examples": 4}, "train", 0, tmp_path)
    path = cache.cache_path(task, {"num_train_examples": 4}, "train", 0, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    path.write_bytes(b"not an npz file")
    again = cache.load_or_generate(task, {"num_train_examples": 4}, "train", 0, tmp_path)
    np.testing.assert_array_equal(again.inputs, data.inputs)
