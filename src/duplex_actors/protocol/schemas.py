"""JSON Schemas of every wire event (both dialects, both directions) and every log record kind,
generated from the attrs classes, and the validators the e2e tests run on real traffic.

Regenerate and check the files checked in under ``schemas/``::

    python -m duplex_actors.protocol.schemas write schemas/
    python -m duplex_actors.protocol.schemas check schemas/   # exit 1, listing what differs

Layout: ``realtime/{client,server}/<type>.json`` (server: GA and beta names),
``native/{client,server}/<type>.json``, ``log/<kind>.json``. ``jsonschema`` is a dev
dependency and is imported only by the validators.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from ..log import records
from . import wire_events as wire

DRAFT: Final = "https://json-schema.org/draft/2020-12/schema"
README: Final = "README.md"
SUBDIRS: Final = ("realtime/client", "realtime/server", "native/client", "native/server", "log")
_SIMPLE: Final[dict[Any, str]] = {str: "string", int: "integer", float: "number", bool: "boolean"}


# -- attrs -> JSON Schema ----------------------------------------------------------------------
def type_schema(tp: Any) -> dict[str, Any]:
    """The schema of one annotation: scalars, ``None``, unions, ``Literal``, ``dict[str, X]``,
    ``list[X]``, ``tuple[X, ...]``, ``bytes`` (base64 when shown as JSON), attrs classes."""
    if tp is Any:
        return {}
    if tp is type(None) or tp is None:
        return {"type": "null"}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if tp is bytes:
        return {"type": "string", "contentEncoding": "base64"}
    if attrs.has(tp):
        return object_schema(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        members = [type_schema(a) for a in args]
        if all(set(m) == {"type"} and isinstance(m["type"], str) for m in members):
            return {"type": [m["type"] for m in members]}
        return {"anyOf": members}
    if origin is dict:
        value = type_schema(args[1]) if args else {}
        return {"type": "object"} if not value else {"type": "object", "additionalProperties": value}
    if origin in (list, tuple, Sequence):
        return {"type": "array", "items": type_schema(args[0]) if args else {}}
    raise TypeError(f"no JSON Schema for annotation {tp!r}")


def _description(cls: type) -> str | None:
    doc = cls.__doc__
    # attrs gives undocumented classes a generated "Name(field, ...)" signature as __doc__.
    if not doc or doc.startswith(f"{cls.__name__}("):
        return None
    return " ".join(inspect.cleandoc(doc).split())


def object_schema(cls: type, *, type_name: str | None = None) -> dict[str, Any]:
    """An attrs class as an object schema; ``type_name`` adds the ``type`` const of an event."""
    hints = typing.get_type_hints(cls)
    flatten = getattr(cls, "FLATTEN", None)
    properties: dict[str, Any] = {}
    required: list[str] = []
    if type_name is not None:
        properties["type"] = {"const": type_name}
        required.append("type")
    for field in attrs.fields(cls):
        if field.name == flatten:
            continue
        properties[field.name] = type_schema(field.metadata.get(wire.SCHEMA, hints[field.name]))
        if field.default is attrs.NOTHING:
            required.append(field.name)
    schema: dict[str, Any] = {}
    description = _description(cls)
    if description:
        schema["description"] = description
    schema.update(
        type="object",
        properties=properties,
        required=required,
        additionalProperties=bool(getattr(cls, "EXTRA_PROPERTIES", False) or flatten),
    )
    return schema


def event_schema(cls: type, type_name: str, title: str) -> dict[str, Any]:
    return {"$schema": DRAFT, "title": title, **object_schema(cls, type_name=type_name)}


def record_schema(cls: type) -> dict[str, Any]:
    kind = records.KIND_NAMES[cls]
    number = next(n for n, c in records.BY_KIND.items() if c is cls)
    schema = {"$schema": DRAFT, "title": f"log record {kind} (kind {number})", **object_schema(cls)}
    blob: str | None = getattr(cls, "BLOB", None)
    note = (
        "The fields of the record's JSON payload (UTF-8, sorted keys)."
        if blob is None
        else f"The fields of the record's JSON payload; `{blob}` is stored as raw bytes after the "
        "JSON object, never base64, and is shown here as base64 for JSON dumps."
    )
    schema["description"] = " ".join(filter(None, [schema.get("description"), note]))
    return schema


# -- the schema set ----------------------------------------------------------------------------
def _events(dialect: str, direction: str, classes: Iterable[type], *, beta_names: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cls in classes:
        names = [wire.wire_type(cls, beta=False)]
        if beta_names:
            names.append(wire.wire_type(cls, beta=True))
        for name in dict.fromkeys(n for n in names if n is not None):
            title = f"{dialect} {direction} event {name}"
            out[f"{dialect}/{direction}/{name}.json"] = event_schema(cls, name, title)
    return out


def schema_objects() -> dict[str, dict[str, Any]]:
    """Every schema by its path relative to ``schemas/``."""
    out: dict[str, Any] = {}
    out.update(_events("realtime", "client", wire.REALTIME_CLIENT_EVENTS, beta_names=False))
    out.update(_events("realtime", "server", wire.REALTIME_SERVER_EVENTS, beta_names=True))
    out.update(_events("native", "client", wire.NATIVE_CLIENT_EVENTS, beta_names=False))
    out.update(_events("native", "server", wire.NATIVE_SERVER_EVENTS, beta_names=False))
    for cls in records.RECORD_TYPES:
        out[f"log/{records.KIND_NAMES[cls]}.json"] = record_schema(cls)
    return out


def _readme(paths: Iterable[str]) -> str:
    lines = [
        "# JSON Schemas (generated; do not edit)",
        "",
        "Generated from the attrs classes in `duplex_actors.protocol.wire_events` and",
        "`duplex_actors.log.records` (session log records). After changing a class, run",
        "",
        "    .venv/bin/python -m duplex_actors.protocol.schemas write schemas/",
        "",
        "`... check schemas/` exits 1 and lists the files that differ; `tests/protocol` runs it.",
        "Wire events are one JSON object per WebSocket text message, discriminated by `type`",
        "(docs: `docs/api.md`); `realtime/server/` holds the GA names and the beta names",
        "(`OpenAI-Beta: realtime=v1`).",
        "",
    ]
    lines += [f"- `{p}`" for p in sorted(paths)]
    return "\n".join(lines) + "\n"


def generate() -> dict[str, str]:
    """Every file of ``schemas/`` (path -> text), README included."""
    objects = schema_objects()
    files = {path: json.dumps(obj, indent=2, ensure_ascii=False) + "\n" for path, obj in objects.items()}
    files[README] = _readme(objects)
    return files


def _existing(root: Path) -> set[str]:
    found = {README} if (root / README).exists() else set()
    for sub in SUBDIRS:
        if (root / sub).is_dir():
            found.update(p.relative_to(root).as_posix() for p in (root / sub).glob("*.json"))
    return found


def write(root: Path) -> list[str]:
    """Write every schema under ``root`` and delete stale ones; returns the paths changed."""
    files = generate()
    changed = []
    for stale in sorted(_existing(root) - set(files)):
        (root / stale).unlink()
        changed.append(stale)
    for path, text in files.items():
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def check(root: Path) -> list[str]:
    """The paths under ``root`` that are missing, stale or different from the generated ones."""
    files = generate()
    differ = sorted(_existing(root) - set(files))
    for path, text in sorted(files.items()):
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            differ.append(path)
    return differ


# -- validation of real traffic ----------------------------------------------------------------
@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    return schema_objects()


@functools.cache
def _validator(path: str) -> Any:
    import jsonschema  # dev dependency: only the tests validate traffic

    return jsonschema.Draft202012Validator(_schemas()[path])


def _validate(obj: Any, dialect: wire.DialectName, direction: str) -> None:
    import jsonschema

    if dialect not in ("realtime", "native"):
        raise ValueError(f"unknown dialect {dialect!r}")
    name = obj.get("type") if isinstance(obj, dict) else None
    path = f"{dialect}/{direction}/{name}.json"
    if not isinstance(name, str) or path not in _schemas():
        raise jsonschema.ValidationError(f"no {dialect} {direction} event has type {name!r}")
    _validator(path).validate(obj)


def validate_server_event(obj: Any, dialect: wire.DialectName) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``obj`` is a valid server event of
    ``dialect`` (binary native messages are not events: check them with
    ``native.split_binary_frame``)."""
    _validate(obj, dialect, "server")


def validate_client_event(obj: Any, dialect: wire.DialectName) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``obj`` is a valid client event of ``dialect``."""
    _validate(obj, dialect, "client")


# -- command line ------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("write", "check"):
        print("usage: python -m duplex_actors.protocol.schemas {write|check} DIR", file=sys.stderr)
        return 2
    root = Path(args[1])
    if args[0] == "write":
        changed = write(root)
        print(f"{len(changed)} file(s) written or removed under {root}")
        return 0
    differ = check(root)
    for path in differ:
        print(f"differs: {root / path}")
    if differ:
        print("regenerate with: python -m duplex_actors.protocol.schemas write schemas/", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
