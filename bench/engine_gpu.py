"""GPU benchmark: ms per 80 ms tick of the batched MoshiEngine at PersonaPlex size, random weights.

No checkpoint is loaded: the 7B Moshi/PersonaPlex LM (``moshi.models.loaders._lm_kwargs``
with an 8-step depformer, as the engine loads PersonaPlex) is built on the meta device,
materialised with ``to_empty`` and filled with random bf16 weights; the full Mimi gets
random weights and random codebooks; the text tokenizer is the tiny SentencePiece model and
the voice prompt a synthetic ``[50, 1, 1, dim]`` one. These go into a ``LoadedCheckpoint``
and a ``MoshiEngine(slots=B)`` exactly as ``load_checkpoint`` would hand them over.

A MoshiEngine puts its LM (and Mimi) into streaming mode for good, so every B gets a fresh
LM and a fresh copy of a never-streamed Mimi; the previous engine is dropped first.

Per B: reset every slot (the first reset computes the prompt snapshot: a cache miss), a
few warm-up steps (moshi captures its CUDA graphs on the second call), then timed steps
with ``torch.cuda.synchronize``. Results: a markdown table, and JSON in ``$OUT/engine_gpu.json``
when ``OUT`` is set (rewritten after every B, so a run cut short keeps what it measured).

Runs where neither moshi nor duplex_actors is installed: ``src/`` is put on ``sys.path``
(see bench/run_gpu.sh for the wheels). ``--dry-run-cpu`` runs the same code path on CPU
with the tiny dimensions in float32.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# moshi reads this when imported; duplex_actors sets the same default. On CUDA, torch.compile
# of RMSNorm would cost compile time out of a 5-minute run; export NO_TORCH_COMPILE= to try it.
os.environ.setdefault("NO_TORCH_COMPILE", "1")

TICK_MS = 80.0
VOICE = "NATF2.pt"
VOICE_POSITIONS = 50
PERSONA = (
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way."
)
GIB = 1024**3


class Setup:
    """Everything shared by the batch sizes: config, tokenizer, voice file, a pristine Mimi."""

    def __init__(self, device: torch.device, dtype: torch.dtype, tiny: bool, workdir: Path) -> None:
        from moshi.models import loaders

        from duplex_actors.model.checkpoint import CheckpointFiles
        from duplex_actors.model.loading import AGENT_STEPS, load_tokenizer
        from duplex_actors.model.tiny import TINY_LM, build_tokenizer_bytes, tiny_mimi_config

        self.device, self.dtype, self.tiny = device, dtype, tiny
        lm_config: dict[str, Any] = dict(TINY_LM) if tiny else {}
        self.lm_kwargs: dict[str, Any] = dict(loaders._lm_kwargs)
        self.lm_kwargs.update(lm_config, dep_q=AGENT_STEPS, depformer_context=AGENT_STEPS)
        self.mimi_config = tiny_mimi_config() if tiny else None

        (workdir / "voices").mkdir(parents=True, exist_ok=True)
        tokenizer_path = workdir / "tokenizer_spm_32k_3.model"
        tokenizer_path.write_bytes(build_tokenizer_bytes())
        voice_path = workdir / "voices" / VOICE
        self.files = CheckpointFiles(
            model_id="random-personaplex-7b" if not tiny else "random-tiny",
            root=workdir,
            lm=workdir / "model.safetensors",  # never read
            mimi=workdir / "tokenizer-e351c8d8-checkpoint125.safetensors",  # never read
            tokenizer=tokenizer_path,
            voices={VOICE: voice_path},
            lm_config=lm_config,
            mimi_config=self.mimi_config,
        )
        self.tokenizer = load_tokenizer(self.files)
        self._write_voice(voice_path)

        started = time.perf_counter()
        self.mimi_template = loaders.get_mimi(
            None, mimi_config=self.mimi_config, device=device, num_codebooks=AGENT_STEPS
        )
        self._randomize_codebooks(self.mimi_template)
        self.mimi_build_s = time.perf_counter() - started

    def _write_voice(self, path: Path) -> None:
        dim = self.lm_kwargs["dim"]
        gen = torch.Generator().manual_seed(2)
        # A summed input embedding of 17 tokens, each ~N(0, 1/dim) per coordinate.
        emb = torch.randn(VOICE_POSITIONS, 1, 1, dim, generator=gen) * math.sqrt(17 / dim)
        cache = torch.randint(0, self.lm_kwargs["card"], (1, 17, 4), generator=gen, dtype=torch.int64)
        cache[0, 0] = torch.randint(0, self.tokenizer.vocab_size(), (4,), generator=gen)
        torch.save({"embeddings": emb.to(self.dtype), "cache": cache}, path)

    @torch.no_grad()
    def _randomize_codebooks(self, mimi: Any) -> None:
        """Random codewords in every RVQ level (a fresh Mimi's are zeros: every code would be 0)."""
        gen = torch.Generator(device=self.device).manual_seed(1)
        for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
            for layer in rvq.vq.layers:
                book = layer._codebook
                book.embedding_sum.normal_(generator=gen)
                book.cluster_usage.fill_(1.0)
                book._initialized.fill_(1.0)

    @torch.no_grad()
    def build_lm(self, seed: int) -> Any:
        """The LM on meta, materialised on the device, then random weights (fast even for 7B)."""
        from moshi.models import loaders

        lm = loaders.get_moshi_lm(None, lm_kwargs=self.lm_kwargs, device="meta", dtype=self.dtype)
        lm = lm.to_empty(device=self.device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for name, param in lm.named_parameters():
            if name.endswith("alpha"):  # RMSNorm scales
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:  # linear and embedding weights: std 1/sqrt(fan_in or dim)
                param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]), generator=gen)
        for name, buf in lm.named_buffers():
            raise RuntimeError(f"unexpected LM buffer {name} {tuple(buf.shape)}: would be uninitialised")
        lm.eval()
        return lm

    def checkpoint(self, lm: Any, mimi: Any) -> Any:
        from duplex_actors.model.loading import LoadedCheckpoint

        return LoadedCheckpoint(
            files=self.files,
            lm=lm,
            mimi=mimi,
            tokenizer=self.tokenizer,
            device=self.device,
            dtype=self.dtype,
        )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_batch(
    setup: Setup, slots: int, steps: int, warmup: int, fail: bool, refs: list[weakref.ref[Any]]
) -> dict[str, Any]:
    from duplex_actors.model.engine import SessionPrompt
    from duplex_actors.model.moshi_engine import MoshiEngine

    device = setup.device
    row: dict[str, Any] = {"B": slots}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    lm = setup.build_lm(seed=slots)
    refs.append(weakref.ref(lm))
    mimi = copy.deepcopy(setup.mimi_template)  # never streamed: a clean copy
    engine = MoshiEngine(setup.checkpoint(lm, mimi), slots=slots, prefill="snapshot")
    del lm, mimi
    sync(device)
    row["build_s"] = time.perf_counter() - started
    if cuda:
        row["weights_gib"] = torch.cuda.memory_allocated(device) / GIB
    if fail:
        raise torch.OutOfMemoryError("simulated by --simulate-oom-at")

    prompt = SessionPrompt(voice=VOICE, persona=PERSONA)
    row["prompt_calls"] = len(engine.prefill_plan(prompt) or ())
    t0 = time.perf_counter()
    engine.reset(0, prompt)  # computes the snapshot on the batch-1 twin: a cache miss
    sync(device)
    row["reset_miss_ms"] = (time.perf_counter() - t0) * 1000
    for slot in range(1, slots):
        engine.reset(slot, prompt)
    t0 = time.perf_counter()
    engine.reset(0, prompt)  # paste only: a cache hit
    sync(device)
    row["reset_hit_ms"] = (time.perf_counter() - t0) * 1000
    assert engine.stats.prefill_snapshot_misses == 1, engine.stats

    rng = np.random.default_rng(slots)

    def frames() -> dict[int, np.ndarray]:
        return {s: (0.1 * rng.standard_normal(1920)).astype(np.float32) for s in range(slots)}

    warm: list[float] = []
    out: dict[int, Any] = {}
    for _ in range(warmup):
        batch = frames()
        sync(device)
        t0 = time.perf_counter()
        out = engine.step(batch)
        sync(device)
        warm.append((time.perf_counter() - t0) * 1000)
    row["warmup_ms"] = [round(w, 1) for w in warm]
    row["ready_after_warmup"] = sum(bool(o.ready) for o in out.values())
    times: list[float] = []
    for _ in range(steps):
        batch = frames()
        sync(device)
        t0 = time.perf_counter()
        engine.step(batch)
        sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    med = float(np.median(times))
    row.update(
        status="ok",
        steps=steps,
        median_ms=med,
        p90_ms=float(np.percentile(times, 90)),
        min_ms=float(np.min(times)),
        ms_per_session=med / slots,
        sessions_per_tick=slots * TICK_MS / med,
    )
    if cuda:
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        row["reserved_gib"] = torch.cuda.memory_reserved(device) / GIB
    del engine, out
    return row


