"""Fuzzing the client protocol: hypothesis strategies built from the JSON Schemas of the client
events (``schemas/realtime/client/*.json``, ``schemas/native/client/*.json``) plus mutations.

- Live: batches of fuzz messages on a real server's ``/v1/realtime``. After each message a
  ``session.heartbeat`` with a fresh ``event_id`` is the fence: everything that arrives before
  its ack answers the fuzz message, which must get its effect or exactly one ``error`` (naming
  the message's ``event_id`` when it had a usable one), never more; the session stays usable
  (audio in, audio out, after every batch); the server never crashes and counts no connection
  error. Every server message is validated against the server schemas (``helpers.Client``).
- Sans-io: thousands of examples through ``parsing.parse_client_text`` (only ``ProtocolError`` may
  come out) and through each dialect's ``parse`` (the commands the connection would run).
"""

from __future__ import annotations

import base64
import functools
import json
import string
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from duplex_actors.protocol import parsing
from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.web.dialects import NativeDialect, RealtimeDialect

from ..e2e.conftest import http_get, start_server
from ..e2e.helpers import Client, connect, error_code
from .conftest import metric_sum, metrics_text, tone_pcm16

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
LIVE_EXAMPLES = 20  # batches of 16 messages: 320
PARSER_EXAMPLES = 2000
# What a valid event of these types is answered with (when not refused).
EFFECTS = {
    "session.heartbeat": "session.heartbeat_ack",
    "playback.ack": "playback.acknowledged",
    "session.update": "session.updated",
    "input_audio_buffer.clear": "input_audio_buffer.cleared",
}


@functools.cache
def load_schemas(dialect: str) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((SCHEMAS / dialect / "client").glob("*.json")):
        schema = json.loads(path.read_text())
        out[schema["properties"]["type"]["const"]] = schema
    return out


