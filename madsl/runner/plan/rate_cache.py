"""The cache of this machine's measured training rates (madsl.runner.plan.rate): where it lives,
how it is read back and how it is written.

    $MADSL_CACHE_DIR/device-rates.json       where that variable is set, else
    $XDG_CACHE_HOME/madsl/device-rates.json  where that one is, else ~/.cache/madsl/

The rates are the machine's, not a results database's: one cache serves every plan made here.
What is read back is untrusted input (the folder may be shared, or written by others): a file
that is not what madsl writes (a symbolic link, not a regular file, too large, not JSON, a key,
a name or a number out of place or out of range) is refused with a ValueError saying what is
wrong, and the caller measures again; a symbolic link is neither read nor replaced. "In range"
is what the machine it claims to be could measure (`plausible_ranges`: per core on a CPU, per
device on a GPU), not merely what a float holds: a cached 1 FLOP/s planned 2,230 hours for a
4-step run. The text shown to the user from it (a device's name) is plain printable text.
Writing is atomic (a new file moved into place); where the folder cannot be written, the next
plan measures again.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

from madsl.oserrors import os_error_words
from madsl.paths import cache_dir

CACHE_NAME = "device-rates.json"
# the layout below; 2: a family's lines at a ladder of widths ("points") and the rest's other terms
# ("outside"). A format-1 cache (one line a family at width 128) is read as empty: measured again,
# never read as format 2; any other is refused (and measured again)
FORMAT = 2
OLDER_FORMATS = (1,)
MAX_BYTES = 1024 * 1024  # madsl writes ~200 bytes a family, a few dozen families a device
MAX_DEVICES = 64
MAX_FAMILIES = 256
MAX_LOAD = 1e6  # a load average
MAX_THREADS = 4096

_KEY = re.compile(r"[0-9a-f]{64}")  # a sha256, as rate.device_key makes them
_FAMILY = re.compile(r"[a-z][a-z0-9_]{0,63}")  # a primitive's name
_TEXT = re.compile(r"[ -~]{1,200}")  # printable ASCII: a name shown on the terminal

# a device's other measurements: the rest of a model, the threads' speedup, a process's start-up
MEASURED = {"rest": "seconds_per_layer_token", "threads_speedup": "factor", "startup": "seconds"}
# The training rate of one layer family a real device measures: a CPU's per core (the families are
# timed on one thread; times the threads recorded, for headroom), a GPU's for the device. Below the
# floor is slower than any CPU of this century; above the ceiling, faster than any chip made.
CPU_FLOPS_PER_CORE = (1e6, 1e12)
GPU_FLOPS = (1e8, 1e17)
MAX_OVERHEAD_S = 60.0  # a layer's fixed cost a training step at width 128: milliseconds on any machine
MAX_REST_S = 1e-3  # the rest of a model, a layer and a token: microseconds on any machine
MAX_FIXED_S = 60.0  # a step's fixed cost outside its layers: milliseconds on any machine
MAX_PER_LOGIT_S = 1e-3  # a logit's head and loss: nanoseconds on any machine
MAX_PER_PARAM_S = 1e-3  # a parameter's optimizer step: nanoseconds on any machine
MAX_STARTUP_S = 600.0  # a process's imports and first optimizer: seconds on any machine
MAX_WIDTH = 1 << 20
MAX_POINTS = 16
# the interval's factors (actual / fitted step time at the rest's points): a fit off by more than
# 100x either way is not a measurement
INTERVAL_FACTOR = (1e-2, 1e2)


def plausible_ranges(device: str, threads: int) -> dict[str, tuple[float, float]]:
    """Each number of a device's measurements -> the range a real measurement of that device (a
    name as rate_model.device_name makes it: "cpu: ..." or "cuda: ...") at `threads` lies in."""
    low, high = GPU_FLOPS if device.startswith("cuda") else (CPU_FLOPS_PER_CORE[0], CPU_FLOPS_PER_CORE[1] * threads)
    return {
        "overhead_s": (0.0, MAX_OVERHEAD_S),
        "flops_per_s": (low, high),
        "seconds_per_layer_token": (0.0, MAX_REST_S),
        "factor": (1.0, float(threads)),
        "fixed_s": (0.0, MAX_FIXED_S),
        "per_logit_s": (0.0, MAX_PER_LOGIT_S),
        "per_param_s": (0.0, MAX_PER_PARAM_S),
        "seconds": (0.0, MAX_STARTUP_S),
        "low": INTERVAL_FACTOR,
        "high": INTERVAL_FACTOR,
    }


OUTSIDE = ("fixed_s", "per_logit_s", "per_param_s", "low", "high")  # the numbers of a device's "outside"


def cache_path() -> Path:
    """Where this machine's rates are cached (the module's docstring; madsl.paths.cache_dir)."""
    return cache_dir() / CACHE_NAME


def read_cache(path: Path) -> dict[str, Any]:
    """The cache at `path` as madsl wrote it: {"format": 2, "devices": {key: device}} (a format-1
    one: no devices); a ValueError saying what is wrong with it otherwise (see the module's docstring)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise ValueError(
            "it is a symbolic link, which madsl does not follow"
            if path.is_symlink()
            else f"it cannot be read: {os_error_words(err)}"
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # a folder (which fdopen refuses with IsADirectoryError), a FIFO, a device
        os.close(fd)
        raise ValueError("it is a folder, not a file" if stat.S_ISDIR(mode) else "it is not a regular file")
    with os.fdopen(fd, "rb") as f:
        text = f.read(MAX_BYTES + 1)
    if len(text) > MAX_BYTES:
        raise ValueError(f"it is larger than {MAX_BYTES // 1024} KiB")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:  # RecursionError: nesting deeper than the parser goes
        raise ValueError(f"it is not JSON: {str(err)[:120] or type(err).__name__}") from None
    _expect(data, dict, "the file")
    if set(data) == {"format", "devices"} and data["format"] in OLDER_FORMATS:
        return {"format": FORMAT, "devices": {}}  # an older madsl's rates: measured again, never misread
    if set(data) != {"format", "devices"} or data["format"] != FORMAT:
        raise ValueError(f"it is not a format-{FORMAT} rate cache (keys format and devices)")
    devices = _expect(data["devices"], dict, "devices")
    if len(devices) > MAX_DEVICES:
        raise ValueError(f"it holds {len(devices)} devices, more than {MAX_DEVICES}")
    for key, device in devices.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"device key {key[:70]!r} is not a rate-cache key")
        check_device(device, key[:12])
    return data


