// The web chat's decisions (docs/decisions.md): the requests a waiting turn puts to a person,
// with approve / deny / edit-the-arguments / answer forms, and who decided what once resolved.
// Requests and resolutions come from the AG-UI stream (CUSTOM kerman.decision/requested and
// kerman.decision/resolved); GET /sessions/{id}/decisions reads the pending ones back when the
// stream (re)opens. Both only ever add to what is known: a request once resolved stays resolved,
// so their order does not matter. Uses chat.js's globals ($, api, state, sessionPath, setStatus).
"use strict";

const OUTCOME_TEXT = { approved: "approved", denied: "denied", edited: "edited", answered: "answered", expired: "expired", cancelled: "cancelled" };

// A request as the stream logs it (camelCase) or as GET lists it (snake_case).
function normalRequest(r) {
  return {
    decisionId: r.decisionId || r.decision_id,
    callId: r.callId || r.call_id,
    name: r.name,
    arguments: r.arguments,
    kind: r.kind,
    note: r.note || null,
    schema: r.schema || null,
    expiresAt: r.expiresAt || r.expires_at || null,
  };
}

function decisionEntry(id) {
  let entry = state.decisions.get(id);
  if (!entry) {
    entry = { request: null, resolution: null, card: null, tool: null };
    state.decisions.set(id, entry);
  }
  return entry;
}

// From the stream, the request comes right after the announcement of its call, so the call's
// card is the latest one with its id (a model may use an id again in a later turn); from GET it
// is shown in the panel only, and bound to its call's card when the stream gets there.
function decisionRequested(raw, fromStream) {
  const request = normalRequest(raw);
  const entry = decisionEntry(request.decisionId);
  if (!entry.request) {
    entry.request = request;
    if (!entry.resolution) entry.card = decisionCard(request);
  }
  if (fromStream && !entry.tool) {
    entry.tool = state.tools.get(request.callId) || null;
    markTool(entry);
  }
  decisionStatus();
}

function decisionResolved(resolution) {
  const entry = decisionEntry(resolution.decisionId);
  entry.resolution = resolution;
  if (entry.card) {
    entry.card.remove();
    entry.card = null;
  }
  markTool(entry);
  decisionStatus();
}

function pendingDecisions() {
  return [...state.decisions.values()].filter((e) => e.request && !e.resolution);
}

// The status line while the turn waits: how many requests are still open.
function decisionStatus() {
  const open = pendingDecisions().length;
  $("#decisions").hidden = open === 0;
  if (state.waiting) setStatus("waiting", open ? `waiting for ${open} decision${open === 1 ? "" : "s"}` : "waiting");
}

function resolutionText(r) {
  let text = OUTCOME_TEXT[r.outcome] || r.outcome;
  if (r.by) text += ` by ${r.by}`;
  if (r.outcome === "denied" && r.reason) text += `: ${r.reason}`;
  if (r.outcome === "edited" && r.arguments !== undefined) text += `: ${r.arguments}`;
  if (r.outcome === "answered" && "value" in r) text += `: ${JSON.stringify(r.value)}`;
  return text;
}

// The transcript's tool card of a call that waits (or waited) for a person says so.
function markTool(entry) {
  const tool = entry.tool;
  if (!tool) return;
  let line = tool.querySelector(".decision-state");
  if (!line) {
    line = document.createElement("span");
    line.className = "decision-state";
    const result = tool.querySelector(".result");
    if (result) tool.insertBefore(line, result);
    else tool.append(line);
  }
  line.dataset.outcome = entry.resolution ? entry.resolution.outcome : "pending";
  line.textContent = entry.resolution ? resolutionText(entry.resolution) : "waiting for a decision";
}

// -- the forms -------------------------------------------------------------------------------------

let fieldIds = 0;

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function button(className, text, label, describedBy) {
  const el = element("button", className, text);
  el.type = "button";
  if (label) el.setAttribute("aria-label", label);
  if (describedBy) el.setAttribute("aria-describedby", describedBy);  // which call: its arguments
  return el;
}

function labelled(text, field) {
  field.id = `decision-field-${++fieldIds}`;
  const label = element("label", null, text);
  label.htmlFor = field.id;
  return label;
}

// A key per submit: a double click sends one request (the buttons are disabled until the server
// answered), and a retried request with the same key would be applied once.
function decisionKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "web-" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (_) {
    return text;
  }
}

// JSON text to a value, or an explanation of why it is not one (shown before anything is sent).
function parsed(text, what, objectOnly) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return { error: `${what} ${what.endsWith("s") ? "are" : "is"} not valid JSON: ${error.message}` };
  }
  if (objectOnly && (value === null || typeof value !== "object" || Array.isArray(value))) {
    return { error: `${what} must be a JSON object, like {"name": "value"}` };
  }
  return { value };
}

