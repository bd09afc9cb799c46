"""The browser page, for real: Debian's Chromium (headless, fake microphone playing a speech WAV)
driven through chromedriver + selenium against ``duplex-actors serve --model tiny-parrot``.

Start -> audio frames and a session id show; Interrupt -> epoch 1; a screenshot is taken (to
docs/browser.png with ``DUPLEX_UPDATE_SCREENSHOTS=1``); Stop -> closed; the session's log
replays identically.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from duplex_actors.log import records as r
from duplex_actors.replay.replayer import replay_logic
from tests.e2e.conftest import ServerProcess, http_get
from tests.system_tools import require

from .conftest import API_KEY, CHROMEDRIVER, CHROMIUM, screenshot_path

PERSONA = "You are a cheerful weather forecaster who answers in one short sentence."
VOICE = "NATM1.pt"  # not the default: the picker really picks


def chromium_args(speech: Path, profile: Path) -> list[str]:
    return [
        "--headless=new",
        "--no-sandbox",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={speech}",
        "--autoplay-policy=no-user-gesture-required",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--mute-audio",
        "--window-size=1000,1080",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
    ]


@pytest.fixture
def browser(speech_wav: Path, tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in chromium_args(speech_wav, tmp_path / "profile"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(10)
    try:
        yield driver
    finally:
        try:
            for entry in driver.get_log("browser"):
                print("browser console:", entry.get("level"), entry.get("message"))
        finally:
            driver.quit()


def wait_for(driver: Any, what: str, predicate: Callable[[Any], Any], timeout: float) -> Any:
    """Poll ``predicate(driver)`` until truthy; fail with the page's readouts after ``timeout``."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(predicate)
    except TimeoutException:
        pytest.fail(f"timed out after {timeout} s waiting for {what}; page shows {readouts(driver)}")


def text(driver: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, element_id).text)


def number(driver: Any, element_id: str) -> int:
    value = text(driver, element_id)
    return int(value) if value.isdigit() else -1


def readouts(driver: Any) -> dict[str, Any]:
    script = """
      const ids = ["state", "session-id", "epoch", "frames-sent", "frames-received", "in-flight",
                   "latency", "buffer", "error", "transcript", "voice", "start"];
      const out = {};
      for (const id of ids) {
        const el = document.getElementById(id);
        out[id] = el ? (el.value !== undefined && el.tagName !== "BUTTON" ? el.value : el.textContent) : null;
      }
      out["state-attr"] = document.getElementById("state").dataset.state;
      out["error-hidden"] = document.getElementById("error").hidden;
      return out;
    """
    try:
        return dict(driver.execute_script(script))
    except Exception as exc:
        return {"unavailable": repr(exc)}


async def test_voices_503_while_loading(tmp_path: Path) -> None:
    from duplex_actors.app import create_quart_app
    from duplex_actors.config import ServerConfig

    app = create_quart_app(ServerConfig(model="tiny-parrot", log_dir=str(tmp_path)))
    client = app.test_client()  # before_serving does not run: the model is "loading"
    resp = await client.get("/v1/voices")
    assert resp.status_code == 503
    assert (await resp.get_json())["error"]["code"] == "not_ready"
    resp = await client.get("/")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in resp.headers["Content-Security-Policy"]


def test_routes(page_server: ServerProcess) -> None:
    status, body = http_get(page_server.base + "/v1/voices")
    assert status == 200
    voices = json.loads(body)
    assert voices["family"] == "personaplex"
    assert voices["default"] == "NATF2.pt"
    assert voices["voices"] == ["NATF0.pt", "NATF2.pt", "NATM1.pt"]

    import urllib.request

    for path, ctype in [
        ("/", "text/html"),
        ("/static/app.js", "text/javascript"),
        ("/static/audio.js", "text/javascript"),
        ("/static/protocol.js", "text/javascript"),
        ("/static/capture-worklet.js", "text/javascript"),
        ("/static/style.css", "text/css"),
    ]:
        with urllib.request.urlopen(page_server.base + path, timeout=10) as resp:
            assert resp.status == 200, path
            assert resp.headers["Content-Type"].split(";")[0] == ctype, path
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            page = resp.read().decode()
        if path == "/":
            assert 'id="start"' in page and "/static/app.js" in page
            assert "http://" not in page and "https://" not in page  # nothing from the network
    for bad in ["/static/nope.js", "/static/../app.py", "/static/%2e%2e/app.py", "/static/"]:
        status, _ = http_get(page_server.base + bad)
        assert status == 404, bad


