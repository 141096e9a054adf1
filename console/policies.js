// policies.js — the loaded policy generation (operator): files, their
// generations, errors and tripped state; reload.

import { h, fill, table, show, badge, problem } from './dom.js';
import { api } from './api.js';

function view(el, g, msg) {
  fill(el, h('h1', {}, 'Policies'),
    h('p', {}, `Generation ${show(g.generation)}, loaded ${show(g.loaded_at)} from `, h('code', {}, show(g.dir)), '. ',
      h('button', { type: 'button', id: 'reload', onclick: async () => {
        fill(msg, 'Reloading…');
        try {
          const r = await api('POST', '/admin/policies/reload');
          view(el, r, msg);
          fill(msg, h('span', { class: 'ok' }, `Reloaded: generation ${show(r.generation)}.`));
        } catch (e) {
          fill(msg, problem(e));
        }
      } }, 'Reload'), ' ', h('a', { href: '#/dryrun' }, 'Dry-run a policy')),
    msg,
    table([
      { title: 'Policy', cell: (p) => h('code', {}, show(p.name)) },
      { title: 'Generation', cell: (p) => show(p.generation) },
      { title: 'Functions', cell: (p) => show((p.functions || []).join(', ')) },
      { title: 'State', cell: (p) => [badge(p.state || 'ok'), p.tripped_until ? ` until ${p.tripped_until}` : '', p.trips ? ` (${p.trips} trips)` : ''] },
      { title: 'Last error', cell: (p) => p.last_error || p.last_call_error ? h('pre', { class: 'excerpt' }, show(p.last_error || p.last_call_error)) : '—' },
      { title: 'Loaded', cell: (p) => show(p.loaded_at) },
    ], g.policies || [], 'No policy files are loaded.'));
}

export async function render(el) {
  view(el, await api('GET', '/admin/policies'), h('div', { id: 'policies-message' }));
}
