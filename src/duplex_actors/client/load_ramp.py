"""``duplex-load --ramp``: the largest N that holds real time, by doubling then bisecting."""

from __future__ import annotations

import argparse
import sys

from .errors import Unauthorized
from .load_runner import Audio, run_trial
from .load_trial import Options, Trial
from .scrape import ready, wait_idle
from .server_metrics import http_base


async def ramp(opts: Options, audio: Audio, args: argparse.Namespace) -> tuple[list[Trial], int]:
    base = http_base(opts.url)
    cap = args.max_n
    if cap is None:
        info = await ready(base, opts.api_key)
        cap = int(info.get("slots_total") or 64)
    trials: list[Trial] = []

    async def trial(n: int) -> Trial:
        for attempt in range(1, max(0, args.retries) + 2):
            await wait_idle(base, opts.api_key)
            t = await run_trial(opts, n, audio)
            t.attempt = attempt
            trials.append(t)
            print(
                f"duplex-load: N={n:<3} attempt {attempt}: "
                f"{'held' if t.held else 'broke: ' + '; '.join(t.reasons)}",
                file=sys.stderr,
                flush=True,
            )
            if all(r.failure and r.failure.startswith("unauthorized") for r in t.runs):
                raise Unauthorized(401, t.runs[0].failure or "unauthorized")
            if t.held or t.aggregate["failed_sessions"]:  # a refusal is not noise: no retry
                break
        return t

    good, bad, n = 0, None, 1
    while True:
        t = await trial(n)
        if not t.held:
            bad = n
            break
        good = n
        if n >= cap:
            break
        n = min(cap, n + args.ramp_step if args.ramp_step > 0 else n * 2)
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if (await trial(mid)).held:
            good = mid
        else:
            bad = mid
    return sorted(trials, key=lambda t: (t.n, t.attempt)), good