def test_talk_in_chromium(page_server: ServerProcess, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(page_server.base + "/")
    wait_for(
        driver,
        "the voice list",
        lambda d: (
            d.find_element(By.ID, "voice").get_attribute("data-loaded") == "1"
            and d.find_element(By.ID, "start").is_enabled()
        ),
        15,
    )
    Select(driver.find_element(By.ID, "voice")).select_by_value(VOICE)
    driver.find_element(By.ID, "persona").send_keys(PERSONA)
    driver.find_element(By.ID, "start").click()

    wait_for(
        driver,
        "received audio frames and a session id",
        lambda d: number(d, "frames-received") > 10 and text(d, "session-id").startswith("sess_"),
        30,
    )
    session_id = text(driver, "session-id")
    assert driver.find_element(By.ID, "state").get_attribute("data-state") == "open"
    assert text(driver, "epoch") == "0"

    driver.find_element(By.ID, "interrupt").click()
    wait_for(driver, "epoch 1 after Interrupt", lambda d: text(d, "epoch") == "1", 20)
    received = number(driver, "frames-received")
    wait_for(
        driver,
        "audio of the new epoch and a latency readout",
        lambda d: number(d, "frames-received") >= received + 12 and text(d, "latency").endswith(")"),
        20,
    )
    assert not driver.find_element(By.ID, "error").is_displayed(), readouts(driver)
    ActionChains(driver).move_to_element(driver.find_element(By.TAG_NAME, "h1")).perform()
    screenshot = screenshot_path("browser.png", tmp_path)
    assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 0

    driver.find_element(By.ID, "stop").click()
    wait_for(
        driver,
        "the closed state",
        lambda d: d.find_element(By.ID, "state").get_attribute("data-state") == "closed",
        15,
    )
    assert "you stopped the session" in text(driver, "state")
    assert not driver.find_element(By.ID, "error").is_displayed(), readouts(driver)
    sent, got = number(driver, "frames-sent"), number(driver, "frames-received")

    # The session's log replays identically (its end record is written as the session closes).
    path = page_server.log_dir / f"{session_id}.dlog"
    deadline = time.monotonic() + 10
    while True:
        report = replay_logic(path) if path.exists() else None
        if (report is not None and report.complete) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert report is not None, f"no log {path}"
    assert report.complete, report.summary()
    assert report.identical, report.summary()
    assert report.session_id == session_id
    assert report.frames_in == sent
    assert report.frames_out == got
    opened = [rec for _, rec in report.records_list if isinstance(rec, r.Open)]
    assert opened and opened[0].config.get("voice") == VOICE
    assert opened[0].config.get("instructions") == PERSONA


HOG = """
const [url, key] = arguments;
window.hog = { state: "connecting", events: [] };
const ws = new WebSocket(url, ["realtime", "openai-insecure-api-key." + key]);
window.hogSocket = ws;
ws.onopen = () => ws.send(JSON.stringify({ type: "session.update", session: {} }));
ws.onmessage = (e) => { const ev = JSON.parse(e.data); window.hog.events.push(ev.type);
                        if (ev.type === "session.created") window.hog.state = "open"; };
ws.onclose = () => { window.hog.state = "closed"; };
"""


def test_refusals_in_plain_words(keyed_server: ServerProcess, browser: Any) -> None:
    """No key: the page says the server wants one. Slot taken: "the server is full". Then the
    right key with a free slot opens a session."""
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(keyed_server.base + "/")
    wait_for(driver, "the voice list", lambda d: d.find_element(By.ID, "start").is_enabled(), 15)

    def start_and_fail(expected: str) -> None:
        driver.find_element(By.ID, "start").click()
        wait_for(
            driver,
            f"the error {expected!r}",
            lambda d: (
                expected in text(d, "error")
                and d.find_element(By.ID, "state").get_attribute("data-state") == "failed"
            ),
            15,
        )
        assert driver.find_element(By.ID, "start").is_enabled()

    start_and_fail("it needs an API key")
    driver.find_element(By.ID, "api-key").send_keys("wrong-key")
    start_and_fail("the API key is wrong")

    # Another client holds the only slot.
    ws_url = keyed_server.ws + "/v1/realtime?duplex=1&autostart=0"
    driver.execute_script(HOG, ws_url, API_KEY)
    wait_for(driver, "the other session", lambda d: d.execute_script("return window.hog.state") == "open", 15)
    key = driver.find_element(By.ID, "api-key")
    key.clear()
    key.send_keys(API_KEY)
    start_and_fail("The server is full right now; try again in a moment.")

    # The slot frees once the other session closes; then the same page gets in.
    driver.execute_script("window.hogSocket.send(JSON.stringify({type: 'session.close'}))")
    wait_for(
        driver,
        "the other session to close",
        lambda d: d.execute_script("return window.hog.state") == "closed",
        15,
    )
    driver.find_element(By.ID, "start").click()
    wait_for(
        driver,
        "a session with the key",
        lambda d: text(d, "session-id").startswith("sess_") and number(d, "frames-received") > 0,
        20,
    )
    assert not driver.find_element(By.ID, "error").is_displayed(), readouts(driver)
    driver.find_element(By.ID, "stop").click()
    wait_for(
        driver,
        "the closed state",
        lambda d: d.find_element(By.ID, "state").get_attribute("data-state") == "closed",
        15,
    )


WORKLET = (
    Path(__file__).resolve().parents[2] / "src" / "duplex_actors" / "web" / "static" / "capture-worklet.js"
)
WORKLET_HARNESS = """
const fs = require("fs");
let Cls;
const posted = [];
globalThis.sampleRate = 24000;
globalThis.AudioWorkletProcessor = class {
  constructor() { this.port = { postMessage: (m) => posted.push(m), onmessage: null }; }
};
globalThis.registerProcessor = (name, cls) => { Cls = cls; };
eval(fs.readFileSync(process.argv[2], "utf8"));
const p = new Cls();
let k = 0;
const fed = [];
function block(n) {
  const x = new Float32Array(n);
  for (let i = 0; i < n; i++) { x[i] = ((k++ % 97) - 48) / 100; fed.push(x[i]); }
  p.process([[x]], [[new Float32Array(n)]]);
}
const [padAt, padMs] = [Number(process.argv[3]), Number(process.argv[4])];
for (let i = 0; i < 100; i++) {
  if (i === padAt) p.port.onmessage({ data: { pad: padMs } });
  block(128);
}
const frames = posted.map((m) => Array.from(new Int16Array(m.pcm)));
console.log(JSON.stringify({ sizes: frames.map((f) => f.length), pads: posted.map((m) => m.padMs),
                             samples: [].concat(...frames) }));
"""


@pytest.mark.parametrize(("pad_at", "pad_ms"), [(20, 30), (33, 30), (20, 79)])
def test_capture_worklet_applies_an_alignment_pad(tmp_path: Path, pad_at: int, pad_ms: int) -> None:
    """The hint, in the worklet alone (node, no browser): the next frame is posted early with
    80 - pad_ms ms of audio and padMs on it, later frames are 80 ms, no sample is lost or moved.
    Hinted before block 20, 640 samples of the frame are filled: with 30 ms the frame is posted
    once 1200 are, with 79 ms (24 samples) at once, the 616 beyond starting the next frame;
    before block 33, 384 are filled."""
    import subprocess

    node = require("node")["node"]
    harness = tmp_path / "harness.cjs"
    harness.write_text(WORKLET_HARNESS)
    proc = subprocess.run(
        [node, str(harness), str(WORKLET), str(pad_at), str(pad_ms)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    short = 1920 - pad_ms * 24
    i = out["sizes"].index(short)
    assert out["pads"][i] == pad_ms and out["pads"].count(0) == len(out["pads"]) - 1
    assert out["sizes"][:i] == [1920] * i and out["sizes"][i + 1 :] == [1920] * (len(out["sizes"]) - i - 1)
    # the pad hint came after block pad_at: the short frame is the one being filled then
    assert i == (pad_at * 128) // 1920
    # every sample in order (the worklet's linear interpolation at 24 kHz is the identity)
    expected = [
        round(((j % 97) - 48) / 100 * (32768 if j % 97 < 48 else 32767)) for j in range(len(out["samples"]))
    ]
    assert out["samples"] == expected