# -- strategies from the schemas ------------------------------------------------------------------
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
event_ids = st.one_of(
    st.none(), st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=16)
)
pcm_b64 = st.binary(min_size=2, max_size=2 * 1920 * 2).map(
    lambda b: base64.b64encode(b[: len(b) // 2 * 2]).decode() if len(b) >= 2 else "AAA="
)
SESSION_KEYS = {
    "voice": st.sampled_from(["NATF2.pt", "NATM1.pt", "nope.pt", ""]) | st.text(max_size=10),
    # Short ones, and some too long for the model's context (refused with
    # invalid_duplex_runtime_config, the session goes on: docs/api.md §3.2).
    "instructions": st.text(max_size=30) | st.text(min_size=1, max_size=3).map(lambda w: (w + " ") * 900),
    "temperature": st.floats(-1, 3) | st.integers(-5, 5),
    "top_k": st.integers(-3, 300),
    "seed": st.integers(-1, 2**40),
    "input_audio_format": st.sampled_from(["pcm16", "pcm_f32le", "g711_ulaw", "audio/pcm", "mp3"]),
    "sample_rate_hz": st.sampled_from([24000, 16000, 0]),
    "output_modalities": st.just(["audio"]),
}
session_objects = st.fixed_dictionaries({}, optional=SESSION_KEYS) | st.dictionaries(
    st.text(max_size=10), json_value, max_size=3
)


def value_for(name: str, prop: dict[str, Any]) -> st.SearchStrategy[Any]:
    if name == "audio":
        return pcm_b64
    if name == "event_id":
        return event_ids
    if name == "session":
        return session_objects
    if name in ("format", "input_audio_format"):
        return st.none() | st.sampled_from(["pcm16", "pcm_f32le", "audio/pcm", "opus"])
    if name == "sample_rate_hz":
        return st.none() | st.sampled_from([24000, 48000])
    types = prop.get("type", [])
    types = [types] if isinstance(types, str) else types
    options = []
    for t in types:
        options.append(
            {
                "string": st.text(max_size=20),
                "null": st.none(),
                "integer": st.integers(-1000, 10**6),
                "number": st.floats(allow_nan=False, allow_infinity=False),
                "boolean": st.booleans(),
                "object": st.dictionaries(st.text(max_size=8), json_value, max_size=3),
                "array": st.lists(json_value, max_size=3),
            }[t]
        )
    return st.one_of(options) if options else json_value


def event_strategy(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = schema["properties"]
    required = {k: value_for(k, v) for k, v in props.items() if k in schema["required"] and k != "type"}
    optional = {k: value_for(k, v) for k, v in props.items() if k not in schema["required"]}
    if schema.get("additionalProperties") is True:  # playback.ack: any keys are the payload
        extra = st.dictionaries(
            st.text(min_size=1, max_size=8).filter(lambda k: k not in props), json_value, max_size=3
        )
    else:
        extra = st.just({})
    type_name = props["type"]["const"]
    return st.builds(
        lambda req, opt, ext: {"type": type_name, **ext, **req, **opt},
        st.fixed_dictionaries(required),
        st.fixed_dictionaries({}, optional=optional),
        extra,
    )


# One strategy object per argument: hypothesis validates a strategy (recursively, json_value's
# too) the first time it is drawn from, and a strategy built inside each draw is new every time.
@functools.cache
def valid_events(dialect: str, exclude: tuple[str, ...] = ()) -> st.SearchStrategy[dict[str, Any]]:
    schemas = load_schemas(dialect)
    return st.one_of([event_strategy(s) for t, s in sorted(schemas.items()) if t not in exclude])


# -- mutations ----------------------------------------------------------------------------------
# A fuzz message: (wire data, kind, event_id the error must name or None). Kinds starting with
# "bad:" must be refused with exactly one error; "valid" may get an error (e.g. cancel without a
# response) or its effect.
Fuzz = tuple[str | bytes, str, str | None]


def _eid(event: dict[str, Any]) -> str | None:
    eid = event.get("event_id")
    return eid if isinstance(eid, str) and len(eid) <= 512 else None


SAMPLES_OF_TYPE = {
    "string": "text",
    "integer": 7,
    "number": 2.5,
    "boolean": True,
    "null": None,
    "array": [1],
    "object": {"a": 1},
}


def allowed_types(prop: dict[str, Any]) -> set[str]:
    types = prop.get("type", list(SAMPLES_OF_TYPE))
    allowed = {types} if isinstance(types, str) else set(types)
    if "number" in allowed:
        allowed.add("integer")  # JSON Schema: an integer is a number
    return allowed


def wrong_type(event: dict[str, Any], data: st.DataObject, dialect: str) -> dict[str, Any]:
    """Give one typed field of the event (by its schema) a value of a type the schema forbids."""
    props = load_schemas(dialect)[event["type"]]["properties"]
    key = data.draw(st.sampled_from(sorted(k for k in props if k != "type")))
    bad = [v for t, v in SAMPLES_OF_TYPE.items() if t not in allowed_types(props[key])]
    if key == "audio":
        bad = [v for v in bad if v is not None]  # a missing/None audio is still refused, keep it simple
    return {**event, key: data.draw(st.sampled_from(bad))}


KINDS = (
    "valid",
    "valid",
    "valid",
    "wrong_type",
    "extra_key",
    "huge_string",
    "huge_event_id",
    "deep_nesting",
    "nan_literal",
    "bad_base64",
    "odd_length",
    "unknown_type",
    "no_type",
    "not_an_object",
    "binary",
    "truncated",
)


@st.composite
def fuzz_messages(
    draw: st.DrawFn, dialect: str = "realtime", kind: str | None = None, small: bool = False
) -> Fuzz:
    """One fuzz message of ``kind`` (drawn when None); ``small`` caps the huge sizes at 10 k."""
    base = draw(valid_events(dialect, exclude=("session.close", "session.create")))
    kind = kind or draw(st.sampled_from(KINDS))
    big = (lambda sizes: [x for x in sizes if x <= 10_000]) if small else (lambda sizes: sizes)
    data = draw(st.data())
    eid = _eid(base)
    if kind == "valid":
        known_bad = base["type"] in ("input_audio_buffer.commit", "response.create")
        return json.dumps(base), "bad:unsupported" if known_bad else "valid", eid
    if kind == "wrong_type":
        mutated = wrong_type(base, data, dialect)
        return json.dumps(mutated), "bad:wrong_type", _eid(mutated)
    if kind == "extra_key":
        key = draw(st.text(alphabet=string.ascii_lowercase, min_size=3, max_size=10))
        return json.dumps({**base, key: draw(json_value)}), "valid", eid
    if kind == "huge_string":
        n = draw(st.sampled_from(big([10_000, 200_000, 1_000_000])))
        field = "zz_pad"  # an unknown session key is echoed; a long persona is another matter (above)
        if base["type"] == "session.update":
            mutated = {**base, "session": {**base["session"], field: "x" * n}}
        else:
            mutated = {**base, field: "x" * n}
        return json.dumps(mutated), "valid", eid
    if kind == "huge_event_id":
        return (
            json.dumps({**base, "event_id": "e" * draw(st.sampled_from(big([513, 5000, 100_000])))}),
            "bad:event_id",
            None,
        )
    if kind == "deep_nesting":
        depth = draw(st.sampled_from(big([50, 5_000, 100_000])))
        nested = "[" * depth + "]" * depth
        text = json.dumps({**base, "zz": 0})[:-1] + f', "nest": {nested}}}'
        return text, "valid" if depth < 500 else "bad:nesting", eid if depth < 500 else None
    if kind == "nan_literal":
        literal = draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
        return json.dumps({**base, "zz": 0})[:-1] + f', "n": {literal}}}', "bad:nan", None
    if kind == "bad_base64":
        junk = draw(st.sampled_from(["!!!!", "AAA", "A", "====", "é", "AB CD", "AAA*"]))
        event = {"type": "input_audio_buffer.append", "audio": junk}
        if eid:
            event["event_id"] = eid
        return json.dumps(event), "bad:base64", eid
    if kind == "odd_length":
        n = draw(st.sampled_from([1, 3, 3839]))
        event = {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01" * n).decode()}
        if eid:
            event["event_id"] = eid
        return json.dumps(event), "valid", eid  # a partial sample may be kept for the next chunk
    if kind == "unknown_type":
        name = draw(st.sampled_from(["", "session.create.x", "conversation.item.delete", "x" * 300])) or draw(
            st.text(max_size=30)
        )
        return json.dumps({**base, "type": name}), "bad:unknown", eid
    if kind == "no_type":
        return json.dumps({k: v for k, v in base.items() if k != "type"}), "bad:no_type", eid
    if kind == "not_an_object":
        return (
            json.dumps(draw(st.sampled_from([[], [base], "session.heartbeat", 1, None, True]))),
            "bad:not_object",
            None,
        )
    if kind == "binary":
        return (
            draw(st.sampled_from([b"\x00\x01", tone_pcm16(1), json.dumps(base).encode()])),
            "bad:binary",
            None,
        )
    text = json.dumps(base)  # truncated
    return text[: draw(st.integers(0, max(0, len(text) - 1)))], "bad:truncated", None


# -- live -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, parrot_dir):
    server = start_server(tmp_path_factory.mktemp("fuzz"), "--max-sessions", "2")
    yield server
    server.stop()


async def run_batch(url: str, batch: tuple[Fuzz, ...], stats: Counter[str], fence_ids: list[int]) -> None:
    async with connect(url) as c:
        await c.wait_for("session.updated")
        for data, kind, eid in batch:
            fence_ids[0] += 1
            fence = f"fence-{fence_ids[0]}"
            since = len(c.messages)
            await c.send_raw(data)
            await c.send_raw(json.dumps({"type": "session.heartbeat", "event_id": fence}))
            ack = await c.wait_until(
                lambda f=fence, s=since: next(  # type: ignore[misc]
                    (
                        i
                        for i, m in enumerate(c.messages[s:], s)
                        if isinstance(m, dict)
                        and m["type"] == "session.heartbeat_ack"
                        and m["client_event_id"] == f
                    ),
                    None,
                ),
                timeout=20,
                what=f"the fence after a {kind} message",
            )
            window = [m for m in c.messages[since:ack] if isinstance(m, dict)]
            errors = [m for m in window if m["type"] == "error"]
            stats["messages"] += 1
            stats[f"kind:{kind}"] += 1
            stats["errors"] += len(errors)
            stats["bytes"] += len(data)
            for e in errors:
                stats[f"code:{error_code(e)}"] += 1
            assert len(errors) <= 1, (kind, str(data)[:300], errors)
            if kind.startswith("bad:"):
                assert len(errors) == 1, (kind, str(data)[:300], [m["type"] for m in window])
            if errors and eid is not None:
                assert errors[0]["error"]["event_id"] == eid, (kind, errors[0])
            if errors and error_code(errors[0]) == "internal_error":
                raise AssertionError(f"internal_error for {kind}: {str(data)[:300]}")
            if kind == "valid" and not errors and isinstance(data, str):
                wanted = EFFECTS.get(json.loads(data).get("type"))
                if wanted:
                    assert any(m["type"] == wanted for m in window), (wanted, [m["type"] for m in window])
        # Still usable: a heartbeat, and audio in -> audio out.
        assert not c.closed.is_set(), (c.close_code, c.close_reason)
        await c.send({"type": "input_audio_buffer.clear"})
        await c.send({"type": "session.update", "session": {"input_audio_format": "pcm16"}})
        before = c.output_frames()
        await c.append(tone_pcm16(2))
        await c.wait_until(
            lambda: c.output_frames() >= before + 2,
            timeout=10,
            what=f"audio after fuzzing (errors: {[m['error'] for m in c.errors()][-3:]})",
        )
        stats["batches_usable_after"] += 1


def test_live_fuzz_never_crashes_and_answers_each_message_once(fuzz_server, record):
    url = fuzz_server.ws + "/v1/realtime"
    stats: Counter[str] = Counter()
    fence_ids = [0]
    errors_before = metric_sum(metrics_text(fuzz_server), "duplex_connection_errors_total")
    t0 = time.monotonic()

    @settings(
        max_examples=LIVE_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[
            Phase.generate
        ],  # no shrinking: each example is a live session; the failure is reported as is
    )
    # Each batch: every kind of KINDS once (valid three times), in a random order.
    @given(st.permutations(KINDS).flatmap(lambda ks: st.tuples(*(fuzz_messages(kind=k) for k in ks))))
    def batch(messages: tuple[Fuzz, ...]) -> None:
        stats["batches"] += 1
        try:
            trio.run(run_batch, url, messages, stats, fence_ids)
        except BaseException:
            dump = [(d if isinstance(d, str) else d.hex(), k, e) for d, k, e in messages]
            print("failing batch:", json.dumps(dump)[:20000])
            raise
        assert fuzz_server.proc.poll() is None, fuzz_server.output

    batch()
    elapsed = time.monotonic() - t0
    text = metrics_text(fuzz_server)
    record(
        seconds=round(elapsed, 1),
        connection_errors_delta=metric_sum(text, "duplex_connection_errors_total") - errors_before,
        **{k.replace(":", "_").replace(".", "_"): v for k, v in sorted(stats.items())},
    )
    assert fuzz_server.proc.poll() is None
    assert http_get(fuzz_server.base + "/health")[0] == 200
    assert metric_sum(text, "duplex_connection_errors_total") == errors_before
    assert metric_sum(text, "duplex_errors_total", code="internal_error") == 0
    assert stats["messages"] == 16 * LIVE_EXAMPLES


def test_client_close_after_fuzz_closes_cleanly(fuzz_server):
    async def go() -> Client:
        async with connect(fuzz_server.ws + "/v1/realtime") as c:
            await c.wait_for("session.updated")
            await c.send_raw('{"type":"session.close","event_id":"bye","extra":[1,2,{"x":null}]}')
            await c.wait_closed()
        return c

    c = trio.run(go)
    assert c.close_code == 1000 and c.of_type("session.closed")[0]["reason"] == "client_close"


# -- sans-io ------------------------------------------------------------------------------------
@st.composite
def parser_inputs(draw: st.DrawFn) -> tuple[str, str | bytes]:
    dialect = draw(st.sampled_from(["realtime", "native"]))
    how = draw(st.sampled_from(["fuzz", "fuzz", "valid", "text", "json"]))
    if how == "valid":
        return dialect, json.dumps(draw(valid_events(dialect)))
    if how == "text":
        return dialect, draw(st.text(max_size=200))
    if how == "json":
        return dialect, json.dumps(draw(json_value))
    return dialect, draw(fuzz_messages(dialect, small=True))[0]


def parse_one(dialect: str, data: str | bytes, stats: Counter[str]) -> None:
    """Only ``ProtocolError`` may come out of the sans-io parsers; counts what happened."""
    stats["examples"] += 1
    if isinstance(data, str):
        try:
            parsing.parse_client_text(data, dialect=dialect)  # type: ignore[arg-type]
            stats["parsed"] += 1
        except ProtocolError as err:
            stats[f"refused:{err.code}"] += 1
    # The whole dialect parse: also decodes audio, normalizes session config, builds the command.
    parser: Any = (
        RealtimeDialect(model="tiny-parrot", capabilities={}, beta=False)
        if dialect == "realtime"
        else NativeDialect(capabilities={})
    )
    try:
        parser.parse(data, {})
        stats["commands"] += 1
    except ProtocolError:
        stats["command_refused"] += 1


def test_sans_io_parser_raises_only_protocol_errors(record) -> None:
    """Thousands of examples through both parsers (self-contained: the counts are this test's own),
    then the numbers, and that the fuzz reached both outcomes of each parser."""
    stats: Counter[str] = Counter()

    # Generating these inputs (recursive JSON, schema-derived events, base64 audio) can pass the
    # too_slow threshold on a loaded CI machine; that is the machine, not the strategy.
    @settings(
        max_examples=PARSER_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(parser_inputs())
    def check(case: tuple[str, str | bytes]) -> None:
        parse_one(*case, stats)

    check()
    record(**{k.replace(":", "_"): v for k, v in sorted(stats.items())})
    assert stats["examples"] >= PARSER_EXAMPLES * 0.9, stats
    assert stats["parsed"] > 0 and sum(v for k, v in stats.items() if k.startswith("refused:")) > 0, stats
    assert stats["commands"] > 0 and stats["command_refused"] > 0, stats
