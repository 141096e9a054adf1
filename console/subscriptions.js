// subscriptions.js — state (enabled, verification, disabled reason),
// failure streak, breaker state (this process's), destination with its
// credentials masked; verify and rotate-secret (tenant key: they are the
// tenant API's).

import { h, fill, table, show, badge, problem } from './dom.js';
import { api, withQuery } from './api.js';

function destination(s) {
  const hdr = s.destination.headers;
  const names = hdr && typeof hdr === 'object' ? Object.keys(hdr) : [];
  return [h('code', {}, show(s.destination.url)),
    names.length ? h('div', { class: 'muted small' }, `headers: ${names.map((n) => `${n}: ••••`).join(', ')}`) : null,
    s.has_headers ? h('div', { class: 'muted small' }, 'headers: (masked)') : null];
}

function actions(s, out) {
  const run = async (what, path, body) => {
    fill(out, `${what}…`);
    try {
      const r = await api('POST', path, body);
      if (r.secret) {
        fill(out, h('div', { class: 'ok' }, `New secret of ${s.id} (shown once): `, h('code', { class: 'secret' }, r.secret)));
      } else {
        fill(out, h('div', { class: 'ok' }, `${what}: verification_state ${show(r.verification_state)}.`));
      }
    } catch (e) {
      fill(out, problem(e));
    }
  };
  return [
    h('button', { type: 'button', onclick: () => run('Verify', `/v1/subscriptions/${s.id}/verify`) }, 'Verify'),
    ' ',
    h('button', { type: 'button', onclick: () => run('Rotate secret', `/v1/subscriptions/${s.id}/rotate-secret`, {}) }, 'Rotate secret'),
  ];
}

export async function render(el, ctx) {
  const tenant = ctx.params.get('tenant') || '';
  const cursor = ctx.params.get('cursor');
  const out = h('div', { id: 'subscription-action' });
  let r, breakers = [];
  if (ctx.operator) {
    [r, breakers] = await Promise.all([
      api('GET', withQuery('/admin/subscriptions', { tenant, cursor, limit: 100 })),
      api('GET', '/admin/breakers').then((b) => b.items).catch(() => []),
    ]);
  } else {
    r = await api('GET', withQuery('/v1/subscriptions', { cursor, limit: 100 }));
  }
  const filter = h('form', { class: 'filters' },
    ctx.operator ? h('label', {}, h('span', {}, 'Tenant'), h('input', { name: 'tenant', value: tenant, placeholder: 'any tenant' })) : null,
    ctx.operator ? h('button', { type: 'submit' }, 'Filter') : null);
  filter.addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = withQuery('#/subscriptions', { tenant: filter.elements.tenant.value.trim() });
  });
  // breakers are per (tenant, origin): an origin is scheme://host:port
  const originOf = (url) => {
    try {
      const u = new URL(url);
      const port = u.port || (u.protocol === 'https:' ? '443' : '80');
      return `${u.protocol}//${u.hostname}:${port}`;
    } catch { return null; }
  };
  const breakerOf = (s) => {
    const origin = originOf(s.destination.url);
    const b = breakers.find((x) => x.tenant_id === s.tenant_id && x.origin === origin);
    return b ? [badge(b.state), h('div', { class: 'muted small' }, `${show(b.consecutive_failures)} failures`)]
      : h('span', { class: 'muted' }, 'closed');
  };
  fill(el, h('h1', {}, 'Subscriptions'), filter, out,
    table([
      { title: 'Id', cell: (s) => [h('code', { class: 'small' }, s.id), h('div', {}, h('a', { href: withQuery('#/deliveries', { subscription: s.id }) }, 'deliveries'))] },
      ctx.operator ? { title: 'Tenant', cell: (s) => show(s.tenant_id) } : null,
      { title: 'Destination', cell: destination },
      { title: 'Enabled', cell: (s) => [badge(s.enabled ? 'enabled' : 'disabled'), s.disabled_reason ? h('div', { class: 'muted small' }, s.disabled_reason) : null] },
      { title: 'Verification', cell: (s) => badge(s.verification_state) },
      { title: 'Failing since', cell: (s) => show(s.failure_first_at) },
      ctx.operator ? { title: 'Breaker (this process)', cell: breakerOf } : null,
      { title: 'Types', cell: (s) => show((s.event_types || []).join(', ')) },
      { title: 'Policy', cell: (s) => show(s.policy) },
      ctx.operator ? null : { title: 'Actions', cell: (s) => actions(s, out) },
    ].filter(Boolean), r.items, 'No subscriptions yet.'),
    r.next_cursor ? h('p', {}, h('a', { href: withQuery('#/subscriptions', { tenant, cursor: r.next_cursor }) }, 'More →')) : null);
}
