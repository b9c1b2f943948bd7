// The svc dashboard: one snapshot over /ws (ops_state), the runs views over /api/v1/runs, issue
// search and recent issues over /api/v1/issues/*, and the per-issue trace viewer (events,
// events_append) with the agent's Markdown. No framework, no build step, no fetch from the
// internet. Reconnects every 3 seconds and re-subscribes.
//
// Acting (steering, cancel) needs the control token, which only the operator hands over: `svc
// open` prints a URL carrying it in the fragment (#token=...), which browsers never send to a
// server. The page moves it to this tab's sessionStorage at once and takes it out of the address
// bar and history; without it the page is read-only.
'use strict';

const $ = (id) => document.getElementById(id);
const state = { snapshot: null, tickets: [], selected: null, events: [], runsView: 'runs', ws: null, workflow: '' };

const TOKEN_KEY = 'svc-control-token';
function takeToken() {
  const m = location.hash.match(/^#token=([^&]*)/);
  if (!m) return;
  try { sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1])); } catch (e) { /* storage off: read-only */ }
  history.replaceState(null, '', location.pathname + location.search + '#/');
}
function token() {
  try { return sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
}
function renderControl() {
  const on = !!token();
  $('control').textContent = on ? 'control: this tab' : 'read-only';
  $('control').classList.toggle('control', on);
  $('forget').hidden = !on;
}

// Markdown, a safe subset (headings, nested lists, code, quotes, tables, emphasis, links): every
// node is built from text with createElement and append, never parsed as HTML, so markup in the
// text stays text; only http(s) and mailto targets become links, and images are left as text.
const safeHref = (url) => (/^(https?:\/\/|mailto:)/i.test(url.trim()) ? url.trim() : null);
const link = (href, kids) => el('a', { href, rel: 'noopener noreferrer nofollow', target: '_blank' }, ...kids);
const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)|\*(?=[^\s*])([^*]*?[^\s*])\*|(?<!\w)_(?=[^\s_])([^_]*?[^\s_])_(?!\w)|!?\[([^\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)|<((?:https?:\/\/|mailto:)[^>\s]+)>|(https?:\/\/[^\s<]*[^\s<.,;:!?)\]'"])/g;
function inline(text) {
  const out = [];
  const re = new RegExp(INLINE.source, 'g');
  let last = 0;
  let m;
  while ((m = re.exec(text))) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[1]) out.push(el('code', {}, m[2]));
    else if (m[3] !== undefined || m[4] !== undefined) out.push(el('strong', {}, ...inline(m[3] ?? m[4])));
    else if (m[5] !== undefined || m[6] !== undefined) out.push(el('em', {}, ...inline(m[5] ?? m[6])));
    else if (m[7] !== undefined) {
      const href = m[0].startsWith('!') ? null : safeHref(m[8]);
      out.push(href ? link(href, inline(m[7])) : m[0]);
    } else {
      const href = m[9] || m[10];
      out.push(link(href, [href]));
    }
    last = re.lastIndex;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}
const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^\s{0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>/;
const ITEM = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_ROW = /^\s{0,3}\|.*\|\s*$/;
const TABLE_RULE = /^\s{0,3}\|(\s*:?-+:?\s*\|)+\s*$/;
const startsBlock = (l) => FENCE.test(l) || HEADING.test(l) || RULE.test(l) || QUOTE.test(l) || ITEM.test(l) || TABLE_ROW.test(l);
const indent = (l) => l.match(/^\s*/)[0].length;
// A table row's cells, between its outer pipes (`\|` is a pipe inside a cell).
const cells = (l) => l.trim().slice(1, -1).split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, '|'));
function md(src, depth = 0) {
  const lines = String(src).replace(/\r\n?/g, '\n').split('\n');
  const frag = document.createDocumentFragment();
  let i = 0;
  let m;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    if ((m = line.match(FENCE))) {
      const code = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(m[1]); i++) code.push(lines[i]);
      i++;
      frag.append(el('pre', {}, el('code', m[2] ? { 'data-lang': m[2] } : {}, code.join('\n'))));
    } else if ((m = line.match(HEADING))) {
      frag.append(el('h' + Math.min(6, m[1].length + 3), {}, ...inline(m[2])));
      i++;
    } else if (RULE.test(line)) {
      frag.append(el('hr'));
      i++;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) quoted.push(lines[i++].replace(/^\s{0,3}>\s?/, ''));
      frag.append(depth < 8 ? el('blockquote', {}, md(quoted.join('\n'), depth + 1)) : el('p', {}, quoted.join('\n')));
    } else if ((m = line.match(ITEM))) {
      // A list: each item holds the lines indented deeper than its marker (nested lists, code,
      // more paragraphs), rendered again one level down.
      const ordered = /\d/.test(m[1]);
      const list = el(ordered ? 'ol' : 'ul');
      if (ordered && parseInt(m[1], 10) !== 1) list.setAttribute('start', String(parseInt(m[1], 10)));
      const base = indent(line);
      let item;
      while (i < lines.length && (item = lines[i].match(ITEM)) && /\d/.test(item[1]) === ordered && indent(lines[i]) <= base) {
        const column = item[0].length - item[2].length;
        const rest = [];
        for (i++; i < lines.length; i++) {
          if (lines[i].trim()) {
            if (indent(lines[i]) <= base) break;
            rest.push(lines[i].slice(Math.min(indent(lines[i]), column)));
          } else {
            let j = i;
            while (j < lines.length && !lines[j].trim()) j++;
            if (j === lines.length || indent(lines[j]) <= base) break;
            rest.push('');
          }
        }
        const li = el('li', {}, ...inline(item[2]));
        while (rest.length && rest[0].trim() && !startsBlock(rest[0])) li.append(' ', ...inline(rest.shift().trim()));
        if (rest.some((l) => l.trim())) li.append(depth < 8 ? md(rest.join('\n'), depth + 1) : rest.join('\n'));
        list.append(li);
      }
      frag.append(list);
    } else if (TABLE_ROW.test(line) && TABLE_RULE.test(lines[i + 1] || '')) {
      // A pipe table: a header row, the rule under it (its colons align the columns), the rows.
      const align = cells(lines[i + 1]).map((c) => (/^:-+:$/.test(c) ? 'center' : /-:$/.test(c) ? 'right' : /^:/.test(c) ? 'left' : ''));
      const row = (l, tag) => el('tr', {}, ...cells(l).slice(0, align.length).map((c, k) => el(tag, align[k] ? { class: 'align-' + align[k] } : {}, ...inline(c))));
      const head = el('thead', {}, row(line, 'th'));
      const body = el('tbody');
      for (i += 2; i < lines.length && TABLE_ROW.test(lines[i]); i++) body.append(row(lines[i], 'td'));
      frag.append(el('table', { class: 'md-table' }, head, body));
    } else {
      const p = el('p');
      for (let first = true; i < lines.length && lines[i].trim() && (first || !startsBlock(lines[i])); first = false, i++) {
        if (!first) p.append(el('br'));
        p.append(...inline(lines[i].trim()));
      }
      frag.append(p);
    }
  }
  return frag;
}

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
const web = (u) => typeof u === 'string' && /^https?:\/\//.test(u);
const na = (v) => (v === null || v === undefined || v === '' ? 'n/a' : v);
// A turn's cost as its trace line records it: `{amount, currency, run}`; nothing when unknown.
const turnCost = (c) => (c && typeof c.amount === 'number' ? ` (${c.amount} ${c.currency}, run ${c.run})` : '');
const num = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : na(n));
const time = (t) => (t ? new Date(t).toLocaleTimeString() : 'n/a');
// A date and time (a reset may be tomorrow), in the browser's time zone.
const when = (t) => (t ? new Date(t).toLocaleString() : 'n/a');
// A run's outcome, styled by what it was (`failed`, `stalled`, `rate_limited` stand out).
const outcomeCell = (o) => el('td', { class: 'outcome ' + o }, o);
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

