// The svc dashboard: one snapshot over /ws (ops_state), the runs views over /api/v1/runs, and the
// per-issue trace viewer (events, events_append). No framework, no build step, no fetch from the
// internet. Reconnects every 3 seconds and re-subscribes.
'use strict';

const $ = (id) => document.getElementById(id);
const state = { snapshot: null, tickets: [], selected: null, events: [], runsView: 'runs', ws: null };

// Steering turns delivered, what waits, and the last message (author, source, text) as its title.
function steeringCell(r) {
  const last = r.last_steering;
  const text = (r.steering_turns || 0) + (r.steering_pending ? ` (+${r.steering_pending})` : '') + (last ? ` · ${last.author}: ${last.text}` : '');
  return el('td', { class: 'msg steering', title: last ? `${last.author} via ${last.source} at ${last.at}: ${last.text}` : '' }, text);
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else if (k.startsWith('on')) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c.nodeType ? c : String(c));
  return e;
}
const na = (v) => (v === null || v === undefined || v === '' ? 'n/a' : v);
const num = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : na(n));
const time = (t) => (t ? new Date(t).toLocaleTimeString() : 'n/a');
const dur = (ms) => (typeof ms !== 'number' ? 'n/a' : ms >= 1000 ? (ms / 1000).toFixed(1) + ' s' : ms + ' ms');

function fillTable(id, rows, empty) {
  const body = $(id).tBodies[0];
  body.replaceChildren(...(rows.length ? rows : [el('tr', { class: 'empty' }, el('td', { colspan: $(id).tHead.rows[0].cells.length }, empty))]));
}

function issueLink(identifier, issueId) {
  return el('a', { href: '#/traces/' + encodeURIComponent(issueId) }, identifier);
}

// An issue's link with its ensemble slot, when the issue runs in several (`ABC-1 [1/3]`).
function slotLink(r) {
  const link = issueLink(r.issue_identifier, r.issue_id);
  return r.ensemble_size > 1 ? el('span', {}, link, ` [${r.slot_index}/${r.ensemble_size}]`) : link;
}

function renderOverview() {
  const s = state.snapshot;
  if (!s || s.error) return;
  $('c-running').textContent = s.counts.running;
  $('c-retrying').textContent = s.counts.retrying;
  $('c-blocked').textContent = s.counts.blocked;
  const waiting = s.waiting_on_blockers || [];
  $('c-waiting').textContent = waiting.length;
  $('c-tokens').textContent = num(s.usage_totals.input_tokens) + ' / ' + num(s.usage_totals.output_tokens);
  renderClock();
  $('c-rate').textContent = s.rate_limits ? JSON.stringify(s.rate_limits) : 'none reported';
  const p = s.worker_pool;
  $('c-pool').textContent = p
    ? `${p.driver}: ${p.live} live, ${p.idle} idle, ${p.leased} leased` + (s.reserving ? `, ${s.reserving} reserving` : '') +
      ` · ${num(p.spend.worker_seconds)} worker-s` + (p.capped ? ` · CAPPED: ${p.capped}` : '')
    : 'none: runs execute on this host';
  fillTable('running', s.running.map((r) => el('tr', {},
    el('td', {}, slotLink(r)), el('td', {}, r.state), el('td', {}, r.agent_kind),
    el('td', {}, r.reserving ? 'reserving…' : (r.worker_host || 'this host')),
    el('td', { class: 'num' }, r.turn_count), steeringCell(r), el('td', { class: 'num' }, num(r.tokens.total_tokens)),
    el('td', {}, na(r.last_event)), el('td', { class: 'msg', title: r.last_message || '' }, na(r.last_message)), el('td', {}, time(r.started_at)))), 'Nothing is running.');
  fillTable('retrying', s.retrying.map((r) => el('tr', {},
    el('td', {}, slotLink(r)), el('td', { class: 'num' }, r.attempt), el('td', {}, time(r.due_at)), el('td', { class: 'msg', title: r.error || '' }, na(r.error)))), 'No retries waiting.');
  fillTable('blocked', s.blocked.map((b) => el('tr', {},
    el('td', {}, b.issue_identifier), el('td', {}, b.state), el('td', {}, b.label))), 'Nothing is blocked.');
  fillTable('waiting', waiting.map((w) => el('tr', {},
    el('td', {}, w.issue_identifier), el('td', {}, w.state),
    el('td', {}, w.blockers.map((b) => `${b.identifier} (${b.state})`).join(', ') + (w.cycle ? ' · a cycle of blockers' : '')))),
  'Nothing waits for a blocker.');
  $('events').replaceChildren(...(s.recent_events || []).map((e) => el('li', {}, time(e.at) + ' ', el('b', {}, e.event), ' ' + e.message)));
}

