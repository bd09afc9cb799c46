"""Every setting declared once (``config.py``, read by ``settings.py``): flag over variable over
default for each of them, one error naming the flag or the variable, the operations table
generated from the declaration."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs
import pytest

from duplex_actors.cli import build_parser, main
from duplex_actors.config import (
    SETTINGS_CLASSES,
    TABLE_END,
    TABLE_START,
    ServeOptions,
    ServerConfig,
    with_table,
)
from duplex_actors.settings import BOOLEAN, ConfigError, as_env, load, settings_of

DOCS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"

# Every flag and variable that worked before the settings were declared in one place.
FLAGS_BEFORE = """--model --revision --family --max-sessions --device --dtype --memory-limit --torch-threads
--frontends --log-dir --log-max-age --log-max-bytes --log-probe-interval --api-key --allowed-origin
--static-ui --idle-timeout --max-message-bytes --input-buffer-bytes --input-budget
--max-messages-per-s --message-burst --max-bytes-per-s --byte-burst --switch-interval-ms
--rate-limit-after --outbox-events --drain-timeout --tick-policy --max-align-pad-ms --context-policy
--max-pinned-prompt --voice-alias --client-sampling --opus-workers --prepare-timeout --body-timeout
--keep-alive-timeout --max-connections --host --port --agent-port --agent-host --admission-refusal
--log-upload --s3-endpoint-url""".split()
VARIABLES_BEFORE = """MODEL DTYPE MEMORY_LIMIT PREPARE_TIMEOUT MODEL_REVISION FAMILY MAX_SESSIONS DEVICE
TORCH_THREADS ENGINE_CORE LOG_DIR LOG_MAX_AGE LOG_MAX_BYTES LOG_PROBE_INTERVAL API_KEY
ALLOWED_ORIGINS IDLE_TIMEOUT INPUT_BUFFER_BYTES OUTBOX_EVENTS MAX_MESSAGE_BYTES TICK_POLICY
CLIENT_SAMPLING BODY_TIMEOUT KEEP_ALIVE_TIMEOUT MAX_CONNECTIONS INPUT_BUDGET MAX_MESSAGES_PER_S
MESSAGE_BURST MAX_BYTES_PER_S BYTE_BURST RATE_LIMIT_AFTER AGENT_PORT AGENT_HOST ADMISSION_REFUSAL
LOG_UPLOAD S3_ENDPOINT_URL OPUS_WORKERS MAX_ALIGN_PAD_MS CONTEXT_POLICY MAX_PINNED_PROMPT
VOICE_ALIASES FRONTENDS""".split()


def all_settings():
    return [(cls, field, spec) for cls in SETTINGS_CLASSES for field, spec in settings_of(cls)]


def test_the_docs_table_is_the_generated_one() -> None:
    document = DOCS.read_text()
    assert TABLE_START in document and TABLE_END in document
    assert document == with_table(document), (
        "docs/operations.md's settings table is stale: python -m duplex_actors.config --update docs/operations.md"
    )


def test_every_flag_and_variable_in_use_is_declared_once() -> None:
    flags = [spec.flag for _, _, spec in all_settings() if spec.flag]
    variables = [spec.env for _, _, spec in all_settings()]
    assert len(flags) == len(set(flags)) and len(variables) == len(set(variables))
    assert set(FLAGS_BEFORE) <= set(flags)
    assert {f"DUPLEX_{name}" for name in VARIABLES_BEFORE} <= set(variables)
    assert all(v.startswith("DUPLEX_") for v in variables)


def test_the_defaults_are_the_declared_ones() -> None:
    assert ServerConfig.from_env({}) == ServerConfig()
    assert load(ServerConfig, {}, build_parser().parse_args(["serve"])) == ServerConfig()
    assert load(ServeOptions, {}, build_parser().parse_args(["serve"])) == ServeOptions()
    assert ServerConfig().keep_alive_timeout_s is None  # hypercorn's own (5 s, or its --keep-alive)


# One value other than the default for each setting of the server.
CHANGED = ServerConfig(
    model="tiny-parrot",
    revision="main",
    family="moshi",
    max_sessions=3,
    device="cuda:1",
    dtype="bfloat16",
    memory_limit=20 << 30,
    torch_threads=2,
    engine_core="\0core",
    log_dir="/tmp/logs",
    log_max_age_s=3600.0,
    log_max_bytes=1 << 30,
    log_probe_interval_s=0.5,
    log_commit_linger_s=0.05,
    api_key="k",
    allowed_origins=("https://a.example", "https://b.example"),
    static_ui=None,  # a directory with an index.html: test_a_ui_dir_needs_its_index
    idle_timeout_s=30.5,
    resume_grace_s=12.5,
    resume_journal_bytes=1 << 20,
    resume_max_backlog_s=1.5,
    input_buffer_bytes=960_000,
    input_budget_s=1.5,
    max_messages_per_s=100.0,
    message_burst=10.0,
    max_bytes_per_s=1e5,
    byte_burst=2e6,
    rate_limit_after_s=5.0,
    outbox_events=16,
    max_message_bytes=1 << 20,
    tick_policy="window",
    context_policy="pin-prompt",
    max_pinned_prompt=81,
    max_align_pad_ms=0,
    voice_aliases=(("butler", "NATM1.pt"), ("ash", "NATF0.pt")),
    client_sampling=True,
    prepare_timeout_s=90.0,
    opus_workers=2,
    body_timeout_s=3.0,
    keep_alive_timeout_s=7.0,
    max_connections=100,
    agent_port=9001,
    agent_host="10.0.0.1",
    admission_refusal="http",
    log_upload="s3://bucket/prefix",
    s3_endpoint_url="http://127.0.0.1:8333",
)


def test_the_example_changes_every_setting_but_the_ui() -> None:
    default = ServerConfig()
    unchanged = [
        f.name for f, _ in settings_of(ServerConfig) if getattr(CHANGED, f.name) == getattr(default, f.name)
    ]
    assert unchanged == ["static_ui"]


def test_the_variables_carry_every_setting_to_another_process() -> None:
    """``as_env`` is what the hypercorn entry gives the engine core it starts."""
    assert ServerConfig.from_env(CHANGED.as_env()) == CHANGED
    assert ServerConfig.from_env(ServerConfig().as_env()) == ServerConfig()


def argv_of(config: ServerConfig) -> list[str]:
    """``serve`` flags for ``config`` (the variables' text, one flag per item)."""
    argv = ["serve"]
    for field, spec in settings_of(ServerConfig):
        value = getattr(config, field.name)
        if spec.flag is None or value is None:
            continue
        if spec.kind is BOOLEAN:
            argv.append(spec.flag if value else f"--no-{spec.flag[2:]}")
        elif spec.many:
            for item in value:
                argv += [spec.flag, spec.kind.render(item)]
        else:
            argv += [spec.flag, spec.render(value)]
    return argv


def test_every_flag_sets_its_setting() -> None:
    args = build_parser().parse_args(argv_of(CHANGED))
    assert load(ServerConfig, {}, args) == attrs_without_core(CHANGED)


def attrs_without_core(config: ServerConfig) -> ServerConfig:
    return attrs.evolve(config, engine_core=None)  # a variable only: serve sets it itself


@pytest.mark.parametrize(("cls", "name"), [(cls, f.name) for cls, f, s in all_settings() if s.flag])
def test_the_flag_wins_over_the_variable_which_wins_over_the_default(
    cls: type, name: str, tmp_path: Path
) -> None:
    spec = dict((f.name, s) for f, s in settings_of(cls))[name]
    other = getattr(CHANGED, name) if cls is ServerConfig else OTHER_OPTIONS[name]
    if name == "static_ui":
        (tmp_path / "index.html").write_text("<html></html>")
        other = str(tmp_path)
    assert other != getattr(cls(), name)
    no_flag = build_parser().parse_args(["serve"])
    assert getattr(load(cls, {spec.env: spec.render(other)}, no_flag), name) == other
    assert getattr(load(cls, {}, no_flag), name) == getattr(cls(), name)
    assert spec.flag is not None
    if spec.kind is BOOLEAN:
        flag_args = [spec.flag if other else f"--no-{spec.flag[2:]}"]
    elif spec.many:
        flag_args = [arg for item in other for arg in (spec.flag, spec.kind.render(item))]
    else:
        flag_args = [spec.flag, spec.render(other)]
    flagged = build_parser().parse_args(["serve", *flag_args])
    # the variable is not even read when the flag is given
    assert getattr(load(cls, {spec.env: "@@ not a value"}, flagged), name) == other


OTHER_OPTIONS: dict[str, Any] = {
    "host": "0.0.0.0",
    "port": 8100,
    "frontends": 2,
    "drain_timeout_s": 3.0,
    "switch_interval_ms": 5.0,
}


def test_serve_reads_the_environment_for_every_setting() -> None:
    env = {"DUPLEX_MAX_SESSIONS": "abc", "DUPLEX_TICK_POLICY": "window", "DUPLEX_FRONTENDS": "3"}
    args = build_parser().parse_args(["serve", "--max-sessions", "2"])
    config = load(ServerConfig, env, args)  # the flag given: the variable is not read
    assert (config.max_sessions, config.tick_policy) == (2, "window")
    assert load(ServeOptions, env, args).frontends == 3
    with pytest.raises(ConfigError, match=r"^DUPLEX_MAX_SESSIONS='abc': expected an integer$"):
        load(ServerConfig, env, build_parser().parse_args(["serve"]))


def test_the_agent_listens_on_serves_host_unless_told() -> None:
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0"])
    host = load(ServeOptions, {}, args).host
    assert load(ServerConfig, {}, args, defaults={"agent_host": host}).agent_host == "0.0.0.0"
    env = {"DUPLEX_AGENT_HOST": "10.0.0.2"}
    assert load(ServerConfig, env, args, defaults={"agent_host": host}).agent_host == "10.0.0.2"
    assert ServerConfig.from_env({}).agent_host == "127.0.0.1"


def test_a_boolean_reads_the_usual_words_and_a_flag_turns_it_off() -> None:
    for word, value in [("1", True), ("Yes", True), ("on", True), ("0", False), ("off", False), ("", False)]:
        assert ServerConfig.from_env({"DUPLEX_CLIENT_SAMPLING": word}).client_sampling is value
    with pytest.raises(
        ConfigError, match="DUPLEX_CLIENT_SAMPLING='maybe': expected 1/true/yes/on or 0/false/no/off"
    ):
        ServerConfig.from_env({"DUPLEX_CLIENT_SAMPLING": "maybe"})
    env = {"DUPLEX_CLIENT_SAMPLING": "1"}
    assert (
        load(ServerConfig, env, build_parser().parse_args(["serve", "--no-client-sampling"])).client_sampling
        is False
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DUPLEX_TICK_POLICY": "fast"}, "DUPLEX_TICK_POLICY='fast': expected one of grid, deadline, window"),
        ({"DUPLEX_ADMISSION_REFUSAL": "x"}, "DUPLEX_ADMISSION_REFUSAL='x': expected one of inband, http"),
        ({"DUPLEX_FAMILY": "gpt"}, "DUPLEX_FAMILY='gpt': expected one of personaplex, moshi"),
        (
            {"DUPLEX_OPUS_WORKERS": "0"},
            "DUPLEX_OPUS_WORKERS='0': expected an integer (processes), at least 1",
        ),
        ({"DUPLEX_IDLE_TIMEOUT": "soon"}, "DUPLEX_IDLE_TIMEOUT='soon': expected a number of seconds"),
        ({"DUPLEX_AGENT_PORT": "http"}, "DUPLEX_AGENT_PORT='http': expected an integer (a port number)"),
    ],
)
def test_a_bad_variable_is_named_with_what_it_allows(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServerConfig.from_env(env)
    assert str(caught.value) == message


def test_a_bad_value_is_one_error_type_however_it_comes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"^tick_policy='fast': expected one of"):
        ServerConfig(tick_policy="fast")
    with pytest.raises(ConfigError, match=r"^admission_refusal='teapot': expected one of inband, http$"):
        ServerConfig(admission_refusal="teapot")
    with pytest.raises(argparse.ArgumentError, match="--tick-policy 'fast': expected one of grid"):
        build_parser().parse_args(["serve", "--tick-policy", "fast"])
    assert main(["serve", "--tick-policy", "fast"]) == 2
    assert (
        capsys.readouterr().err
        == "duplex-actors: --tick-policy 'fast': expected one of grid, deadline, window\n"
    )
    assert main(["serve", "--voice-alias", "butler"]) == 2
    assert capsys.readouterr().err == (
        "duplex-actors: --voice-alias 'butler': voice alias 'butler': expected NAME=FILE.pt\n"
    )


