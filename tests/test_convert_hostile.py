"""`madsl convert --from-hf CONFIG.json` given a config.json as a hostile pull request would write it:
every file is refused with a located MadslError (exit status 2, no traceback) or converted into a
spec that `madsl compile` accepts; nothing runs away with time or memory, and a file that is not
JSON is never echoed. One test per case found in review, then Hypothesis properties over
generated hostile files (derandomized, as tests/test_properties.py)."""

from __future__ import annotations

import contextlib
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madsl import account, load_spec
from madsl.cli import main
from madsl.interop.huggingface.config import MAX_CONFIG_BYTES
from madsl.lang.yamlsource import MAX_DEPTH, MAX_INTEGER
from madsl.topology import MAX_BLOCKS

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "specs/public"
CONFIGS = tuple(sorted(path.name.removesuffix(".config.json") for path in PUBLIC.glob("*.config.json")))
PROFILE = dict(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = 10.0  # seconds: a conversion is a few milliseconds; anything near this is a runaway


def _config(name: str = "jamba-v0.1") -> dict:
    return json.loads((PUBLIC / f"{name}.config.json").read_text())


def convert(path: Path | str, *extra: str) -> tuple[int, str, str]:
    """`madsl convert --from-hf PATH` in this process: (exit status, stdout, stderr). An exception other
    than argparse's exit escapes and fails the test: the CLI turns every MadslError into exit status 2."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["convert", "--from-hf", str(path), *extra])
    return rc, out.getvalue(), err.getvalue()


def convert_in_a_box(path: Path | str) -> subprocess.CompletedProcess:
    """The same in a child process with 1 GiB of address space and a minute: a runaway loop or
    read fails the test instead of the machine."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "madsl", "convert", "--from-hf", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        preexec_fn=limit,
    )


def refused(path: Path | str, *message: str) -> str:
    """Converting `path` exits 2 with each of `message` in the error and no traceback; the error."""
    rc, out, err = convert(path)
    assert rc == 2 and out == "", (rc, out, err)
    assert "Traceback" not in err
    for part in message:
        assert part in err, err
    return err


