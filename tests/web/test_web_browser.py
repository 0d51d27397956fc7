"""The dashboard end to end, in a real headless Chromium (Debian's ``chromium`` driven through
its ``chromedriver`` by selenium; nothing is downloaded): a real supervisor runs under chaos
mode, the dashboard shows its runs move to succeeded without a reload, a run's timeline, and a
failed run retried with a click until it succeeds, a run forked from its second step with a
click; then the chaos report is drawn.

Screenshots are kept in ``$LEASEKEEPER_ARTIFACTS/web`` (default ``test-artifacts/web`` in the
checkout); the run's summary names the directory. ``.ci/run`` installs chromium and
chromium-driver; with LEASEKEEPER_REQUIRE_TOOLS=1 a missing browser fails the test.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from event_stream import EventStreamClient
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from sv_harness import Supervisor
from tools import require_tool
from web_process import WebProcess

from supervisor import exitcodes
from workerproc.store import ClaimRequest, Commit, Lease, Store, open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
STEP_RUNS = 24
WAIT = 120.0  # seconds: generous, for a loaded two-core machine (waits end on state)
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,1000",
)  # fmt: skip


def artifacts() -> Path:
    where = Path(os.environ.get("LEASEKEEPER_ARTIFACTS", ROOT / "test-artifacts")) / "web"
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium = require_tool("chromium", shutil.which("chromium"), "chromium")
    driver_path = require_tool("chromedriver", shutil.which("chromedriver"), "chromium-driver")
    profile = tempfile.mkdtemp(prefix="lk-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_runs_succeed_under_chaos_a_timeline_and_a_retry_with_a_click(
    sv: Supervisor, browser: WebDriver, tmp_path: Path
) -> None:
    driver = browser
    shots = artifacts()
    # the live parts are replaced while we look at them: an element may go stale; look again
    wait = WebDriverWait(driver, WAIT, poll_frequency=0.1, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException))  # fmt: skip

    def texts(css: str) -> list[str]:
        """The text of every element matching ``css``, read at one instant."""
        script = "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);"
        return [str(t).strip() for t in driver.execute_script(script, css)]

    def shoot(name: str) -> None:
        """A screenshot of the whole page, not only the window (Chromium's DevTools call)."""
        size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 4000),
                "scale": 1}  # fmt: skip
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        (shots / name).write_bytes(base64.b64decode(shot["data"]))

    def click(by: str, value: str) -> bool:
        """Click it; False (the wait tries again) if the live page replaced it meanwhile."""
        try:
            driver.find_element(by, value).click()
        except StaleElementReferenceException:
            return False
        return True

    report = tmp_path / "chaos.json"
    sv.start(
        "--lease-ttl", "1", "--poll-interval", "0.2", "--max-attempts", "3",
        "--chaos", "--chaos-interval", "0.4", "--chaos-faults", "kill,pause",
        "--chaos-max-faults", "4", "--chaos-seed", "11", "--chaos-report", str(report),
        n=3, app="apps.web_app:app",
    )  # fmt: skip
    sv.wait_event("chaos_started")
    web = WebProcess(tmp_path, "--db", sv.db, "--pidfile", sv.pidfile, "--chaos-report",
                     str(report), "--port", "0", "--refresh", "0.5")  # fmt: skip
    try:
        url = web.url()
        # the runs page is open before any run exists; it must fill and finish by itself
        driver.get(url + "runs?task=step")
        driver.execute_script("window.neverReloaded = true;")
        store = open_store(sv.db)
        try:
            payload = {"n": 0, "steps": 3, "sleep": 0.05}
            steps = [store.start_run("step", payload, {}) for _ in range(STEP_RUNS)]
            flaky = store.start_run("flaky", {"fail_attempts": 3}, {})
        finally:
            store.close()

        wait.until(lambda _: len(texts("table.runs .status")) == STEP_RUNS)
        wait.until(lambda _: texts("table.runs .status") == ["succeeded"] * STEP_RUNS)
        assert driver.execute_script("return window.neverReloaded === true;")

        driver.get(url)
        wait.until(lambda _: driver.find_elements(By.CSS_SELECTOR, ".phase"))
        shoot("overview.png")

        # one run's timeline (one that chaos hit, if any): every step committed
        store = open_store(sv.db)
        try:
            hit = [r for r in steps if store.attempt_history(r)] + steps
        finally:
            store.close()
        driver.get(url + "runs?task=step")
        wait.until(lambda _: click(By.LINK_TEXT, str(hit[0])))
        wait.until(lambda _: driver.current_url.endswith(f"/runs/{hit[0]}"))
        outcomes = texts("table.attempts .outcome")
        assert outcomes.count("committed") == 3, outcomes
        assert driver.find_elements(By.CSS_SELECTOR, "figure.timeline rect.committed")
        shoot("run-timeline.png")

        # fork that run from its second step with a click: a new run runs steps 2 and 3
        wait.until(lambda _: click(By.ID, "fork-2"))
        wait.until(lambda _: "started: a fork" in driver.page_source)
        # (read at one instant: the live page replaces its elements as the new run moves)
        assert texts("#forked-from") == [f"run {hit[0]}"], texts("#forked-from")
        wait.until(lambda _: texts("#run-status") == ["succeeded"])
        assert len(texts("#steps tbody tr")) == 2  # steps 2 and 3 of the source
        shoot("run-forked.png")

        # the flaky run fails its three attempts; retry it with a click and watch it succeed
        driver.get(url + "runs?status=failed")
        wait.until(lambda _: driver.find_elements(By.LINK_TEXT, str(flaky)))
        wait.until(lambda _: click(By.LINK_TEXT, str(flaky)))
        wait.until(lambda _: driver.find_element(By.ID, "retry"))
        released = texts(".outcome.released")
        assert len(released) >= 2, released  # the handler's errors, kept per attempt
        shoot("run-failed.png")
        wait.until(lambda _: click(By.ID, "retry"))
        wait.until(lambda _: "queued again" in driver.page_source)
        wait.until(lambda _: texts("#run-status") == ["succeeded"])
        shoot("run-retried.png")

        # stop the pool: chaos mode writes its report, and the chaos page draws it (the
        # verifier's own verdict is tests/chaos/test_chaos.py's business: here, that it is shown)
        sv.signal(15)
        assert sv.wait_exit(WAIT) in (0, exitcodes.CHAOS_VIOLATION), sv.text()[-3000:]
        ok = json.loads(report.read_text())["ok"]
        driver.get(url + "chaos")
        verdict = wait.until(lambda _: driver.find_element(By.ID, "verdict"))
        assert verdict.text == ("OK" if ok else "VIOLATIONS")
        assert driver.find_elements(By.CSS_SELECTOR, "figure.faults rect")
        shoot("chaos.png")
    finally:
        web.kill()
    assert (shots / "run-retried.png").stat().st_size > 0


