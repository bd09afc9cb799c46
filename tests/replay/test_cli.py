"""``duplex-replay`` as a user runs it: exit codes, reports and outputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from duplex_actors.log import records as r
from duplex_actors.log.segment import encode_record, read_log

CORPUS = Path(__file__).resolve().parents[2] / "replay"
GREEDY = "sess_golden-tiny-greedy.dlog"
EXE = str(Path(sys.executable).with_name("duplex-replay"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def corpus(tmp_path) -> Path:
    for path in CORPUS.glob("*.dlog"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_logic_replay_of_one_log(corpus):
    out = run(str(corpus / GREEDY))
    assert out.returncode == 0, out.stderr
    assert "logic replay" in out.stdout and "identical" in out.stdout


def test_model_replay_uses_the_model_named_in_the_header(corpus, tiny_dir):
    out = run(str(corpus / GREEDY), "--model")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "model replay" in out.stdout and "identical" in out.stdout


def test_a_different_checkpoint_is_refused_unless_forced(corpus, parrot_dir):
    out = run(str(corpus / GREEDY), "--model", "tiny-parrot")
    assert out.returncode == 2 and "--force" in out.stderr
    forced = run(str(corpus / GREEDY), "--model", "tiny-parrot", "--force")
    assert forced.returncode == 1 and "DIVERGED at epoch 0 frame 0" in forced.stdout


def test_model_replay_runs_at_the_width_the_session_was_served_at(corpus, tiny_dir, parrot_dir):
    header = read_log(corpus / GREEDY).records[0][1]
    assert isinstance(header, r.Header) and header.engine["slots"] == 2
    out = run(str(corpus / GREEDY), "--model")
    assert out.returncode == 0 and "model replay at batch width 2," in out.stdout, out.stdout + out.stderr
    # Another width is the user's choice; a divergence then says that the width differs.
    narrow = run(str(corpus / GREEDY), "--model", "tiny-parrot", "--force", "--batch-width", "1")
    assert narrow.returncode == 1 and "model replay at batch width 1," in narrow.stdout
    assert (
        "(replayed at batch width 1, served at 2: only a replay at the served width is exact)"
        in narrow.stdout
    )
    same = run(str(corpus / GREEDY), "--model", "tiny-parrot", "--force", "--batch-width", "2")
    assert same.returncode == 1 and "served at" not in same.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "--batch-width", "0"), "must be at least 1, got 0"),
        (("--model", "--batch-width", "two"), "not a whole number: 'two'"),
        (("--batch-width", "2"), "--batch-width needs --model"),
    ],
)
def test_a_bad_batch_width_is_refused(corpus, args, message):
    out = run(str(corpus / GREEDY), *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_directory_summary(corpus):
    out = run(str(corpus))
    assert out.returncode == 0, out.stdout
    n = len(json.loads((CORPUS / "expected.json").read_text()))
    assert f"{n} logs, {n} reproduced, 0 not" in out.stdout
    for name in json.loads((CORPUS / "expected.json").read_text()):
        assert name in out.stdout


def test_emit_wav_and_dump(corpus, tmp_path):
    events, wav = tmp_path / "events.jsonl", tmp_path / "out.wav"
    out = run(str(corpus / GREEDY), "--emit", str(events), "--wav", str(wav))
    assert out.returncode == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert lines[0]["event"] == "SessionCreated" and lines[-1]["event"] == "SessionClosed"
    frames = [e for e in lines if e["event"] == "AudioFrame"]
    assert len(frames) == 20 and frames[0]["pcm16"]["bytes"] == 3840
    with wave.open(str(wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()) == (
            24_000,
            1,
            2,
            20 * 1920,
        )
    dump = run(str(corpus / GREEDY), "--dump")
    kinds = [json.loads(line)["kind"] for line in dump.stdout.splitlines()]
    assert kinds[0] == "header" and kinds[1] == "open" and kinds[-2:] == ["close", "end"]


def test_a_tampered_event_stream_is_a_divergence(corpus):
    path = corpus / GREEDY
    result = read_log(path)
    records = [rec for _, rec in result.records]
    i = next(k for k, rec in enumerate(records) if isinstance(rec, r.Step))
    step = records[i]
    assert isinstance(step, r.Step)
    records[i] = r.Step(
        step.epoch,
        step.frame_index,
        step.ready,
        step.text_token,
        step.text_piece + "x",
        step.agent_codes,
        step.user_codes,
        step.pcm16,
    )
    path.write_bytes(b"DUPLXLOG" + b"".join(encode_record(seq, rec) for seq, rec in enumerate(records)))
    out = run(str(path))
    assert out.returncode == 1 and "DIVERGED: events_sha256" in out.stdout


def test_torn_tail_and_missing_end_are_reported_not_corruption(corpus):
    path = corpus / GREEDY
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # a crash in the middle of the last record (the end record)
    out = run(str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torn tail at byte" in out.stdout and "no end record" in out.stdout


def test_corruption_is_exit_2_with_the_offset(corpus):
    path = corpus / GREEDY
    data = bytearray(path.read_bytes())
    data[400] ^= 0xFF  # inside an early record; valid records follow
    path.write_bytes(bytes(data))
    out = run(str(path))
    assert out.returncode == 2 and "corrupt" in out.stderr and "at byte" in out.stderr
    summary = run(str(corpus))
    assert summary.returncode == 2 and "UNREADABLE" in summary.stdout


def test_not_a_log(tmp_path):
    bogus = tmp_path / "x.dlog"
    bogus.write_bytes(b"hello world")
    assert run(str(bogus)).returncode == 2
    assert run(str(tmp_path / "missing.dlog")).returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(str(empty)).returncode == 2


def test_a_model_that_cannot_be_loaded_is_exit_2_with_a_message(corpus, tmp_path):
    out = run(str(corpus / GREEDY), "--model", str(tmp_path / "no-such-checkpoint"))
    assert out.returncode == 2
    assert "no-such-checkpoint" in out.stderr and "Traceback" not in out.stderr
