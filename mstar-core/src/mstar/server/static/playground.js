// The M* playground: plain JS over the public HTTP API (no build step, no libraries).
"use strict";

const $ = (id) => document.getElementById(id);
const keyInput = $("api-key");
keyInput.value = localStorage.getItem("mstar-api-key") || "";
keyInput.addEventListener("change", () => { localStorage.setItem("mstar-api-key", keyInput.value); init(); });

function headers(json = true) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (keyInput.value) h["Authorization"] = `Bearer ${keyInput.value}`;
  return h;
}

function showError(message) {
  const el = $("error");
  el.textContent = message;
  el.hidden = !message;
}

// An error response in OpenAI's shape -> its message.
async function errorText(resp) {
  try {
    const body = await resp.json();
    return `${resp.status}: ${body.error ? body.error.message : JSON.stringify(body)}`;
  } catch (_) {
    return `${resp.status} ${resp.statusText}`;
  }
}

async function getJSON(path) {
  const resp = await fetch(path, { headers: headers(false) });
  if (!resp.ok) throw new Error(await errorText(resp));
  return resp.json();
}

let cards = new Map(); // model id -> its /v1/models entry (endpoints, chat_audio)
let shown = 0; // bumped on each model switch: a slower, older voice listing is dropped

async function init() {
  showError("");
  try {
    const [models, version] = await Promise.all([getJSON("/v1/models"), getJSON("/version")]);
    const select = $("model");
    const previous = select.value;
    select.innerHTML = "";
    cards = new Map(models.data.map((m) => [m.id, m]));
    for (const m of models.data) {
      const aliases = (m.aliases || []).length ? ` (also ${m.aliases.join(", ")})` : "";
      select.add(new Option(m.id + aliases, m.id));
    }
    if (cards.has(previous)) select.value = previous;
    $("server-status").textContent = `M* ${version.version} · ${version.plugin}`;
    await showModel();
  } catch (err) {
    showError(`Cannot list the models: ${err.message} (a server with --api-key needs the key above)`);
  }
}

// Shows only the panels the picked model's endpoints allow, and its voices.
async function showModel() {
  const turn = ++shown;
  const select = $("model");
  const card = cards.get(select.value) || { endpoints: [], chat_audio: false };
  const speech = card.endpoints.includes("speech");
  const chat = card.endpoints.includes("chat");
  if (live && live.model !== select.value) closeLive(); // it speaks with the model it was opened for
  const talks = chat && card.endpoints.includes("transcription"); // hears: WS /v1/realtime serves it
  if (typeof talk !== "undefined" && talk && talk.model !== select.value) stopTalk();
  $("talk-panel").hidden = !talks;
  $("speech-panel").hidden = !speech;
  $("chat-panel").hidden = !chat;
  $("chat-audio-controls").hidden = !(chat && card.chat_audio);
  if (!card.chat_audio) $("chat-speak").checked = false;
  $("no-panel").hidden = speech || chat;
  delete select.dataset.shown;
  const voices = speech || card.chat_audio ? await loadVoices(select.value) : [];
  if (turn !== shown) return;
  fillVoices($("voice"), voices);
  fillVoices($("chat-voice"), voices.filter((v) => !v.saved)); // chat speaks built-in voices only
  fillVoices($("talk-voice"), card.chat_audio ? voices.filter((v) => !v.saved) : []);
  select.dataset.shown = select.value; // the page shows this model (tests wait on it)
}

async function loadVoices(model) {
  return (await getJSON(`/v1/audio/voices?model=${encodeURIComponent(model)}`)).data;
}

function fillVoices(select, voices) {
  select.innerHTML = "";
  for (const v of voices) {
    const langs = v.languages.length ? ` (${v.languages.join(", ")})` : "";
    select.add(new Option(v.name + langs, v.name, v.default, v.default));
  }
  if (!voices.length) select.add(new Option("(model default)", ""));
}

// ---- speech: stream raw PCM, play each chunk as it arrives, decode the whole at the end ----

let audioCtx = null;

async function audioContext() {
  audioCtx = audioCtx || new AudioContext();
  await audioCtx.resume().catch(() => {});
  return audioCtx;
}

function pcm16ToFloat(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
  return out;
}

