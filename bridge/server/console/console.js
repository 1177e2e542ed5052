// parlora-bridge console: live calls over Server-Sent Events (GET /events), a per-call view, hang-up, and the
// browser channel's Talk button (WebRTC, offer/answer over POST /talk). No build step, nothing fetched from
// outside the bridge.
//
// The token, when the bridge has one, is never put in a URL: the sign-in form posts it once (POST /session,
// JSON) and the bridge answers with an HttpOnly, SameSite=Strict cookie that every later request of this page
// carries (the event stream included, which cannot set headers). Every POST says Content-Type:
// application/json: the bridge refuses anything else, and anything from a page of another origin.
"use strict";

const JSON_POST = { method: "POST", headers: { "content-type": "application/json" } };
const calls = new Map(); // call id -> {summary, captions: [], stages: [], lastRecovery, lastRollover, ended}
let selected = null;

const $ = (id) => document.getElementById(id);

function fmtDuration(ms) {
  if (ms == null) return "–";
  const s = Math.floor(ms / 1000);
  return Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0");
}

function entry(callId) {
  let c = calls.get(callId);
  if (!c) {
    c = { summary: {}, captions: [], stages: [], lastRecovery: "none", lastRollover: "none", seenAt: Date.now() };
    calls.set(callId, c);
  }
  return c;
}

function stage(c, text) {
  c.stages.push(new Date().toLocaleTimeString() + "  " + text);
  if (c.stages.length > 50) c.stages.shift();
}

function recoveryText(r) { return r ? r.stage + " (" + r.cause + ", token " + r.token + ")" : "none"; }
function rolloverText(r) {
  if (!r) return "none";
  return r.stage + (r.next ? " → " + r.next : "") + (r.rollovers ? " (" + r.rollovers + " done)" : "");
}

function onCall(msg) {
  const c = entry(msg.call_id);
  c.summary = msg;
  c.seenAt = Date.now();
  // Stages read from status snapshots, for a bridge whose sessions send no notices (they would say it first).
  const rec = msg.output_recovery ? msg.output_recovery.stage : "none";
  if (rec !== c.lastRecovery && !c.notices) {
    stage(c, rec === "none" ? "recovery cleared" : "recovery " + recoveryText(msg.output_recovery));
    c.lastRecovery = rec;
  }
  const roll = rolloverText(msg.rollover);
  if (roll !== c.lastRollover) {
    stage(c, "rollover " + roll);
    c.lastRollover = roll;
  }
  const barges = (msg.playback || {}).barge_ins || 0;
  if (c.lastBargeIns !== undefined && barges > c.lastBargeIns && !c.notices) stage(c, "barge-in #" + barges + " (from status)");
  c.lastBargeIns = barges;
  if (!selected) selected = msg.call_id;
  render();
}

function onGone(msg) {
  const c = calls.get(msg.call_id);
  calls.delete(msg.call_id);
  if (selected === msg.call_id) selected = calls.size ? calls.keys().next().value : null;
  if (c) console.log("call ended", msg.call_id);
  render();
}

function onCaption(msg) {
  const c = entry(msg.call_id);
  c.notices = true;
  const last = c.captions[c.captions.length - 1];
  // The same utterance again (interim, then final): one bubble, its latest text.
  const same = c.captions.find((x) => x.role === msg.role && x.at === msg.at_ms && x.epoch === msg.epoch);
  if (same) {
    same.text = msg.text;
  } else {
    c.captions.push({ role: msg.role, text: msg.text, at: msg.at_ms, epoch: msg.epoch,
                      epochBreak: !!last && last.epoch !== msg.epoch });
  }
  if (c.captions.length > 200) c.captions.shift();
  if (msg.call_id === selected) renderDetail();
}

function onBargeIn(msg) {
  // The ledger's truncation point: how much of each interrupted assistant item the caller was sent.
  const c = entry(msg.call_id);
  c.notices = true;
  for (let i = c.captions.length - 1; i >= 0; i--) {
    if (c.captions[i].role === "assistant") {
      const heard = (msg.heard || []).map((h) => h[1] + " ms").join(", ") || "nothing";
      c.captions[i].cut = "cut by barge-in: heard " + heard + ", cleared " + msg.cleared_ms + " ms";
      break;
    }
  }
  stage(c, "barge-in (" + msg.source + ") at " + msg.at_ms + " ms");
  if (msg.call_id === selected) renderDetail();
}

