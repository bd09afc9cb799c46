// The page: pick a voice and persona, Start streams the microphone to /v1/realtime?duplex=1,
// the model's audio plays through a jitter buffer, and the transcript and session state show.

import { FRAME_MS, FRAME_SAMPLES, Microphone, Player, base64ToInt16, int16ToBase64 } from "./audio.js";
import { closeCodeWords, closedWords, errorWords, realtimeUrl, subprotocols, voiceLabel } from "./protocol.js";

const JITTER_MS = 120;
const MAX_UNSENT_BYTES = 1 << 20; // input frames are skipped while the socket has this much queued
const STOP_GRACE_MS = 3000; // force-close the socket if session.closed does not come

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"),
  voice: $("voice"),
  persona: $("persona"),
  apiKey: $("api-key"),
  start: $("start"),
  interrupt: $("interrupt"),
  stop: $("stop"),
  micLevel: $("mic-level"),
  error: $("error"),
  state: $("state"),
  sessionId: $("session-id"),
  epoch: $("epoch"),
  framesSent: $("frames-sent"),
  framesReceived: $("frames-received"),
  inFlight: $("in-flight"),
  latency: $("latency"),
  buffer: $("buffer"),
  transcript: $("transcript"),
};

let ctx = null; // one AudioContext for capture and playback, created on the first Start click
let session = null; // the current Session, or null