def test_serve_stops_on_a_bad_variable_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DUPLEX_MAX_SESSIONS", "abc")
    assert main(["serve"]) == 2
    assert capsys.readouterr().err == "duplex-actors: DUPLEX_MAX_SESSIONS='abc': expected an integer\n"
    monkeypatch.delenv("DUPLEX_MAX_SESSIONS")
    monkeypatch.setenv("DUPLEX_LOG_UPLOAD", "https://bucket")
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.startswith("duplex-actors: DUPLEX_LOG_UPLOAD: ")


def test_a_ui_dir_needs_its_index(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no index\.html there"):
        ServerConfig.from_env({"DUPLEX_STATIC_UI": str(tmp_path)})
    (tmp_path / "index.html").write_text("<html></html>")
    assert ServerConfig.from_env({"DUPLEX_STATIC_UI": str(tmp_path)}).static_ui == str(tmp_path)
    args = build_parser().parse_args(["serve", "--static-ui", str(tmp_path)])
    assert load(ServerConfig, {}, args).static_ui == str(tmp_path)


def test_as_env_names_every_setting() -> None:
    assert set(as_env(ServeOptions())) == {spec.env for _, spec in settings_of(ServeOptions)}


def test_the_log_commit_linger_default_is_the_writers() -> None:
    from duplex_actors.config import DEFAULT_LOG_COMMIT_LINGER_S
    from duplex_actors.log.writer import COMMIT_LINGER_S

    assert ServerConfig().log_commit_linger_s == DEFAULT_LOG_COMMIT_LINGER_S == COMMIT_LINGER_S
