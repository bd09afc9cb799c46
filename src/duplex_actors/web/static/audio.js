// Microphone capture (AudioWorklet -> 80 ms pcm16 frames at 24 kHz) and jittered playback.

export const SAMPLE_RATE = 24000;
export const FRAME_SAMPLES = 1920; // 80 ms at 24 kHz
export const FRAME_MS = 80;

const WORKLET_URL = "/static/capture-worklet.js";

// The microphone through the "pcm16-capture" worklet. onFrame(Int16Array, rms, padMs) per 80 ms
// frame; pad(ms) makes the next frame ms early and shorter, with padMs = ms (an alignment hint).
export class Microphone {
  constructor(ctx, stream, source, node, sink) {
    this.ctx = ctx;
    this.stream = stream;
    this.source = source;
    this.node = node;
    this.sink = sink;
    this.onFrame = null;
    node.port.onmessage = (e) => {
      if (this.onFrame) this.onFrame(new Int16Array(e.data.pcm), e.data.rms, e.data.padMs || 0);
    };
  }

  pad(ms) {
    this.node.port.postMessage({ pad: ms });
  }

  static async open(ctx) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("this browser gives no microphone access here (the page needs https or localhost)");
    }
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      video: false,
    });
    try {
      await ctx.audioWorklet.addModule(WORKLET_URL);
      const source = ctx.createMediaStreamSource(stream);
      // One silent output, connected through a muted gain, keeps the node pulled by the graph.
      const node = new AudioWorkletNode(ctx, "pcm16-capture", {
        numberOfInputs: 1,
        numberOfOutputs: 1,
        outputChannelCount: [1],
        channelCount: 1,
        channelCountMode: "explicit",
        channelInterpretation: "speakers",
      });
      const sink = ctx.createGain();
      sink.gain.value = 0;
      source.connect(node);
      node.connect(sink);
      sink.connect(ctx.destination);
      return new Microphone(ctx, stream, source, node, sink);
    } catch (err) {
      for (const track of stream.getTracks()) track.stop();
      throw err;
    }
  }

  close() {
    this.onFrame = null;
    try {
      this.node.port.postMessage("stop");
      this.source.disconnect();
      this.node.disconnect();
      this.sink.disconnect();
    } catch (_) {
      // already disconnected
    }
    for (const track of this.stream.getTracks()) track.stop();
  }
}

// Plays 24 kHz pcm16 chunks on the AudioContext clock, starting each run of audio bufferMs
// ahead of "now" so that network jitter below that does not cause gaps. When the queue runs
// dry it restarts bufferMs ahead (an underrun); when it grows past maxMs (the server sent a
// burst) chunks are dropped to keep the conversation's latency bounded.
export class Player {
  constructor(ctx, { bufferMs = 120, maxMs = 600 } = {}) {
    this.ctx = ctx;
    this.bufferMs = bufferMs;
    this.maxMs = maxMs;
    this.gain = ctx.createGain();
    this.gain.connect(ctx.destination);
    this.nextTime = 0;
    this.sources = new Set();
    this.started = false;
    this.underruns = 0;
    this.dropped = 0; // chunks dropped over maxMs
    this.trimmed = 0; // chunks dropped to shrink a queue left deep by a burst
    this.deepPushes = 0;
  }

  push(pcm) {
    const ctx = this.ctx;
    const samples = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
    const buffer = ctx.createBuffer(1, samples.length, SAMPLE_RATE);
    buffer.copyToChannel(samples, 0);
    const now = ctx.currentTime;
    if (this.nextTime < now + 0.005) {
      if (this.started) this.underruns++;
      this.nextTime = now + this.bufferMs / 1000;
    } else if ((this.nextTime - now) * 1000 > this.maxMs) {
      this.dropped++;
      return;
    } else if ((this.nextTime - now) * 1000 > this.bufferMs + FRAME_MS + 20) {
      // A burst left the queue deeper than it needs to be and a steady stream keeps it so:
      // after about 2 s of that, drop one chunk to bring the delay back down.
      if (++this.deepPushes >= 25) {
        this.deepPushes = 0;
        this.trimmed++;
        return;
      }
    } else {
      this.deepPushes = 0;
    }
    this.started = true;
    const src = ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.gain);
    src.onended = () => this.sources.delete(src);
    src.start(this.nextTime);
    this.sources.add(src);
    this.nextTime += buffer.duration;
  }

  // Silence at once: drop everything queued (interrupt, cleared output, stop).
  flush() {
    for (const src of this.sources) {
      try {
        src.stop();
      } catch (_) {
        // not started yet
      }
    }
    this.sources.clear();
    this.nextTime = 0;
    this.started = false;
    this.deepPushes = 0;
  }

  get bufferedMs() {
    return Math.max(0, this.nextTime - this.ctx.currentTime) * 1000;
  }

  close() {
    this.flush();
    this.gain.disconnect();
  }
}

export function int16ToBase64(pcm) {
  const bytes = new Uint8Array(pcm.buffer, pcm.byteOffset, pcm.byteLength);
  let binary = "";
  const chunk = 0x8000;
  for (let i = 0; i < bytes.length; i += chunk) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + chunk));
  }
  return btoa(binary);
}

export function base64ToInt16(b64) {
  const binary = atob(b64);
  const n = binary.length >> 1;
  const out = new Int16Array(n);
  for (let i = 0; i < n; i++) {
    const v = binary.charCodeAt(2 * i) | (binary.charCodeAt(2 * i + 1) << 8);
    out[i] = v >= 0x8000 ? v - 0x10000 : v;
  }
  return out;
}