// -- voices -------------------------------------------------------------------------------------
async function loadVoices() {
  for (;;) {
    let status = 0;
    let body = null;
    try {
      const resp = await fetch("/v1/voices", { cache: "no-store" });
      status = resp.status;
      body = await resp.json();
    } catch (_) {
      status = 0;
    }
    if (status === 200 && body) {
      fillVoices(body);
      return;
    }
    ui.voice.replaceChildren(new Option(status === 503 ? "the model is loading…" : "server unreachable…", ""));
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function fillVoices({ voices, default: byDefault, model, family }) {
  ui.model.textContent = model ? `${model}${family ? " · " + family : ""}` : family || "";
  if (!voices || voices.length === 0) {
    ui.voice.replaceChildren(new Option("(this model has no voice prompts)", ""));
    ui.voice.disabled = true;
  } else {
    ui.voice.replaceChildren(
      ...voices.map((v) => new Option(voiceLabel(v) + (v === byDefault ? " (default)" : ""), v, false, v === byDefault)),
    );
    ui.voice.disabled = false;
  }
  ui.start.disabled = false;
  ui.voice.dataset.loaded = "1";
}

// -- display ------------------------------------------------------------------------------------
function setState(state, words) {
  ui.state.dataset.state = state;
  ui.state.textContent = words ? `${state} — ${words}` : state;
  const live = state === "connecting" || state === "open";
  ui.start.disabled = live || state === "closing" || ui.voice.dataset.loaded !== "1";
  ui.stop.disabled = !live;
  ui.interrupt.disabled = state !== "open";
  const locked = live || state === "closing";
  ui.voice.disabled = locked || ui.voice.options.length === 0 || ui.voice.value === "";
  ui.persona.disabled = locked;
  ui.apiKey.disabled = locked;
}

function showError(words, detail) {
  ui.error.replaceChildren(document.createTextNode(words));
  if (detail && detail !== words) {
    const d = document.createElement("span");
    d.className = "detail";
    d.textContent = detail;
    ui.error.append(d);
  }
  ui.error.hidden = false;
}

function clearError() {
  ui.error.hidden = true;
  ui.error.replaceChildren();
}

// -- one session --------------------------------------------------------------------------------
class Session {
  constructor({ voice, persona, apiKey }) {
    this.config = { voice, persona, apiKey };
    this.ws = null;
    this.mic = null;
    this.player = null;
    this.sessionId = null;
    this.opened = false; // session.created seen
    this.closedSeen = false; // session.closed seen
    this.finished = false;
    this.stopping = false;
    this.epoch = null;
    this.framesSent = 0;
    this.framesReceived = 0;
    this.framesSkipped = 0;
    this.lastFrameIndex = -1; // frame_index of the last output frame received
    this.sentAt = new Map(); // input frame index -> performance.now() when sent
    this.samplesSent = 0; // input samples (24 kHz) sent
    this.sends = []; // [samples sent after an append, performance.now() when sent], oldest first
    this.padsApplied = 0;
    this.roundTrip = null;
    this.roundTripAvg = null;
    this.paragraph = null; // transcript <p> of the current response
    this.paragraphEpoch = null;
    this.timer = null;
  }

  async start() {
    setState("connecting", "asking for the microphone");
    this.player = new Player(ctx, { bufferMs: JITTER_MS });
    try {
      this.mic = await Microphone.open(ctx);
    } catch (err) {
      this.fail("The microphone is not available: " + (err && err.message ? err.message : err));
      return;
    }
    if (this.finished) return;
    this.mic.onFrame = (pcm, rms, padMs) => this.onMicFrame(pcm, rms, padMs);
    setState("connecting", "opening the session");
    try {
      this.ws = new WebSocket(realtimeUrl(), subprotocols(this.config.apiKey));
    } catch (err) {
      this.fail("Could not open the connection: " + (err && err.message ? err.message : err) +
        " (an API key may only contain letters, digits and -._~ characters).");
      return;
    }
    this.ws.onopen = () => this.onOpen();
    this.ws.onmessage = (e) => this.onMessage(e.data);
    this.ws.onclose = (e) => this.onClose(e);
    this.timer = setInterval(() => this.render(), 100);
  }

  send(obj) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(obj));
  }

  onOpen() {
    const session = { type: "realtime", input_audio_format: "pcm16", output_audio_format: "pcm16" };
    if (this.config.voice) session.voice = this.config.voice;
    session.instructions = this.config.persona;
    // Alignment to the server's tick (docs/protocol.md §7): the page sends whole 80 ms frames,
    // so it opts in to the server's hints and sends one frame early (and shorter) when told.
    session.duplex = { alignment: "client" };
    this.send({ type: "session.update", session });
  }

  onMicFrame(pcm, rms, padMs) {
    ui.micLevel.style.width = `${Math.min(100, Math.round(Math.sqrt(rms) * 180))}%`;
    if (!this.opened || this.stopping || !this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    if (this.ws.bufferedAmount > MAX_UNSENT_BYTES) {
      this.framesSkipped++;
      return;
    }
    const append = { type: "input_audio_buffer.append", audio: int16ToBase64(pcm) };
    if (padMs) {
      append.pad_ms = padMs;
      this.padsApplied++;
    }
    this.send(append);
    const now = performance.now();
    this.sentAt.set(this.framesSent, now);
    this.samplesSent += pcm.length;
    this.sends.push([this.samplesSent, now]);
    if (this.sends.length > 256) this.sends.splice(0, this.sends.length - 256);
    this.framesSent++;
  }

  // When the append holding input sample `end - 1` was sent (undefined if no longer known).
  sentTimeOf(end) {
    for (const [samples, at] of this.sends) if (samples >= end) return at;
    return undefined;
  }

  onMessage(data) {
    let ev;
    try {
      ev = JSON.parse(data);
    } catch (_) {
      return;
    }
    switch (ev.type) {
      case "session.created":
        this.opened = true;
        this.sessionId = ev.session && ev.session.id;
        ui.sessionId.textContent = this.sessionId || "–";
        setState("open", "listening");
        break;
      case "response.created":
        this.paragraph = null;
        break;
      case "response.output_audio.delta":
      case "response.audio.delta":
        this.onAudio(ev);
        break;
      case "response.output_audio_transcript.delta":
      case "response.audio_transcript.delta":
        this.onText(ev.delta || "");
        break;
      case "output_audio_buffer.cleared":
        this.player.flush();
        break;
      case "input_audio_buffer.alignment":
        if (this.mic && typeof ev.pad_ms === "number") this.mic.pad(ev.pad_ms);
        break;
      case "response.done":
        if (ev.response && ev.response.status === "cancelled") {
          this.player.flush();
          if (this.paragraph && ev.response.status_details &&
              ev.response.status_details.reason !== "session_closed") {
            this.paragraph.classList.add("interrupted");
          }
        }
        this.paragraph = null;
        break;
      case "session.closing":
        setState("closing", closedWords(ev.reason));
        break;
      case "session.closed":
        this.closedSeen = true;
        this.closeReason = ev.reason;
        break;
      case "error":
        this.onError(ev.error || {});
        break;
      default:
        break;
    }
  }

  onAudio(ev) {
    const pcm = base64ToInt16(ev.delta || "");
    const meta = ev.metadata || {};
    const frames = Math.max(1, Math.round(pcm.length / FRAME_SAMPLES));
    this.framesReceived += frames;
    if (typeof meta.epoch === "number") this.epoch = meta.epoch;
    if (typeof meta.frame_index === "number") {
      const first = meta.frame_index;
      // With alignment pads the server's frame k is no longer the page's frame k: the delta says
      // where in the page's own input its frame ended.
      const sent =
        typeof meta.input_samples_end === "number" && meta.input_samples_end > 0
          ? this.sentTimeOf(meta.input_samples_end)
          : this.sentAt.get(first);
      if (sent !== undefined) {
        this.roundTrip = performance.now() - sent;
        this.roundTripAvg = this.roundTripAvg === null ? this.roundTrip : 0.9 * this.roundTripAvg + 0.1 * this.roundTrip;
      }
      this.lastFrameIndex = first + frames - 1;
      for (const k of this.sentAt.keys()) {
        if (k > this.lastFrameIndex) break;
        this.sentAt.delete(k);
      }
    }
    if (!this.stopping) this.player.push(pcm);
  }

  onText(text) {
    if (!text) return;
    const t = ui.transcript;
    const placeholder = t.querySelector(".placeholder");
    if (placeholder) placeholder.remove();
    if (!this.paragraph || this.paragraphEpoch !== this.epoch) {
      this.paragraph = document.createElement("p");
      const tag = document.createElement("span");
      tag.className = "epoch-tag";
      tag.textContent = `epoch ${this.epoch ?? 0}`;
      this.paragraph.append(tag, document.createTextNode(""));
      this.paragraphEpoch = this.epoch;
      t.append(this.paragraph);
    }
    this.paragraph.lastChild.appendData(text);
    t.scrollTop = t.scrollHeight;
  }

  onError(error) {
    const { words, detail, recoverable } = errorWords(error);
    showError(words, detail);
    if (recoverable) setTimeout(() => { if (ui.error.textContent.startsWith(words)) clearError(); }, 6000);
  }

  interrupt() {
    this.player.flush();
    this.send({ type: "response.cancel" });
  }

  stop() {
    if (this.finished) return;
    this.stopping = true;
    this.player.flush();
    if (this.ws && this.ws.readyState === WebSocket.OPEN && this.opened) {
      setState("closing", "ending the session");
      this.send({ type: "session.close" });
      setTimeout(() => { if (!this.finished) this.ws.close(1000); }, STOP_GRACE_MS);
    } else if (this.ws) {
      this.ws.close(1000);
      this.finish("closed", "you stopped before the session opened");
    } else {
      this.finish("closed", "you stopped before the session opened");
    }
  }

  onClose(e) {
    if (this.closedSeen) {
      this.finish("closed", closedWords(this.closeReason));
      return;
    }
    if (this.stopping) {
      this.finish("closed", "you stopped the session");
      return;
    }
    const words = closeCodeWords(e.code, this.opened);
    if (!this.opened && e.code === 1006) {
      // Refused before the upgrade (HTTP 401/403/503) or unreachable: ask /ready which.
      fetch("/ready", { cache: "no-store" })
        .then((r) => r.status)
        .catch(() => 0)
        .then((status) => {
          if (status === 503) showError(errorWords({ code: "not_ready" }).words);
          else if (status === 200) {
            showError(this.config.apiKey
              ? "The server refused the connection: the API key is wrong, or this page's origin is not allowed."
              : "The server refused the connection: it needs an API key (type it in the API key field), or this page's origin is not allowed.");
          } else showError("The server cannot be reached.");
        });
    } else if (e.code === 1013) {
      showError(errorWords({ code: "resource_exhausted" }).words);
    }
    this.finish(this.opened ? "closed" : "failed", words);
  }

  fail(message) {
    showError(message);
    if (this.ws) this.ws.close();
    this.finish("failed", "");
  }

  finish(state, words) {
    if (this.finished) return;
    this.finished = true;
    if (this.timer) clearInterval(this.timer);
    this.render();
    if (this.mic) this.mic.close();
    if (this.player) this.player.close();
    ui.micLevel.style.width = "0";
    setState(state, words);
  }

  render() {
    ui.epoch.textContent = this.epoch === null ? "–" : String(this.epoch);
    ui.framesSent.textContent = String(this.framesSent);
    ui.framesReceived.textContent = String(this.framesReceived);
    if (this.opened) {
      const inFlight = Math.max(0, this.framesSent - (this.lastFrameIndex + 1));
      ui.inFlight.textContent = `${inFlight} frame${inFlight === 1 ? "" : "s"} · ${inFlight * FRAME_MS} ms`;
    }
    if (this.roundTrip !== null) {
      ui.latency.textContent = `${Math.round(this.roundTrip)} ms (avg ${Math.round(this.roundTripAvg)})`;
    }
    if (this.player && this.player.started) {
      const extra = this.player.underruns ? `, ${this.player.underruns} gaps` : "";
      ui.buffer.textContent = `${Math.round(this.player.bufferedMs)} ms${extra}`;
    }
  }
}

// -- buttons ------------------------------------------------------------------------------------
function resetReadouts() {
  ui.sessionId.textContent = "–";
  ui.epoch.textContent = "–";
  ui.framesSent.textContent = "0";
  ui.framesReceived.textContent = "0";
  ui.inFlight.textContent = "–";
  ui.latency.textContent = "–";
  ui.buffer.textContent = "–";
  const p = document.createElement("p");
  p.className = "placeholder";
  p.textContent = "Listening… the model's words appear here as it speaks them.";
  ui.transcript.replaceChildren(p);
}

ui.start.addEventListener("click", () => {
  if (session && !session.finished) return;
  clearError();
  resetReadouts();
  // Created (or resumed) inside the click so browsers allow it to play.
  if (!ctx) ctx = new AudioContext({ latencyHint: "interactive" });
  if (ctx.state === "suspended") ctx.resume();
  session = new Session({
    voice: ui.voice.value,
    persona: ui.persona.value.trim(),
    apiKey: ui.apiKey.value,
  });
  session.start();
});

// Enter in a field must not submit (and reload) the form.
$("setup").addEventListener("submit", (e) => e.preventDefault());

ui.interrupt.addEventListener("click", () => {
  if (session && session.opened && !session.finished) session.interrupt();
});

ui.stop.addEventListener("click", () => {
  if (session) session.stop();
});

window.addEventListener("pagehide", () => {
  if (session && !session.finished) session.stop();
});

setState("idle", "");
loadVoices();
