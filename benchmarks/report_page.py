"""The HTML report at a few thousand runs (`madsl report --html`, docs/report.md): the page's size,
the time to build it, and its load time in headless Chromium (Debian's chromium and chromedriver),
with the time a click takes to sort the runs table; and a screenshot of the page for the docs.

    python benchmarks/report_page.py --specs 111 --screenshot docs/figures/report-page.png

The database is tests/report_helpers.py's, made larger: `--specs` architectures x 9 task settings
x 3 learning rates of MAD runs (111 specs: 2,997 runs), a study's 12 pretraining runs and a search.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from report_helpers import make_database  # noqa: E402
from test_report_html import Driver, _free_port  # noqa: E402

from madsl.report.html import write_page  # noqa: E402

LOAD = (
    "const t = performance.timing; "
    "return [t.domContentLoadedEventEnd - t.navigationStart, t.loadEventEnd - t.navigationStart];"
)
SORT = """const th = document.querySelector('#run-table thead th:nth-child(12)'); const t0 = performance.now();
th.click(); return performance.now() - t0;"""


def browse(page: Path, screenshot: Path | None) -> dict:
    port = _free_port()
    process = subprocess.Popen(
        [shutil.which("chromedriver"), f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    driver = Driver(port)
    try:
        for _ in range(100):
            try:
                driver.call("GET", "/status")
                break
            except (OSError, AssertionError):
                time.sleep(0.1)
        driver.start(shutil.which("chromium"))
        loads = []
        for _ in range(3):
            driver.call("POST", f"/session/{driver.session}/url", {"url": page.as_uri()})
            loads.append(driver.run(LOAD))
        sort_ms = driver.run(SORT)
        if screenshot is not None:
            driver.call("POST", f"/session/{driver.session}/url", {"url": page.as_uri()})
            driver.call("POST", f"/session/{driver.session}/window/rect", {"width": 1300, "height": 1500})
            screenshot.write_bytes(base64.b64decode(driver.call("GET", f"/session/{driver.session}/screenshot")))
        driver.call("DELETE", f"/session/{driver.session}")
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {"dom_ms": sorted(d for d, _ in loads)[1], "load_ms": sorted(x for _, x in loads)[1], "sort_ms": sort_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, default=111)
    parser.add_argument("--screenshot", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        db = make_database(
            folder / "r.db", specs=tuple(f"arch-{i:03d}" for i in range(args.specs)), lrs=(1e-3, 5e-4, 1e-4)
        )
        made = time.perf_counter() - started
        started = time.perf_counter()
        page = write_page(db, folder / "page")
        built = time.perf_counter() - started
        from madsl.runner.store.results import Store

        store = Store(db, create=False)
        runs = len(store.runs())
        store.close()
        figures = browse(page, args.screenshot)
        print(
            f"runs {runs:,} (database made in {made:.1f} s); "
            f"page {page.stat().st_size / 2**20:.2f} MiB built in {built:.1f} s"
        )
        print(
            f"headless chromium: DOMContentLoaded {figures['dom_ms']} ms, load {figures['load_ms']} ms (median of 3); "
            f"sorting the runs table by a column {figures['sort_ms']:.0f} ms"
        )


if __name__ == "__main__":
    main()
