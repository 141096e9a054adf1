// overview.js — the hub at a glance.  Operator: this process's /metrics
// (ingest and delivery counts and their rates between two readings, due
// jobs, open breakers, attempt latency) and the policy generation.  Tenant:
// its own figures of the last 24 hours (GET /v1/stats, cluster-wide).

import { h, fill, show, problem } from './dom.js';
import { api, metricsText } from './api.js';

// Prometheus text → Map(series → value), series as rendered ("name{labels}").
export function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    if (sp > 0) m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  return m;
}

// The sum of every series of metric `name` whose labels contain `labelPart`.
function sum(m, name, labelPart) {
  let s = 0;
  for (const [k, v] of m) {
    const base = k.split('{')[0];
    if (base === name && (!labelPart || k.includes(labelPart))) s += v;
  }
  return s;
}

// Mean attempt latency from the histogram's _sum and _count.
function meanLatencyMs(m) {
  const c = sum(m, 'streaming_hub_delivery_attempt_seconds_count');
  return c > 0 ? (1000 * sum(m, 'streaming_hub_delivery_attempt_seconds_sum')) / c : null;
}

function card(label, value, note) {
  return h('div', { class: 'card' }, h('div', { class: 'label' }, label), h('div', { class: 'value' }, value), note ? h('div', { class: 'note' }, note) : null);
}

// Bars of the last rate samples (heights set through the CSSOM: allowed by
// the console's Content-Security-Policy, unlike style attributes).
function bars(samples) {
  const max = Math.max(1, ...samples);
  return h('div', { class: 'bars', 'aria-hidden': 'true' }, samples.map((v) => {
    const b = h('span', { class: 'bar', title: v.toFixed(1) });
    b.style.height = `${Math.round((40 * v) / max)}px`;
    return b;
  }));
}

const history = { accepted: [], delivered: [] };
let last = null;

function figures(m, gen) {
  const now = performance.now();
  const accepted = sum(m, 'streaming_hub_ingest_records_total', 'verdict="accepted"');
  const delivered = sum(m, 'streaming_hub_deliveries_total');
  let rateA = null, rateD = null;
  if (last) {
    const dt = (now - last.t) / 1000;
    rateA = Math.max(0, (accepted - last.accepted) / dt);
    rateD = Math.max(0, (delivered - last.delivered) / dt);
    history.accepted = [...history.accepted, rateA].slice(-30);
    history.delivered = [...history.delivered, rateD].slice(-30);
  }
  last = { t: now, accepted, delivered };
  const lat = meanLatencyMs(m);
  return h('div', { class: 'cards' },
    card('Ingest rate', rateA === null ? '…' : `${rateA.toFixed(1)}/s`, bars(history.accepted)),
    card('Delivery rate', rateD === null ? '…' : `${rateD.toFixed(1)}/s`, bars(history.delivered)),
    card('Events accepted', show(accepted)),
    card('Delivery attempts', show(delivered)),
    card('Mean attempt latency', lat === null ? '—' : `${lat.toFixed(1)} ms`),
    card('Due jobs', show(sum(m, 'streaming_hub_jobs_due'))),
    card('Open breakers', show(sum(m, 'streaming_hub_breakers_open'))),
    card('Policy generation', show(gen)),
    card('Hub processes', show(sum(m, 'streaming_hub_cluster_processes') || 1)));
}

async function operator(el) {
  const area = h('div', { id: 'overview-figures' });
  const draw = async () => {
    const [text, pol] = await Promise.all([metricsText(), api('GET', '/admin/policies')]);
    fill(area, figures(parseMetrics(text), pol.generation));
  };
  fill(el, h('h1', {}, 'Overview'),
    h('p', { class: 'muted' }, 'Figures of the process that serves this console (its /metrics), rates between the last two readings (every 5 s); per-tenant figures under Tenants are cluster-wide.'),
    area);
  await draw();
  // a rate needs two readings: the second comes after 1 s, then every 5 s
  const again = () => {
    if (!document.body.contains(area)) return false;
    draw().catch((e) => area.appendChild(problem(e)));
    return true;
  };
  setTimeout(() => {
    if (!again()) return;
    const timer = setInterval(() => { if (!again()) clearInterval(timer); }, 5000);
  }, 1000);
}

export function statsCards(s) {
  return h('div', { class: 'cards' },
    ['accepted', 'duplicates', 'quarantined', 'dropped', 'delivered', 'delayed', 'retried', 'dead', 'replayed']
      .map((k) => card(k, show(s[k]))));
}

export async function render(el, ctx) {
  if (ctx.operator) return operator(el);
  const s = await api('GET', '/v1/stats');
  fill(el, h('h1', {}, `Overview · ${show(s.tenant)}`),
    h('p', { class: 'muted' }, `Your figures from ${s.since} to ${s.until} (all hub processes).`),
    statsCards(s));
}
