// delivery.js — one delivery and its attempt timeline (status, duration,
// error, response excerpt), with "Redeliver" for a dead one.  Redeliver is
// the tenant API's (POST /v1/deliveries/{id}/redeliver), so it needs the
// tenant's key; the operator sees the timeline through GET
// /admin/deliveries/{id}.

import { h, fill, show, badge, problem } from './dom.js';
import { api } from './api.js';

function get(ctx, id) {
  const base = ctx.operator ? '/admin/deliveries/' : '/v1/deliveries/';
  return api('GET', base + encodeURIComponent(id));
}

function timeline(attempts) {
  if (attempts.length === 0) return h('p', { class: 'muted empty' }, 'No attempt yet.');
  return h('ol', { class: 'timeline' }, attempts.map((a) => h('li', { class: a.status >= 200 && a.status < 300 ? 'ok' : 'bad' },
    h('div', { class: 'attempt-head' },
      h('strong', {}, `Attempt ${show(a.number)}`), ' · ', show(a.started_at), ' · ',
      h('span', { class: 'status' }, a.status === null ? 'no answer' : `HTTP ${a.status}`), ' · ',
      `${show(a.duration_ms)} ms`),
    a.error ? h('div', { class: 'attempt-error' }, 'Error: ', show(a.error)) : null,
    a.response_excerpt !== null && a.response_excerpt !== undefined
      ? h('pre', { class: 'excerpt' }, show(a.response_excerpt)) : null)));
}

function summary(d) {
  const row = (k, v) => [h('dt', {}, k), h('dd', {}, v)];
  return h('dl', { class: 'summary' },
    d.tenant_id !== undefined ? row('Tenant', show(d.tenant_id)) : null,
    row('State', [badge(d.state), d.reason ? ` ${d.reason}` : '']),
    row('Event', h('code', {}, show(d.event_id))),
    row('Type', show(d.event_type)),
    row('Subscription', h('code', {}, show(d.subscription_id))),
    row('Attempts', show(d.attempt_count)),
    row('Next attempt', show(d.next_attempt_at)),
    row('Created', show(d.created_at)));
}

// Polls until the delivery leaves pending/in_flight (or 30 s pass).
async function follow(ctx, id, onUpdate) {
  const until = Date.now() + 30000;
  for (;;) {
    await new Promise((r) => setTimeout(r, 300));
    const d = await get(ctx, id);
    onUpdate(d);
    if (!['pending', 'in_flight'].includes(d.state) || Date.now() > until) return;
  }
}

export async function render(el, ctx) {
  const id = ctx.arg;
  const d = await get(ctx, id);
  const body = h('div', {});
  const msg = h('div', { id: 'delivery-message' });
  const draw = (x) => {
    const redeliver = x.state === 'dead' && !ctx.operator
      ? h('button', { type: 'button', id: 'redeliver', onclick: async (ev) => {
        ev.target.disabled = true;
        fill(msg, 'Redelivering…');
        try {
          const y = await api('POST', `/v1/deliveries/${encodeURIComponent(id)}/redeliver`);
          fill(msg, h('span', { class: 'ok' }, `Redelivery queued (state ${y.state}).`));
          draw(y);
          await follow(ctx, id, draw);
        } catch (e) {
          fill(msg, problem(e));
          ev.target.disabled = false;
        }
      } }, 'Redeliver') : null;
    const note = x.state === 'dead' && ctx.operator
      ? h('p', { class: 'muted' }, 'Redeliver and replay are the tenant API\u2019s: sign in with the tenant\u2019s key to run them.') : null;
    fill(body, summary(x), redeliver, note, h('h2', {}, 'Attempts'), timeline(x.attempts || []));
  };
  draw(d);
  fill(el, h('p', {}, h('a', { href: '#/deliveries' }, '← Deliveries')), h('h1', {}, `Delivery ${id}`), msg, body);
}
