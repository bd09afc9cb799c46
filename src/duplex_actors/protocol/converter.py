"""The one cattrs converter of every wire event, and the JSON text of server events.

Client events structure as tagged unions on ``type`` (``CONVERTER.structure(obj,
RealtimeClientEvent)``); server events unstructure to the messages the projections send
(``type`` first, then the fields in class order) and structure back (the client's parser).
Fields are type-checked without coercion: ``"5"`` is not an int, ``1`` is not a bool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from . import wire_events as wire
from .wire_events import (
    CLIENT_EVENTS,
    NATIVE_CLIENT_EVENTS,
    REALTIME_CLIENT_EVENTS,
    ClientEvent,
    NativeClientEvent,
    PlaybackAck,
    RealtimeClientEvent,
    SessionCreate,
)

_ENVELOPE: Final = frozenset({"type", "event_id"})


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _structure_str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {json_type(value)}")
    return value


def _structure_int(value: Any, _: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {json_type(value)}")
    return value


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {json_type(value)}")
    return float(value)


def _structure_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {json_type(value)}")
    return value


def _structure_object(value: Any, _: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {json_type(value)}")
    return dict(value)


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name}: expected a string, got {json_type(value)}")
    return value


def _structure_playback_ack(value: dict[str, Any], _: Any) -> PlaybackAck:
    payload = {k: v for k, v in value.items() if k not in _ENVELOPE}
    return PlaybackAck(payload=payload, event_id=_optional_str(value.get("event_id"), "event_id"))


def _unstructure_playback_ack(event: PlaybackAck) -> dict[str, Any]:
    return {**event.payload, "event_id": event.event_id}


def _structure_session_create(value: dict[str, Any], _: Any) -> SessionCreate:
    # binary_output and resume are options of the connection, not session config: never echoed.
    options = ("binary_output", "resume")
    if "session" in value:
        session = value["session"]
        if not isinstance(session, dict):
            raise TypeError(f"session: expected an object, got {json_type(session)}")
        found = {k: value.get(k, session.get(k, False)) for k in options}
        session = {k: v for k, v in session.items() if k not in options}
    else:
        found = {k: value.get(k, False) for k in options}
        session = {k: v for k, v in value.items() if k not in _ENVELOPE and k not in options}
    for name, flag in found.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a boolean, got {json_type(flag)}")
    return SessionCreate(
        session=session,
        binary_output=bool(found["binary_output"]),
        resume=bool(found["resume"]),
        event_id=_optional_str(value.get("event_id"), "event_id"),
    )


def _unstructure_session_create(event: SessionCreate) -> dict[str, Any]:
    out = {"session": event.session, "binary_output": event.binary_output, "event_id": event.event_id}
    if event.resume:
        out["resume"] = True
    return out


def _tag(cls: type) -> str:
    return str(getattr(cls, "TYPE"))  # noqa: B009 - TYPE is a ClassVar mypy cannot see on `type`


# Server events and the objects nested in them: every attrs class of .events but the client
# events, which keep their own rules (tagged unions, ``type`` added last on unstructure).
_CLIENT_CLASSES: Final = frozenset(CLIENT_EVENTS)


def _is_server_class(cls: Any) -> bool:
    return attrs.has(cls) and getattr(cls, "__module__", None) == wire.__name__ and cls not in _CLIENT_CLASSES


def _server_unstructure_hook(cls: type[Any], conv: cattrs.Converter) -> Callable[[Any], dict[str, Any]]:
    """The message of one instance: ``{"type": TYPE}`` for an event, then the fields in order
    (``OMIT_IF_NONE`` ones left out while ``None``), then the keys of the ``FLATTEN`` dict."""
    flatten: str | None = getattr(cls, "FLATTEN", None)
    overrides: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if field.name == flatten:
            overrides[field.name] = override(omit=True)
        elif field.metadata.get(wire.OMIT_IF_NONE):
            overrides[field.name] = override(omit_if_default=True)
    fields_of = make_dict_unstructure_fn(cls, conv, **overrides)
    tag: str | None = getattr(cls, "TYPE", None)
    if flatten is not None:

        def flattened(obj: Any) -> dict[str, Any]:
            out = {} if tag is None else {"type": tag}
            out.update(fields_of(obj))
            out.update(getattr(obj, flatten))
            return out

        return flattened
    if tag is not None:
        return lambda obj: {"type": tag, **fields_of(obj)}
    return fields_of


def _server_structure_hook(cls: type[Any], conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """Structure a class with a ``FLATTEN`` dict: the keys that are not fields go into it."""
    flatten: str = getattr(cls, "FLATTEN")  # noqa: B009 - a ClassVar mypy cannot see on `type`
    names = frozenset(f.name for f in attrs.fields(cls)) - {flatten}
    fields_from = make_dict_structure_fn(cls, conv)

    def hook(value: Any, _: Any) -> Any:
        obj = _structure_object(value, None)
        known = {k: v for k, v in obj.items() if k in names}
        known[flatten] = {k: v for k, v in obj.items() if k not in names}
        return fields_from(known, cls)

    return hook


def make_converter() -> cattrs.Converter:
    """The strict converter with the client-event unions of both dialects configured."""
    conv = cattrs.Converter(forbid_extra_keys=False)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(float, _structure_float)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook_func(lambda t: t == dict[str, Any], _structure_object)
    conv.register_structure_hook(PlaybackAck, _structure_playback_ack)
    conv.register_unstructure_hook(PlaybackAck, _unstructure_playback_ack)
    conv.register_structure_hook(SessionCreate, _structure_session_create)
    conv.register_unstructure_hook(SessionCreate, _unstructure_session_create)
    configure_tagged_union(RealtimeClientEvent, conv, tag_generator=_tag, tag_name="type")
    configure_tagged_union(NativeClientEvent, conv, tag_generator=_tag, tag_name="type")
    configure_tagged_union(ClientEvent, conv, tag_generator=_tag, tag_name="type")
    # Free-form objects (session config, payloads) go out as they are, one level copied.
    conv.register_unstructure_hook_func(lambda t: t == dict[str, Any], dict)
    conv.register_unstructure_hook_factory(_is_server_class, lambda cls: _server_unstructure_hook(cls, conv))
    conv.register_structure_hook_factory(
        lambda t: _is_server_class(t) and hasattr(t, "FLATTEN"), lambda cls: _server_structure_hook(cls, conv)
    )
    return conv


CONVERTER: Final = make_converter()
CLIENT_UNIONS: Final[dict[str, Any]] = {"realtime": RealtimeClientEvent, "native": NativeClientEvent}
CLIENT_TYPES: Final[dict[str, frozenset[str]]] = {
    "realtime": frozenset(_tag(c) for c in REALTIME_CLIENT_EVENTS),
    "native": frozenset(_tag(c) for c in NATIVE_CLIENT_EVENTS),
}


def encode_client_event(event: ClientEvent) -> dict[str, Any]:
    """A client event as the JSON object a client sends (tests and in-repo clients use it)."""
    out: dict[str, Any] = CONVERTER.unstructure(event, unstructure_as=ClientEvent)
    return out


_SERVER_HOOKS: Final[dict[type[Any], Callable[[Any], dict[str, Any]]]] = {}


def encode_server_event(event: Any) -> dict[str, Any]:
    """A server event (an instance of a :mod:`.events` class) as its JSON object, with the
    canonical (GA) ``type``: ``CONVERTER.unstructure(event)``, the hook looked up once per class
    since the audio path runs per frame."""
    cls = type(event)
    hook = _SERVER_HOOKS.get(cls)
    if hook is None:
        hook = _SERVER_HOOKS[cls] = CONVERTER.get_unstructure_hook(cls)
    return hook(event)


def server_event_encoder(cls: type[Any], type_name: str) -> Callable[[Any], dict[str, Any]]:
    """:func:`encode_server_event` for instances of ``cls``, writing ``type_name`` as the
    ``type`` (a Realtime beta name; renamed in place, so ``type`` stays the first key)."""
    hook: Callable[[Any], dict[str, Any]] = CONVERTER.get_unstructure_hook(cls)
    if type_name == getattr(cls, "TYPE", None):
        return hook

    def renamed(event: Any) -> dict[str, Any]:
        message = hook(event)
        message["type"] = type_name
        return message

    return renamed


_DUMPS = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode  # built once, not per call


def dumps(obj: Mapping[str, Any]) -> str:
    """Compact JSON text of a server event. ASCII-only, so a lone surrogate a client sent and
    that is echoed back still encodes as UTF-8; NaN is refused, as the spec's JSON has none."""
    return _DUMPS(obj)