def test_a_page_updates_from_the_event_stream_without_the_poll_timer(
    browser: WebDriver, tmp_path: Path
) -> None:
    """--refresh 3600: nothing polls within the test, so what appears came by the stream (a
    run started, a run's page seeing it cancelled); with --max-streams 0 the page polls."""
    driver = browser
    wait = WebDriverWait(driver, WAIT, poll_frequency=0.1, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException))  # fmt: skip
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        first = store.start_run("first")
    web = WebProcess(tmp_path, "--db", db, "--port", "0", "--refresh", "3600")
    try:
        url = web.url()
        driver.get(url + "runs")
        live = "return document.querySelector('[data-poll]').dataset.live;"
        wait.until(lambda _: driver.execute_script(live) == "stream")
        driver.execute_script("window.neverReloaded = true;")
        with open_store(db) as store:
            second = store.start_run("second")
        wait.until(lambda _: driver.find_elements(By.LINK_TEXT, str(second)))
        assert driver.execute_script("return window.neverReloaded === true;")

        driver.get(url + f"runs/{first}")
        wait.until(lambda _: driver.execute_script(live) == "stream")
        with open_store(db) as store:
            store.cancel_run(first)
        wait.until(lambda _: driver.find_element(By.ID, "run-status").text == "cancelled")
    finally:
        web.kill()

    polled = WebProcess(tmp_path, "--db", db, "--port", "0", "--refresh", "0.5",
                        "--max-streams", "0")  # fmt: skip
    try:
        driver.get(polled.url() + "runs")
        assert driver.execute_script(live) == "poll"
        with open_store(db) as store:
            third = store.start_run("third")
        wait.until(lambda _: driver.find_elements(By.LINK_TEXT, str(third)))
    finally:
        polled.kill()


