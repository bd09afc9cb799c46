"""Alignment to the tick grid (docs/protocol.md §7), sans-io: when to pad a session's input.

The scheduler steps every session on one grid (tick n at ``origin + n * period``). Inserting
P ms of silence (0 <= P < 80) into a session's input makes its later frames complete P ms
earlier (mod 80): the aligner picks P so that they complete ``margin`` before a tick. Why the
server aligns sessions rather than waiting for them: docs/design.md, decision 10.

Measurement. An append's *offset* is ``arrival - (client samples so far) / 24 kHz`` (pads do
not change it). The smallest offset over the first ``measure_appends`` appends (by default the
first alone, so that the pad goes in before the first frame completes) is the session's
*base*; an append's *lateness* is its offset minus the base. The *anchor* is the jitter-free
completion time of the session's next frame: frames complete at ``anchor + k * 80 ms - (pads
since)``. A base measured through jitter shows as drift, and the rechecks correct it.

Decisions (``before_append``), each taken at the first append of a frame (the core's tail
before it shorter than a chunk), where a pad moves that frame's own completion:

- chunks of 240, 480 or 960 samples (10, 20, 40 ms) in mode "server" or "client": a
  ``ServerPad`` of a whole number of chunks, the smallest that makes frames complete at least
  ``margin`` before a tick (jitter-free, in ``(tick - margin - chunk, tick - margin]``);
- 80 ms chunks (1920 samples) in mode "client": a ``ClientHint(pad_ms)`` once, then none until
  the client pads or ``recheck_s`` passes without it (applied, frames complete in ``(tick -
  margin - 1 ms, tick - margin]``);
- anything else (other or irregular chunk sizes, 80 ms chunks in mode "server", mode "off", no
  grid yet): None, and the session is served unaligned.

A server pad at the start, before the first frame, or one that moves frames earlier never makes
two frames complete for one tick (a hint does once: the chunk sent early lands in the tick of
the one before it).

Margin. It starts at ``initial_margin_ms``. Rechecks come ``first_recheck_s`` after the
measurement, then every ``recheck_s``, each once ``MIN_WINDOW`` frames have completed since the
last. The window's least lateness is how far the session's phase moved (the base and the anchor
move with it; more than the margin is *drift*). The margin becomes the ``lateness_percentile``
(default p99) of the lateness above that least one, + 2 ms, clamped to ``[margin_min_ms,
margin_max_ms]``; the margin used is at least ``burst_floor_ms`` (within ``margin_max_ms``).
Left out of the percentile: lateness above ``margin_max_ms`` (a stall no margin covers; the
scheduler's catch-ups and drains handle it) with the frames that arrived with it
(``STALL_JOIN_S``), and frames whose tick the scheduler held because most sessions were late
together (``Grid.held``), unless such frames are ``SYSTEMATIC_SHARE`` of the window (the tail of
the aligned sessions' burst of appends, late at every tick, which the margin must cover). The
margin is raised only when frames came later than it allows in two bursts (late frames at most
``BURST_GAP`` frames apart are one) over this window and the one before, or at once when late
frames are ``SYSTEMATIC_SHARE`` of the window.

Re-alignment (reason "drift" or "margin") happens when frames would complete later than the
margin allows, or more than one pad granule plus ``realign_gain_ms`` earlier than needed.
``cleared()`` measures afresh and re-aligns with reason "clear"; the first alignment has reason
"start". Once a pad would take the session's total past ``max_total_pad_samples``, the aligner
returns None from then on.

The actor's calls, per append it is about to log: first ``client_padded(samples)`` if the append
carries ``pad_ms`` (the pad the core inserts before it), then ``before_append(now, grid, chunk,
tail)`` with ``chunk`` the append's own audio and ``tail`` the core's partial tail before the
append and before its pad. The aligner is deterministic: the same calls give the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import attrs

RATE: Final = 24_000
FRAME: Final = 1920  # samples per 80 ms frame at 24 kHz
SAMPLES_PER_MS: Final = RATE // 1000
# Chunk sizes the server pads by itself: shorter than a frame and dividing it (10, 20, 40 ms).
SERVER_CHUNKS: Final = (240, 480, 960)
MODES: Final = ("server", "client", "off")
REASONS: Final = ("start", "clear", "drift", "margin")
# Frames since the last check a recheck needs (a 4 s recheck sees ~50).
MIN_WINDOW: Final = 8
# Frames arriving this close after one later than margin_max_ms were held with it (a stall
# released at once over an in-order stream): their lateness says nothing about the jitter.
STALL_JOIN_S: Final = 0.002
# Late frames at most this many frames apart (~1 s) are one burst: one stall of the server or
# the path, which may release and stall again.
BURST_GAP: Final = 12
# Late frames that are at least this share of a recheck's window (and at least MIN_WINDOW of
# them) are how the session's frames arrive, not a stall.
SYSTEMATIC_SHARE: Final = 0.25
SYSTEMATIC_WINDOW: Final = 3 * MIN_WINDOW


def _systematic(late_at: Sequence[int], window: int) -> bool:
    """Frames late at these indices of a window of ``window`` are how the session's frames
    arrive: many (a quarter, at least MIN_WINDOW) and in both halves of a window of at least
    SYSTEMATIC_WINDOW frames (one long stall is late in one stretch; the first recheck's second
    of frames cannot tell a session's phase from the congestion of sessions starting together)."""
    if window < SYSTEMATIC_WINDOW or len(late_at) < max(MIN_WINDOW, SYSTEMATIC_SHARE * window):
        return False
    half = window / 2
    return any(i < half for i in late_at) and any(i >= half for i in late_at)


_EPS: Final = 1e-6


@attrs.frozen(slots=True)
class Grid:
    """The scheduler's tick grid: tick n at ``origin + n * period`` (seconds). ``held``: recent
    ticks (their n) the scheduler held open because most sessions' frames were late together."""

    origin: float
    period: float = 0.080
    held: frozenset[int] = frozenset()

    def tick_at_or_after(self, t: float) -> int:
        """The n of the first tick at or after ``t``."""
        return math.ceil((t - self.origin) / self.period - _EPS)


@attrs.frozen(slots=True)
class ServerPad:
    """Insert ``samples`` zeros (24 kHz) before this append (the actor writes ``r.Pad``)."""

    samples: int
    reason: str


@attrs.frozen(slots=True)
class ClientHint:
    """Ask the client to send its next chunk ``pad_ms`` early (the actor writes ``r.AlignHint``)."""

    pad_ms: int
    reason: str


Decision = ServerPad | ClientHint | None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in (0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


class Aligner:
    """One session's alignment state; see the module docstring."""

    def __init__(
        self,
        *,
        mode: str = "server",
        max_total_pad_samples: int = 24_000,
        margin_min_ms: float = 3.0,
        margin_max_ms: float = 40.0,
        recheck_s: float = 4.0,
        initial_margin_ms: float = 6.0,
        measure_appends: int = 1,
        first_recheck_s: float = 1.0,
        lateness_percentile: float = 99.0,
        realign_gain_ms: float = 20.0,
        hint_gain_ms: float = 10.0,
    ) -> None:
        if margin_min_ms > margin_max_ms or margin_min_ms < 0:
            raise ValueError("need 0 <= margin_min_ms <= margin_max_ms")
        if measure_appends < 1 or recheck_s <= 0 or not 0 < lateness_percentile <= 100:
            raise ValueError("need measure_appends >= 1, recheck_s > 0, 0 < lateness_percentile <= 100")
        if mode not in MODES:
            raise ValueError(f"alignment must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.max_total_pad_samples = max_total_pad_samples
        self.margin_min_ms = margin_min_ms
        self.margin_max_ms = margin_max_ms
        self.recheck_s = recheck_s
        self.initial_margin_ms = min(margin_max_ms, max(margin_min_ms, initial_margin_ms))
        self.measure_appends = measure_appends
        self.first_recheck_s = first_recheck_s
        self.lateness_percentile = lateness_percentile
        self.realign_gain_ms = realign_gain_ms
        self.hint_gain_ms = hint_gain_ms
        self._total = 0
        self._exhausted = False
        self._client_pos = 0  # client samples appended so far (pads excluded)
        self._pending_pad = 0  # a client pad announced for the next append
        self._margin_ms = self.initial_margin_ms
        # The least margin the server asks for whatever the lateness measured: the time its
        # event loop takes to read the pre-tick burst of every session's append (set by the
        # session actor before each append; 0 where nothing is known).
        self.burst_floor_ms = 0.0
        self._restart("start")

    def _restart(self, reason: str) -> None:
        self._reason = reason  # of the alignment owed or last made
        self._chunk: int | None = None  # the session's chunk size, once seen
        self._irregular = False
        self._measured: list[float] = []  # offsets of the appends measured
        self._base: float | None = None  # the smallest offset: start time + base delay
        self._anchor: float | None = None  # a jitter-free frame completion time (mod period)
        self._due = False  # an alignment is owed at the next first append of a frame
        self._window: list[float] = []  # lateness (s) of frames since the last check
        # Of those, the ones not part of a stall beyond margin_max_ms, each with whether its
        # tick was held for most sessions (a stall they shared).
        self._coverable: list[tuple[float, int | None]] = []
        self._stall_at = -math.inf  # when the last frame later than margin_max_ms arrived
        self._bursts_before = 0  # bursts past the margin in the window before the last check
        self._next_check = math.inf
        self._hint_at: float | None = None  # a hint the client has not answered yet

    # -- the API the session actor uses -----------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"alignment must be one of {', '.join(MODES)}, not {mode!r}")
        if mode != self.mode and mode != "off" and self._base is not None:
            self._due = True  # e.g. "off" -> "server": align at the next frame
        self.mode = mode

    @property
    def total_pad_samples(self) -> int:
        return self._total

    @property
    def margin_ms(self) -> float:
        """The margin frames are aligned to: the measured one, at least the burst floor."""
        return min(self.margin_max_ms, max(self._margin_ms, self.burst_floor_ms))

    @property
    def exhausted(self) -> bool:
        """A pad would have passed the bound: the session is served unaligned from now on."""
        return self._exhausted

    def client_padded(self, samples: int) -> None:
        """The next append carries a pad of ``samples`` the core inserts before it."""
        if samples <= 0:
            return
        self._total += samples
        self._pending_pad += samples
        self._hint_at = None
        if self._anchor is not None:
            self._anchor -= samples / RATE

    def cleared(self) -> None:
        """``input_audio_buffer.clear``: measure afresh and re-align (reason "clear")."""
        self._pending_pad = 0
        self._restart("clear")

    def before_append(self, now: float, grid: Grid | None, chunk_samples: int, tail_samples: int) -> Decision:
        pad_in, self._pending_pad = self._pending_pad, 0
        if chunk_samples <= 0:
            return None
        completes = tail_samples + pad_in + chunk_samples >= FRAME
        self._client_pos += chunk_samples
        offset = now - self._client_pos / RATE
        self._see_chunk(chunk_samples + pad_in)
        if self._base is None:
            self._measured.append(offset)
            if len(self._measured) < self.measure_appends:
                return None
            base = self._base = min(self._measured)
            # When the next frame completes, jitter-free: now (less this append's lateness) if
            # this append completes it, else at the end of the append that will.
            filled = tail_samples + pad_in + chunk_samples
            to_go = 0 if filled >= FRAME else math.ceil((FRAME - filled) / chunk_samples) * chunk_samples
            self._anchor = base + (self._client_pos + to_go) / RATE
            self._margin_ms = max(
                self.initial_margin_ms, self._margin_from([o - base for o in self._measured])
            )
            self._next_check = now + self.first_recheck_s
            self._due = True
        elif completes:
            late = offset - self._base
            self._window.append(late)
            if late * 1000 > self.margin_max_ms:
                self._stall_at = now
            elif now - self._stall_at > STALL_JOIN_S:
                # The tick it was meant for (asked against the held ticks at the recheck: the
                # scheduler may hold it after this append is read).
                tick = None if grid is None else grid.tick_at_or_after(now - late)
                self._coverable.append((late, tick))
        # Decide only at the first append of a frame (the previous frame completed before it):
        # a pad there moves this frame's own completion, so no frame completes at the old
        # phase after another completed at the new one (two frames for one tick).
        if grid is None or tail_samples + pad_in >= chunk_samples:
            return None
        if self._due:
            return self._align(now, grid, self._reason)
        if now >= self._next_check - _EPS and len(self._window) >= MIN_WINDOW:
            return self._recheck(now, grid)
        return None

    # -- internals --------------------------------------------------------------------------------
    def _see_chunk(self, samples: int) -> None:
        if self._chunk is None:
            self._chunk = samples
        elif samples != self._chunk:
            self._irregular = True

    def _margin_from(self, lateness: Sequence[float]) -> float:
        late_ms = percentile(lateness, self.lateness_percentile) * 1000 if lateness else 0.0
        return min(self.margin_max_ms, max(self.margin_min_ms, late_ms + 2.0))

    def _granule_samples(self) -> int | None:
        """The pad granule for this session (None: not aligned by this mode)."""
        if self.mode == "off" or self._irregular or self._chunk is None:
            return None
        if self._chunk in SERVER_CHUNKS:
            return self._chunk
        if self._chunk == FRAME and self.mode == "client":
            return SAMPLES_PER_MS
        return None

    def _phase_ms(self, grid: Grid) -> float:
        """When (ms after a tick) this session's frames complete, jitter-free."""
        assert self._anchor is not None
        return ((self._anchor - grid.origin) % grid.period) * 1000

    def _recheck(self, now: float, grid: Grid) -> Decision:
        assert self._base is not None and self._anchor is not None
        window, self._window = self._window, []
        coverable, self._coverable = self._coverable, []
        self._next_check = now + self.recheck_s
        ignored = self._hint_at is not None and now - self._hint_at >= self.recheck_s - _EPS
        if ignored:
            self._hint_at = None  # one more hint may go out, with the same reason
        # The window's earliest frame is where the session's jitter-free phase is now.
        shift = min(window)
        drift = abs(shift) * 1000 > self._margin_ms
        self._base += shift
        self._anchor += shift
        old = self._margin_ms
        # Lateness in ticks held for every session is a stall they shared, left out, unless
        # it is most of what the window saw (the aligned sessions' appends arrive as a burst
        # whose tail is late every tick: that is this session's phase, which the margin covers).
        held = [tick is not None and tick in grid.held for _, tick in coverable]
        systematic = _systematic([i for i, h in enumerate(held) if h], len(coverable))
        lateness = [x - shift for (x, _), h in zip(coverable, held, strict=True) if systematic or not h]
        self._margin_ms = self._margin_from(lateness)
        if self._margin_ms > old + _EPS:
            # Frames the old margin left short, grouped in bursts (BURST_GAP): one
            # burst in two windows is a stall (most often the whole server's: every session is
            # late at once), which a margin raised for good would charge every later frame for.
            # Late frames that are much of the window are no stall: the margin rises now.
            late_at = [i for i, x in enumerate(lateness) if x * 1000 + 2.0 > old + _EPS]
            bursts = sum(1 for k, i in enumerate(late_at) if k == 0 or i - late_at[k - 1] > BURST_GAP)
            if bursts + self._bursts_before < 2 and not _systematic(late_at, len(lateness)):
                short = set(late_at)
                kept = [x for i, x in enumerate(lateness) if i not in short]
                self._margin_ms = min(old, self._margin_from(kept))
            self._bursts_before = bursts
        else:
            self._bursts_before = 0
        granule = self._granule_samples()
        if granule is None:
            return None
        period_ms = grid.period * 1000
        latest = period_ms - self.margin_ms  # the latest acceptable completion phase
        early_by = (latest - self._phase_ms(grid)) % period_ms
        if early_by <= granule / SAMPLES_PER_MS + self.realign_gain_ms + _EPS:
            return None  # late enough to wait little, early enough to make the tick
        if drift:
            reason = "drift"
        elif abs(self._margin_ms - old) > _EPS:
            reason = "margin"
        elif ignored:
            reason = self._reason
        else:
            reason = "drift"  # a slow drift (clock skew): less than the margin per check
        return self._align(now, grid, reason)

    def _align(self, now: float, grid: Grid, reason: str) -> Decision:
        self._due = False
        granule = self._granule_samples()
        if granule is None or self._exhausted:
            return None
        period_ms = grid.period * 1000
        if granule == SAMPLES_PER_MS:
            # A hint: a frame completed at the old phase already (the chunk is a frame), so
            # moving completions to a tick's margin puts the next frame in the same tick as that
            # one (a double, which costs a catch-up step); not worth it for a few ms of wait.
            early_by = (period_ms - self.margin_ms - self._phase_ms(grid)) % period_ms
            if early_by <= granule / SAMPLES_PER_MS + self.hint_gain_ms + _EPS:
                self._reason = reason
                return None
        # How far to move completions earlier so that they land margin before the tick.
        want_ms = (self._phase_ms(grid) + self.margin_ms) % period_ms
        pad = math.ceil(want_ms * SAMPLES_PER_MS / granule - _EPS) * granule % FRAME
        if pad == 0:
            self._reason = reason
            return None
        if self._total + pad > self.max_total_pad_samples:
            self._exhausted = True
            return None
        if granule == SAMPLES_PER_MS:  # a hint: the client pads (client_padded counts it)
            if self._hint_at is not None:
                return None
            self._hint_at, self._reason = now, reason
            return ClientHint(pad // SAMPLES_PER_MS, reason)
        assert self._anchor is not None
        self._total += pad
        self._anchor -= pad / RATE
        self._reason = reason
        return ServerPad(pad, reason)