def free(device: torch.device) -> float | None:
    gc.collect()
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device) / GIB


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "NO_TORCH_COMPILE": os.environ.get("NO_TORCH_COMPILE"),
        "NO_CUDA_GRAPH": os.environ.get("NO_CUDA_GRAPH"),
    }
    try:
        import moshi

        info["moshi"] = moshi.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_mem_gib=round(props.total_memory / GIB, 1),
            cuda=torch.version.cuda,
        )
    return info


def fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| B | status | build s | reset miss ms | reset hit ms | warm-up ms (2nd = graph capture) "
        "| median ms/tick | p90 ms/tick | ms/session | fits 80 ms | B*80/median | peak GiB |"
    )
    print("|---:|---|---:|---:|---:|---|---:|---:|---:|:---:|---:|---:|")
    for r in rows:
        med = r.get("median_ms")
        fits = "-" if med is None else ("yes" if med <= TICK_MS else "no")
        warm = ", ".join(f"{w:.0f}" for w in r.get("warmup_ms", [])) or "-"
        print(
            f"| {r['B']} | {r['status']} | {fmt(r.get('build_s'))} | {fmt(r.get('reset_miss_ms'))} "
            f"| {fmt(r.get('reset_hit_ms'), '.2f')} | {warm} | {fmt(med)} | {fmt(r.get('p90_ms'))} "
            f"| {fmt(r.get('ms_per_session'), '.2f')} | {fits} | {fmt(r.get('sessions_per_tick'))} "
            f"| {fmt(r.get('peak_mem_gib'), '.1f')} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", help="comma-separated batch sizes (GPU: 1,8,16,32,64; dry run: 1,4)")
    parser.add_argument("--steps", type=int, help="timed steps per B (GPU: 20; dry run: 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per B (>= 3: capture)")
    parser.add_argument("--time-budget", type=float, default=240.0, help="skip the Bs left after this (s)")
    parser.add_argument("--dry-run-cpu", action="store_true", help="tiny dims, float32, on CPU")
    parser.add_argument("--simulate-oom-at", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    started = time.perf_counter()

    if args.dry_run_cpu:
        device, dtype = torch.device("cpu"), torch.float32
        batches = args.batches or "1,4"
        steps = args.steps or 5
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device; use --dry-run-cpu to test on CPU")
        device, dtype = torch.device("cuda"), torch.bfloat16
        batches = args.batches or "1,8,16,32,64"
        steps = args.steps or 20
    sizes = [int(b) for b in batches.split(",") if b.strip()]
    out_dir = os.environ.get("OUT")
    out_path = Path(out_dir) / "engine_gpu.json" if out_dir else None

    with tempfile.TemporaryDirectory(prefix="engine-gpu-") as tmp:
        setup = Setup(device, dtype, tiny=args.dry_run_cpu, workdir=Path(tmp))
        info = machine_info(device)
        dims = {k: setup.lm_kwargs[k] for k in ("dim", "num_layers", "num_heads", "context", "dep_q")}
        print(
            f"machine: {info['platform']}, cpus {info['cpu_count']}, python {info['python']}, "
            f"torch {info['torch']}, moshi {info.get('moshi')}, {info.get('gpu', 'CPU')}, {info['date']}"
        )
        print(
            f"LM {dims} {dtype}, Mimi {'tiny' if setup.tiny else 'full'}, NO_TORCH_COMPILE="
            f"{info['NO_TORCH_COMPILE']!r}, NO_CUDA_GRAPH={info['NO_CUDA_GRAPH']!r}; "
            f"setup {time.perf_counter() - started:.1f} s"
        )
        sys.stdout.flush()
        result: dict[str, Any] = {"machine": info, "lm": dims, "dtype": str(dtype), "rows": []}
        rows: list[dict[str, Any]] = result["rows"]
        last_s = 0.0
        for slots in sizes:
            elapsed = time.perf_counter() - started
            if elapsed + 1.5 * last_s > args.time_budget:
                rows.append({"B": slots, "status": "skipped (time budget)"})
                continue
            t_b = time.perf_counter()
            refs: list[weakref.ref[Any]] = []
            try:
                fail = slots == args.simulate_oom_at
                row = run_batch(setup, slots, steps, args.warmup, fail, refs)
            except Exception as exc:
                status = "OOM" if is_oom(exc) else f"error: {type(exc).__name__}: {exc}"
                row = {"B": slots, "status": status}
                if not is_oom(exc):
                    traceback.print_exc()
                del exc
            row["after_free_gib"] = free(device)
            row["lm_freed"] = all(ref() is None for ref in refs)  # else memory leaks into the next B
            last_s = time.perf_counter() - t_b
            row["wall_s"] = last_s
            rows.append(row)
            print(f"B={slots}: {row['status']} in {last_s:.1f} s", flush=True)
            if out_path is not None:
                out_path.write_text(json.dumps(result, indent=1) + "\n")
        print()
        print_table(rows)
        one = next((r for r in rows if r["B"] == 1 and r["status"] == "ok"), None)
        if one is not None:
            fits = [r["B"] for r in rows if r["status"] == "ok" and r["median_ms"] <= TICK_MS]
            best = max(r["sessions_per_tick"] for r in rows if r["status"] == "ok")
            print()
            print(
                f"capacity: batched {max(fits, default=0)} sessions measured, {best:.1f} extrapolated; "
                f"one session per B=1 step: {TICK_MS / one['median_ms']:.1f}"
            )
        result["total_s"] = time.perf_counter() - started
        if out_path is not None:
            out_path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"total {result['total_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
