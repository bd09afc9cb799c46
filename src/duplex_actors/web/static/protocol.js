// Wire-protocol helpers for the page: the WebSocket URL and subprotocols, and server errors and
// close reasons in plain words.

export const KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key.";

export function realtimeUrl(loc = window.location) {
  const scheme = loc.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${loc.host}/v1/realtime?duplex=1&autostart=0`;
}

// "realtime" always (the server echoes it), plus the key when the user typed one.
export function subprotocols(apiKey) {
  const key = (apiKey || "").trim();
  return key ? ["realtime", KEY_SUBPROTOCOL_PREFIX + key] : ["realtime"];
}

const ERROR_WORDS = {
  resource_exhausted: "The server is full right now; try again in a moment.",
  unauthorized: "The server refused the API key. Type the right key in the API key field and start again.",
  forbidden: "The server does not accept connections from this page's address (origin).",
  not_ready: "The model is still loading; try again in a few seconds.",
  model_not_found: "The server serves a different model than the one asked for.",
  config_timeout: "The server waited too long for the session settings and gave up.",
  invalid_voice: "The server does not know that voice. Pick one from the list.",
  voice_update_unsupported: "The voice cannot change once the model has heard audio. Stop and start again to change it.",
  persona_update_unsupported: "The persona cannot change once the model has heard audio. Stop and start again to change it.",
  invalid_duplex_runtime_config: "A setting was refused: the server operator owns it.",
  bad_audio: "The server could not read an audio frame from this page.",
  unsupported_audio_format: "The server does not accept this audio format.",
  input_backpressure: "The server is behind: it has more of your audio waiting than it can keep. Some audio was dropped.",
  rate_limited: "This page sent audio or messages faster than real time for too long; the server ended the session.",
  response_cancel_not_active: "Nothing to interrupt yet: the model has not started answering.",
  session_closed: "The session has already ended.",
  log_unavailable: "The server cannot record sessions right now (its log storage failed); try again later.",
  internal_error: "The server hit an internal error and ended the session.",
  invalid_json: "The server could not read a message from this page.",
  bad_event: "The server refused a malformed message from this page.",
  unknown_event: "The server did not understand a message from this page.",
  invalid_value: "The server refused a setting value.",
};

// Errors after which the session goes on.
const RECOVERABLE = new Set([
  "response_cancel_not_active",
  "input_backpressure",
  "voice_update_unsupported",
  "persona_update_unsupported",
  "invalid_value",
  "unknown_event",
  "bad_event",
  "invalid_json",
  "bad_audio",
]);

export function errorWords(error) {
  const code = (error && error.code) || "";
  const words = ERROR_WORDS[code] || (error && error.message) || "The server reported an error.";
  return { code, words, detail: (error && error.message) || "", recoverable: RECOVERABLE.has(code) };
}

const CLOSED_WORDS = {
  client_close: "you stopped the session",
  timeout: "the server closed it after a long silence from this page",
  server_shutdown: "the server is restarting",
  error: "a server error ended it",
  log_unavailable: "the server could not record the session",
  slow_consumer: "this page could not keep up with the audio",
  rate_limited: "this page sent faster than real time for too long",
  disconnect: "the connection dropped",
};

export function closedWords(reason) {
  return CLOSED_WORDS[reason] || reason || "closed";
}

// A WebSocket close seen without a session.closed event before it.
export function closeCodeWords(code, opened) {
  switch (code) {
    case 1000:
      return "the server closed the connection";
    case 1009:
      return "a message was too large for the server";
    case 1011:
      return "a server error ended it";
    case 1012:
      return "the server is restarting";
    case 1013:
      return "the server is full; try again in a moment";
    default:
      return opened ? "the connection dropped" : "could not connect";
  }
}

// "NATF2.pt" -> "NATF2 · natural female"
export function voiceLabel(name) {
  const base = name.replace(/\.pt$/, "");
  const m = /^(NAT|VAR)([FM])(\d+)$/.exec(base);
  if (!m) return base;
  const kind = m[1] === "NAT" ? "natural" : "varied";
  const who = m[2] === "F" ? "female" : "male";
  return `${base} · ${kind} ${who}`;
}
