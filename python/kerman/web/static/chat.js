// The Kerman web chat: one AG-UI stream per session (GET /sessions/{id}/events), rendered as
// it arrives. The stream replays the session from its first event, so a reload rebuilds the
// transcript and the queue from the log; EventSource reconnects by itself with Last-Event-ID,
// and the server resumes exactly after it. No build step, no dependency.
"use strict";

const $ = (selector) => document.querySelector(selector);
const state = {
  session: null, source: null, messages: new Map(), tools: new Map(), tags: new Map(), queue: null,
  run: [],  // the elements the running turn added: marked when it is rolled back
  decisions: new Map(), waiting: false,  // decisions.js: each request and its resolution; the turn waits for them
  turn: null,  // the turn the stream is in (RUN_STARTED's runId), for its usage line
};

function showError(text) {
  const box = $("#error");
  box.textContent = text;
  box.hidden = !text;
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = (data.error && data.error.message) || `${method} ${path}: HTTP ${response.status}`;
    showError(message);
    const error = new Error(message);
    error.status = response.status;
    error.code = data.error && data.error.code;
    throw error;
  }
  showError("");
  return data;
}

const sessionPath = (...rest) => `/sessions/${encodeURIComponent(state.session)}${rest.join("")}`;

// -- the transcript ----------------------------------------------------------------------------

function bubble(id, role) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  el.dataset.messageId = id;
  const tag = state.tags.get(id);
  if (tag) {
    el.dataset.placement = tag;
    const label = document.createElement("span");
    label.className = "tag";
    label.textContent = tag;
    el.append(label);
  }
  const text = document.createElement("span");
  text.className = "text";
  el.append(text);
  if (role === "user") el.append(editControl(id, text));
  $("#transcript").append(el);
  state.messages.set(id, text);
  state.run.push(el);
  return text;
}

// "Edit an earlier message and continue from there": the session is forked just before the
// message was taken (POST /sessions/{id}/fork), the edited text runs in the fork, and the page
// moves to it; the original session stays as it is.
function editControl(id, text) {
  const edit = document.createElement("button");
  edit.type = "button";
  edit.className = "fork-edit";
  edit.textContent = "edit";
  edit.title = "Edit this message and continue from here in a new session (a fork); this one is kept";
  edit.onclick = () => {
    const el = edit.parentElement;
    const input = document.createElement("input");
    input.className = "fork-text";
    input.value = text.textContent;
    const save = document.createElement("button");
    save.type = "button";
    save.className = "fork-save";
    save.textContent = "continue from here";
    const close = () => { input.remove(); save.remove(); edit.hidden = false; };
    save.onclick = () => {
      save.disabled = true;
      api("POST", sessionPath("/fork"), { message_id: id, text: input.value })
        .then((fork) => { location.hash = `s=${encodeURIComponent(fork.id)}`; }, () => { save.disabled = false; });
    };
    input.onkeydown = (e) => { if (e.key === "Enter") save.onclick(); if (e.key === "Escape") close(); };
    edit.hidden = true;
    el.append(input, save);
    input.focus();
  };
  return edit;
}

function rolledBack(value) {
  for (const el of state.run) {
    el.classList.add("rolled-back");
    el.dataset.rolledBack = "true";
  }
  runEnd(`turn ${value.turn} rolled back: out of the conversation`, false);
}

function append(id, delta) {
  const text = state.messages.get(id);
  if (text) {
    text.textContent += delta;
    scroll();
  }
}

function scroll() {
  const t = $("#transcript");
  t.scrollTop = t.scrollHeight;
}

function toolCard(event) {
  const el = document.createElement("div");
  el.className = "tool";
  el.dataset.callId = event.toolCallId;
  const head = document.createElement("span");
  head.className = "call";
  head.textContent = `tool ${event.toolCallName}(`;
  const args = document.createElement("span");
  args.className = "args";
  const close = document.createTextNode(")");
  el.append(head, args, close);
  $("#transcript").append(el);
  state.tools.set(event.toolCallId, el);
  state.run.push(el);
  scroll();
}

function toolResult(event) {
  const el = state.tools.get(event.toolCallId);
  if (!el) return;
  const result = document.createElement("span");
  result.className = "result";
  result.textContent = typeof event.content === "string" ? event.content : JSON.stringify(event.content);
  const meta = event.metadata && event.metadata.kerman;
  if (meta && meta.isError) el.classList.add("error");
  el.append(result);
  el.dataset.done = "true";
  scroll();
}

