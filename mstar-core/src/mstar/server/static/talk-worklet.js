// The Talk panel's microphone tap: mono float samples at the audio context's rate in,
// 16-bit PCM at 24 kHz out (what WS /v1/realtime takes), posted every 100 ms.
"use strict";

const OUT_RATE = 24000;
const CHUNK = OUT_RATE / 10;

class Pcm16At24k extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUT_RATE; // input samples per output sample
    this.pos = 0; // next output position, in input samples after `prev`
    this.prev = 0; // the last input sample of the previous block
    this.out = new Int16Array(CHUNK);
    this.filled = 0;
  }

  // Linear interpolation over [prev, ...block]: position p lies between x[floor(p)] and
  // x[floor(p) + 1], with x[0] = prev and x[k] = block[k - 1].
  process(inputs) {
    const block = inputs[0] && inputs[0][0];
    if (!block || !block.length) return true;
    const n = block.length;
    while (this.pos < n) {
      const i = Math.floor(this.pos);
      const a = i === 0 ? this.prev : block[i - 1];
      const y = a + (block[i] - a) * (this.pos - i);
      this.out[this.filled++] = Math.max(-32768, Math.min(32767, Math.round(y * 32767)));
      if (this.filled === CHUNK) {
        this.port.postMessage(this.out.buffer, [this.out.buffer]);
        this.out = new Int16Array(CHUNK);
        this.filled = 0;
      }
      this.pos += this.step;
    }
    this.pos -= n;
    this.prev = block[n - 1];
    return true;
  }
}

registerProcessor("pcm16-24k", Pcm16At24k);
