"""The link's status record: what counts as a change worth a message."""

from __future__ import annotations

from duplex_actors.core.wire import ORIGIN_TOLERANCE_S, CoreStatus


def _status(**changes: object) -> CoreStatus:
    fields: dict[str, object] = {
        "slots_total": 8,
        "slots_free": 3,
        "slots_releasing": 0,
        "failed": None,
        "grid_origin": 6311.082566,
        "grid_held": frozenset({4}),
    }
    fields.update(changes)
    return CoreStatus(**fields)  # type: ignore[arg-type]


def test_an_origin_read_a_few_microseconds_apart_is_the_same_status():
    assert _status().same_as(_status(grid_origin=6311.082568))
    assert _status().same_as(_status(grid_origin=6311.082566 - ORIGIN_TOLERANCE_S / 2))


def test_an_origin_that_moved_is_a_new_status():
    assert not _status().same_as(_status(grid_origin=6311.082566 + 2 * ORIGIN_TOLERANCE_S))
    assert not _status().same_as(_status(grid_origin=None))
    assert not _status(grid_origin=None).same_as(_status())
    assert _status(grid_origin=None).same_as(_status(grid_origin=None))


def test_every_other_field_counts_exactly():
    base = _status()
    variants: tuple[dict[str, object], ...] = (
        {"slots_total": 9},
        {"slots_free": 2},
        {"slots_releasing": 1},
        {"failed": "StepFailed: boom"},
        {"grid_period": 0.04},
        {"grid_held": frozenset()},
    )
    for changes in variants:
        assert not base.same_as(_status(**changes)), changes
        assert not base.same_as(_status(grid_origin=6311.082567, **changes)), changes


def test_nothing_sent_yet_is_never_the_same():
    assert not _status().same_as(None)
