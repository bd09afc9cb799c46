"""The alignment goldens (log format 4) hold what they are for: a server pad, a client hint and
its client pad, a drain; older goldens stay format 3 and keep no positions."""

from __future__ import annotations

from pathlib import Path

from duplex_actors.log import records as r
from duplex_actors.replay.replayer import replay_logic
from duplex_actors.session import events as ev

CORPUS = Path(__file__).resolve().parents[2] / "replay"


def kinds(name: str) -> tuple[int, list[tuple[str, str | None]], list[ev.SessionEvent]]:
    report = replay_logic(CORPUS / f"sess_golden-{name}.dlog")
    assert report.identical and report.complete
    header = report.records_list[0][1]
    assert isinstance(header, r.Header)
    marks = [
        (r.KIND_NAMES[type(rec)], getattr(rec, "reason", None))
        for _, rec in report.records_list
        if isinstance(rec, r.Pad | r.AlignHint | r.Drain)
    ]
    return header.format_version, marks, report.events


def test_the_server_pad_golden() -> None:
    version, marks, events = kinds("tiny-grid-server-pad")
    assert version == 4 and ("pad", "clear") in marks
    ends = [e.input_samples_end for e in events if isinstance(e, ev.AudioFrame)]
    known = [e for e in ends if e is not None]
    assert len(known) == len(ends) > 0 and known == sorted(known)


def test_the_client_hint_golden() -> None:
    version, marks, events = kinds("tiny-grid-client-hint")
    assert version == 4
    assert [m[0] for m in marks] == ["align_hint", "pad", "drain"] and marks[1] == ("pad", "client")
    assert any(isinstance(e, ev.AlignmentHint) for e in events)


def test_older_goldens_have_no_positions() -> None:
    version, marks, events = kinds("tiny-greedy")
    assert version <= 3 and marks == []
    assert all(e.input_samples_end is None for e in events if isinstance(e, ev.AudioFrame))
