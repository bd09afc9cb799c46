"""The built PersonaPlex web UI (NVIDIA/personaplex ``client/``, unmodified, in
``shared/clients/personaplex-web/``) against ``duplex-actors serve --static-ui DIR``, in Debian's
headless Chromium with a fake microphone playing an espeak-ng speech WAV.

The UI is served from the server's own origin (``--static-ui``), so it opens
``ws://<host>/api/chat?text_prompt=...&voice_prompt=NATF0.pt&...`` there. Clicking Connect must
connect (the handshake), stream the microphone as Ogg/Opus, play the reply back ("Audio played"
grows), show the model's text, and raise no page error; Chromium's network log gives the
WebSocket frames both ways. A screenshot is taken (to docs/personaplex-ui.png with
``DUPLEX_UPDATE_SCREENSHOTS=1``); the session log replays.
The model is ``tiny`` (random weights): the parrot's text is always EPAD, which is never sent.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duplex_actors.replay.replayer import replay_logic
from tests.e2e.conftest import ServerProcess, start_server
from tests.e2e.test_api_chat_clients import api_chat_log

from .conftest import CHROMEDRIVER, CHROMIUM, screenshot_path
from .test_page import chromium_args

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

ROOT = Path(__file__).resolve().parents[2]
STREAM_S = 6.0  # of conversation after the handshake


def ui_dir() -> Path | None:
    """The built UI: ``$DUPLEX_PERSONAPLEX_UI``, else ``shared/clients/personaplex-web`` beside or
    above the checkout (``/work/shared`` for worktrees), or beside or above the local repository
    it was cloned from (a fresh clone in a temporary directory)."""
    env = os.environ.get("DUPLEX_PERSONAPLEX_UI")
    candidates = [Path(env)] if env else []
    for base in (ROOT, *_local_origin()):
        candidates += [p / "shared" / "clients" / "personaplex-web" for p in (base, *base.parents)]
    return next((p for p in candidates if (p / "index.html").is_file()), None)


def _local_origin() -> list[Path]:
    """The directory of the checkout's ``origin`` remote when it is a local path, else nothing."""
    try:
        url = subprocess.run(
            ["git", "-C", str(ROOT), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    origin = Path(url.removeprefix("file://"))
    return [origin] if origin.is_absolute() and origin.is_dir() else []


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory, parrot_dir: Path) -> Iterator[ServerProcess]:
    folder = ui_dir()
    if folder is None:
        pytest.skip("the built PersonaPlex UI (shared/clients/personaplex-web) is not on this machine")
    server = start_server(tmp_path_factory.mktemp("ui-server"), "--static-ui", str(folder), model="tiny")
    yield server
    server.stop()


@pytest.fixture
def chromium(speech_wav: Path, tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in chromium_args(speech_wav, tmp_path / "profile"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def ws_traffic(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """From Chromium's performance log: the WebSocket URLs and the binary frames' kinds, in order."""
    urls: list[str] = []
    sent: list[int] = []
    received: list[tuple[int, bytes]] = []
    for entry in entries:
        msg = json.loads(entry["message"])["message"]
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Network.webSocketCreated":
            urls.append(params["url"])
        elif method in ("Network.webSocketFrameSent", "Network.webSocketFrameReceived"):
            frame = params["response"]
            if frame.get("opcode") != 2:
                continue
            data = base64.b64decode(frame.get("payloadData", ""))
            if method.endswith("Sent"):
                sent.append(data[0] if data else -1)
            else:
                received.append((data[0] if data else -1, data[1:]))
    return {"urls": urls, "sent": sent, "received": received}


def audio_played_s(driver: Any) -> float:
    """The UI's "Audio played:" readout (m:ss.xx) in seconds; -1 when not shown."""
    body = driver.execute_script("return document.body.innerText")
    m = re.search(r"Audio played:\s*(\d+):(\d+(?:\.\d+)?)", body)
    return int(m.group(1)) * 60 + float(m.group(2)) if m else -1.0


def wait(what: str, predicate: Any, timeout: float, driver: Any) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            body = driver.execute_script("return document.body.innerText")
            pytest.fail(f"timed out after {timeout} s waiting for {what}; the page shows:\n{body[:2000]}")
        time.sleep(0.1)


def test_personaplex_ui_talks(ui_server: ServerProcess, chromium: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = chromium

    def button(label: str) -> Any:
        found = driver.find_elements(By.XPATH, f"//button[normalize-space()='{label}']")
        return found[0] if found else None

    driver.get(ui_server.base + "/")
    wait("the Connect button", lambda: button("Connect") is not None, 20, driver)
    button("Connect").click()
    wait("connected (the Disconnect button)", lambda: button("Disconnect") is not None, 30, driver)
    connected_at = time.monotonic()
    wait("1 s of audio played back", lambda: audio_played_s(driver) >= 1.0, 20, driver)
    t1, played1 = time.monotonic(), audio_played_s(driver)
    time.sleep(max(2.0, STREAM_S - (t1 - connected_at)))
    t2, played2 = time.monotonic(), audio_played_s(driver)
    body = driver.execute_script("return document.body.innerText")
    screenshot = screenshot_path("personaplex-ui.png", tmp_path)
    assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 0
    button("Disconnect").click()
    time.sleep(0.5)

    traffic = ws_traffic(driver.get_log("performance"))
    console = driver.get_log("browser")
    # No page error (an unknown kind would throw in decodeMessage). The UI's stylesheet asks
    # Google Fonts for its typeface: offline, that one fetch fails; any failed load from the
    # server's own origin counts.
    errors = [
        e
        for e in console
        if e.get("level") == "SEVERE"
        and not (e.get("source") == "network" and not e.get("message", "").startswith(ui_server.base))
    ]
    assert not errors, errors

    (url,) = traffic["urls"]
    assert url.startswith(ui_server.ws + "/api/chat?")
    assert "text_prompt=" in url and "voice_prompt=NATF0.pt" in url
    kinds = [k for k, _ in traffic["received"]]
    assert kinds[0] == 0 and kinds.count(0) == 1  # the 1-byte handshake, first and once
    assert traffic["received"][0][1] == b""
    counts = Counter(kinds)
    assert set(counts) <= {0, 1, 2, 6}, counts  # nothing a PersonaPlex UI cannot decode (6: ping)
    # Lockstep: one 0x01 per 80 ms of input, and opus-recorder sends a page per 40 ms (the header
    # pages apart): never more audio messages back than half the pages sent; at least 2 s of them
    # (how many of the rest are still in flight depends on this shared machine's load).
    sent = Counter(traffic["sent"])
    assert sent[1] >= 0.5 * STREAM_S / 0.04, sent
    assert 25 <= counts[1] <= (sent[1] - 2) / 2 + 1, (counts, sent)
    # Once playing, the reply keeps playing (the UI's clock; late audio counts as missed, apart).
    assert played2 - played1 >= 0.5 * (t2 - t1), (played1, played2, t2 - t1)
    pieces = [p.decode() for k, p in traffic["received"] if k == 2]
    shown = [p.strip() for p in pieces if p.strip()]
    assert shown, counts  # the model's text came
    assert shown[0] in body  # ... and the UI shows it

    # The session log replays identically.
    report = replay_logic(api_chat_log(ui_server))
    assert report.complete and report.identical, report.summary()
    assert report.frames_out >= counts[1] - 1