def test_a_refused_stream_falls_back_to_polling_and_is_tried_again(
    browser: WebDriver, tmp_path: Path
) -> None:
    """The only stream slot is held by the test: the page's stream gets 503, it polls (and
    shows a new run); once the slot is free, it tries the stream again and follows it."""
    driver = browser
    wait = WebDriverWait(driver, WAIT, poll_frequency=0.1, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException))  # fmt: skip
    db = str(tmp_path / "lk.db")
    open_store(db).close()
    web = WebProcess(tmp_path, "--db", db, "--port", "0", "--refresh", "0.5",
                     "--max-streams", "1")  # fmt: skip
    try:
        url = web.url()
        holder = EventStreamClient(url)
        assert holder.status == 200
        driver.get(url + "runs")
        live = "return document.querySelector('[data-poll]').dataset.live;"
        wait.until(lambda _: driver.execute_script(live) == "poll")
        with open_store(db) as store:
            polled = store.start_run("polled")
        wait.until(lambda _: driver.find_elements(By.LINK_TEXT, str(polled)))
        holder.close()
        wait.until(lambda _: driver.execute_script(live) == "stream")  # tried again (5 s)
    finally:
        web.kill()


def test_a_runs_stream_shows_live_resumes_after_a_dropped_connection_and_resets(
    browser: WebDriver, tmp_path: Path
) -> None:
    """A run's page follows the run's stream (B21) as it is written; the
    dashboard is stopped and started again on its port while chunks are written: the page's
    EventSource reconnects with Last-Event-ID and shows each chunk once; a takeover's reset
    clears the step's text before the new attempt's; the run's end closes the stream."""
    driver = browser
    wait = WebDriverWait(driver, WAIT, poll_frequency=0.1, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException))  # fmt: skip
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        run_id = store.start_run("answer")
        old = store.commit_many([], claim=ClaimRequest("zombie", 600.0)).leases[0]
        last = store.append_stream(old, ['"hello "']).last
    web = WebProcess(tmp_path, "--db", db, "--port", "0", "--refresh", "3600")
    again = None
    text = "return document.getElementById('run-stream').innerText;"
    live = "return document.querySelector('[data-run-stream]').dataset.live;"
    try:
        url = web.url()
        driver.get(url + f"runs/{run_id}")
        wait.until(lambda _: driver.execute_script(live) == "stream")
        with open_store(db) as store:
            written = store.append_stream(old, ['"world"'], after=last)
            assert written.outcome == "written"
            last = written.last
        wait.until(lambda _: driver.execute_script(text).strip() == "hello world")
        port = url.rsplit(":", 1)[1].strip("/")
        web.kill()  # the connection drops; chunks are written meanwhile
        wait.until(lambda _: driver.execute_script(live) == "retrying")
        with open_store(db) as store:
            assert store.append_stream(old, ['", again"', '" and again"'],
                                       after=last).outcome == "written"  # fmt: skip
        again = WebProcess(tmp_path, "--db", db, "--port", port, "--refresh", "3600")
        again.url()
        wait.until(lambda _: driver.execute_script(text).strip()
                   == "hello world, again and again")  # fmt: skip
        with open_store(db) as store:  # the zombie's leases are released; a new attempt writes
            assert store.release_owner("zombie") == 1
            new = wait_for_claim(store)
            assert store.append_stream(new, ['"fresh"']).reset
        wait.until(lambda _: driver.execute_script(text).strip() == "fresh")  # reset, then it
        state = "return document.getElementById('stream-state').innerText;"
        with open_store(db) as store:
            store.commit_many([Commit(new, "finish")])
        wait.until(lambda _: driver.execute_script(live) == "ended")
        assert "succeeded" in driver.execute_script(state)
        driver.save_screenshot(str(artifacts() / "run-stream.png"))
    finally:
        web.kill()
        if again is not None:
            again.kill()


def wait_for_claim(store: Store) -> Lease:
    found = WebDriverWait(store, WAIT, poll_frequency=0.1).until(
        lambda s: s.commit_many([], claim=ClaimRequest("w2", 60.0)).leases
    )
    return found[0]