function decisionCard(request) {
  const card = element("article", "decision");
  card.dataset.decisionId = request.decisionId;
  card.dataset.callId = request.callId;
  card.dataset.name = request.name;
  card.dataset.kind = request.kind;
  const title = element("h3", "decision-title", request.kind === "answer" ? `${request.name} asks: ` : `Run ${request.name}? `);
  title.id = `decision-title-${++fieldIds}`;
  card.setAttribute("aria-labelledby", title.id);
  title.append(element("code", "decision-arguments", request.arguments));
  card.append(title);
  if (request.note) card.append(element("p", "note", request.note));
  if (request.expiresAt) card.append(element("p", "expires", `expires ${new Date(request.expiresAt).toLocaleString()}`));
  const problem = element("p", "decision-error");
  problem.id = `decision-error-${++fieldIds}`;
  problem.setAttribute("role", "alert");
  problem.hidden = true;
  const say = (text) => { problem.textContent = text; problem.hidden = !text; };

  const send = (body, field) => {
    const by = $("#decider").value.trim() || "web";
    const buttons = [...card.querySelectorAll("button")];
    buttons.forEach((b) => { b.disabled = true; });
    say("");
    api("POST", sessionPath(`/decisions/${encodeURIComponent(request.decisionId)}`), { ...body, by, key: decisionKey() })
      .then(() => { card.dataset.sent = "true"; })
      .catch((error) => {
        const code = error.code;
        const why = code === "decision-resolved" ? "Someone decided this already."
          : code === "decision-expired" ? "This request expired."
          : code === "decision-not-found" ? "The session has no such request any more."
          : "Not decided.";
        say(`${why} The server said: ${error.message}`);
        // A request decided or expired elsewhere is shown as the log has it once the stream
        // brings its resolution; until then its buttons stay off.
        if (!["decision-resolved", "decision-expired", "decision-not-found"].includes(code)) buttons.forEach((b) => { b.disabled = false; });
        if (field) field.focus();
      });
  };

  const denyRow = element("div", "deny-row");
  const reason = element("input", "reason");
  reason.type = "text";
  reason.placeholder = "optional";
  const deny = button("deny", request.kind === "answer" ? "Decline" : "Deny", `${request.kind === "answer" ? "Decline" : "Deny"} ${request.name}`, title.id);
  deny.onclick = () => send(reason.value.trim() ? { outcome: "deny", reason: reason.value.trim() } : { outcome: "deny" });
  reason.onkeydown = (e) => { if (e.key === "Enter") { e.preventDefault(); deny.click(); } };
  denyRow.append(labelled("reason", reason), reason, deny);

  if (request.kind === "answer") {
    if (request.schema) {
      const schema = element("details", "schema");
      schema.append(element("summary", null, "expected answer (JSON Schema)"), element("pre", null, JSON.stringify(request.schema, null, 2)));
      card.append(schema);
    }
    const answer = element("textarea", "answer");
    answer.rows = 2;
    answer.setAttribute("aria-describedby", problem.id);
    const asJson = element("input", "answer-json");
    asJson.type = "checkbox";
    const type = request.schema && request.schema.type;
    asJson.checked = !(request.schema === null || type === "string" || (Array.isArray(type) && type.includes("string")));
    const submit = button("send-answer", "Send answer", `Answer ${request.name}`, title.id);
    submit.onclick = () => {
      let value = answer.value;
      if (asJson.checked) {
        const got = parsed(answer.value, "The answer", false);
        answer.setAttribute("aria-invalid", got.error ? "true" : "false");
        if (got.error) { say(got.error); answer.focus(); return; }
        value = got.value;
      }
      send({ outcome: "answer", value }, answer);
    };
    answer.onkeydown = (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); submit.click(); } };
    const row = element("div", "actions");
    row.append(submit, " ", labelled("as JSON", asJson), asJson);
    card.append(labelled("Your answer (Ctrl+Enter sends)", answer), answer, row, denyRow);
  } else {
    const approve = button("approve", "Approve", `Approve ${request.name}`, title.id);
    approve.onclick = () => send({ outcome: "approve" });
    const edit = button("edit", "Edit arguments", `Edit the arguments of ${request.name}`, title.id);
    edit.setAttribute("aria-expanded", "false");
    const editor = element("div", "editor");
    editor.hidden = true;
    const args = element("textarea", "arguments");
    args.rows = 4;
    args.spellcheck = false;
    args.setAttribute("aria-describedby", problem.id);
    const sendEdit = button("send-edit", "Run with these arguments", `Run ${request.name} with these arguments`);
    const close = button("cancel-edit", "Cancel", "Cancel editing");
    const closeEditor = () => { editor.hidden = true; edit.setAttribute("aria-expanded", "false"); say(""); edit.focus(); };
    edit.onclick = () => {
      if (editor.hidden) args.value = pretty(request.arguments);
      editor.hidden = false;
      edit.setAttribute("aria-expanded", "true");
      args.focus();
    };
    sendEdit.onclick = () => {
      const got = parsed(args.value, "The arguments", true);
      args.setAttribute("aria-invalid", got.error ? "true" : "false");
      if (got.error) { say(got.error); args.focus(); return; }
      send({ outcome: "edit", arguments: got.value }, args);
    };
    close.onclick = closeEditor;
    args.onkeydown = (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); sendEdit.click(); }
      if (e.key === "Escape") { e.preventDefault(); closeEditor(); }
    };
    editor.append(labelled("Arguments, a JSON object (Ctrl+Enter sends, Escape closes)", args), args, sendEdit, " ", close);
    const row = element("div", "actions");
    row.append(approve, " ", edit, denyRow);
    card.append(row, editor);
  }
  card.append(problem);
  $("#decisions-list").append(card);
  return card;
}

// The pending requests as the server lists them: after a reload, or when the stream reopens.
// Not through api(): a background read neither shows nor clears the error line.
function readDecisions(sessionId) {
  fetch(`/sessions/${encodeURIComponent(sessionId)}/decisions`, { credentials: "same-origin" })
    .then((response) => (response.ok ? response.json() : { decisions: [] }))
    .then(({ decisions }) => {
      if (state.session !== sessionId) return;
      for (const request of decisions) decisionRequested(request, false);
      if (decisions.length && !state.waiting) {
        state.waiting = true;
        decisionStatus();
      }
    })
    .catch(() => {});
}

function clearDecisions() {
  state.decisions.clear();
  state.waiting = false;
  $("#decisions-list").replaceChildren();
  $("#decisions").hidden = true;
}
