"""The dashboard of a running job in a real headless browser (Debian's chromium and
chromium-driver, driven by selenium): every step of the graph is drawn, the records
counter rises while the job runs, the stateful step shows its state. A screenshot is
kept in ``test-artifacts/`` (EMBER_TEST_ARTIFACTS to change it)."""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
import time

import dashboard_job
import pytest

from ember.runner.spark.checkpoint import CheckpointLayout

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = pathlib.Path(os.environ.get("EMBER_TEST_ARTIFACTS", pathlib.Path(__file__).resolve().parents[2] / "test-artifacts"))


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, DRIVER):  # `make test` installs them (Debian's chromium, chromium-driver)
        assert os.path.exists(path), f"{path} is missing: apt-get install chromium chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,1100"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


def _wait(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.mark.spark
def test_the_dashboard_of_a_running_job_in_chromium(env):
    sinks = dashboard_job.build(env, rate=4_000)
    steps = [n.name for n in env.graph().nodes]
    checkpoint = str(pathlib.Path(env.config.checkpoint_dir) / "watched")
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = env.execute("watched", checkpoint=checkpoint, duration_s=90, ui=0, progress=False)
        except BaseException as exc:  # reported by the test below
            outcome["error"] = exc

    job = threading.Thread(target=run, daemon=True)
    job.start()
    board = _wait(lambda: env.dashboard, 60, "the dashboard to start")
    browser = _browser()
    try:
        browser.get(board.url)
        drawn = _wait(lambda: [g.get_attribute("data-step") for g in browser.find_elements("css selector", "#graph g.step")],
                      30, "the graph")
        assert sorted(drawn) == sorted(steps)

        def events() -> int:
            return int(browser.find_element("id", "events-total").text.replace(",", "") or 0)

        first = _wait(lambda: events() or None, 60, "a first micro-batch's events on the page")
        _wait(lambda: events() > first, 60, "the records counter to rise")
        _wait(lambda: "state 3 rows" in browser.find_element("css selector", 'g.step[data-step="count-per-type"] .state').text,
              30, "the keyed step's state (3 event types)")
        assert browser.find_element("id", "status").text == "running"
        rates = browser.find_element("css selector", 'g.step[data-step="label"] .rates').text
        assert rates.startswith("in ") and "out " in rates
        assert browser.find_element("id", "dead-letters").text.startswith("unparsable: ")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    finally:
        browser.quit()
        open(CheckpointLayout(checkpoint).stop_request, "a").close()  # stop the job at a clean cut, as a savepoint does
        job.join(120)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].stopped_because != "duration 90 s reached"
    assert env.dashboard is None  # stopped with the job
    # what the page counted for the sinks is what they received
    snap = board.monitor.snapshot()
    assert snap["steps"]["counts"]["records_in_total"] == sinks["counts"].count > 0
    assert snap["steps"]["even"]["records_in_total"] == sinks["even"].count > 0
    assert snap["dead_letters"]["unparsable"] == sinks["dead"].count > 0
    shutil.rmtree(checkpoint, ignore_errors=True)