def check_device(device: Any, where: str) -> None:
    """One device's entry: {"device": name, "threads": n, "families": {name: measurement},
    "rest", "threads_speedup", "outside": measurement (each optional)}; ValueError otherwise."""
    _expect(device, dict, where)
    allowed = {"device", "threads", "families", "outside", *MEASURED}
    if not {"device", "threads", "families"} <= set(device) <= allowed:
        raise ValueError(f"{where}: expected the keys {', '.join(sorted(allowed))}")
    if not isinstance(device["device"], str) or not _TEXT.fullmatch(device["device"]):
        raise ValueError(f"{where}: the device's name is not printable text of at most 200 characters")
    threads = device["threads"]
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"{where}: threads {_short(threads)} is not an integer in 1..{MAX_THREADS}")
    families = _expect(device["families"], dict, f"{where}: families")
    if len(families) > MAX_FAMILIES:
        raise ValueError(f"{where}: {len(families)} families, more than {MAX_FAMILIES}")
    ranges = plausible_ranges(device["device"], threads)
    kind = f"{device['device'][:40]} at {threads} thread(s)"
    for name, measurement in families.items():
        if not _FAMILY.fullmatch(name):
            raise ValueError(f"{where}: {name[:70]!r} is not a layer family's name")
        line = {key: ranges[key] for key in ("overhead_s", "flops_per_s")}
        _expect(measurement, dict, f"{where}: {name}")
        check_measurement({k: v for k, v in measurement.items() if k != "points"}, line, f"{where}: {name}", kind)
        _check_points(measurement.get("points", []), line, f"{where}: {name}: points", kind)
    for name, number in MEASURED.items():
        if name in device:
            check_measurement(device[name], {number: ranges[number]}, f"{where}: {name}", kind)
    if "outside" in device:
        check_measurement(device["outside"], {key: ranges[key] for key in OUTSIDE}, f"{where}: outside", kind)


def _check_points(points: Any, line: dict[str, tuple[float, float]], where: str, kind: str) -> None:
    """A family's lines at a ladder of widths: [[width, overhead_s, flops_per_s], ...], each in range."""
    _expect(points, list, where)
    if len(points) > MAX_POINTS:
        raise ValueError(f"{where}: {len(points)} widths, more than {MAX_POINTS}")
    for point in points:
        if not isinstance(point, list) or len(point) != 3:
            raise ValueError(f"{where}: {_short(point)} is not [width, overhead_s, flops_per_s]")
        width, overhead, rate = point
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
            raise ValueError(f"{where}: width {_short(width)} is not an integer in 1..{MAX_WIDTH}")
        for name, value in (("overhead_s", overhead), ("flops_per_s", rate)):
            low, high = line[name]
            if not _number(value) or not low <= value <= high:
                raise ValueError(
                    f"{where}: {name} {_short(value)} at width {width} is not a finite number in "
                    f"[{low:g}, {high:g}] (what {kind} could measure)"
                )


def check_measurement(entry: Any, fields: dict[str, tuple[float, float]], where: str, kind: str = "") -> None:
    """A measurement: its numbers (each finite, in its range: what `kind` of device could
    measure), when ("measured": an ISO date and time) and under what load (the 1-minute load
    average, or null where the system has none)."""
    _expect(entry, dict, where)
    if set(entry) != {*fields, "measured", "load"}:
        raise ValueError(f"{where}: expected the keys {', '.join(sorted({*fields, 'measured', 'load'}))}")
    for name, (low, high) in fields.items():
        value = entry[name]
        if not _number(value) or not low <= value <= high:
            raise ValueError(
                f"{where}: {name} {_short(value)} is not a finite number in [{low:g}, {high:g}]"
                + (f" (what {kind} could measure)" if kind and _number(value) else "")
            )
    if entry["load"] is not None and (not _number(entry["load"]) or not 0 <= entry["load"] <= MAX_LOAD):
        raise ValueError(f"{where}: load {_short(entry['load'])} is not null or a finite number in [0, {MAX_LOAD:g}]")
    measured = entry["measured"]
    try:
        if not isinstance(measured, str) or len(measured) > 40:
            raise ValueError
        datetime.fromisoformat(measured)
    except ValueError:
        raise ValueError(f"{where}: measured {_short(measured)} is not an ISO date and time") from None


def save_cache(path: Path, data: dict[str, Any]) -> bool:
    """Write the cache (atomically); False where it cannot be (a read-only home, a full disk)
    or where `path` is a symbolic link (not madsl's: neither followed nor replaced)."""
    if path.is_symlink():
        return False
    from madsl.outputs import write_text_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))  # its temporary: O_EXCL, never followed
        return True
    except OSError:
        return False


def _expect(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{where}: a {type(value).__name__} where a {kind.__name__} belongs")
    return value


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number of a rate cache")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
