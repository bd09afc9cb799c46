// AudioWorklet processor "pcm16-capture": mixes the microphone to mono, low-passes it when the
// context runs faster than 24 kHz, resamples to 24 kHz (linear interpolation) and posts whole
// 80 ms frames (1920 samples) of 16-bit PCM to the main thread:
//   port.postMessage({ pcm: ArrayBuffer (Int16, little-endian on every browser platform), rms, padMs })
// Send "stop" on the port to end processing. Alignment (docs/protocol.md §7): send
// { pad: ms } and the next frame is posted that much early, holding only 80 - ms of audio, with
// padMs = ms (the page puts pad_ms on its append; the server inserts the silence before it);
// every later frame is 80 ms again, on the shifted boundaries.

const OUT_RATE = 24000;
const FRAME_SAMPLES = 1920;

// RBJ biquad low-pass coefficients, normalised by a0.
function lowpass(cutoff, rate, q) {
  const w0 = (2 * Math.PI * cutoff) / rate;
  const cos = Math.cos(w0);
  const alpha = Math.sin(w0) / (2 * q);
  const a0 = 1 + alpha;
  return {
    b0: (1 - cos) / 2 / a0,
    b1: (1 - cos) / a0,
    b2: (1 - cos) / 2 / a0,
    a1: (-2 * cos) / a0,
    a2: (1 - alpha) / a0,
  };
}

class Biquad {
  constructor(c) {
    this.c = c;
    this.z1 = 0;
    this.z2 = 0;
  }

  run(x) {
    const c = this.c;
    const y = c.b0 * x + this.z1;
    this.z1 = c.b1 * x - c.a1 * y + this.z2;
    this.z2 = c.b2 * x - c.a2 * y;
    return y;
  }
}

class Pcm16Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUT_RATE; // input samples per output sample
    // Two cascaded sections (4th order Butterworth-ish) at 0.45 x 24 kHz against aliasing.
    this.filters = [];
    if (this.step > 1) {
      const c = lowpass(0.45 * OUT_RATE, sampleRate, Math.SQRT1_2);
      this.filters = [new Biquad(c), new Biquad(c)];
    }
    this.t = 0; // read position (in input samples) relative to the current block; -1 = this.prev
    this.prev = 0;
    this.mono = new Float32Array(128);
    this.frame = new Int16Array(FRAME_SAMPLES);
    this.fill = 0;
    this.sumSq = 0;
    this.running = true;
    this.target = FRAME_SAMPLES; // samples of the frame being filled (less after a pad hint)
    this.padMs = 0;
    this.port.onmessage = (e) => {
      if (e.data === "stop") this.running = false;
      else if (e.data && typeof e.data.pad === "number") this.pad(e.data.pad);
    };
  }

  pad(ms) {
    const pad = Math.round((ms * OUT_RATE) / 1000);
    if (!(pad > 0 && pad < FRAME_SAMPLES)) return;
    this.padMs = ms;
    this.target = FRAME_SAMPLES - pad;
    if (this.fill >= this.target) this.post(); // already past the early boundary: at once
  }

  // Post the first `target` samples of the frame; what is beyond starts the next frame.
  post() {
    const n = this.target;
    const out = this.frame.slice(0, n);
    let sumSq = 0;
    for (let i = 0; i < n; i++) sumSq += (out[i] / 32768) * (out[i] / 32768);
    const rms = Math.sqrt(sumSq / n);
    this.port.postMessage({ pcm: out.buffer, rms, padMs: this.padMs }, [out.buffer]);
    const rest = this.frame.slice(n, this.fill);
    this.frame = new Int16Array(FRAME_SAMPLES);
    this.frame.set(rest);
    this.fill = rest.length;
    this.target = FRAME_SAMPLES;
    this.padMs = 0;
  }

  emit(sample) {
    const s = sample < -1 ? -1 : sample > 1 ? 1 : sample;
    this.frame[this.fill++] = s < 0 ? Math.round(s * 32768) : Math.round(s * 32767);
    if (this.fill >= this.target) this.post();
  }

  process(inputs, outputs) {
    if (!this.running) return false;
    const input = inputs[0];
    const out = outputs[0];
    if (out) for (const ch of out) ch.fill(0);
    if (!input || input.length === 0 || input[0].length === 0) return true;
    const n = input[0].length;
    if (this.mono.length < n) this.mono = new Float32Array(n);
    const x = this.mono;
    const channels = input.length;
    for (let i = 0; i < n; i++) {
      let v = 0;
      for (let c = 0; c < channels; c++) v += input[c][i];
      v /= channels;
      for (const f of this.filters) v = f.run(v);
      x[i] = v;
    }
    // Linear interpolation between x[i] and x[i + 1] (x[-1] is the previous block's last sample).
    let t = this.t;
    while (t < n - 1) {
      const i = Math.floor(t);
      const frac = t - i;
      const a = i < 0 ? this.prev : x[i];
      const b = x[i + 1];
      this.emit(a + (b - a) * frac);
      t += this.step;
    }
    this.t = t - n;
    this.prev = x[n - 1];
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
