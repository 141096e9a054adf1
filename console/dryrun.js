// dryrun.js — try a policy before it ships (operator): a loaded policy or
// edited Lua source, run by POST /admin/policies/dry-run against a tenant's
// stored events (the last N, or given sequence numbers), nothing delivered.
// Shows per event: match, shaped body against the stored one (a line
// diff), retry delay, errors with their line, time and memory.

import { h, fill, table, show, problem } from './dom.js';
import { api } from './api.js';

// A line diff of a → b (longest common subsequence; inputs are bounded by
// the dry-run's answer).  Returns [{op: ' '|'-'|'+', line}].
export function diffLines(a, b) {
  const x = a.split('\n'), y = b.split('\n');
  if (x.length * y.length > 250000) return [...x.map((line) => ({ op: '-', line })), ...y.map((line) => ({ op: '+', line }))];
  const n = x.length, m = y.length;
  const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (x[i] === y[j]) { out.push({ op: ' ', line: x[i] }); i++; j++; } else if (L[i + 1][j] >= L[i][j + 1]) { out.push({ op: '-', line: x[i++] }); } else { out.push({ op: '+', line: y[j++] }); }
  }
  while (i < n) out.push({ op: '-', line: x[i++] });
  while (j < m) out.push({ op: '+', line: y[j++] });
  return out;
}

// Pretty-prints JSON text so that a diff is per member; other text as is.
function pretty(t) {
  try { return JSON.stringify(JSON.parse(t), null, 2); } catch { return t; }
}

function diffView(stored, shaped) {
  if (shaped === null || shaped === undefined) return h('span', { class: 'muted' }, 'not shaped');
  return h('pre', { class: 'diff' }, diffLines(pretty(stored || ''), pretty(shaped)).map((d) =>
    h('div', { class: d.op === '+' ? 'add' : d.op === '-' ? 'del' : 'same' }, `${d.op} ${d.line}`)));
}

export async function render(el) {
  const loaded = (await api('GET', '/admin/policies')).policies || [];
  const policy = h('select', { name: 'policy' }, h('option', { value: '' }, 'edited source below'),
    loaded.map((p) => h('option', { value: p.name }, p.name)));
  const source = h('textarea', { name: 'source', rows: 12, cols: 80, spellcheck: 'false',
    placeholder: 'function match(event) return true end\nfunction shape(event) return event end' });
  const tenant = h('input', { name: 'tenant', required: true, placeholder: 'tenant id' });
  const sub = h('input', { name: 'subscription', placeholder: 'subscription id (optional)', size: 36 });
  const limit = h('input', { name: 'limit', type: 'number', min: 1, max: 1000, value: '20' });
  const out = h('div', { id: 'dryrun-result' });
  const form = h('form', { class: 'dryrun', id: 'dryrun-form' },
    h('div', { class: 'filters' },
      h('label', {}, h('span', {}, 'Policy'), policy),
      h('label', {}, h('span', {}, 'Tenant'), tenant),
      h('label', {}, h('span', {}, 'Subscription'), sub),
      h('label', {}, h('span', {}, 'Last N events'), limit)),
    h('label', { class: 'block' }, h('span', {}, 'Lua source (used when no loaded policy is chosen)'), source),
    h('button', { type: 'submit' }, 'Run dry-run'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body = { tenant: tenant.value.trim(), events: 'recent', limit: Number(limit.value) || 20 };
    if (policy.value) body.policy = policy.value; else body.source = source.value;
    if (sub.value.trim()) body.subscription = sub.value.trim();
    fill(out, 'Running…');
    try {
      const r = await api('POST', '/admin/policies/dry-run', body);
      fill(out, h('p', {}, `Policy ${show(r.policy)} (generation ${show(r.generation)}): ${r.results.length} events, ${show(r.errors)} errors.`),
        table([
          { title: 'Seq', cell: (x) => show(x.sequence) },
          { title: 'Event', cell: (x) => [h('code', {}, show(x.event_id)), h('div', { class: 'muted small' }, show(x.type))] },
          { title: 'Match', cell: (x) => show(x.match) },
          { title: 'Stored → shaped body', cell: (x) => diffView(x.stored_body, x.shape && x.shape.body) },
          { title: 'Retry', cell: (x) => x.retry ? `attempt ${show(x.retry.attempt)}, ${show(x.retry.status)} → ${x.retry.delay_ms === null ? 'dead' : x.retry.delay_ms + ' ms'}` : '—' },
          { title: 'Error', cell: (x) => x.error ? h('span', { class: 'error-text' }, `${show(x.error.function)}: ${show(x.error.kind)} at line ${show(x.error.line)}: ${show(x.error.message)}`) : '—' },
          { title: 'CPU / memory', cell: (x) => `${show(x.cpu_us)} µs / ${show(x.memory_bytes)} B` },
        ], r.results, 'The tenant has no stored events to run against.'));
    } catch (e) {
      fill(out, problem(e));
    }
  });
  fill(el, h('h1', {}, 'Policy dry-run'),
    h('p', { class: 'muted' }, 'Runs match, shape and retry in the same sandbox and limits as delivery, on stored events; nothing is delivered and nothing counts toward a trip.'),
    form, out);
}
