// quarantine.js — quarantined records (operator) with their evidence: the
// reason, field and detail, the Kafka position, headers and the value as
// text (shown as text only, whatever it holds).

import { h, fill, table, show, base64Text } from './dom.js';
import { api, withQuery } from './api.js';

export async function render(el, ctx) {
  const p = ctx.params;
  const r = await api('GET', withQuery('/admin/quarantine', { tenant: p.get('tenant'), reason: p.get('reason'), cursor: p.get('cursor'), limit: 50 }));
  fill(el, h('h1', {}, 'Quarantine'),
    h('p', { class: 'muted' }, 'Records ingest refused (SPEC §3.2), newest first.'),
    table([
      { title: 'Id', cell: (q) => show(q.id) },
      { title: 'Received', cell: (q) => show(q.received_at) },
      { title: 'Tenant', cell: (q) => show(q.tenant_id) },
      { title: 'Reason', cell: (q) => [h('strong', {}, show(q.reason)), q.field ? ` (${q.field})` : ''] },
      { title: 'Detail', cell: (q) => show(q.detail) },
      { title: 'Where', cell: (q) => q.topic ? `${q.topic}[${q.partition}]@${q.offset}` : show(q.source) },
      { title: 'Evidence', cell: (q) => h('details', {}, h('summary', {}, `${show(q.value_size)} bytes`),
        h('pre', { class: 'excerpt' }, q.value_base64 === null ? '(too large for the list)' : base64Text(q.value_base64)),
        q.headers ? h('pre', { class: 'excerpt' }, show(q.headers)) : null) },
    ], r.items, 'The quarantine is empty.'),
    r.next_cursor ? h('p', {}, h('a', { href: withQuery('#/quarantine', { cursor: r.next_cursor }) }, 'More →')) : null);
}
