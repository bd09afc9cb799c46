"""``serve --static-ui DIR``: a built third-party UI served at ``/`` and by its relative paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from duplex_actors.app import create_quart_app
from duplex_actors.config import ServerConfig
from duplex_actors.web.page import ui_files


def _ui(tmp_path: Path) -> Path:
    ui = tmp_path / "dist"
    (ui / "assets").mkdir(parents=True)
    (ui / "index.html").write_text("<!doctype html><title>PersonaPlex</title>")
    (ui / "assets" / "index-1.js").write_text("console.log(1)")
    (ui / "assets" / "codec.wasm").write_bytes(b"\x00asm")
    (ui / ".env").write_text("SECRET=1")
    (ui / "notes.py").write_text("x = 1")
    (tmp_path / "outside.js").write_text("nope")
    (ui / "assets" / "link.js").symlink_to(tmp_path / "outside.js")
    return ui


def test_listing_keeps_known_files_inside_the_folder(tmp_path: Path) -> None:
    assert sorted(ui_files(_ui(tmp_path))) == ["assets/codec.wasm", "assets/index-1.js", "index.html"]


async def test_routes_serve_the_ui_and_nothing_else(tmp_path: Path) -> None:
    ui = _ui(tmp_path)
    app = create_quart_app(
        ServerConfig(model="tiny-parrot", log_dir=str(tmp_path / "logs"), static_ui=str(ui))
    )
    client = app.test_client()
    resp = await client.get("/")
    assert resp.status_code == 200 and "PersonaPlex" in await resp.get_data(as_text=True)
    assert "Content-Security-Policy" not in resp.headers  # the UI's wasm codec needs eval
    resp = await client.get("/assets/codec.wasm")
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "application/wasm"
    resp = await client.get("/assets/index-1.js")
    assert resp.headers["Content-Type"].startswith("text/javascript")
    for bad in [
        "/.env",
        "/notes.py",
        "/assets/link.js",
        "/assets/../index.html",
        "/assets/%2e%2e/.env",
        "/nope",
    ]:
        assert (await client.get(bad)).status_code == 404, bad
    assert (await client.get("/health")).status_code in (200, 503)  # the server's own routes win
    assert (await client.get("/static/app.js")).status_code == 200  # and the built-in page's files stay


def test_serve_refuses_a_folder_without_index(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).with_name("duplex-actors"))
    proc = subprocess.run(
        [
            exe,
            "serve",
            "--model",
            "tiny-parrot",
            "--static-ui",
            str(tmp_path),
            "--log-dir",
            str(tmp_path / "l"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no index.html" in proc.stderr