function onRecovery(msg) {
  const c = entry(msg.call_id);
  c.notices = true;
  stage(c, "recovery " + msg.stage + " (" + msg.cause + ", token " + msg.token + ")");
  c.lastRecovery = msg.stage === "done" ? "none" : msg.stage;
  if (msg.call_id === selected) renderDetail();
}

function onRollover(msg) {
  const c = entry(msg.call_id);
  stage(c, "rollover " + msg.what + " " + msg.connection_id + (msg.detail ? " (" + msg.detail + ")" : ""));
  if (msg.call_id === selected) renderDetail();
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null ? "–" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
}

function render() {
  const tbody = $("calls").querySelector("tbody");
  tbody.replaceChildren();
  for (const [id, c] of calls) {
    const s = c.summary;
    const tr = document.createElement("tr");
    tr.dataset.callId = id;
    if (id === selected) tr.classList.add("selected");
    cell(tr, s.from);
    cell(tr, s.called || s.to);
    cell(tr, s.engine);
    cell(tr, s.provider);
    const live = s.duration_ms == null ? null : s.duration_ms + (Date.now() - c.seenAt);
    cell(tr, fmtDuration(live), "duration");
    cell(tr, s.state, "state state-" + s.state);
    tr.addEventListener("click", () => { selected = id; render(); });
    tbody.appendChild(tr);
  }
  $("call-count").textContent = String(calls.size);
  $("no-calls").hidden = calls.size > 0;
  renderDetail();
}

function renderDetail() {
  const c = selected && calls.get(selected);
  $("detail").hidden = !c;
  if (!c) return;
  const s = c.summary;
  $("detail").dataset.callId = selected;
  $("detail-title").textContent = "Call " + selected + " · " + (s.from || "") + " → " + (s.called || s.to || "");
  const rec = $("recovery-now");
  rec.textContent = recoveryText(s.output_recovery);
  rec.className = "stage " + (s.output_recovery ? s.output_recovery.stage : "none");
  $("rollover-now").textContent = rolloverText(s.rollover);
  $("reservoir").textContent = s.reservoir_ms == null ? "–" : s.reservoir_ms + " ms";
  const q = s.qos || {};
  const p = s.playback || {};
  $("qos").textContent = "frames in " + (q.frames_in ?? "–") + " · underruns " + (q.underruns ?? "–") +
    " · cushion " + (p.cushion_frames ?? "–") + " frames";
  const stages = $("stages");
  stages.replaceChildren(...c.stages.map((t) => { const li = document.createElement("li"); li.textContent = t; return li; }));
  const box = $("captions");
  box.replaceChildren(...c.captions.map((cap) => {
    const div = document.createElement("div");
    div.className = "caption " + cap.role + (cap.cut ? " truncated" : "") + (cap.epochBreak ? " epoch-break" : "");
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = cap.role + " · " + cap.at + " ms";
    div.append(who, document.createTextNode(cap.text));
    if (cap.cut) { const cut = document.createElement("span"); cut.className = "cut"; cut.textContent = cap.cut; div.append(cut); }
    return div;
  }));
  box.scrollTop = box.scrollHeight;
}

$("hangup").addEventListener("click", async () => {
  if (!selected) return;
  await fetch("/calls/" + encodeURIComponent(selected) + "/hangup", JSON_POST);
});

function connectFeed() {
  const es = new EventSource("/events");
  es.onopen = () => { $("feed-state").textContent = "live"; $("feed-state").className = "pill live"; };
  es.onerror = () => { $("feed-state").textContent = "reconnecting…"; $("feed-state").className = "pill"; };
  const on = (kind, fn) => es.addEventListener(kind, (e) => fn(JSON.parse(e.data)));
  on("call", onCall);
  on("gone", onGone);
  on("caption", onCaption);
  on("barge_in", onBargeIn);
  on("recovery", onRecovery);
  on("rollover", onRollover);
}

// --- the browser channel ---

const talk = { pc: null, analyser: null, peak: 0, callId: null };