function base64Bytes(text) {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// Plays 16-bit mono PCM as it arrives: each piece is scheduled on the audio context right
// after the previous one, and kept for the whole clip.
class PcmPlayer {
  constructor(ctx, rate, onPlayed = () => {}) {
    this.ctx = ctx;
    this.rate = rate;
    this.onPlayed = onPlayed;
    this.playAt = ctx.currentTime + 0.05;
    this.carry = new Uint8Array(0); // a sample split across two pieces
    this.parts = [];
    this.sources = []; // scheduled, for stop()
    this.bytes = 0;
    this.played = 0;
  }

  // Silences everything scheduled (an interrupted answer).
  stop() {
    for (const src of this.sources) { try { src.stop(); } catch (_) { /* not started */ } }
    this.sources = [];
  }

  push(piece) {
    const bytes = new Uint8Array(this.carry.length + piece.length);
    bytes.set(this.carry); bytes.set(piece, this.carry.length);
    const even = bytes.length & ~1;
    this.carry = bytes.slice(even);
    if (!even) return 0;
    const chunk = bytes.slice(0, even);
    this.parts.push(chunk);
    this.bytes += chunk.length;
    const samples = pcm16ToFloat(chunk);
    const buffer = this.ctx.createBuffer(1, samples.length, this.rate);
    buffer.copyToChannel(samples, 0);
    const src = this.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.ctx.destination);
    src.onended = () => { this.sources = this.sources.filter((s) => s !== src); this.onPlayed(++this.played); };
    this.sources.push(src);
    this.playAt = Math.max(this.playAt, this.ctx.currentTime);
    src.start(this.playAt);
    this.playAt += buffer.duration;
    return chunk.length;
  }

  // Everything pushed, as one WAV clip and as the browser decodes it.
  async finish() {
    const pcm = new Uint8Array(this.bytes);
    let offset = 0;
    for (const p of this.parts) { pcm.set(p, offset); offset += p.length; }
    const wav = wavFile(pcm, this.rate);
    const decoded = await this.ctx.decodeAudioData(await wav.arrayBuffer());
    return { wav, decoded };
  }
}

// A WAV file around 16-bit mono PCM, so the browser's own decoder reads the whole clip.
function wavFile(pcm, sampleRate) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, s) => { for (let i = 0; i < s.length; i++) header.setUint8(offset + i, s.charCodeAt(i)); };
  text(0, "RIFF"); header.setUint32(4, 36 + pcm.byteLength, true); text(8, "WAVE");
  text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
  header.setUint32(24, sampleRate, true); header.setUint32(28, sampleRate * 2, true);
  header.setUint16(32, 2, true); header.setUint16(34, 16, true);
  text(36, "data"); header.setUint32(40, pcm.byteLength, true);
  return new Blob([header.buffer, pcm], { type: "audio/wav" });
}

async function speak() {
  showError("");
  const status = $("speech-status");
  status.dataset.state = "streaming";
  status.dataset.bytes = "0";
  status.dataset.playedChunks = "0";
  delete status.dataset.decodedSamples;
  $("speech-audio").hidden = true;
  const ctx = await audioContext();
  const body = { model: $("model").value, input: $("speech-text").value, response_format: "pcm", stream_format: "audio" };
  if ($("voice").value) body.voice = $("voice").value;
  if ($("speech-seed").value !== "") body.seed = Number($("speech-seed").value);
  const started = performance.now();
  try {
    const resp = await fetch("/v1/audio/speech", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!resp.ok) throw new Error(await errorText(resp));
    const rate = Number(resp.headers.get("x-sample-rate"));
    const player = new PcmPlayer(ctx, rate, (n) => { status.dataset.playedChunks = String(n); });
    const reader = resp.body.getReader();
    let firstAudioMs = null;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (!player.push(value)) continue;
      if (firstAudioMs === null) firstAudioMs = performance.now() - started;
      status.dataset.bytes = String(player.bytes);
      status.textContent = `streaming: ${player.bytes} bytes at ${rate} Hz, first audio after ${firstAudioMs.toFixed(0)} ms`;
    }
    const { wav, decoded } = await player.finish();
    status.dataset.sampleRate = String(rate);
    // decodeAudioData resamples to the context's rate: its length counts samples at that rate.
    status.dataset.decodedSamples = String(decoded.length);
    status.dataset.decodedRate = String(decoded.sampleRate);
    status.dataset.state = "done";
    const rtf = decoded.duration ? (performance.now() - started) / 1000 / decoded.duration : null;
    status.dataset.rtf = String(rtf);
    status.textContent = `${player.bytes} bytes, ${decoded.duration.toFixed(2)} s of audio (decoded ${decoded.length} samples), ` +
      `first audio after ${firstAudioMs === null ? "-" : firstAudioMs.toFixed(0)} ms, real-time factor ${rtf === null ? "-" : rtf.toFixed(2)}, ` +
      `seed ${resp.headers.get("x-mstar-seed")}`;
    const audio = $("speech-audio");
    audio.src = URL.createObjectURL(wav);
    audio.hidden = false;
  } catch (err) {
    status.dataset.state = "error";
    showError(`Speech failed: ${err.message}`);
  }
}

