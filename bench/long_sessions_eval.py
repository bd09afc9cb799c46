"""Does a pinned prompt keep a persona past the model's context? An evaluation on real weights.

Every arm runs in one batch of one ``MoshiEngine(context_policy="pin-prompt")``, so they share
one code path and one batch (moshi's ring is the arm with pin 0, bit for bit on CPU and within
bf16 rounding on GPU):

- S: pin 0, moshi's ring: the prompt is overwritten from C positions on (240 s on PersonaPlex);
- P: the whole prompt pinned (``--context-policy pin-prompt``);
- K: the first 4 positions pinned ("attention sinks"), the rest of the prompt rings out.

Sessions: personas with checkable facts x voices x decodings (greedy, and sampled with one
seed) x arms. Every session hears the same user track (``--user-audio``, a long recording of
filler talk, looped; without one, synthetic speech-like audio) for ``--minutes`` minutes. At
each probe time (minutes 1, 3, 5, 10, 15, 20 by default):

1. forced choice (the primary measure): the session's LM state is forked into two spare slots
   (same pin); in one the agent's text is forced to the fact's carrier phrase and the true
   answer, in the other to the carrier and a foil (user: silence). The answer whose text has
   the larger summed log-probability is the session's choice. Reported per arm and probe: the
   share of (session, fact) choices that are right, the mean margin (nats), and the same over
   the facts the agent did not itself say in the last C positions (only the prompt holds them);
2. free recall, with ``--probe-audio DIR`` (a spoken question per fact, ``<persona>-<fact>.wav``
   in 24 kHz mono, fed at the probe time instead of the track): whether the agent's text within
   8 s after the question names the true answer;
3. health per arm: the share of frames with no text (PAD), the longest run of one repeated text
   token; (voice similarity against minute 1 needs a speaker-embedding model: not measured);
4. engineering: median ms per step of the mixed batch, peak accelerator memory, and at the end
   ms per step with every live slot pinned against every live slot at pin 0.

Pass (for making ``pin-prompt`` the default): P stays within noise of minute 1 at 10 and 20
min, is above S from 5 min on and does not collapse (health); S must drop after ~4 min, or the
evaluation is not sensitive.

    # one H200, PersonaPlex weights in the Hugging Face cache (the full run: ~20-25 min)
    python bench/long_sessions_eval.py --model nvidia/personaplex-7b-v1 --device cuda --batch 64
    # the smoke run: arms S and P, greedy, 10 minutes
    python bench/long_sessions_eval.py --model nvidia/personaplex-7b-v1 --device cuda --batch 32 \\
        --arms S,P --decodings greedy --minutes 10 --probes 1,3,5,10
    # the same code end to end on CPU in under a minute: the tiny model, its context cut to 96
    python bench/long_sessions_eval.py --dry-run-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import wave
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("NO_TORCH_COMPILE", "1")

FRAME = 1920
RATE = 24_000
FRAMES_PER_MINUTE = 750
RECALL_WINDOW_FRAMES = 100  # 8 s
SINKS = 4


@attrs.frozen
class Fact:
    key: str
    carrier: str  # forced before the answer
    true: str
    foil: str


@attrs.frozen
class Persona:
    name: str
    text: str
    facts: tuple[Fact, ...]


PERSONAS = (
    Persona(
        "marta",
        "You are Marta, the receptionist at Green Valley Dental. The clinic opens at eight in the "
        "morning. Your favourite colour is teal.",
        (
            Fact("name", "My name is", " Marta", " Julia"),
            Fact("opening", "We open at", " eight", " nine"),
            Fact("colour", "My favourite colour is", " teal", " orange"),
        ),
    ),
    Persona(
        "oskar",
        "You are Oskar, a tutor at Riverside Music School. A lesson costs forty dollars. You play the cello.",
        (
            Fact("name", "My name is", " Oskar", " Peter"),
            Fact("price", "A lesson costs", " forty", " sixty"),
            Fact("instrument", "I play the", " cello", " flute"),
        ),
    ),
    Persona(
        "lena",
        "You are Lena, a support agent for Northwind Bikes. Orders ship on Tuesdays. The warranty "
        "lasts three years.",
        (
            Fact("name", "My name is", " Lena", " Sara"),
            Fact("shipping", "Orders ship on", " Tuesdays", " Fridays"),
            Fact("warranty", "The warranty lasts", " three", " five"),
        ),
    ),
    Persona(
        "sam",
        "You are Sam, the concierge of Hotel Aurora. Breakfast is served until ten. The pool is on the fifth floor.",
        (
            Fact("name", "My name is", " Sam", " Tom"),
            Fact("breakfast", "Breakfast is served until", " ten", " noon"),
            Fact("pool", "The pool is on the", " fifth", " second"),
        ),
    ),
)
# The tiny model spells a persona out letter by letter: short ones fit its 96-position dry run.
DRY_PERSONAS = (
    Persona("ann", "You are Ann.", (Fact("name", "I am", " Ann", " Bob"),)),
    Persona("bob", "You are Bob.", (Fact("name", "I am", " Bob", " Ann"),)),
)


@attrs.define
class Live:
    """One session: its slot, what it is, and what it said."""

    slot: int
    persona: Persona
    voice: str
    decoding: str
    arm: str
    prompt_positions: int = 0
    frames: int = 0
    texts: list[int] = attrs.field(factory=list)  # the agent's text token per frame
    pieces: list[str] = attrs.field(factory=list)


def speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Syllable-rate modulated harmonics with noise: audio shaped like talk, without words."""
    rs = np.random.RandomState(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    pitch = 120 + 30 * np.sin(2 * np.pi * 0.3 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    syllables = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t + 3 * np.sin(2 * np.pi * 0.2 * t))
    pauses = (np.sin(2 * np.pi * 0.15 * t) > -0.6).astype(np.float64)
    audio = 0.25 * syllables * pauses * sum(np.sin(k * phase) / k for k in range(1, 5))
    return (audio + 0.01 * rs.randn(len(t))).astype(np.float32)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        if w.getframerate() != RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise SystemExit(f"{path}: expected 24 kHz mono 16-bit PCM")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (data.astype(np.float32) / 32768.0).copy()


def open_eval_engine(args: argparse.Namespace, slots: int) -> Any:
    import torch

    from duplex_actors.model.factory import resolve_checkpoint
    from duplex_actors.model.loading import load_checkpoint
    from duplex_actors.model.moshi_engine import MoshiEngine

    dtype = getattr(torch, args.dtype) if args.dtype else None
    loaded = load_checkpoint(resolve_checkpoint(args.model), device=args.device, dtype=dtype)
    if args.context:
        # A shorter context than the checkpoint's (before streaming starts): the seam comes sooner.
        lm: Any = loaded.lm
        lm.context = args.context
        for layer in lm.transformer.layers:
            layer.self_attn.context = args.context
    engine = MoshiEngine(
        loaded,
        slots=slots,
        context_policy="pin-prompt",
        pin_max=args.pin_max,
        torch_threads=args.torch_threads,
    )
    engine._runner.text_logits = torch.zeros(slots, loaded.lm.text_card, device=loaded.device)
    return engine


class Evaluation:
    def __init__(self, args: argparse.Namespace) -> None:
        from duplex_actors.model.engine import SamplingConfig, SessionPrompt

        self.args = args
        personas = DRY_PERSONAS if args.dry_run_cpu else PERSONAS
        self.engine = open_eval_engine(args, args.batch)
        self.runner = self.engine._runner
        self.context = self.engine.context
        tokenizer = self.engine._tokenizer
        self.encode = lambda text: list(tokenizer.encode(text))
        decodings = {
            "greedy": SamplingConfig(),
            "seed": SamplingConfig(temperature=0.8, temperature_text=0.7, seed=1),
        }
        self.live: list[Live] = []
        slot = 0
        for persona in personas:
            for voice in args.voices.split(","):
                for decoding in args.decodings.split(","):
                    for arm in args.arms.split(","):
                        self.live.append(Live(slot, persona, voice, decoding, arm))
                        slot += 1
        self.spares = list(range(slot, args.batch))
        if len(self.spares) < 2:
            raise SystemExit(f"{slot} sessions need --batch of at least {slot + 2} (two spare slots)")
        started = time.perf_counter()
        for session in self.live:
            prompt = SessionPrompt(session.voice, session.persona.text, decodings[session.decoding])
            self.engine.reset(session.slot, prompt)
            plan = self.engine.prefill_plan(prompt)
            session.prompt_positions = len(plan)
            # Every arm is pinned as P by the reset; S and K are set here, before any wrap.
            if session.arm == "S":
                self.runner.set_pin(session.slot, 0)
            elif session.arm == "K":
                self.runner.set_pin(session.slot, SINKS)
        self.prefill_s = time.perf_counter() - started
        needed_s = args.minutes * args.frames_per_minute * FRAME / RATE + 1.0
        track = read_wav(Path(args.user_audio)) if args.user_audio else speechlike(min(600.0, needed_s))
        self.track = track[: len(track) // FRAME * FRAME].reshape(-1, FRAME)
        self.probe_audio: dict[tuple[str, str], np.ndarray] = {}
        if args.probe_audio:
            for persona in personas:
                for fact in persona.facts:
                    path = Path(args.probe_audio) / f"{persona.name}-{fact.key}.wav"
                    audio = read_wav(path)
                    self.probe_audio[(persona.name, fact.key)] = np.pad(audio, (0, -len(audio) % FRAME))
        self.step_ms: list[float] = []
        self.choices: list[dict[str, Any]] = []
        self.recalls: list[dict[str, Any]] = []

    # -- the conversation --------------------------------------------------------------------
    def step_live(self, frames: dict[int, np.ndarray]) -> None:
        started = time.perf_counter()
        out = self.engine.step(frames)
        self.sync()
        self.step_ms.append((time.perf_counter() - started) * 1000)
        for session in self.live:
            if session.slot in out:
                result = out[session.slot]
                session.frames += 1
                session.texts.append(result.text_token)
                session.pieces.append(result.text_piece)

    def sync(self) -> None:
        if self.engine.device.type == "cuda":
            import torch

            torch.cuda.synchronize()

    def run(self) -> None:
        per_minute = self.args.frames_per_minute
        probes = sorted({round(float(m) * per_minute) for m in self.args.probes.split(",")})
        total = round(self.args.minutes * per_minute)
        frame = 0
        for probe in [*probes, total]:
            while frame < min(probe, total):
                audio = self.track[frame % len(self.track)]
                self.step_live({s.slot: audio for s in self.live})
                frame += 1
            if probe < total:
                self.probe(probe)
        self.time_arms(self.args.timing_steps)

    # -- probes --------------------------------------------------------------------------------
    def probe(self, frame: int) -> None:
        minute = frame / self.args.frames_per_minute
        print(f"probe at frame {frame} (minute {minute:g}): forced choices", flush=True)
        jobs = []
        for session in self.live:
            for fact in session.persona.facts:
                recent = "".join(session.pieces[-self.context :]).lower()
                jobs.append((session, fact, fact.true.strip().lower() in recent))
        pairs = len(self.spares) // 2
        for i in range(0, len(jobs), pairs):
            self.forced_choices(jobs[i : i + pairs], minute)
        if self.probe_audio:
            self.free_recall(minute)

    def forced_choices(self, jobs: list[tuple[Live, Any, bool]], minute: float) -> None:
        """Fork each job's session into two spare slots and score true against foil."""
        import torch

        from duplex_actors.model.engine import GREEDY
        from duplex_actors.model.personaplex import SILENCE_TOKENS

        runner, device = self.runner, self.engine.device
        texts: dict[int, list[int]] = {}
        scored: dict[int, int] = {}  # slot -> tokens from which on the log-probs count
        for n, (session, fact, _) in enumerate(jobs):
            snap = runner.snapshot(session.slot, session.prompt_positions + session.frames)
            carrier = self.encode(fact.carrier)
            for k, answer in enumerate((fact.true, fact.foil)):
                slot = self.spares[2 * n + k]
                self.engine.reset(slot, None)
                runner.paste(slot, snap)
                runner.sampler.configure(slot, GREEDY)
                texts[slot] = carrier + self.encode(answer)
                scored[slot] = len(carrier)
        logp = {slot: 0.0 for slot in texts}
        user = torch.tensor(SILENCE_TOKENS, device=device).view(1, 8, 1).expand(runner.batch_size, 8, 1)
        for j in range(max(len(t) for t in texts.values())):
            executed = torch.zeros(runner.batch_size, dtype=torch.bool, device=device)
            for slot, tokens in texts.items():
                if j < len(tokens):
                    executed[slot] = True
                    runner.force_text_mask[slot] = True
                    runner.force_text[slot] = tokens[j]
            runner.step(user.contiguous(), executed)
            log_probs = torch.log_softmax(runner.text_logits.float(), dim=-1).cpu()
            for slot, tokens in texts.items():
                if scored[slot] <= j < len(tokens):
                    logp[slot] += float(log_probs[slot, tokens[j]])
        for n, (session, fact, in_recent) in enumerate(jobs):
            true_lp, foil_lp = logp[self.spares[2 * n]], logp[self.spares[2 * n + 1]]
            self.choices.append(
                {
                    "minute": minute,
                    "arm": session.arm,
                    "persona": session.persona.name,
                    "voice": session.voice,
                    "decoding": session.decoding,
                    "fact": fact.key,
                    "margin": true_lp - foil_lp,
                    "right": true_lp > foil_lp,
                    "in_recent": in_recent,
                }
            )
        for slot in texts:
            runner.clear_forcing(slot)
            self.engine.reset(slot, None)

    def free_recall(self, minute: float) -> None:
        """Each fact's spoken question to every session in turn, then 8 s of the track."""
        by_fact: dict[str, list[Live]] = defaultdict(list)
        for session in self.live:
            by_fact[session.persona.name].append(session)
        for persona_name, sessions in by_fact.items():
            for fact in sessions[0].persona.facts:
                question = self.probe_audio[(persona_name, fact.key)].reshape(-1, FRAME)
                start = {s.slot: s.frames for s in sessions}
                for frame in [*question, *self.track[:RECALL_WINDOW_FRAMES]]:
                    self.step_live({s.slot: frame for s in sessions})
                for s in sessions:
                    said = "".join(s.pieces[start[s.slot] + len(question) :]).lower()
                    self.recalls.append(
                        {
                            "minute": minute,
                            "arm": s.arm,
                            "fact": fact.key,
                            "hit": fact.true.strip().lower() in said,
                        }
                    )

    # -- engineering ---------------------------------------------------------------------------
    def time_arms(self, steps: int = 20) -> None:
        """ms per step with every live slot pinned against every live slot at pin 0 (the
        sessions are over: the pins are changed after the wrap, for timing only)."""
        self.timing: dict[str, float] = {}
        for name, pin in (("all at pin 0 (ring)", False), ("all pinned", True)):
            for session in self.live:
                self.runner.set_pin(session.slot, session.prompt_positions if pin else 0)
            times = []
            for i in range(steps):
                audio = self.track[i % len(self.track)]
                started = time.perf_counter()
                self.engine.step({s.slot: audio for s in self.live})
                self.sync()
                times.append((time.perf_counter() - started) * 1000)
            self.timing[name] = statistics.median(times)

    # -- the report ----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        arms = self.args.arms.split(",")
        minutes = sorted({c["minute"] for c in self.choices})
        print(
            f"\nforced choice: share right (mean margin in nats, n) per arm and probe minute; C = {self.context}"
        )
        print("| minute | " + " | ".join(arms) + " |")
        print("|---:|" + "---:|" * len(arms))
        for minute in minutes:
            cells = []
            for arm in arms:
                rows = [c for c in self.choices if c["minute"] == minute and c["arm"] == arm]
                cells.append(_cell(rows))
            print(f"| {minute:g} | " + " | ".join(cells) + " |")
        print("\nthe same, only facts the agent did not say itself in the last C positions")
        print("| minute | " + " | ".join(arms) + " |")
        print("|---:|" + "---:|" * len(arms))
        for minute in minutes:
            cells = []
            for arm in arms:
                rows = [
                    c
                    for c in self.choices
                    if c["minute"] == minute and c["arm"] == arm and not c["in_recent"]
                ]
                cells.append(_cell(rows))
            print(f"| {minute:g} | " + " | ".join(cells) + " |")
        if self.recalls:
            print("\nfree recall: share of spoken questions answered with the true fact within 8 s")
            for arm in arms:
                hits = [r["hit"] for r in self.recalls if r["arm"] == arm]
                print(f"  {arm}: {sum(hits)}/{len(hits)}")
        else:
            print("\nfree recall: not measured (no --probe-audio)")
        print("\nhealth per arm: share of frames without text; longest run of one repeated text token")
        health = {}
        for arm in arms:
            sessions = [s for s in self.live if s.arm == arm]
            silent = statistics.mean(
                sum(1 for p in s.pieces if not p) / max(1, len(s.pieces)) for s in sessions
            )
            longest = max(
                _longest_run([t for t, p in zip(s.texts, s.pieces, strict=True) if p]) for s in sessions
            )
            health[arm] = {"no_text_share": silent, "longest_repeat": longest}
            print(f"  {arm}: {silent:.2f} without text; longest repeat {longest}")
        peak = None
        if self.engine.device.type == "cuda":
            import torch

            peak = torch.cuda.max_memory_allocated() / 2**30
        ms = statistics.median(self.step_ms)
        print(
            f"\nengineering: B={self.args.batch} ({len(self.live)} sessions, {len(self.spares)} spare), "
            f"prefill {self.prefill_s:.1f} s, median {ms:.1f} ms per step of the mixed batch"
            + (f", peak memory {peak:.1f} GiB" if peak is not None else "")
        )
        for name, value in self.timing.items():
            print(f"  {name}: {value:.1f} ms per step")
        return {
            "args": vars(self.args),
            "context": self.context,
            "choices": self.choices,
            "recalls": self.recalls,
            "health": health,
            "median_step_ms": ms,
            "timing": self.timing,
            "peak_memory_gib": peak,
        }


def _cell(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "-"
    right = sum(r["right"] for r in rows) / len(rows)
    margin = statistics.mean(r["margin"] for r in rows)
    return f"{right:.2f} ({margin:+.2f}, {len(rows)})"


def _longest_run(tokens: list[int]) -> int:
    best = run = 0
    previous = None
    for token in tokens:
        run = run + 1 if token == previous else 1
        previous = token
        best = max(best, run)
    return best


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nvidia/personaplex-7b-v1")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bf16 on CUDA)")
    parser.add_argument("--batch", type=int, default=64, help="slots: the sessions plus spares for forks")
    parser.add_argument("--minutes", type=float, default=None, help="the user track's length (default 21)")
    parser.add_argument("--probes", default=None, help="probe times in minutes (default 1,3,5,10,15,20)")
    parser.add_argument("--arms", default="S,P,K")
    parser.add_argument("--voices", default="NATF2.pt,NATM1.pt")
    parser.add_argument("--decodings", default="greedy,seed")
    parser.add_argument("--user-audio", default=None, help="24 kHz mono WAV of filler talk (looped)")
    parser.add_argument("--probe-audio", default=None, help="folder of <persona>-<fact>.wav questions")
    parser.add_argument(
        "--context", type=int, default=None, help="cut the LM's context to this many positions"
    )
    parser.add_argument(
        "--pin-max", type=int, default=None, help="the pin cap (default: a quarter of the context)"
    )
    parser.add_argument("--frames-per-minute", type=int, default=FRAMES_PER_MINUTE)
    parser.add_argument("--timing-steps", type=int, default=20, help="steps per arm of the closing timing")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", default=os.environ.get("OUT"), help="write long_sessions_eval.json here")
    parser.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="the tiny model on CPU, context 96, two short personas, one voice, greedy; a 'minute' "
        "of 24 frames, 9 of them, probes at 1, 5 and 8",
    )
    args = parser.parse_args(argv)
    if args.dry_run_cpu:
        # The tiny model's default prompt takes 81 positions: the pin cap must admit it.
        args.model, args.device, args.dtype, args.context, args.pin_max = "tiny", "cpu", "float32", 96, 85
        args.voices, args.decodings, args.batch, args.frames_per_minute = "NATF2.pt", "greedy", 10, 24
        args.minutes = 9.0 if args.minutes is None else args.minutes
        args.probes = args.probes or "1,5,8"
    args.minutes = 21.0 if args.minutes is None else args.minutes
    args.probes = args.probes or "1,3,5,10,15,20"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    evaluation = Evaluation(args)
    evaluation.run()
    result = evaluation.report()
    print(f"\n{time.perf_counter() - started:.1f} s in all")
    if args.out:
        out = Path(args.out) / "long_sessions_eval.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
