// tenants.js — the roster (operator): status, quotas, and each tenant's
// figures of the last 24 hours (GET /admin/tenants/{id}/stats).

import { h, fill, table, show, badge, problem } from './dom.js';
import { api, withQuery } from './api.js';
import { statsCards } from './overview.js';

export async function render(el, ctx) {
  const r = await api('GET', withQuery('/admin/tenants', { limit: 100, cursor: ctx.params.get('cursor') }));
  const detail = h('div', { id: 'tenant-stats' });
  const open = async (t) => {
    fill(detail, h('h2', {}, `Figures of ${t.id} (last 24 h)`), 'Loading…');
    try {
      const s = await api('GET', `/admin/tenants/${encodeURIComponent(t.id)}/stats`);
      fill(detail, h('h2', {}, `Figures of ${t.id} (last 24 h)`), statsCards(s));
    } catch (e) {
      fill(detail, problem(e));
    }
  };
  fill(el, h('h1', {}, 'Tenants'),
    table([
      { title: 'Tenant', cell: (t) => h('button', { type: 'button', class: 'link', onclick: () => open(t) }, t.id) },
      { title: 'Status', cell: (t) => badge(t.status) },
      { title: 'Quotas', cell: (t) => h('code', {}, show(t.quotas)) },
      { title: 'Subscriptions', cell: (t) => h('a', { href: withQuery('#/subscriptions', { tenant: t.id }) }, 'list') },
      { title: 'Deliveries', cell: (t) => h('a', { href: withQuery('#/deliveries', { tenant: t.id }) }, 'list') },
      { title: 'Created', cell: (t) => show(t.created_at) },
    ], r.items, 'No tenants yet: create one with POST /admin/tenants.'),
    r.next_cursor ? h('p', {}, h('a', { href: withQuery('#/tenants', { cursor: r.next_cursor }) }, 'More →')) : null,
    detail);
}