// A daemon serving several workflows (the state's `workflows`): their table, a Workflow column
// in the issue tables, and a filter narrowing those tables (and the recent events) to the
// workflow chosen in this tab. With one workflow none of it is shown and the tables are as ever.
function renderWorkflows(s) {
  const list = s.workflows || [];
  $('workflows-box').hidden = !list.length;
  const names = list.map((w) => w.name);
  if (!names.includes(state.workflow)) state.workflow = '';
  const select = $('wf-filter');
  if ([...select.options].slice(1).map((o) => o.value).join('\n') !== names.join('\n')) {
    select.replaceChildren(select.options[0], ...names.map((n) => el('option', { value: n }, n)));
  }
  select.value = state.workflow;
  fillTable('workflows', list.map((w) => el('tr', { class: w.status === 'failing' ? 'failing' : '' },
    el('td', {}, w.name), el('td', {}, w.status), el('td', {}, w.tracker_kind), el('td', { class: 'num' }, w.running),
    el('td', { class: 'num' }, w.retrying), el('td', { class: 'num' }, w.blocked), el('td', {}, time(w.last_poll_at)),
    el('td', { class: 'msg', title: w.last_error || '' }, w.last_error || ''))), 'No workflow.');
  return list.length > 0;
}

// The Workflow column of table `id`: its header cell first when `on`, else none.
function workflowColumn(id, on) {
  const head = $(id).tHead.rows[0];
  const has = head.cells[0].classList.contains('wf');
  if (on && !has) head.prepend(el('th', { class: 'wf' }, 'Workflow'));
  if (!on && has) head.cells[0].remove();
}

