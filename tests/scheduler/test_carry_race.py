import numpy as np, trio, trio.testing, pytest
from duplex_actors.model.engine import FRAME_SAMPLES, StepOutput
from duplex_actors.scheduler.actor import Scheduler
from duplex_actors.scheduler.clock import VIRTUAL_TIME

class Eng:
    def __init__(self):
        self.slots = 2; self.calls = []; self.on_reset = None
    def reset(self, slot, prompt):
        self.calls.append(("reset", slot, prompt))
        if self.on_reset: self.on_reset(slot)
    def step(self, frames):
        self.calls.append(("step", tuple(sorted(frames))))
        return {s: StepOutput(True, 0, "", (0,)*8, (0,)*8, np.zeros(FRAME_SAMPLES, np.float32)) for s in frames}

class Sink:
    def __init__(self): self.results = []
    def deliver_nowait(self, r): self.results.append(r)

@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)

async def test_frame_queued_at_epoch_change_is_carried_even_if_another_slot_resets(autojump_clock):
    eng = Eng()
    sched = Scheduler(eng, clock=VIRTUAL_TIME)
    async with trio.open_nursery() as n:
        await n.start(sched.run)
        a, b = Sink(), Sink()
        sa, sb = sched.admit(a), sched.admit(b)
        sched.request_reset(sa, 0, "p"); sched.request_reset(sb, 0, "p")
        await trio.sleep(0.1)
        f = np.zeros(FRAME_SAMPLES, np.float32)
        sched.submit_nowait(sa, 0, f)
        await trio.sleep(0.1)
        # Session a: frame 1 drained, then a cancel (epoch 1) that lands while slot b's reset runs.
        def hook(slot):
            if slot == sb:
                eng.on_reset = None
                sched.request_reset(sa, 1, "p")
        eng.on_reset = hook
        sched.submit_nowait(sa, 1, f)
        sched.request_reset(sb, 1, "q")
        await trio.sleep(0.1)
        print(eng.calls)
        assert [(r.epoch, r.frame_index) for r in a.results] == [(0, 0), (1, 1)]
        n.cancel_scope.cancel()
