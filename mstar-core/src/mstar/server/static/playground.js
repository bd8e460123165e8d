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

async function init() {
  showError("");
  try {
    const [models, version] = await Promise.all([getJSON("/v1/models"), getJSON("/version")]);
    const select = $("model");
    select.innerHTML = "";
    for (const m of models.data) select.add(new Option(m.id, m.id));
    $("server-status").textContent = `M* ${version.version} · ${version.plugin}`;
    $("speech-panel").hidden = !version.endpoints.includes("speech");
    $("chat-panel").hidden = !version.endpoints.includes("chat");
    if (version.endpoints.includes("speech")) await loadVoices();
  } catch (err) {
    showError(`Cannot list the models: ${err.message} (a server with --api-key needs the key above)`);
  }
}

async function loadVoices() {
  const voices = await getJSON(`/v1/audio/voices?model=${encodeURIComponent($("model").value)}`);
  const select = $("voice");
  select.innerHTML = "";
  for (const v of voices.data) {
    const langs = v.languages.length ? ` (${v.languages.join(", ")})` : "";
    select.add(new Option(v.name + langs, v.name, v.default, v.default));
  }
  if (!voices.data.length) select.add(new Option("(model default)", ""));
}

// ---- speech: stream raw PCM, play each chunk as it arrives, decode the whole at the end ----

let audioCtx = null;

function pcm16ToFloat(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
  return out;
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
  audioCtx = audioCtx || new AudioContext();
  await audioCtx.resume().catch(() => {});
  const body = { model: $("model").value, input: $("speech-text").value, response_format: "pcm", stream_format: "audio" };
  if ($("voice").value) body.voice = $("voice").value;
  if ($("speech-seed").value !== "") body.seed = Number($("speech-seed").value);
  const started = performance.now();
  try {
    const resp = await fetch("/v1/audio/speech", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!resp.ok) throw new Error(await errorText(resp));
    const rate = Number(resp.headers.get("x-sample-rate"));
    const reader = resp.body.getReader();
    const parts = [];
    let carry = new Uint8Array(0); // a sample split across two network chunks
    let total = 0, firstAudioMs = null, playAt = audioCtx.currentTime + 0.05, played = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const bytes = new Uint8Array(carry.length + value.length);
      bytes.set(carry); bytes.set(value, carry.length);
      const even = bytes.length & ~1;
      carry = bytes.slice(even);
      if (!even) continue;
      const chunk = bytes.slice(0, even);
      parts.push(chunk);
      total += chunk.length;
      if (firstAudioMs === null) firstAudioMs = performance.now() - started;
      const samples = pcm16ToFloat(chunk);
      const buffer = audioCtx.createBuffer(1, samples.length, rate);
      buffer.copyToChannel(samples, 0);
      const src = audioCtx.createBufferSource();
      src.buffer = buffer;
      src.connect(audioCtx.destination);
      src.onended = () => { status.dataset.playedChunks = String(++played); };
      playAt = Math.max(playAt, audioCtx.currentTime);
      src.start(playAt);
      playAt += buffer.duration;
      status.dataset.bytes = String(total);
      status.textContent = `streaming: ${total} bytes at ${rate} Hz, first audio after ${firstAudioMs.toFixed(0)} ms`;
    }
    const pcm = new Uint8Array(total);
    let offset = 0;
    for (const p of parts) { pcm.set(p, offset); offset += p.length; }
    const wav = wavFile(pcm, rate);
    const decoded = await audioCtx.decodeAudioData(await wav.arrayBuffer());
    status.dataset.sampleRate = String(rate);
    // decodeAudioData resamples to the context's rate: its length counts samples at that rate.
    status.dataset.decodedSamples = String(decoded.length);
    status.dataset.decodedRate = String(decoded.sampleRate);
    status.dataset.state = "done";
    status.textContent = `${total} bytes, ${decoded.duration.toFixed(2)} s of audio (decoded ${decoded.length} samples), ` +
      `first audio after ${firstAudioMs === null ? "-" : firstAudioMs.toFixed(0)} ms, seed ${resp.headers.get("x-mstar-seed")}`;
    const player = $("speech-audio");
    player.src = URL.createObjectURL(wav);
    player.hidden = false;
  } catch (err) {
    status.dataset.state = "error";
    showError(`Speech failed: ${err.message}`);
  }
}

