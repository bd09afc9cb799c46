"""meta_init_skipped: a model built on the meta device skips its parameters' initialisation
(and so torch._dynamo's import), while every tensor with data is initialised as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import torch

from duplex_actors.model.meta_init import INIT_FUNCTIONS, meta_init_skipped


def test_meta_tensors_are_left_alone_and_tensors_with_data_initialised_in_any_thread():
    seen: dict[str, torch.Tensor] = {}
    entered, measured = threading.Event(), threading.Event()

    def other_thread() -> None:
        entered.wait(10)
        seen["thread"] = torch.nn.init.ones_(torch.zeros(3))
        measured.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with meta_init_skipped():
        meta = torch.empty(4, 4, device="meta")
        assert torch.nn.init.normal_(meta) is meta
        assert torch.nn.init.kaiming_uniform_(meta, a=5**0.5) is meta
        real = torch.nn.init.constant_(torch.zeros(2, 2), 7.0)
        assert torch.equal(real, torch.full((2, 2), 7.0))
        entered.set()
        assert measured.wait(10)
    thread.join(10)
    assert torch.equal(seen["thread"], torch.ones(3))


def test_torchs_functions_come_back_after_nested_and_concurrent_uses():
    originals = {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS}
    common = {"normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_", "trunc_normal_"}
    assert common <= set(INIT_FUNCTIONS)
    with meta_init_skipped():
        swapped = {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS}
        assert all(swapped[name] is not originals[name] for name in INIT_FUNCTIONS)
        with meta_init_skipped():
            pass
        # the inner use left the swap in place for the outer one
        assert all(getattr(torch.nn.init, name) is swapped[name] for name in INIT_FUNCTIONS)
    assert all(getattr(torch.nn.init, name) is originals[name] for name in INIT_FUNCTIONS)

    def nothing_inside() -> None:
        with meta_init_skipped():
            pass

    threads = [threading.Thread(target=nothing_inside) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(getattr(torch.nn.init, name) is originals[name] for name in INIT_FUNCTIONS)


def test_loading_a_checkpoint_never_imports_torch_dynamo(parrot_dir: Path):
    """The start-up cost this exists for: in a fresh interpreter, loading the tiny checkpoint
    (an LM built on the meta device, then assigned its weights) leaves torch._dynamo unimported;
    building the same LM on the meta device without the context imports it (the control)."""
    script = textwrap.dedent(
        f"""
        import sys, time
        import torch
        from moshi.models.lm import LMModel
        from duplex_actors.model.checkpoint import checkpoint_from_dir
        from duplex_actors.model.loading import lm_kwargs, load_checkpoint
        files = checkpoint_from_dir(__import__("pathlib").Path({str(parrot_dir)!r}))
        started = time.perf_counter()
        loaded = load_checkpoint(files)
        print("load_s", round(time.perf_counter() - started, 2))
        print("after_load", "torch._dynamo" in sys.modules)
        LMModel(device=torch.device("meta"), dtype=torch.float32, **lm_kwargs(files))
        print("after_plain_meta_build", "torch._dynamo" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["after_load"] == "False", out.stdout
    assert lines["after_plain_meta_build"] == "True", out.stdout