// A running call's progress (tool/progress, an MCP server's notifications, coalesced): a bar
// with its percentage when the total is known (indeterminate otherwise) and the message, on
// the call's card, replaced by each update; the last one stays once the call has its result.
function toolProgress(value) {
  const el = state.tools.get(value.callId);
  if (!el) return;
  let box = el.querySelector(".progress");
  if (!box) {
    box = document.createElement("span");
    box.className = "progress";
    const bar = document.createElement("progress");
    const label = document.createElement("span");
    label.className = "progress-text";
    box.append(bar, label);
    const result = el.querySelector(".result");
    el.insertBefore(box, result);  // above the result when one is there (a replay keeps the order)
  }
  const bar = box.querySelector("progress");
  const total = typeof value.total === "number" && value.total > 0 ? value.total : null;
  const parts = [];
  if (total !== null) {
    bar.max = total;
    bar.value = Math.min(value.progress, total);
    const percent = Math.round((100 * value.progress) / total);
    box.dataset.percent = String(percent);
    parts.push(`${percent}%`);
  } else {
    bar.removeAttribute("value");  // indeterminate
    delete box.dataset.percent;
  }
  if (value.message) parts.push(value.message);
  if (value.task) box.dataset.task = value.task;
  box.querySelector(".progress-text").textContent = parts.join(" ");
  scroll();
}

function runEnd(text, isError) {
  const el = document.createElement("div");
  el.className = isError ? "run-end error" : "run-end";
  el.textContent = text;
  $("#transcript").append(el);
  scroll();
}

// Input a turn claimed but ended before reading (cancelled between its claim and its entry):
// not queued any more and not in the conversation, so shown here with a resend button.
const UNREAD = { aborted: "cancelled before it was read", blocked: "rejected before it was read" };

function unreadCard(value) {
  const el = document.createElement("div");
  el.className = "unread";
  el.dataset.unreadId = value.messageId;
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = value.text;
  const kind = value.reason && value.reason.kind;
  const note = document.createElement("span");
  note.className = "note";
  note.textContent = UNREAD[kind] || `not read: the turn ended ${kind}`;
  const resend = document.createElement("button");
  resend.type = "button";
  resend.className = "resend";
  resend.textContent = "resend";
  resend.onclick = () => { resend.disabled = true; api("POST", sessionPath("/requeue"), { turn: value.turn }).catch(() => { resend.disabled = false; }); };
  el.append(text, " ", note, " ", resend);
  $("#transcript").append(el);
  scroll();
}

// A compaction: a divider where it happened, saying what it replaced (the messages above it stay
// shown: the log keeps them; the model sees the summary instead from here on).
function compactionCard(value) {
  const el = document.createElement("details");
  el.className = "compaction";
  el.dataset.seq = value.seq;
  const head = document.createElement("summary");
  const what = value.revert ? "restored" : "compacted";
  head.textContent = `history ${what}: events ${value.first}–${value.last} (${value.strategy}, ${value.reason})` +
    (value.pinned && value.pinned.length ? `, ${value.pinned.length} pinned` : "");
  el.append(head);
  if (value.summary) {
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = value.summary;
    el.append(body);
  }
  $("#transcript").append(el);
  scroll();
}

function requeued(value) {
  for (const el of document.querySelectorAll(".unread")) {
    if (el.dataset.unreadId !== value.messageId) continue;
    el.dataset.resent = "true";
    el.querySelector(".note").textContent = "sent again";
    const resend = el.querySelector(".resend");
    if (resend) resend.remove();
  }
}

// -- usage (GET /sessions/{id}/usage: the usage ledger) -------------------------------------------
// A line under each ended turn and the session's total in the header, filled from the ledger once
// the stream has gone quiet for a moment (a replay ends many turns at once: one request for all).

let usageTimer = null;

function usageLine(turn) {
  if (!turn) return;
  const el = document.createElement("div");
  el.className = "usage";
  el.dataset.turn = String(turn);
  $("#transcript").append(el);
  refreshUsage();
}

function refreshUsage() {
  clearTimeout(usageTimer);
  const session = state.session;
  usageTimer = setTimeout(async () => {
    const response = await fetch(sessionPath("/usage"), { credentials: "same-origin" }).catch(() => null);
    if (!response || !response.ok || session !== state.session) return;
    const usage = await response.json();
    const total = $("#usage-total");
    total.textContent = `session: ${usage.session.summary}`;
    total.dataset.tokens = String(usage.session.tokens);
    for (const turn of usage.turns) {
      for (const el of document.querySelectorAll(`.usage[data-turn="${turn.turn}"]`)) {
        el.textContent = `turn ${turn.turn}: ${turn.summary}`;
        el.dataset.tokens = String(turn.tokens);
      }
    }
  }, 150);
}