// ---- live speech: typed text goes over WS /v1/audio/speech/stream, sentence by sentence ----

let live = null; // {ws, sent, playAt, bytes, segments}

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function liveStatus(state, text) {
  const el = $("live-status");
  el.dataset.state = state;
  if (live) { el.dataset.bytes = String(live.bytes); el.dataset.segments = String(live.segments); }
  el.textContent = text;
}

async function startLive() {
  showError("");
  audioCtx = audioCtx || new AudioContext();
  await audioCtx.resume().catch(() => {});
  // A browser cannot set headers on a WebSocket: the key travels as a subprotocol.
  const protocols = ["mstar.speech"];
  if (keyInput.value) protocols.push("mstar.bearer." + base64url(keyInput.value));
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/audio/speech/stream`;
  const ws = new WebSocket(url, protocols);
  ws.binaryType = "arraybuffer";
  live = { ws, sent: 0, playAt: 0, rate: 16000, bytes: 0, segments: 0 };
  ws.onopen = () => {
    const session = { type: "session", model: $("model").value };
    if ($("voice").value) session.voice = $("voice").value;
    if ($("speech-seed").value !== "") session.seed = Number($("speech-seed").value);
    ws.send(JSON.stringify(session));
    liveStatus("open", "live: type, and each finished sentence is spoken");
    sendTyped();
  };
  ws.onmessage = (msg) => {
    if (!live || live.ws !== ws) return;
    if (typeof msg.data !== "string") {
      const samples = pcm16ToFloat(new Uint8Array(msg.data));
      const buffer = audioCtx.createBuffer(1, samples.length, live.rate);
      buffer.copyToChannel(samples, 0);
      const src = audioCtx.createBufferSource();
      src.buffer = buffer;
      src.connect(audioCtx.destination);
      live.playAt = Math.max(live.playAt, audioCtx.currentTime);
      src.start(live.playAt);
      live.playAt += buffer.duration;
      live.bytes += msg.data.byteLength;
      return;
    }
    const event = JSON.parse(msg.data);
    if (event.type === "start") live.rate = event.sample_rate;
    if (event.type === "end") live.segments += 1;
    if (event.type === "error") showError(`Live speech: ${event.error.message}`);
    if (event.type === "flushed") { ws.close(); live = null; $("live-status").dataset.state = "closed"; return; }
    liveStatus("open", `live: ${live.segments} sentence(s), ${live.bytes} bytes` + (event.type === "start" ? ` · speaking "${event.text}"` : ""));
  };
  ws.onerror = () => showError("Live speech: the WebSocket failed (wrong API key?)");
  ws.onclose = () => { if (live && live.ws === ws) { live = null; liveStatus("closed", "live: closed"); $("live").checked = false; } };
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

async function send() {
  showError("");
  const reply = $("chat-reply");
  const status = $("chat-status");
  reply.textContent = "";
  reply.dataset.state = "streaming";
  const started = performance.now();
  try {
    const body = {
      model: $("model").value,
      messages: [{ role: "user", content: await userContent() }],
      max_tokens: Number($("chat-max-tokens").value) || 64,
      stream: true,
      stream_options: { include_usage: true },
    };
    const resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let pending = "", usage = null;
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
        for (const choice of chunk.choices || []) reply.textContent += (choice.delta && choice.delta.content) || "";
      }
    }
    reply.dataset.state = "done";
    status.textContent = `${usage ? usage.completion_tokens + " tokens, " : ""}${((performance.now() - started) / 1000).toFixed(2)} s`;
  } catch (err) {
    reply.dataset.state = "error";
    showError(`Chat failed: ${err.message}`);
  }
}

$("model").addEventListener("change", () => { if (!$("speech-panel").hidden) loadVoices().catch((e) => showError(e.message)); });
$("speak").addEventListener("click", speak);
$("live").addEventListener("change", (e) => (e.target.checked ? startLive() : stopLive()));
$("speech-text").addEventListener("input", sendTyped);
$("send").addEventListener("click", send);
init();