// The daemon publishes ops_state only when something changed, so what moves with the clock
// alone is computed here: seconds running grow by the running count since the snapshot, and the
// heartbeat comes from /api/v1/daemon every 5 s (its age computed by the daemon at read time).
function renderClock() {
  const s = state.snapshot;
  if (s && !s.error) {
    const since = Math.max(0, (Date.now() - Date.parse(s.generated_at)) / 1000);
    $('c-seconds').textContent = Math.round(s.usage_totals.seconds_running + s.counts.running * since) + ' s';
  }
  const d = state.daemon || (s && s.daemon);
  if (!d) { $('daemon').textContent = 'no daemon status'; return; }
  const age = state.daemonAt ? d.heartbeat_age_ms + (Date.now() - state.daemonAt) : null;
  const beat = age === null ? time(d.heartbeat_at) : (d.stale ? 'STALE, ' : '') + (age / 1000).toFixed(1) + ' s ago';
  $('daemon').textContent = `pid ${d.pid} on ${d.hostname} · ${d.workflow_path} · heartbeat ${beat}`;
}

async function loadDaemon() {
  try {
    const r = await fetch('/api/v1/daemon');
    if (r.ok) { state.daemon = await r.json(); state.daemonAt = Date.now(); }
  } catch (e) { /* offline: the link indicator says so */ }
  renderClock();
}

async function loadRuns() {
  const q = state.runsView === 'runs' ? '?limit=50' : '?' + state.runsView + '=true';
  let body;
  try { body = await (await fetch('/api/v1/runs' + q)).json(); } catch (e) { return; }
  const out = $('runs-body');
  if (body.view === 'cost') {
    $('runs-summary').textContent = 'Tokens per agent (USD is not computed).';
    const t = el('table', {}, el('thead', {}, el('tr', {}, ...['Agent', 'Runs', 'Done', 'Input', 'Output', 'Total', 'Avg/run'].map((h) => el('th', {}, h)))),
      el('tbody', {}, ...body.summary.agents.map((a) => el('tr', {}, el('td', {}, a.agent_kind), el('td', { class: 'num' }, a.runs), el('td', { class: 'num' }, a.done),
        el('td', { class: 'num' }, num(a.input_tokens)), el('td', { class: 'num' }, num(a.output_tokens)), el('td', { class: 'num' }, num(a.total_tokens)), el('td', { class: 'num' }, num(Math.round(a.avg_tokens_per_run)))))));
    out.replaceChildren(t);
  } else if (body.view === 'retries') {
    $('runs-summary').textContent = body.issues.length + ' issues needed retries.';
    out.replaceChildren(el('table', {}, el('thead', {}, el('tr', {}, ...['Issue', 'Attempts', 'Latest outcome', 'Tokens', 'Run', 'Failure'].map((h) => el('th', {}, h)))),
      el('tbody', {}, ...body.issues.map((i) => el('tr', {}, el('td', {}, i.issue_identifier), el('td', { class: 'num' }, i.attempts), el('td', {}, i.latest_outcome),
        el('td', { class: 'num' }, num(i.total_tokens)), el('td', {}, i.run_id), el('td', { class: 'msg' }, na(i.failure_reason)))))));
  } else {
    const s = body.summary;
    $('runs-summary').textContent = `${s.total} runs: ${s.running} running, ${s.success} success, ${s.failed} failed, ${s.stalled} stalled, ${s.canceled} canceled`;
    out.replaceChildren(el('table', {}, el('thead', {}, el('tr', {}, ...['Run', 'Issue', 'Agent', 'Worker', 'Outcome', 'Attempt', 'Turns', 'Tokens', 'Duration', 'Failure'].map((h) => el('th', {}, h)))),
      el('tbody', {}, ...body.runs.map((r) => el('tr', {}, el('td', {}, r.id), el('td', {}, slotLink(r)), el('td', {}, r.agent_kind), el('td', {}, r.worker_host || 'this host'), el('td', {}, r.outcome),
        el('td', { class: 'num' }, r.retry_attempt), el('td', { class: 'num' }, r.turn_count), el('td', { class: 'num' }, num(r.tokens.total_tokens)), el('td', {}, dur(r.duration_ms)), el('td', { class: 'msg' }, na(r.failure_reason)))))));
  }
}

function renderTickets() {
  $('tickets').replaceChildren(...state.tickets.map((t) => {
    const li = el('li', { tabindex: '0', role: 'option', 'aria-selected': String(t.issueId === state.selected) },
      el('span', { class: 'st' }, t.status), t.identifier, el('br'), el('small', {}, t.title || ''));
    const open = () => { location.hash = '#/traces/' + encodeURIComponent(t.issueId); };
    li.addEventListener('click', open);
    li.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); open(); } });
    return li;
  }));
}

