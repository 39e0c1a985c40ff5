"""`madsl report --html DIR` (madsl/report/html.py): one self-contained page, checked as text (every
section, no network address, the same bytes from the same database) and in a real browser: Debian's
Chromium driven headless through its WebDriver (chromedriver, on a loopback port this test picks),
which loads the page from its file, reports no console error, sorts the leaderboard by a clicked
column and renders every section. Skipped, saying why, where chromium or chromedriver is absent
(.ci/run installs both)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from report_helpers import make_database

from madsl.cli import main

SECTIONS = ("leaderboard", "heatmap", "runs", "sweeps", "studies", "searches", "commands")
NETWORK = re.compile(
    r"(?i)\b(?:https?|ftps?|wss?|file)://|//www\.|\bwww\.|\b\d{1,3}(?:\.\d{1,3}){3}\b|<link\b|@import|url\("
)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("html")
    db = make_database(folder / "r.db")
    assert main(["report", "--db", str(db), "--html", str(folder / "page"), "--quiet"]) == 0
    return folder / "page" / "index.html"


def test_the_page_holds_every_section_and_no_network_address(page):
    text = page.read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f'<section id="{section}">' in text
    assert NETWORK.search(text) is None, NETWORK.search(text)
    assert " src=" not in text and "<iframe" not in text
    assert text.count("<svg") >= 6  # the sweeps, the study's three charts, the search's two
    assert (
        "madsl eval specs/paper/mamba.mad specs/paper/attention-sg.mad specs/paper/hyena.mad" in text.replace("\n", " ")
        or "--protocol quick" in text
    )


def test_the_same_database_gives_the_same_page(page, tmp_path):
    assert main(["report", "--db", str(page.parent.parent / "r.db"), "--html", str(tmp_path), "--quiet"]) == 0
    again = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert again.replace(str(tmp_path), str(page.parent)) == page.read_text(encoding="utf-8")  # (the commands name it)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Driver:
    """Just enough of the W3C WebDriver protocol, over urllib, to load, click and read a page."""

    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"
        self.session = ""

    def call(self, method: str, path: str, body: dict | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        try:
            with opener.open(request, timeout=60) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{method} {path}: {err.code} {err.read()[:400]!r}") from None

    def start(self, chromium: str) -> None:
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,900"]
        caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": chromium, "args": args}}
        caps["goog:loggingPrefs"] = {"browser": "ALL"}
        self.session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]

    def run(self, script: str) -> object:
        return self.call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": []})

    def click(self, css: str) -> None:
        found = self.call("POST", f"/session/{self.session}/element", {"using": "css selector", "value": css})
        self.call("POST", f"/session/{self.session}/element/{next(iter(found.values()))}/click", {})


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip(
            "the browser check needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        )
    port = _free_port()
    process = subprocess.Popen([chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = Driver(port)
    try:
        for _ in range(100):
            try:
                driver.call("GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        driver.start(chromium)
        yield driver
        driver.call("DELETE", f"/session/{driver.session}")
    finally:
        process.terminate()
        process.wait(timeout=30)


COLUMN = """
const table = document.getElementById("board");
const col = Array.from(table.tHead.rows[0].cells).findIndex(th => th.textContent === "MAD score");
return Array.from(table.tBodies[0].rows).map(row => row.cells[col].getAttribute("data-v"));
"""


def test_the_page_in_headless_chromium(page, browser):
    browser.call("POST", f"/session/{browser.session}/url", {"url": page.as_uri()})
    assert browser.run("return document.body.getAttribute('data-ready')") == "1"  # its script ran to the end
    browser.click("#board thead th:nth-child(10)")  # "MAD score", after architecture, protocol, conventions
    ascending = [float(v) for v in browser.run(COLUMN)]
    assert ascending == sorted(ascending) and len(ascending) == 3
    browser.click("#board thead th:nth-child(10)")
    assert [float(v) for v in browser.run(COLUMN)] == sorted(ascending, reverse=True)
    browser.click("#board thead th:nth-child(1)")  # by name
    names = browser.run(
        "return Array.from(document.querySelectorAll('#board tbody tr td:first-child'), c => c.textContent)"
    )
    assert names == sorted(names)
    rendered = browser.run(
        "return Array.from(document.querySelectorAll('section'), s => [s.id, s.getBoundingClientRect().height, "
        "s.querySelectorAll('svg polyline, svg circle').length, s.querySelectorAll('table tr').length])"
    )
    sizes = {sid: (height, marks, rows) for sid, height, marks, rows in rendered}
    assert set(sizes) == set(SECTIONS) and all(height > 20 for height, _, _ in sizes.values())
    assert sizes["sweeps"][1] > 0 and sizes["studies"][1] > 0 and sizes["searches"][1] > 0
    assert sizes["heatmap"][2] == 4 and sizes["runs"][2] == 55
    logs = browser.call("POST", f"/session/{browser.session}/se/log", {"type": "browser"})
    errors = [entry for entry in logs if entry.get("level") in ("SEVERE", "ERROR")]
    assert errors == []
