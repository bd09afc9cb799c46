"""The browser page: talk to the model from a browser (``GET /``).

``install_page_routes(app, holder, config)`` adds:

- ``GET /``: the page (``static/index.html``);
- ``GET /static/<file>``: the page's JS modules, AudioWorklet and stylesheet, shipped in the
  package (no CDN, no build step, nothing fetched from the network at run time); ``.js`` is
  served as ``text/javascript`` (what module scripts and ``audioWorklet.addModule`` need);
- ``GET /v1/voices``: ``{"voices": [...], "default": "NATF2.pt", "family": "personaplex"}``,
  the voice prompts the served checkpoint bundles; 503 while the model is loading.

Only the files present in ``static/`` when the routes are installed are served; any other
name is a 404 (no path is ever joined from the request).

With ``serve --static-ui DIR`` (a built third-party web UI, e.g. the PersonaPlex client's
``dist/``), ``GET /`` is DIR's ``index.html`` instead, and every file under DIR is served at its
relative path (``/assets/index-....js``), from a listing made at start-up: the UI then talks to
``/api/chat`` on the server's own origin. Those files get no Content-Security-Policy of ours
(the UI's WebAssembly Opus codec would need ``wasm-unsafe-eval``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quart import Response, jsonify

STATIC_DIR = Path(__file__).with_name("static")

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
UI_CONTENT_TYPES = {
    **CONTENT_TYPES,
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".map": "application/json",
    ".txt": "text/plain; charset=utf-8",
    ".webmanifest": "application/manifest+json",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".ttf": "font/ttf",
    ".jpg": "image/jpeg",
    ".webp": "image/webp",
}

# Same-origin only: the page, its modules and worklet, and the WebSocket back to this host.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; media-src 'self' blob:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'none'"
)


def static_files(folder: Path = STATIC_DIR) -> dict[str, Path]:
    """The servable files: plain files directly in ``folder`` with a known suffix."""
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in CONTENT_TYPES}


def _file_response(path: Path) -> Response:
    response = Response(path.read_bytes(), content_type=CONTENT_TYPES[path.suffix])
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    if path.suffix == ".html":
        response.headers["Content-Security-Policy"] = CSP
        response.headers["Referrer-Policy"] = "no-referrer"
    return response


def ui_files(folder: Path) -> dict[str, Path]:
    """A built UI's servable files by URL path (``assets/x.js``): plain files under ``folder``
    with a known suffix, no dot-files, no symlinks out of it."""
    root = folder.resolve()
    out: dict[str, Path] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if (
            p.is_file()
            and p.suffix in UI_CONTENT_TYPES
            and not any(part.startswith(".") for part in rel.parts)
        ):
            if p.resolve().is_relative_to(root):
                out[rel.as_posix()] = p
    return out


def _ui_response(path: Path) -> Response:
    response = Response(path.read_bytes(), content_type=UI_CONTENT_TYPES[path.suffix])
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _not_found(what: str) -> tuple[Any, int]:
    return jsonify({"error": {"type": "invalid_request_error", "code": "not_found", "message": what}}), 404


def install_page_routes(app: Any, holder: Any, config: Any) -> None:
    """Add ``/``, ``/static/<file>`` and ``/v1/voices`` to the Quart app."""
    files = static_files()

    async def page() -> Any:
        index = files.get("index.html")
        if index is None:
            return _not_found("the page is not installed")
        return _file_response(index)

    async def static(filename: str) -> Any:
        path = files.get(filename)
        if path is None:
            return _not_found(f"no static file {filename!r}")
        return _file_response(path)

    async def voices() -> Any:
        engine = holder.engine
        if engine is None or holder.server is None:
            body: dict[str, Any] = {
                "error": {
                    "type": "server_error",
                    "code": "not_ready",
                    "message": f"the model {config.model} is still loading",
                }
            }
            if holder.error:
                body["error"]["message"] = f"the model failed to load: {holder.error}"
            return jsonify(body), 503
        family = engine.family
        return jsonify(
            {
                "voices": list(family.voices),
                "default": family.default_voice,
                "family": family.name,
                "model": config.model,
            }
        )

    ui = ui_files(Path(config.static_ui)) if getattr(config, "static_ui", None) else {}
    if ui:

        async def ui_page() -> Any:
            return _ui_response(ui["index.html"])

        async def ui_file(path: str) -> Any:
            file = ui.get(path)
            if file is None:
                return _not_found(f"no file {path!r}")
            return _ui_response(file)

        app.add_url_rule("/", "page", ui_page, methods=["GET"])
        app.add_url_rule("/<path:path>", "ui_file", ui_file, methods=["GET"])
    else:
        app.add_url_rule("/", "page", page, methods=["GET"])
    app.add_url_rule("/v1/voices", "voices", voices, methods=["GET"])
    # Quart registers ``/static/<path:filename>`` (endpoint "static") for the app's default
    # static folder, which this package does not have: serve the page's files under it.
    if "static" in app.view_functions:
        app.view_functions["static"] = static
    else:
        app.add_url_rule("/static/<path:filename>", "static", static, methods=["GET"])