function renderEvent(e) {
  const meta = (text) => el('span', { class: 'meta' }, time(e.at) + (text ? ' · ' + text : ''));
  switch (e.kind) {
    case 'message': return el('li', { class: 'message' }, meta('agent'), e.text);
    case 'thought': return el('li', { class: 'thought' }, meta('thought'), e.text);
    case 'user_message': return el('li', { class: 'message steering' }, meta(e.author ? `from ${e.author} via ${na(e.source)}` : 'user'), e.text);
    case 'tool_call': return el('li', { class: 'tool_call' + (e.error ? ' error' : '') }, meta('tool ' + na(e.toolKind)), e.title || e.toolCallId,
      el('span', { class: 'tag' + (e.error ? ' bad' : '') }, e.status), el('span', { class: 'tag' }, dur(e.durationMs)));
    case 'plan': return el('li', {}, meta('plan'), (e.entries || []).map((p) => (p.status === 'completed' ? '✓ ' : '· ') + p.content).join('\n'));
    case 'permission': return el('li', {}, meta('permission'), e.title + ' → ' + e.decision);
    case 'turn_started': return el('li', {}, meta(), 'Turn ' + e.turn + ' started');
    case 'turn_completed': return el('li', {}, meta(), 'Turn ' + e.turn + ' ended: ' + na(e.stopReason));
    case 'turn_failed': return el('li', { class: 'turn_failed' }, meta(), 'Turn ' + na(e.turn) + ' failed: ' + na(e.error));
    case 'hook': return el('li', { class: e.ok ? '' : 'error' }, meta('hook'), e.hook + (e.ok ? ' ok' : ' failed: ' + na(e.error)));
    case 'notice': return el('li', {}, meta(), e.text);
    default: return el('li', {}, meta(e.type || e.kind));
  }
}

function renderTimeline() {
  const t = state.tickets.find((x) => x.issueId === state.selected);
  $('trace-title').textContent = state.selected ? (t ? t.identifier + ' · ' + (t.title || '') : state.selected) : 'Pick an issue';
  $('timeline').replaceChildren(...state.events.map(renderEvent));
}

function route() {
  const hash = location.hash || '#/';
  const [, view, id] = hash.match(/^#\/([^/]*)\/?(.*)$/) || [];
  const which = view === 'runs' ? 'runs' : view === 'traces' ? 'traces' : 'overview';
  for (const s of ['overview', 'runs', 'traces']) {
    $(s).hidden = s !== which;
    $('nav-' + s).setAttribute('aria-current', s === which ? 'page' : 'false');
  }
  if (which === 'runs') loadRuns();
  if (which === 'traces') {
    const wanted = id ? decodeURIComponent(id) : null;
    if (wanted !== state.selected) {
      if (state.selected) send({ type: 'unsubscribe', issueId: state.selected });
      state.selected = wanted;
      state.events = [];
      if (wanted) send({ type: 'subscribe', issueId: wanted });
    }
    renderTickets();
    renderTimeline();
  }
}

function send(msg) {
  if (state.ws && state.ws.readyState === 1) state.ws.send(JSON.stringify(msg));
}

function connect() {
  const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws');
  state.ws = ws;
  ws.onopen = () => {
    $('link').textContent = 'live'; $('link').classList.add('live');
    if (state.selected) send({ type: 'subscribe', issueId: state.selected });
  };
  ws.onmessage = (m) => {
    let msg; try { msg = JSON.parse(m.data); } catch (e) { return; }
    if (msg.type === 'ops_state') { state.snapshot = msg.state; renderOverview(); }
    else if (msg.type === 'init' || msg.type === 'update') { state.tickets = msg.tickets || []; renderTickets(); renderTimeline(); }
    else if (msg.type === 'events' && msg.issueId === state.selected) { state.events = msg.events || []; renderTimeline(); }
    else if (msg.type === 'events_append' && msg.issueId === state.selected) {
      if (msg.fromIndex > state.events.length) { send({ type: 'subscribe', issueId: state.selected }); return; }
      state.events.splice(msg.fromIndex, state.events.length - msg.fromIndex, ...msg.events);
      renderTimeline();
    }
  };
  ws.onclose = () => {
    $('link').textContent = 'offline, reconnecting'; $('link').classList.remove('live');
    setTimeout(connect, 3000);
  };
}

for (const b of document.querySelectorAll('.tabs button')) {
  b.addEventListener('click', () => {
    state.runsView = b.dataset.view;
    for (const x of document.querySelectorAll('.tabs button')) x.setAttribute('aria-pressed', String(x === b));
    loadRuns();
  });
}
window.addEventListener('hashchange', route);
setInterval(() => { if (!$('runs').hidden) loadRuns(); }, 5000);
setInterval(loadDaemon, 5000);
setInterval(renderClock, 1000);
loadDaemon();
connect();
route();
