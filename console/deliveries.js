// deliveries.js — find deliveries: by event id ("what happened to my
// event"), by subscription, state and time; replay a window (tenant key).
// The operator reads GET /admin/deliveries across tenants, a tenant
// GET /v1/deliveries across its subscriptions: the same filters and pages.

import { h, fill, table, show, badge, problem } from './dom.js';
import { api, withQuery } from './api.js';

const STATES = ['', 'pending', 'in_flight', 'succeeded', 'dead', 'parked'];

// datetime-local (browser local time) ↔ RFC 3339 UTC
function toRfc3339(local) { return local ? new Date(local).toISOString() : ''; }

function filterForm(ctx, p, subs) {
  const field = (name, label, input) => h('label', {}, h('span', {}, label), input);
  const f = {
    event_id: h('input', { name: 'event_id', value: p.get('event_id') || '', placeholder: 'event id', size: 28 }),
    state: h('select', { name: 'state' }, STATES.map((s) => h('option', { value: s, selected: s === (p.get('state') || '') }, s || 'any'))),
    since: h('input', { name: 'since', value: p.get('since') || '', placeholder: 'since (RFC 3339)', size: 24 }),
    until: h('input', { name: 'until', value: p.get('until') || '', placeholder: 'until (RFC 3339)', size: 24 }),
  };
  if (ctx.operator) {
    f.tenant = h('input', { name: 'tenant', value: p.get('tenant') || '', placeholder: 'any tenant', size: 16 });
    f.subscription = h('input', { name: 'subscription', value: p.get('subscription') || '', placeholder: 'any subscription', size: 36 });
  } else {
    f.subscription = h('select', { name: 'subscription' },
      h('option', { value: '' }, 'every subscription'),
      subs.map((s) => h('option', { value: s.id, selected: s.id === p.get('subscription') }, `${s.id} → ${s.destination.url}`)));
  }
  const form = h('form', { class: 'filters', id: 'deliveries-filter' },
    field('event_id', 'Event id', f.event_id),
    ctx.operator ? field('tenant', 'Tenant', f.tenant) : null,
    field('subscription', 'Subscription', f.subscription),
    field('state', 'State', f.state),
    field('since', 'Since', f.since),
    field('until', 'Until', f.until),
    h('button', { type: 'submit' }, 'Find'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const q = {};
    for (const [k, el] of Object.entries(f)) if (el.value.trim()) q[k] = el.value.trim();
    location.hash = withQuery('#/deliveries', q);
  });
  return form;
}

function deliveryTable(ctx, items) {
  const cols = [
    { title: 'Id', cell: (d) => h('a', { href: `#/delivery/${d.id}` }, show(d.id)) },
    ctx.operator ? { title: 'Tenant', cell: (d) => show(d.tenant_id) } : null,
    { title: 'Event', cell: (d) => h('code', {}, show(d.event_id)) },
    { title: 'Type', cell: (d) => show(d.event_type) },
    { title: 'State', cell: (d) => [badge(d.state), d.reason ? h('span', { class: 'muted' }, ` ${d.reason}`) : null] },
    { title: 'Attempts', cell: (d) => show(d.attempt_count) },
    { title: 'Created', cell: (d) => show(d.created_at) },
    { title: 'Subscription', cell: (d) => h('code', { class: 'small' }, show(d.subscription_id)) },
  ].filter(Boolean);
  return table(cols, items, 'No deliveries match.');
}

// The replay form (tenant key only: replay is the tenant API's).
function replayForm(subs) {
  const sub = h('select', { name: 'replay-subscription' }, subs.map((s) => h('option', { value: s.id }, `${s.id} → ${s.destination.url}`)));
  const since = h('input', { type: 'datetime-local', step: 1, name: 'replay-since', required: true });
  const until = h('input', { type: 'datetime-local', step: 1, name: 'replay-until' });
  const out = h('div', { class: 'result' });
  const form = h('form', { class: 'filters replay' },
    h('label', {}, h('span', {}, 'Subscription'), sub),
    h('label', {}, h('span', {}, 'Since (local time)'), since),
    h('label', {}, h('span', {}, 'Until (default now)'), until),
    h('button', { type: 'submit' }, 'Replay window'), out);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    fill(out, 'Replaying…');
    const body = { since: toRfc3339(since.value) };
    if (until.value) body.until = toRfc3339(until.value);
    try {
      const r = await api('POST', `/v1/subscriptions/${encodeURIComponent(sub.value)}/replay`, body);
      fill(out, h('span', { class: 'ok' }, `Replay accepted: ${show(r.events)} events in the window, ${show(r.created)} jobs made${r.truncated ? ' (truncated: continue from ' + r.next_since + ')' : ''}.`));
    } catch (e) {
      fill(out, problem(e));
    }
  });
  return h('details', { class: 'panel' }, h('summary', {}, 'Replay a window'), form);
}

export async function render(el, ctx) {
  const p = ctx.params;
  fill(el, h('h1', {}, 'Deliveries'));
  let subs = [];
  if (!ctx.operator) subs = (await api('GET', '/v1/subscriptions?limit=100')).items;
  el.appendChild(filterForm(ctx, p, subs));
  const list = h('div', { id: 'deliveries-list' });
  el.appendChild(list);
  const q = {};
  for (const k of ['tenant', 'subscription', 'event_id', 'state', 'since', 'until', 'cursor']) q[k] = p.get(k);
  q.limit = 50;
  if (!ctx.operator) delete q.tenant;
  const r = await api('GET', withQuery(ctx.operator ? '/admin/deliveries' : '/v1/deliveries', q));
  fill(list, deliveryTable(ctx, r.items));
  if (r.next_cursor) {
    const q = Object.fromEntries(p.entries());
    q.cursor = r.next_cursor;
    list.appendChild(h('p', {}, h('a', { href: withQuery('#/deliveries', q), class: 'more' }, 'Older deliveries →')));
  }
  if (!ctx.operator && subs.length > 0) el.appendChild(replayForm(subs));
}