// ---- live speech: typed text goes over WS /v1/audio/speech/stream, sentence by sentence ----

let live = null; // {ws, model, sent, player, segments}

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function liveStatus(state, text) {
  const el = $("live-status");
  el.dataset.state = state;
  if (live) { el.dataset.bytes = String(live.player.bytes); el.dataset.segments = String(live.segments); }
  el.textContent = text;
}

async function startLive() {
  showError("");
  const ctx = await audioContext();
  // A browser cannot set headers on a WebSocket: the key travels as a subprotocol.
  const protocols = ["mstar.speech"];
  if (keyInput.value) protocols.push("mstar.bearer." + base64url(keyInput.value));
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/audio/speech/stream`;
  const ws = new WebSocket(url, protocols);
  ws.binaryType = "arraybuffer";
  live = { ws, model: $("model").value, sent: 0, player: new PcmPlayer(ctx, 16000), segments: 0 };
  ws.onopen = () => {
    const session = { type: "session", model: live.model };
    if ($("voice").value) session.voice = $("voice").value;
    if ($("speech-seed").value !== "") session.seed = Number($("speech-seed").value);
    ws.send(JSON.stringify(session));
    liveStatus("open", "live: type, and each finished sentence is spoken");
    sendTyped();
  };
  ws.onmessage = (msg) => {
    if (!live || live.ws !== ws) return;
    if (typeof msg.data !== "string") {
      live.player.push(new Uint8Array(msg.data));
      return;
    }
    const event = JSON.parse(msg.data);
    if (event.type === "start") live.player.rate = event.sample_rate;
    if (event.type === "end") live.segments += 1;
    if (event.type === "error") showError(`Live speech: ${event.error.message}`);
    if (event.type === "flushed") { ws.close(); live = null; $("live-status").dataset.state = "closed"; return; }
    liveStatus("open", `live: ${live.segments} sentence(s), ${live.player.bytes} bytes` + (event.type === "start" ? ` · speaking "${event.text}"` : ""));
  };
  ws.onerror = () => showError("Live speech: the WebSocket failed (wrong API key?)");
  ws.onclose = () => { if (live && live.ws === ws) { live = null; liveStatus("closed", "live: closed"); $("live").checked = false; } };
}

// Closes a live session at once (closing the socket aborts what it still generates).
function closeLive() {
  if (!live) return;
  const { ws } = live;
  live = null;
  ws.close();
  $("live").checked = false;
  liveStatus("closed", "live: closed");
}

// Sends what was appended to the text since the last send (an edit earlier in the text
// starts over from its current end).
function sendTyped() {
  if (!live || live.ws.readyState !== WebSocket.OPEN) return;
  const text = $("speech-text").value;
  if (text.length < live.sent) live.sent = text.length;
  if (text.length > live.sent) {
    live.ws.send(JSON.stringify({ type: "text", text: text.slice(live.sent) }));
    live.sent = text.length;
  }
}

function stopLive() {
  if (live && live.ws.readyState === WebSocket.OPEN) live.ws.send(JSON.stringify({ type: "flush" })); // closes once flushed
}

// ---- chat: SSE deltas appended as they arrive ------------------------------------------------

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

async function userContent() {
  const text = $("chat-text").value;
  const file = $("chat-file").files[0];
  if (!file) return text;
  const url = await readAsDataURL(file);
  const parts = [{ type: "text", text }];
  if (file.type.startsWith("image/")) {
    parts.push({ type: "image_url", image_url: { url } });
  } else {
    const format = (file.name.split(".").pop() || "wav").toLowerCase();
    parts.push({ type: "input_audio", input_audio: { data: url.slice(url.indexOf(",") + 1), format } });
  }
  return parts;
}

// Spoken replies (modalities text + audio) stream delta.audio: transcript pieces, then
// base64 pcm16 pieces at the x-sample-rate header's rate, played as they arrive.
async function send() {
  showError("");
  const reply = $("chat-reply");
  const status = $("chat-status");
  const speakIt = !$("chat-audio-controls").hidden && $("chat-speak").checked;
  reply.textContent = "";
  reply.dataset.state = "streaming";
  for (const key of ["audioBytes", "audioPieces", "playedChunks", "sampleRate", "decodedSamples", "decodedRate"]) delete status.dataset[key];
  $("chat-audio").hidden = true;
  const started = performance.now();
  try {
    const body = {
      model: $("model").value,
      messages: [{ role: "user", content: await userContent() }],
      max_tokens: Number($("chat-max-tokens").value) || 64,
      stream: true,
      stream_options: { include_usage: true },
    };
    if ($("chat-seed").value !== "") body.seed = Number($("chat-seed").value);
    const sampling = $("chat-sampling").value.trim();
    if (sampling) {
      try { body.sampling = JSON.parse(sampling); } catch (err) { throw new Error(`Sampling is not JSON: ${err.message}`); }
    }
    if (speakIt) {
      body.modalities = ["text", "audio"];
      body.audio = { format: "pcm16" };
      if ($("chat-voice").value) body.audio.voice = $("chat-voice").value;
    }
    const ctx = speakIt ? await audioContext() : null;
    const resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!resp.ok) throw new Error(await errorText(resp));
    let player = null;
    if (speakIt) {
      const rate = Number(resp.headers.get("x-sample-rate"));
      if (!rate) throw new Error("the spoken reply has no x-sample-rate header");
      status.dataset.sampleRate = String(rate);
      status.dataset.playedChunks = "0";
      player = new PcmPlayer(ctx, rate, (n) => { status.dataset.playedChunks = String(n); });
    }
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let pending = "", usage = null, firstAudioMs = null, firstTokenMs = null;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      pending += value;
      const events = pending.split("\n\n");
      pending = events.pop();
      for (const event of events) {
        const data = event.replace(/^data: /, "");
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          const delta = choice.delta || {};
          if (firstTokenMs === null && (delta.content || (delta.audio && delta.audio.transcript))) firstTokenMs = performance.now() - started;
          reply.textContent += delta.content || "";
          if (!delta.audio) continue;
          reply.textContent += delta.audio.transcript || "";
          if (delta.audio.data && player) {
            player.push(base64Bytes(delta.audio.data));
            if (firstAudioMs === null) firstAudioMs = performance.now() - started;
            status.dataset.audioBytes = String(player.bytes);
            status.dataset.audioPieces = String(player.parts.length);
            status.textContent = `speaking: ${player.bytes} bytes at ${player.rate} Hz, first audio after ${firstAudioMs.toFixed(0)} ms`;
          }
        }
      }
    }
    let spoken = "";
    if (player) {
      status.dataset.audioBytes = String(player.bytes);
      if (player.bytes) {
        const { wav, decoded } = await player.finish();
        status.dataset.decodedSamples = String(decoded.length);
        status.dataset.decodedRate = String(decoded.sampleRate);
        const rtf = (performance.now() - started) / 1000 / decoded.duration;
        status.dataset.rtf = String(rtf);
        spoken = `, ${player.bytes} bytes of audio (${decoded.duration.toFixed(2)} s, first after ${firstAudioMs.toFixed(0)} ms, real-time factor ${rtf.toFixed(2)})`;
        const audio = $("chat-audio");
        audio.src = URL.createObjectURL(wav);
        audio.hidden = false;
      } else {
        spoken = ", no audio";
      }
    }
    reply.dataset.state = "done";
    const firstToken = firstTokenMs === null ? "" : `, first token after ${firstTokenMs.toFixed(0)} ms`;
    status.textContent = `${usage ? usage.completion_tokens + " tokens, " : ""}${((performance.now() - started) / 1000).toFixed(2)} s${firstToken}${spoken}`;
  } catch (err) {
    reply.dataset.state = "error";
    showError(`Chat failed: ${err.message}`);
  }
}

$("model").addEventListener("change", () => showModel().catch((e) => showError(e.message)));
$("speak").addEventListener("click", speak);
$("live").addEventListener("change", (e) => (e.target.checked ? startLive() : stopLive()));
$("speech-text").addEventListener("input", sendTyped);
$("send").addEventListener("click", send);
init();