function renderOverview() {
  const s = state.snapshot;
  if (!s || s.error) return;
  const several = renderWorkflows(s);
  for (const id of ['cooldowns', 'running', 'retrying', 'blocked', 'waiting']) workflowColumn(id, several);
  const mine = (r) => !state.workflow || r.workflow === state.workflow;
  const wf = (r) => (several ? el('td', { class: 'wf' }, na(r.workflow)) : null);
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
  // The spend ledger: the UTC day's dollars (the fleet's) against the daily budget.
  const l = s.ledger || {};
  const today = (l.today || {});
  $('c-spend').textContent = (today.cost_usd > 0 ? '$' + today.cost_usd.toFixed(4) : '$n/a') +
    ` · ${num(today.total_tokens || 0)} tok · ${today.runs || 0} runs` +
    (l.daily_budget_usd != null ? ` · budget $${l.daily_budget_usd}` + (l.daily_budget_reached ? ' REACHED' : '') : '');
  // Every daemon sharing the claim store; each names its host, pid, runs and HTTP API.
  const fleet = s.fleet || [];
  $('c-fleet').replaceChildren(...(fleet.length > 1
    ? fleet.flatMap((m, i) => [i ? ' · ' : '', el(web(m.url) ? 'a' : 'span', web(m.url) ? { href: m.url } : {},
      `${m.hostname}:${m.pid}`), ` ${m.running} running` + (m.this ? ' (this)' : '') + (m.stale ? ' STALE' : '')])
    : ['this daemon only']));
  fillTable('running', s.running.filter(mine).map((r) => el('tr', {}, wf(r),
    el('td', {}, slotLink(r)), el('td', {}, r.state), el('td', {}, r.agent_kind),
    el('td', {}, r.claimed === false ? 'claiming…' : r.reserving ? 'reserving…' : (r.worker_host || 'this host')),
    el('td', { class: 'num' }, r.turn_count), steeringCell(r),
    el('td', { class: 'num', title: r.spend ? `issue spent ${num(r.spend.total_tokens)} tokens over ${r.spend.runs} runs` : '' },
      num(r.tokens.total_tokens) + (r.spend && r.spend.cost_usd > 0 ? ` · issue $${r.spend.cost_usd.toFixed(4)}` : '')),
    el('td', {}, na(r.last_event)), el('td', { class: 'msg', title: r.last_message || '' }, na(r.last_message)), el('td', {}, time(r.started_at)))), 'Nothing is running.');
  fillTable('retrying', s.retrying.filter(mine).map((r) => el('tr', {}, wf(r),
    el('td', {}, slotLink(r)), el('td', { class: 'num' }, r.attempt), el('td', {}, time(r.due_at)), el('td', { class: 'msg', title: r.error || '' }, na(r.error)))), 'No retries waiting.');
  // Agent kinds cooling down after a rate limit (shown only while one does): no run starts on
  // them until their reset; runs go to a fallback kind meanwhile.
  const cooldowns = (s.cooldowns || []).filter(mine);
  $('cooldowns-box').hidden = !cooldowns.length;
  fillTable('cooldowns', cooldowns.map((c) => el('tr', {}, wf(c),
    el('td', {}, c.agent_kind), el('td', { title: c.until }, when(c.until)),
    el('td', { class: 'msg', title: `${c.reason} (since ${when(c.since)})` }, c.reason),
    el('td', { title: c.scope === 'host' ? "this host's account: other hosts' daemons still use it" : 'every daemon of the claim store' }, c.scope))),
  'No agent kind is cooling down.');
  // An issue waiting for a rate limit names the kind and when the earliest reset comes.
  fillTable('blocked', s.blocked.filter(mine).map((b) => el('tr', {}, wf(b),
    el('td', {}, b.issue_identifier), el('td', {}, b.state),
    b.agent_kind ? el('td', { class: 'rate-limited', title: na(b.reset_at) }, `${b.label}: ${b.agent_kind} resets ${when(b.reset_at)}`) : el('td', {}, b.label))),
  'Nothing is blocked.');
  fillTable('waiting', waiting.filter(mine).map((w) => el('tr', {}, wf(w),
    el('td', {}, w.issue_identifier), el('td', {}, w.state),
    el('td', {}, w.blockers.map((b) => `${b.identifier} (${b.state})`).join(', ') + (w.cycle ? ' · a cycle of blockers' : '')))),
  'Nothing waits for a blocker.');
  $('events').replaceChildren(...(s.recent_events || []).filter(mine).map((e) => el('li', {}, time(e.at) + ' ',
    several && e.workflow ? e.workflow + ' · ' : '', el('b', {}, e.event), ' ' + e.message)));
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
      el('tbody', {}, ...body.issues.map((i) => el('tr', {}, el('td', {}, i.issue_identifier), el('td', { class: 'num' }, i.attempts), outcomeCell(i.latest_outcome),
        el('td', { class: 'num' }, num(i.total_tokens)), el('td', {}, i.run_id), el('td', { class: 'msg' }, na(i.failure_reason)))))));
  } else {
    const s = body.summary;
    $('runs-summary').textContent = `${s.total} runs: ${s.running} running, ${s.success} success, ${s.failed} failed, ${s.stalled} stalled, ${s.canceled} canceled` +
      (s.rate_limited ? `, ${s.rate_limited} rate limited` : '');
    // A Workflow column when the runs carry theirs (a daemon serving several).
    const several = body.runs.some((r) => typeof r.workflow === 'string');
    const heads = ['Run', ...(several ? ['Workflow'] : []), 'Issue', 'Agent', 'Worker', 'Outcome', 'Attempt', 'Turns', 'Tokens', 'Duration', 'Failure'];
    out.replaceChildren(el('table', {}, el('thead', {}, el('tr', {}, ...heads.map((h) => el('th', {}, h)))),
      el('tbody', {}, ...body.runs.map((r) => el('tr', {}, el('td', {}, r.id), several ? el('td', {}, na(r.workflow)) : null, el('td', {}, slotLink(r)), el('td', {}, r.agent_kind), el('td', {}, r.worker_host || 'this host'), outcomeCell(r.outcome),
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
    case 'message': return el('li', { class: 'message md' }, meta('agent'), md(e.text));
    case 'thought': return el('li', { class: 'thought' }, meta('thought'), e.text);
    case 'user_message': return el('li', { class: 'message steering md' }, meta(e.author ? `from ${e.author} via ${na(e.source)}` : 'user'), md(e.text));
    case 'tool_call': return el('li', { class: 'tool_call' + (e.error ? ' error' : '') }, meta('tool ' + na(e.toolKind)), e.title || e.toolCallId,
      el('span', { class: 'tag' + (e.error ? ' bad' : '') }, e.status), el('span', { class: 'tag' }, dur(e.durationMs)));
    case 'plan': return el('li', {}, meta('plan'), (e.entries || []).map((p) => (p.status === 'completed' ? '✓ ' : '· ') + p.content).join('\n'));
    case 'permission': return el('li', {}, meta('permission'), e.title + ' → ' + e.decision);
    case 'turn_started': return el('li', {}, meta(), 'Turn ' + e.turn + ' started');
    case 'turn_completed': return el('li', {}, meta(), 'Turn ' + e.turn + ' ended: ' + na(e.stopReason) + turnCost(e.cost));
    case 'turn_failed': return el('li', { class: 'turn_failed' }, meta(), 'Turn ' + na(e.turn) + ' failed: ' + na(e.error));
    case 'hook': return el('li', { class: e.ok ? '' : 'error' }, meta('hook'), e.hook + (e.ok ? ' ok' : ' failed: ' + na(e.error)));
    case 'notice': return el('li', {}, meta(), e.text);
    default: return el('li', {}, meta(e.type || e.kind));
  }
}

function renderTitle() {
  const t = state.tickets.find((x) => x.issueId === state.selected);
  $('trace-title').textContent = state.selected ? (t ? t.identifier + ' · ' + (t.title || '') : state.selected) : 'Pick an issue';
  renderAct();
}

// The whole timeline; a live trace then only replaces its tail (`events_append`), so the
// Markdown of earlier events is not parsed again.
function renderTimeline() {
  $('timeline').replaceChildren(...state.events.map(renderEvent));
  renderTitle();
}

function appendTimeline(from, events) {
  const tl = $('timeline');
  while (tl.children.length > from) tl.lastChild.remove();
  tl.append(...events.map(renderEvent));
}

// The selected issue's live entry: running (steer: its next turn; cancel: stop the run) or
// retrying (steer: its next run; cancel: drop the retry).
function actTarget() {
  const s = state.snapshot;
  if (!s || s.error || !state.selected) return null;
  // Several workflows: the qualified identifier names the entry's own.
  const named = (r) => (r.workflow ? `${r.workflow}:${r.issue_identifier}` : r.issue_identifier);
  const running = s.running.find((r) => r.issue_id === state.selected);
  if (running) return { identifier: named(running), running: true };
  const retrying = s.retrying.find((r) => r.issue_id === state.selected);
  return retrying ? { identifier: named(retrying), running: false } : null;
}

function renderAct() {
  const target = actTarget();
  $('act').hidden = !target;
  if (!target) return;
  const on = !!token();
  $('act-readonly').hidden = on;
  $('steer-form').hidden = !on;
  $('steer-label').textContent = target.running
    ? `Message to the agent of ${target.identifier} (its next turn)`
    : `Message for ${target.identifier}'s next run (it is retrying)`;
  $('cancel-run').textContent = $('cancel-run').classList.contains('armed') ? 'Confirm cancel' : target.running ? 'Cancel run' : 'Cancel retry';
}

// A control request with this tab's token; the status line says what happened.
async function act(path, body) {
  const t = token();
  if (!t) { renderAct(); return null; }
  const say = (text) => { $('act-status').textContent = text; };
  let r;
  try {
    r = await fetch(path, { method: 'POST', headers: { Authorization: 'Bearer ' + t, 'Content-Type': 'application/json' }, body: body ? JSON.stringify(body) : '' });
  } catch (e) { say('The daemon does not answer.'); return null; }
  let v = null;
  try { v = await r.json(); } catch (e) { /* no body */ }
  if (r.status === 401) { say('Refused: this tab\'s token is not the daemon\'s. Run svc open again and open the URL it prints.'); return null; }
  if (r.status !== 202) { say(`Not done (HTTP ${r.status}): ${(v && v.error && v.error.message) || 'unexpected answer'}`); return null; }
  return { v, say };
}

async function sendSteer(e) {
  e.preventDefault();
  const target = actTarget();
  const text = $('steer-text').value;
  if (!target || !text.trim()) return;
  const done = await act(`/api/v1/${encodeURIComponent(target.identifier)}/steer`, { message: text, author: 'dashboard' });
  if (!done) return;
  $('steer-text').value = '';
  done.say(done.v.delivery === 'running' ? `Sent to ${target.identifier}: it is the agent's next turn.` : `Sent: it waits for ${target.identifier}'s next run.`);
}

let cancelArmed = null;
async function cancelRun() {
  const target = actTarget();
  const button = $('cancel-run');
  if (!target) return;
  // Two presses: the first arms the button for 5 seconds, the second sends.
  if (!button.classList.contains('armed')) {
    button.classList.add('armed');
    clearTimeout(cancelArmed);
    cancelArmed = setTimeout(() => { button.classList.remove('armed'); renderAct(); }, 5000);
    renderAct();
    return;
  }
  button.classList.remove('armed');
  clearTimeout(cancelArmed);
  renderAct();
  const done = await act(`/api/v1/${encodeURIComponent(target.identifier)}/cancel`);
  if (done) done.say(`Canceled ${target.identifier} (${done.v.canceled}): it is not dispatched again until its tracker state changes.`);
}

// Issues the store has seen: a search (each word a prefix of the identifier or title) and the
// most recent ones.
function issueItem(i) {
  const href = i.url && safeHref(i.url);
  return el('li', {}, el('a', { href: '#/traces/' + encodeURIComponent(i.id) }, i.identifier), ' ', i.title || '',
    el('span', { class: 'st' }, i.state), el('span', { class: 'seen' }, 'seen ' + (i.last_seen_at ? new Date(i.last_seen_at).toLocaleString() : 'n/a')),
    href ? el('span', { class: 'seen' }, link(href, ['open in tracker'])) : null);
}

async function getIssues(path) {
  try {
    const r = await fetch(path);
    if (r.status === 404) return { note: 'The issue store is not available on this daemon.' };
    const v = await r.json();
    return r.ok ? { issues: v.issues || [] } : { note: (v.error && v.error.message) || 'HTTP ' + r.status };
  } catch (e) { return { note: 'The daemon does not answer.' }; }
}

function fillIssues(id, got, empty) {
  $(id).replaceChildren(...(got.issues && got.issues.length ? got.issues.map(issueItem) : [el('li', { class: 'note' }, got.note || empty)]));
}

let searchSeq = 0;
let searched = null; // the last query searched (typing searches before the hash names it)
let shown = null; // the view shown
async function search(q) {
  searched = q;
  const seq = ++searchSeq;
  const got = await getIssues('/api/v1/issues/search?limit=20&q=' + encodeURIComponent(q));
  if (seq !== searchSeq) return;
  $('search-note').textContent = got.issues ? `${got.issues.length} issue(s) matching "${q}"` : '';
  fillIssues('search-results', got, `No issue matches "${q}".`);
}

async function loadRecent() {
  fillIssues('recent-issues', await getIssues('/api/v1/issues/recent?limit=10'), 'No issue has run yet.');
}

function route() {
  const hash = location.hash || '#/';
  const [, view, id] = hash.match(/^#\/([^/]*)\/?(.*)$/) || [];
  const which = ['runs', 'traces', 'issues'].includes(view) ? view : 'overview';
  for (const s of ['overview', 'runs', 'issues', 'traces']) {
    $(s).hidden = s !== which;
    $('nav-' + s).setAttribute('aria-current', s === which ? 'page' : 'false');
  }
  if (which === 'runs') loadRuns();
  if (which === 'issues') {
    if (shown !== 'issues') loadRecent();
    const q = id ? decodeURIComponent(id) : '';
    if (q && $('q').value !== q) $('q').value = q;
    if (!q) { searched = null; $('search-results').replaceChildren(); $('search-note').textContent = ''; }
    else if (q !== searched) search(q);
  }
  shown = which;
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
    if (msg.type === 'ops_state') { state.snapshot = msg.state; renderOverview(); renderAct(); }
    else if (msg.type === 'init' || msg.type === 'update') { state.tickets = msg.tickets || []; renderTickets(); renderTitle(); }
    else if (msg.type === 'events' && msg.issueId === state.selected) { state.events = msg.events || []; renderTimeline(); }
    else if (msg.type === 'events_append' && msg.issueId === state.selected) {
      if (msg.fromIndex > state.events.length) { send({ type: 'subscribe', issueId: state.selected }); return; }
      state.events.splice(msg.fromIndex, state.events.length - msg.fromIndex, ...msg.events);
      appendTimeline(msg.fromIndex, msg.events);
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
$('search-form').addEventListener('submit', (e) => {
  e.preventDefault();
  location.hash = '#/issues/' + encodeURIComponent($('q').value.trim());
});
let typing = null;
$('q').addEventListener('input', () => {
  clearTimeout(typing);
  typing = setTimeout(() => { const q = $('q').value.trim(); if (q) search(q); }, 250);
});
$('wf-filter').addEventListener('change', () => { state.workflow = $('wf-filter').value; renderOverview(); });
$('steer-form').addEventListener('submit', sendSteer);
$('cancel-run').addEventListener('click', cancelRun);
$('forget').addEventListener('click', () => {
  try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* nothing kept */ }
  renderControl();
  renderAct();
});
window.addEventListener('hashchange', () => { takeToken(); renderControl(); route(); });
setInterval(() => { if (!$('runs').hidden) loadRuns(); }, 5000);
setInterval(loadDaemon, 5000);
setInterval(renderClock, 1000);
takeToken();
renderControl();
loadDaemon();
connect();
route();
