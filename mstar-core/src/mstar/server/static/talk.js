// The Talk panel: the microphone over WS /v1/realtime (OpenAI's Realtime API, server_vad
// turns), each answer's audio played as it streams and its transcript shown; speaking over
// an answer (or the Interrupt button) stops it. Uses playground.js's helpers.
"use strict";

// What this page sent and heard, for tests and curious users: the session.update, every
// appended chunk (base64 PCM16 24 kHz), the turns the server heard (VAD start / end, ms of
// audio sent) and per answer its transcript and PCM (base64 pieces joined by "|").
const mstarTalk = { session: null, sent: [], turns: [], answers: [] };
let talk = null; // {ws, stream, source, node, sink, open, player, turn, turnEnd}

function bytesToBase64(bytes) {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

function talkStatus(state, text) {
  const el = $("talk-status");
  el.dataset.state = state;
  el.textContent = text;
}

function talkSession() {
  const speaks = (cards.get($("model").value) || {}).chat_audio; // else it answers in text
  const session = { type: "realtime", output_modalities: [speaks ? "audio" : "text"], audio: { input: { turn_detection: { type: "server_vad" } }, output: {} } };
  if ($("talk-voice").value) session.audio.output.voice = $("talk-voice").value;
  if ($("talk-seed").value !== "") session.seed = Number($("talk-seed").value);
  session.max_output_tokens = Number($("talk-max-tokens").value) || 64;
  const sampling = $("talk-sampling").value.trim();
  if (sampling) session.sampling = JSON.parse(sampling);
  return { type: "session.update", session };
}

async function startTalk() {
  showError("");
  let update;
  try { update = talkSession(); } catch (err) { showError(`Sampling is not JSON: ${err.message}`); $("talk-start").checked = false; return; }
  const ctx = await audioContext();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false } });
    await ctx.audioWorklet.addModule("/static/talk-worklet.js");
  } catch (err) {
    showError(`Microphone: ${err.message}`);
    $("talk-start").checked = false;
    return;
  }
  // A browser cannot set headers on a WebSocket: the key travels as OpenAI's subprotocol.
  const protocols = ["realtime"];
  if (keyInput.value) protocols.push("openai-insecure-api-key." + keyInput.value);
  const model = $("model").value;
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime?model=${encodeURIComponent(model)}`, protocols);
  const source = ctx.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(ctx, "pcm16-24k");
  const sink = ctx.createGain(); // silent: keeps the tap running without playing the microphone back
  sink.gain.value = 0;
  source.connect(node).connect(sink).connect(ctx.destination);
  talk = { ws, stream, source, node, sink, model, open: false, player: null, turn: null, turnEnd: null };
  mstarTalk.session = update;
  mstarTalk.sent = [];
  mstarTalk.turns = [];
  node.port.onmessage = (e) => {
    if (!talk || talk.ws !== ws || !talk.open) return;
    const audio = bytesToBase64(new Uint8Array(e.data));
    mstarTalk.sent.push(audio);
    ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio }));
  };
  ws.onopen = () => {
    ws.send(JSON.stringify(update));
    talk.open = true; // audio goes after the settings
    talkStatus("listening", "listening: speak, and pause to let the model answer");
  };
  ws.onmessage = (msg) => { if (talk && talk.ws === ws) onTalkEvent(JSON.parse(msg.data), ctx); };
  ws.onerror = () => showError("Talk: the WebSocket failed (wrong API key?)");
  ws.onclose = () => { if (talk && talk.ws === ws) stopTalk(); };
}

function onTalkEvent(event, ctx) {
  const t = talk;
  switch (event.type) {
    case "input_audio_buffer.speech_started":
      mstarTalk.turns.push({ start_ms: event.audio_start_ms, end_ms: null });
      if (t.player) t.player.stop(); // barge-in: the server cancels the answer, we stop playing it
      talkStatus("hearing", "hearing you…");
      break;
    case "input_audio_buffer.speech_stopped":
      t.turnEnd = performance.now();
      if (mstarTalk.turns.length) mstarTalk.turns[mstarTalk.turns.length - 1].end_ms = event.audio_end_ms;
      break;
    case "response.created": {
      const el = document.createElement("p");
      el.className = "answer";
      $("talk-reply").append(el);
      t.turn = { el, started: t.turnEnd || performance.now(), firstAudio: null, firstToken: null, transcript: "", pcm: [] };
      t.player = new PcmPlayer(ctx, 24000);
      $("talk-reply").dataset.state = "streaming";
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      if (!t.turn) break;
      if (t.turn.firstToken === null) t.turn.firstToken = performance.now() - t.turn.started;
      t.turn.transcript += event.delta;
      t.turn.el.textContent = t.turn.transcript;
      break;
    case "response.output_audio.delta": {
      if (!t.turn) break;
      if (t.turn.firstAudio === null) t.turn.firstAudio = performance.now() - t.turn.started;
      t.turn.pcm.push(event.delta);
      t.player.push(base64Bytes(event.delta));
      talkStatus("speaking", `speaking: first audio after ${t.turn.firstAudio.toFixed(0)} ms`);
      break;
    }
    case "response.done":
      if (t.turn) finishTurn(t.turn, t.player, event.response);
      t.turn = null;
      break;
    case "error":
      showError(`Talk: ${event.error.message}`);
      break;
  }
}

// Time to first audio / first token from the end of the user's turn, and the real-time
// factor (the answer's wall time over its audio's duration).
function finishTurn(turn, player, response) {
  const seconds = player.bytes / 2 / 24000;
  const wall = (performance.now() - turn.started) / 1000;
  const rtf = seconds ? wall / seconds : null;
  mstarTalk.answers.push({ status: response.status, transcript: turn.transcript, audio: turn.pcm.join("|") });
  const st = $("talk-status");
  Object.assign(st.dataset, { answers: String(mstarTalk.answers.length), ttfaMs: String(turn.firstAudio), ttftMs: String(turn.firstToken), rtf: String(rtf) });
  const ms = (v) => (v === null ? "-" : `${v.toFixed(0)} ms`);
  talkStatus("done", `${response.status}: first audio ${ms(turn.firstAudio)}, first token ${ms(turn.firstToken)}, ` +
    `${seconds.toFixed(2)} s of audio, real-time factor ${rtf === null ? "-" : rtf.toFixed(2)}, seed ${response.seed}`);
  $("talk-reply").dataset.state = "done";
}

function interruptTalk() {
  if (!talk) return;
  if (talk.player) talk.player.stop();
  if (talk.turn && talk.ws.readyState === WebSocket.OPEN) talk.ws.send(JSON.stringify({ type: "response.cancel" }));
}

function stopTalk() {
  if (!talk) return;
  const t = talk;
  talk = null;
  if (t.player) t.player.stop();
  t.stream.getTracks().forEach((track) => track.stop());
  t.source.disconnect();
  t.node.disconnect();
  t.sink.disconnect();
  if (t.ws.readyState <= WebSocket.OPEN) t.ws.close();
  $("talk-start").checked = false;
  talkStatus("closed", "microphone off");
}

$("talk-start").addEventListener("change", (e) => (e.target.checked ? startTalk() : stopTalk()));
$("talk-interrupt").addEventListener("click", interruptTalk);