function waitForIce(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", done); resolve(); } };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, 3000); // host candidates come at once, a STUN answer within this; never wait forever
  });
}

function meter() {
  if (!talk.analyser) return;
  const data = new Float32Array(talk.analyser.fftSize);
  talk.analyser.getFloatTimeDomainData(data);
  let peak = 0;
  for (const v of data) peak = Math.max(peak, Math.abs(v));
  talk.peak = Math.max(talk.peak, peak);
  $("talk-level").firstElementChild.style.width = Math.min(100, peak * 200) + "%";
  requestAnimationFrame(meter);
}

async function startTalk() {
  $("talk-status").textContent = "starting…";
  if (!navigator.mediaDevices) throw "no microphone access on this page: open it over HTTPS or from loopback";
  const conf = await fetch("/talk", { headers: { accept: "application/json" } });
  if (!conf.ok) { $("talk-status").textContent = "refused: " + (await conf.json()).error; return; }
  const { iceServers } = await conf.json(); // the bridge's STUN servers (--stun), none by default
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  const pc = new RTCPeerConnection({ iceServers });
  talk.pc = pc;
  mic.getTracks().forEach((t) => pc.addTrack(t, mic));
  pc.ontrack = (e) => {
    const stream = e.streams[0] || new MediaStream([e.track]);
    $("talk-audio").srcObject = stream;
    const ctx = new AudioContext();
    const src = ctx.createMediaStreamSource(stream);
    talk.analyser = ctx.createAnalyser();
    talk.analyser.fftSize = 2048;
    src.connect(talk.analyser);
    ctx.resume();
    requestAnimationFrame(meter);
  };
  pc.onconnectionstatechange = () => { $("talk-status").textContent = "WebRTC " + pc.connectionState; };
  await pc.setLocalDescription(await pc.createOffer());
  await waitForIce(pc);
  const res = await fetch("/talk", { ...JSON_POST, body: JSON.stringify({ type: "offer", sdp: pc.localDescription.sdp }) });
  const answer = await res.json();
  if (!res.ok) { $("talk-status").textContent = "refused: " + answer.error; stopTalk(); return; }
  talk.callId = answer.call_id;
  await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  $("talk").textContent = "Stop";
  $("talk").classList.add("on");
}

function stopTalk() {
  if (talk.pc) talk.pc.close();
  talk.pc = null;
  talk.analyser = null;
  $("talk").textContent = "Talk";
  $("talk").classList.remove("on");
  $("talk-status").textContent = "not talking";
}

$("talk").addEventListener("click", () => { if (talk.pc) stopTalk(); else startTalk().catch((e) => { $("talk-status").textContent = "error: " + e; }); });

// For tests and the curious: what the page has received on the browser channel.
window.talkStats = async function () {
  const out = { callId: talk.callId, state: talk.pc ? talk.pc.connectionState : "closed", peak: talk.peak,
                bytesReceived: 0, packetsReceived: 0, codec: null };
  if (!talk.pc) return out;
  const stats = await talk.pc.getStats();
  stats.forEach((r) => {
    if (r.type === "inbound-rtp" && r.kind === "audio") { out.bytesReceived = r.bytesReceived; out.packetsReceived = r.packetsReceived; }
    if (r.type === "codec" && r.mimeType && r.mimeType.startsWith("audio/") && !out.codec) out.codec = r.mimeType;
  });
  return out;
};

// --- signing in (only when the bridge has a token) ---

$("sign-in").addEventListener("submit", async (e) => {
  e.preventDefault();
  const res = await fetch("/session", { ...JSON_POST, body: JSON.stringify({ token: $("token").value }) });
  $("token").value = "";
  if (!res.ok) { $("sign-in-error").textContent = "refused: " + (await res.json()).error; return; }
  $("sign-in").hidden = true;
  connectFeed();
});

async function start() {
  const probe = await fetch("/calls", { headers: { accept: "application/json" } });
  if (probe.status === 401) {
    $("feed-state").textContent = "signed out";
    $("sign-in").hidden = false;
    $("token").focus();
    return;
  }
  connectFeed();
}

setInterval(render, 1000); // durations tick between feed updates
start();