const turnOf = (runId) => { const m = /^turn-(\d+)/.exec(runId || ""); return m ? Number(m[1]) : null; };

function setStatus(status, text) {
  const el = $("#status");
  el.dataset.status = status;
  el.textContent = text || status;
}

// -- the queue (AG-UI shared state: one snapshot, then JSON Patch deltas) ------------------------

function patch(doc, ops) {
  for (const op of ops) {
    const keys = op.path.split("/").slice(1).map((k) => k.replace(/~1/g, "/").replace(/~0/g, "~"));
    const last = keys.pop();
    let parent = doc;
    for (const key of keys) parent = parent[Array.isArray(parent) ? Number(key) : key];
    if (op.op === "add") {
      if (Array.isArray(parent)) parent.splice(last === "-" ? parent.length : Number(last), 0, op.value);
      else parent[last] = op.value;
    } else if (op.op === "remove") {
      if (Array.isArray(parent)) parent.splice(Number(last), 1);
      else delete parent[last];
    } else if (op.op === "replace") {
      parent[Array.isArray(parent) ? Number(last) : last] = op.value;
    }
  }
  return doc;
}

function renderQueue() {
  const list = $("#queue");
  const editing = list.querySelector("input");
  if (editing) return; // do not pull the field from under the user; rendered again after saving
  list.replaceChildren();
  const items = state.queue ? [...state.queue.queue.nextTurn, ...state.queue.queue.nextStep] : [];
  $("#queue-empty").hidden = items.length > 0;
  for (const item of items) {
    const li = document.createElement("li");
    li.dataset.id = item.id;
    li.dataset.placement = item.placement;
    const placement = document.createElement("span");
    placement.className = "placement";
    placement.textContent = item.placement;
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = item.text;
    const edit = document.createElement("button");
    edit.type = "button";
    edit.className = "edit";
    edit.textContent = "edit";
    edit.onclick = () => startEdit(li, item);
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "remove";
    remove.textContent = "remove";
    // Over a PostgresStore the owning worker applies it: one click until it answered.
    remove.onclick = () => {
      remove.disabled = true;
      api("DELETE", sessionPath(`/queue/${encodeURIComponent(item.id)}`)).catch(() => {}).finally(() => { remove.disabled = false; });
    };
    li.append(placement, text, " ", edit, " ", remove);
    list.append(li);
  }
}

function startEdit(li, item) {
  const input = document.createElement("input");
  input.value = item.text;
  input.className = "edit-text";
  const save = document.createElement("button");
  save.type = "button";
  save.className = "save";
  save.textContent = "save";
  const done = () => { li.replaceChildren(); renderQueue(); };
  save.onclick = () => {
    input.remove();
    api("PATCH", sessionPath(`/queue/${encodeURIComponent(item.id)}`), { text: input.value }).catch(() => {}).finally(done);
  };
  input.onkeydown = (e) => { if (e.key === "Enter") save.onclick(); if (e.key === "Escape") { input.remove(); done(); } };
  li.replaceChildren(input, save);
  input.focus();
}

// -- the stream ------------------------------------------------------------------------------------

