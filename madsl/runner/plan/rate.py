"""This machine's training rates as the plan reads them (`RateBook`): from the cache
(madsl.runner.plan.rate_cache), measured where missing or on request (madsl.runner.plan.rate_measure);
what a rate is and how it is measured: madsl.runner.plan.rate_model.

A cache that cannot be used is said in a warning on the logger "madsl.runner.plan.rate" (the
`madsl` command prints it as `warning: ...`; a program sees it wherever it sends its logging),
not through `warnings.warn`, which shows the user a line of madsl's source.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from madsl.runner.plan import rate_measure
from madsl.runner.plan.rate_cache import (
    FORMAT,
    MEASURED,
    OUTSIDE,
    cache_path,
    check_device,
    read_cache,
    save_cache,
)
from madsl.runner.plan.rate_model import DeviceRates, Line, Measured, Outside, Progress, device_name

log = logging.getLogger(__name__)


class RateBook:
    """The rates of the devices a plan's runs train on: read from the cache at `path` (None:
    none), measured where missing or, with `remeasure`, measured again; `save` keeps them."""

    def __init__(self, path: Path | None = None, remeasure: bool = False, progress: Progress | None = None):
        self.path, self.remeasure, self.progress = path, remeasure, progress
        self.data: dict[str, Any] = {"format": FORMAT, "devices": {}}
        self.changed = False
        self.books: dict[tuple[str, int], DeviceRates] = {}
        self.used: dict[tuple[str, int], set[str]] = {}  # the families each device's runs asked for
        self.unavailable: dict[str, str] = {}  # a device the runs name that this machine lacks -> why
        if path is not None and (path.exists() or path.is_symlink()):
            try:
                self.data = read_cache(path)
            except ValueError as err:  # measured again, and rewritten by save() (a link, a folder: left alone)
                log.warning(
                    "%s: not a usable rate cache (%s); it is set aside and this machine's training rates "
                    "are measured again",
                    path,
                    err,
                )

    @classmethod
    def default(cls, remeasure: bool = False, progress: Progress | None = None) -> "RateBook":
        """The book of this machine's cache (rate_cache.cache_path)."""
        return cls(cache_path(), remeasure, progress)

    @classmethod
    def known(cls, rates: DeviceRates, path: Path | None = None) -> "RateBook":
        """A book holding `rates` (e.g. another machine's, to plan for it), kept at `path` by
        `save` where one is given; a family they lack is measured here."""
        book = cls(None)
        book.path, book.changed = path, path is not None
        book.books[(rates.device, rates.threads)] = rates
        book.data["devices"][device_key(rates.device, rates.threads)] = to_entry(rates)
        return book

    def rates(self, device: Any, threads: int, families: set[str]) -> DeviceRates:
        """The rates of `device` (a torch.device) at `threads`, for every family of `families`
        (each missing one measured now, with the rest of a model and the threads' speedup)."""
        name = device_name(device)
        threads = threads if device.type == "cpu" else 1
        book = self.books.get((name, threads))
        if book is None:
            entry = {} if self.remeasure else self.data["devices"].get(device_key(name, threads), {})
            book = self.books[(name, threads)] = from_entry(name, threads, entry)
        missing = sorted(f for f in families if f not in book.families and f not in book.failed)
        if missing or book.rest is None or book.startup is None:
            rate_measure.measure_into(book, device, missing, self.progress)
            self.data["devices"][device_key(name, threads)] = to_entry(book)
            self.changed = True
        self.used.setdefault((name, threads), set()).update(families)
        return book

    def describe(self) -> list[dict[str, Any]]:
        """Where the rates the plan used come from, a device at a time (DeviceRates.describe)."""
        return [
            {**self.books[key].describe(sorted(families)), "cache": str(self.path) if self.path else None}
            for key, families in self.used.items()
        ] + [{"device": name, "unavailable": why} for name, why in self.unavailable.items()]

    def save(self) -> None:
        if self.changed and self.path is not None:
            save_cache(self.path, self.data)
            self.changed = False


def device_key(name: str, threads: int) -> str:
    """The cache's key of a device's rates: its name, threads, torch's and madsl's versions (a
    new version of either may change how fast a layer trains: measured again)."""
    import torch

    from madsl.runner.store.results import canonical_json, madsl_version, sha256

    return sha256(canonical_json([name, threads, torch.__version__, madsl_version()]))


def from_entry(name: str, threads: int, entry: dict[str, Any]) -> DeviceRates:
    """A device's rates as the cache holds them (checked by rate_cache on read)."""
    book = DeviceRates(name, threads)
    for family, line in entry.get("families", {}).items():
        points = tuple((int(w), float(o), float(r)) for w, o, r in line.get("points", []))
        book.families[family] = Line(line["overhead_s"], line["flops_per_s"], line["measured"], line["load"], points)
    for key, number in MEASURED.items():
        if key in entry:
            setattr(book, key, Measured(entry[key][number], entry[key]["measured"], entry[key]["load"]))
    if "outside" in entry:
        outside = entry["outside"]
        book.outside = Outside(*(outside[key] for key in OUTSIDE), outside["measured"], outside["load"])
    return book


def to_entry(book: DeviceRates) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "device": book.device,
        "threads": book.threads,
        "families": {
            family: {
                "overhead_s": line.overhead_s,
                "flops_per_s": line.flops_per_s,
                "measured": line.measured,
                "load": line.load,
                **({"points": [list(point) for point in line.points]} if line.points else {}),
            }
            for family, line in sorted(book.families.items())
        },
    }
    if book.outside is not None:
        outside = book.outside
        entry["outside"] = {
            **{key: getattr(outside, key) for key in OUTSIDE},
            "measured": outside.measured,
            "load": outside.load,
        }
    for key, number in MEASURED.items():
        value = getattr(book, key)
        if value is not None:
            entry[key] = {number: value.value, "measured": value.measured, "load": value.load}
    check_device(entry, "the rates just measured")  # what is written is what a read accepts
    return entry