def write_config(tmp_path: Path, text: str | bytes, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def with_value(name: str, key: str, literal: str) -> str:
    """The public config `name` with `key` set to the JSON text `literal`, written as is."""
    data = _config(name)
    data[key] = "@@VALUE@@"
    return json.dumps(data, indent=2).replace('"@@VALUE@@"', literal)


# ---- reading: size, encoding, nesting, numbers ------------------------------------------------------


def test_a_5000_digit_integer_is_refused_at_its_key(tmp_path):
    path = write_config(tmp_path, with_value("jamba-v0.1", "hidden_size", "9" * 5000))
    err = refused(
        path,
        '"hidden_size": the integer 999999999999... (5,000 characters) is too large',
        f"{path}:10:3",
        f"at most {MAX_INTEGER:,}",
    )
    assert "9" * 100 not in err  # the number is shortened, not printed


def test_an_integer_of_65_bits_in_a_key_madsl_does_not_read_is_refused_too(tmp_path):
    path = write_config(tmp_path, with_value("jamba-v0.1", "pad_token_id", str(2**64)))
    refused(path, f'"pad_token_id": the integer {2**64} is too large')


def test_100000_deep_nesting_is_refused_before_json_recurses(tmp_path):
    path = write_config(tmp_path, "[" * 100_000)  # 100 KB: under the size cap
    err = refused(path, f"nested more than {MAX_DEPTH} deep", f"{path}:1:{MAX_DEPTH + 1}")
    assert "[[" not in err
    nested = write_config(tmp_path, '{"a": ' * 10_000 + "1" + "}" * 10_000, "nested.json")
    refused(nested, f"nested more than {MAX_DEPTH} deep")
    # a bracket inside a string is not nesting
    quoted = write_config(tmp_path, with_value("jamba-v0.1", "comment", json.dumps("[" * 1000)), "quoted.json")
    assert convert(quoted)[0] == 0


def test_deep_nesting_does_not_give_a_traceback_in_a_real_process(tmp_path):
    proc = convert_in_a_box(write_config(tmp_path, "[" * 100_000 + "]" * 10_000))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "nested more than" in proc.stderr


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    text = json.dumps(_config()).encode("utf-8").replace(b'"jamba"', b'"jamba\xff"')
    refused(write_config(tmp_path, text), "is not UTF-8 JSON")


def test_a_utf16_file_without_a_byte_order_mark_is_refused(tmp_path):
    text = json.dumps(_config()).encode("utf-16-le")  # valid "UTF-8" too: every other byte is NUL
    err = refused(write_config(tmp_path, text), "is not UTF-8 JSON", "UTF-16")
    assert "model_type" not in err
    refused(write_config(tmp_path, json.dumps(_config()).encode("utf-16"), "bom16.json"), "is not UTF-8 JSON")


def test_utf8_with_a_byte_order_mark_is_utf8(tmp_path):
    rc, out, err = convert(write_config(tmp_path, b"\xef\xbb\xbf" + json.dumps(_config()).encode()))
    assert rc == 0 and "topology: (Mb-Sg:Mb-MoE:" in out, err


def test_dev_zero_is_refused_after_the_size_cap():
    proc = convert_in_a_box("/dev/zero")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"/dev/zero is larger than {MAX_CONFIG_BYTES // 1024} KiB" in proc.stderr


def test_a_file_one_byte_over_the_cap_is_refused_and_one_at_it_is_read(tmp_path):
    text = json.dumps({**_config(), "pad": ""})
    at_cap = text.replace('"pad": ""', '"pad": "' + "x" * (MAX_CONFIG_BYTES - len(text)) + '"')
    assert len(at_cap) == MAX_CONFIG_BYTES
    assert convert(write_config(tmp_path, at_cap))[0] == 0
    refused(write_config(tmp_path, at_cap + " ", "over.json"), "is larger than 128 KiB")


def test_etc_passwd_is_refused_without_printing_a_line_of_it():
    lines = [line for line in Path("/etc/passwd").read_text().splitlines() if line]
    err = refused("/etc/passwd", "not valid JSON", "/etc/passwd:1:1")
    assert not any(line in err for line in lines) and "root:" not in err


def test_a_secret_that_is_not_json_is_not_echoed(tmp_path):
    secret = "token = sk-0123456789abcdef\npassword: hunter2-secret\n"
    err = refused(write_config(tmp_path, secret), "not valid JSON", ":1:1", "expected: a config.json")
    assert "sk-0123" not in err and "hunter2" not in err and "token" not in err


@pytest.mark.parametrize(
    "text,kind",
    [
        ('"sk-secret-token"', "a string"),
        ("[1, 2, 3]", "a list"),
        ("12345", "a number"),
        ("null", "true, false or null"),
    ],
)
def test_a_top_level_that_is_not_an_object_is_refused_without_its_content(tmp_path, text, kind):
    err = refused(write_config(tmp_path, text), f"a config.json holds one JSON object, not {kind}")
    assert "sk-secret" not in err and "12345" not in err and "1, 2" not in err


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused_wherever_they_are(tmp_path, literal):
    for key in ("router_aux_loss_coef", "initializer_range"):  # read, and not read
        path = write_config(tmp_path, with_value("jamba-v0.1", key, literal), f"{key}.json")
        refused(path, f'"{key}": {literal} is not a finite number')


def test_a_repeated_key_is_refused_at_its_second_place(tmp_path):
    text = json.dumps(_config(), indent=2).replace('"hidden_size": 4096,', '"hidden_size": 4096, "hidden_size": 8,')
    refused(write_config(tmp_path, text), '"hidden_size": the key is repeated', ":10:24")


# ---- every value read: type, range, finiteness, located by key -----------------------------------------


@pytest.mark.parametrize(
    "key,literal,message",
    [
        (
            "num_hidden_layers",
            "1e12",
            f'"num_hidden_layers": expected a positive integer at most {MAX_BLOCKS:,}, got 1e12',
        ),
        ("hidden_size", "1e30", "expected a positive integer at most 9,223,372,036,854,775,807, got 1e30"),
        ("hidden_size", str(2**63), f'"hidden_size": the integer {2**63} is too large'),
        ("hidden_size", "4096.0", "got 4096.0"),
        ("hidden_size", "true", "got true"),
        ("hidden_size", '"4096"', 'got "4096"'),
        ("hidden_size", "0", "got 0"),
        ("hidden_size", "-4096", "got -4096"),
        ("attn_layer_offset", "-1", '"attn_layer_offset": expected an integer from 0 to'),
        ("mamba_dt_rank", '"Auto"', '"mamba_dt_rank": expected a positive integer'),
        ("mamba_conv_bias", "1", '"mamba_conv_bias": expected true or false, got 1'),
        ("router_aux_loss_coef", "-0.5", '"router_aux_loss_coef": expected a non-negative finite number, got -0.5'),
        ("router_aux_loss_coef", "false", "got false"),
        ("tie_word_embeddings", '"false"', '"tie_word_embeddings": expected true or false, got "false"'),
        ("model_type", '["jamba"]', '"model_type": expected a string, got a list'),
    ],
)
def test_each_value_read_is_checked_and_located_by_its_key(tmp_path, key, literal, message):
    path = write_config(tmp_path, with_value("jamba-v0.1", key, literal))
    err = refused(path, message, "hint:")
    assert f"{path}:" in err and f'"{key}":' in err.split("\n")[3]  # the caret's line is the key's


def test_a_jamba_stack_of_a_trillion_layers_is_refused_before_it_is_built(tmp_path):
    for literal in ("1000000000000", "1e12", str(MAX_BLOCKS + 1)):
        path = write_config(tmp_path, with_value("jamba-v0.1", "num_hidden_layers", literal))
        start = time.monotonic()
        proc = convert_in_a_box(path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"expected a positive integer at most {MAX_BLOCKS:,}" in proc.stderr
        assert time.monotonic() - start < 30


def test_nemotron_counts_megatron_layers_two_to_a_block(tmp_path):
    path = write_config(tmp_path, with_value("nemotron-h-8b", "num_hidden_layers", str(2 * MAX_BLOCKS + 1)))
    refused(path, f"at most {2 * MAX_BLOCKS:,}", "2 layers each")


@pytest.mark.parametrize(
    "entry,message",
    [
        ('["mamba"]', '"layer_types"[5]: layer 6 is a list'),
        ('{"kind": "mamba"}', '"layer_types"[5]: layer 6 is an object'),
        ("7", '"layer_types"[5]: layer 6 is 7'),
        ('"mаmba"', "U+0430 CYRILLIC SMALL LETTER A"),
    ],
)
def test_layer_types_entries_are_strings_of_the_known_kinds(tmp_path, entry, message):
    kinds = _config("granite-4.0-h-small")["layer_types"]
    literal = "[" + ", ".join(entry if i == 5 else json.dumps(k) for i, k in enumerate(kinds)) + "]"
    refused(
        write_config(tmp_path, with_value("granite-4.0-h-small", "layer_types", literal)),
        message,
        'each layer is "mamba", "attention", "linear_attention" or "full_attention"',
    )


def test_a_look_alike_letter_in_a_pattern_is_named_by_its_code_point(tmp_path):
    pattern = _config("nemotron-h-8b")["hybrid_override_pattern"]
    for written in (json.dumps("М" + pattern[1:], ensure_ascii=False), json.dumps("М" + pattern[1:])):  # raw, \u041c
        path = write_config(tmp_path, with_value("nemotron-h-8b", "hybrid_override_pattern", written))
        refused(
            path, "\"hybrid_override_pattern\": character 1 is 'М' (U+041C CYRILLIC CAPITAL LETTER EM)", "look-alike"
        )
    path = write_config(tmp_path, with_value("nemotron-h-8b", "hybrid_override_pattern", json.dumps("m" + pattern[1:])))
    refused(path, "character 1 is 'm', not a layer character", "one of M * - E")


def test_a_pairing_error_in_a_pattern_written_with_escapes_is_located_at_the_key(tmp_path):
    pattern = "-" + _config("nemotron-h-8b")["hybrid_override_pattern"][1:]
    refused(
        write_config(
            tmp_path,
            with_value("nemotron-h-8b", "hybrid_override_pattern", json.dumps(pattern).replace("-", "\\u002d", 1)),
        ),
        '"hybrid_override_pattern": layer 1',
        ":11:3",
    )
    refused(
        write_config(
            tmp_path, with_value("nemotron-h-8b", "hybrid_override_pattern", json.dumps(pattern)), "plain.json"
        ),
        '"hybrid_override_pattern": layer 1',
        ":11:31",
    )


def test_a_bad_value_inside_rope_parameters_is_named_by_its_path_and_located_at_its_key(tmp_path):
    text = with_value("lfm2-1.2b", "rope_parameters", '{"rope_type": "default", "rope_theta": "1e6"}')
    err = refused(write_config(tmp_path, text), '"rope_parameters"."rope_theta": expected a positive finite number')
    line = next(i for i, row in enumerate(text.splitlines(), 1) if '"rope_parameters"' in row)
    assert f":{line}:" in err


def test_a_layers_block_type_entry_is_located_by_its_index(tmp_path):
    data = {
        k: v
        for k, v in _config("nemotron-3-nano-30b-a3b").items()
        if k not in ("hybrid_override_pattern", "num_hidden_layers")
    }
    data["layers_block_type"] = ["mamba", "moe", "mаmba"]  # a Cyrillic a
    err = refused(
        write_config(tmp_path, json.dumps(data, indent=2, ensure_ascii=False)), '"layers_block_type"[2]', "U+0430"
    )
    assert "Traceback" not in err


def test_a_look_alike_model_type_is_named(tmp_path):
    refused(
        write_config(tmp_path, with_value("jamba-v0.1", "model_type", '"jаmba"')),
        'madsl converts no "jаmba" configs',
        "U+0430 CYRILLIC SMALL LETTER A",
    )


# ---- the result compiles, or the conversion is refused ---------------------------------------------


def test_a_config_whose_spec_would_not_compile_is_refused_and_nothing_is_written(tmp_path):
    path = write_config(tmp_path, with_value("nemotron-h-8b", "n_groups", "3"))
    out = tmp_path / "out.mad"
    rc, _, err = convert(path, "-o", str(out))
    assert rc == 2 and "does not compile" in err and "groups=3 does not divide" in err and not out.exists()
    data = _config("nemotron-h-8b")
    data.update(num_hidden_layers=2 * MAX_BLOCKS, hybrid_override_pattern="M" * 2 * MAX_BLOCKS)
    refused(
        write_config(tmp_path, json.dumps(data), "long.json"),
        "does not compile",
        f"beyond the limit of {MAX_BLOCKS:,} blocks",
    )


def test_a_layer_value_compile_refuses_is_refused_by_convert(tmp_path):
    rc, out, err = convert(PUBLIC / "jamba-v0.1.config.json", "--layer", "MoE.aux_loss_weight=.nan")
    assert rc == 2 and out == "" and "--layer MoE.aux_loss_weight=.nan: '.nan' is not a finite number" in err
    rc, out, err = convert(PUBLIC / "jamba-v0.1.config.json", "--layer", f"Sg.inner={2**63}")
    assert rc == 2 and "too large" in err


@pytest.mark.parametrize("value", ["[", "[" * 3000, "{a: [1"])
def test_a_layer_value_that_is_not_yaml_is_refused(value):
    rc, out, err = convert(PUBLIC / "jamba-v0.1.config.json", "--layer", f"A.heads={value}")
    assert rc == 2 and out == "" and "--layer A.heads=...: the value is not a YAML value" in err


def test_the_largest_values_madsl_reads_convert_into_a_spec_that_compiles(tmp_path):
    data = _config("jamba-v0.1")
    data.update(mamba_d_state=10**18, vocab_size=MAX_INTEGER, router_aux_loss_coef=1e300)
    rc, out, err = convert(write_config(tmp_path, json.dumps(data)))
    assert rc == 0, err
    spec = write_config(tmp_path, out, "converted.mad")
    assert account(load_spec(spec)).spec.vocab == MAX_INTEGER


# ---- Hypothesis: generated hostile config.json files ----------------------------------------------


def assert_sound(path: Path) -> tuple[int, str]:
    """Converting `path`: exit 0 or 2, never an exception or a traceback, quickly; exit 0 only with a
    spec that loads and accounts as `madsl compile` reads it."""
    start = time.monotonic()
    rc, out, err = convert(path)
    assert time.monotonic() - start < SLOW
    assert rc in (0, 2) and "Traceback" not in err
    if rc == 0:
        with tempfile.TemporaryDirectory() as folder:
            spec = Path(folder) / "converted.mad"
            spec.write_text(out)
            account(load_spec(spec))
    else:
        assert err.startswith("error: ") and out == ""
    return rc, err


def _deep(depth: int, bracket: str) -> str:
    return ('{"a": ' * depth + "1" + "}" * depth) if bracket == "{" else "[" * depth + "1" + "]" * depth


LOOK_ALIKES = "MEАВЕКМНОРСТХаеорсхΑΒΕΜΟΡΤμοⅯＭ\u200b\u00a0"
STRINGS = st.one_of(
    st.sampled_from(
        [
            "mamba",
            "attention",
            "auto",
            "rope",
            "nope",
            "relu2",
            "jamba",
            "nemotron_h",
            "granitemoehybrid",
            "bamba",
            "falcon_h1",
            "lfm2",
            "zamba2",
            "conv",
            "full_attention",
            "moe",
            "M-M-M*-",
            "",
        ]
    ),
    st.text(st.sampled_from("M*-E" + LOOK_ALIKES), max_size=60),
    st.text(max_size=20),
)
LITERALS = st.one_of(
    st.integers(1, 6000).map(lambda n: "9" * n),  # past 64 bits, past Python's 4,300 digits
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),  # NaN, Infinity, 1e+300, -0.0
    st.sampled_from(
        [
            "1e999",
            "-1e999",
            "1e12",
            "1E3",
            "32.0",
            "0",
            "-1",
            "true",
            "false",
            "null",
            '"32"',
            "[]",
            "{}",
            "1024",
            "1025",
            "2048",
            "2049",
            "-0",
        ]
    ),
    STRINGS.map(lambda s: json.dumps(s, ensure_ascii=False) if s.isprintable() else json.dumps(s)),
    st.lists(
        st.sampled_from(
            [
                '"mamba"',
                '"attention"',
                '["mamba"]',
                "{}",
                '"mаmba"',
                "1",
                "null",
                '"moe"',
                '"conv"',
                '"full_attention"',
                '"mlp"',
                "9",
                "0",
            ]
        ),
        max_size=50,
    ).map(lambda items: "[" + ", ".join(items) + "]"),
    st.builds(_deep, st.integers(1, 3 * MAX_DEPTH), st.sampled_from("[{")),
)


def _never_read(literal: str) -> bool:
    """A literal refused wherever it is written: NaN, an infinity, an integer past 64 bits."""
    digits = literal.removeprefix("-")
    return (
        digits in ("NaN", "Infinity", "1e999")
        or digits.isdigit()
        and (len(digits) > len(str(MAX_INTEGER)) or int(digits) > MAX_INTEGER)
    )


@st.composite
def hostile_configs(draw) -> tuple[str, list[tuple[str, str]]]:
    """A public config with 1 to 4 keys (read ones, or new ones) set to hostile JSON literals."""
    name = draw(st.sampled_from(CONFIGS))
    data = _config(name)
    keys = sorted(data) + [
        "text_config",
        "initializer_range",
        "rope_theta",
        "mamba_d_head",
        "head_dim",
        "rope_parameters",
        "layers_block_type",
        "moe_latent_size",
        "attn_layer_indices",
    ]
    changes = draw(
        st.lists(st.tuples(st.sampled_from(keys), LITERALS), min_size=1, max_size=4, unique_by=lambda change: change[0])
    )
    for i, (key, _) in enumerate(changes):
        data[key] = f"@@{i}@@"
    text = json.dumps(data, indent=2)
    for i, (_, literal) in enumerate(changes):
        text = text.replace(f'"@@{i}@@"', literal)
    return text, changes


@settings(max_examples=150, **PROFILE)
@given(hostile_configs())
def test_hostile_values_are_refused_at_their_key_or_convert_to_a_spec_that_compiles(case):
    text, changes = case
    with tempfile.TemporaryDirectory() as folder:
        rc, err = assert_sound(write_config(Path(folder), text))
    deep = [key for key, literal in changes if literal[:1] in "[{" and literal.count(literal[0]) >= MAX_DEPTH]
    never = [key for key, literal in changes if _never_read(literal)]
    if deep:  # inside the top-level object: one level more; refused before json parses
        assert rc == 2 and f"nested more than {MAX_DEPTH} deep" in err, err
    elif never:  # refused wherever it is written, named by its key
        assert rc == 2 and any(f'"{key}"' in err for key in never), err


@settings(max_examples=100, **PROFILE)
@given(st.sampled_from(CONFIGS), st.data())
def test_corrupted_bytes_never_give_a_traceback(name, data):
    """A public config with bytes replaced, inserted or cut, or random bytes altogether."""
    raw = json.dumps(_config(name), indent=2).encode()
    kind = data.draw(st.sampled_from(["splice", "cut", "random"]))
    if kind == "random":
        raw = data.draw(st.binary(max_size=400))
    else:
        at = data.draw(st.integers(0, len(raw)))
        end = at if kind == "splice" and data.draw(st.booleans()) else data.draw(st.integers(at, len(raw)))
        raw = raw[:at] + (data.draw(st.binary(min_size=1, max_size=8)) if kind == "splice" else b"") + raw[end:]
    with tempfile.TemporaryDirectory() as folder:
        assert_sound(write_config(Path(folder), raw))


@settings(max_examples=60, **PROFILE)
@given(
    st.lists(
        st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=30), min_size=1, max_size=6
    ),
    st.from_regex(r"SECRET[a-z0-9]{8}", fullmatch=True),
    st.integers(0, 5),
)
def test_a_file_that_is_not_a_json_object_is_never_echoed(lines, secret, where):
    lines.insert(min(where, len(lines)), secret)
    text = "\n".join(lines)
    with tempfile.TemporaryDirectory() as folder:
        rc, err = assert_sound(write_config(Path(folder), text))
    try:
        is_object = isinstance(json.loads(text), dict)
    except ValueError:
        is_object = False
    if not is_object:
        assert rc == 2 and secret not in err and not any(len(line) >= 8 and line in err for line in lines), err