const handlers = {
  RUN_STARTED: (e) => { state.waiting = false; state.turn = turnOf(e.runId); state.run = []; setStatus("running"); },
  RUN_FINISHED: (e) => {
    state.waiting = e.outcome && e.outcome.type === "interrupt";
    if (state.waiting) { decisionStatus(); return; }  // the turn goes on once the person decided
    setStatus("idle");
    usageLine(turnOf(e.runId));  // under the reply, before the line that says how the turn ended
    const reason = e.result && e.result.reason;
    if (reason && reason.kind !== "completed") runEnd(`turn ${reason.kind}${reason.reason ? ": " + JSON.stringify(reason.reason) : ""}`, false);
  },
  RUN_ERROR: (e) => {
    state.waiting = false;
    setStatus("idle");
    usageLine(state.turn);
    runEnd(`turn failed: ${e.message}${e.code ? " [" + e.code + "]" : ""}`, true);
  },
  TEXT_MESSAGE_START: (e) => bubble(e.messageId, e.role || "assistant"),
  TEXT_MESSAGE_CONTENT: (e) => append(e.messageId, e.delta),
  REASONING_MESSAGE_START: (e) => bubble(e.messageId, "reasoning"),
  REASONING_MESSAGE_CONTENT: (e) => append(e.messageId, e.delta),
  TOOL_CALL_START: toolCard,
  TOOL_CALL_ARGS: (e) => { const el = state.tools.get(e.toolCallId); if (el) el.querySelector(".args").textContent += e.delta; },
  TOOL_CALL_RESULT: toolResult,
  STATE_SNAPSHOT: (e) => { state.queue = structuredClone(e.snapshot); renderQueue(); },
  STATE_DELTA: (e) => { if (state.queue) { patch(state.queue, e.delta); renderQueue(); } },
  CUSTOM: (e) => {
    if (e.name === "kerman.steering" || e.name === "kerman.context") state.tags.set(e.value.messageId, e.name.slice(7));
    else if (e.name === "kerman.unread") unreadCard(e.value);
    else if (e.name === "kerman.requeued") requeued(e.value);
    else if (e.name === "kerman.decision/requested") decisionRequested(e.value, true);
    else if (e.name === "kerman.decision/resolved") decisionResolved(e.value);
    else if (e.name === "kerman.context/compacted") compactionCard(e.value);
    else if (e.name === "kerman.turn/rolled-back") rolledBack(e.value);
    else if (e.name === "kerman.tool/progress") toolProgress(e.value);
  },
};

function connect(sessionId) {
  if (state.source) state.source.close();
  state.session = sessionId;
  state.messages.clear();
  state.tools.clear();
  state.tags.clear();
  state.run = [];
  state.queue = null;
  clearDecisions();
  state.turn = null;
  $("#usage-total").textContent = "";
  $("#transcript").replaceChildren();
  renderQueue();
  setStatus("idle");
  const source = new EventSource(sessionPath("/events?protocol=agui"));
  state.source = source;
  const connection = $("#connection");
  source.onopen = () => { connection.dataset.state = "open"; connection.textContent = "live"; readDecisions(sessionId); };
  source.onerror = () => { connection.dataset.state = "error"; connection.textContent = "reconnecting"; };
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    const handle = handlers[event.type];
    if (handle) handle(event);
  };
}

async function loadSessions(selected) {
  const { sessions } = await api("GET", "/sessions");
  const picker = $("#session");
  picker.replaceChildren(...sessions.map((s) => new Option(s.id, s.id)));
  if (selected) picker.value = selected;
}

async function newSession() {
  const session = await api("POST", "/sessions", {});
  location.hash = `s=${encodeURIComponent(session.id)}`;
}

async function fromHash() {
  const match = /^#s=(.+)$/.exec(location.hash);
  if (!match) {
    const { sessions } = await api("GET", "/sessions");
    if (sessions.length) location.hash = `s=${encodeURIComponent(sessions[sessions.length - 1].id)}`;
    else await newSession();
    return;
  }
  const id = decodeURIComponent(match[1]);
  await loadSessions(id);
  connect(id);
}

function send(event) {
  event.preventDefault();
  const prompt = $("#prompt");
  const text = prompt.value;
  if (!text.trim() || !state.session) return;
  const body = { text, delivery: $("#delivery").value };
  const onBusy = $("#on-busy").value;
  if (body.delivery === "followup" && onBusy) body.on_busy = onBusy;
  api("POST", sessionPath("/messages"), body).then(() => { prompt.value = ""; }, () => {});
}

window.addEventListener("DOMContentLoaded", () => {
  $("#composer").addEventListener("submit", send);
  $("#prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("#composer").requestSubmit(); }
  });
  $("#cancel").addEventListener("click", () => {
    const button = $("#cancel");
    button.disabled = true;  // until the session's owner answered
    api("POST", sessionPath("/cancel"), { keep_inbox: $("#keep-inbox").checked }).catch(() => {})
      .finally(() => { button.disabled = false; });
  });
  $("#new-session").addEventListener("click", () => newSession().catch(() => {}));
  const decider = $("#decider");
  try {  // storage may be off (a private window's settings): the name then lasts as long as the page
    decider.value = localStorage.getItem("kerman.decider") || "";
    decider.addEventListener("input", () => localStorage.setItem("kerman.decider", decider.value));
  } catch (_) { /* nothing to remember it in */ }
  $("#session").addEventListener("change", (e) => { location.hash = `s=${encodeURIComponent(e.target.value)}`; });
  window.addEventListener("hashchange", () => fromHash().catch(() => {}));
  fromHash().catch(() => {});
});
