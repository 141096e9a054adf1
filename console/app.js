// app.js — the console's shell: sign-in, the navigation, and the router
// that renders one screen into <main> for the location's hash
// ("#/deliveries?state=dead").  Each screen is a module whose render(main,
// params) resolves once its main data is on the page; the shell then marks
// "hub:data" in the Performance timeline (the browser test reads it) and
// sets body[data-ready] to the screen's name.

import { h, fill, problem } from './dom.js';
import { session, signIn } from './api.js';
import * as overview from './overview.js';
import * as tenants from './tenants.js';
import * as subscriptions from './subscriptions.js';
import * as deliveries from './deliveries.js';
import * as delivery from './delivery.js';
import * as quarantine from './quarantine.js';
import * as policies from './policies.js';
import * as dryrun from './dryrun.js';

// name → [module, title, operator only, in the navigation]
const screens = {
  overview: [overview, 'Overview', false, true],
  tenants: [tenants, 'Tenants', true, true],
  subscriptions: [subscriptions, 'Subscriptions', false, true],
  deliveries: [deliveries, 'Deliveries', false, true],
  delivery: [delivery, 'Delivery', false, false],
  quarantine: [quarantine, 'Quarantine', true, true],
  policies: [policies, 'Policies', true, true],
  dryrun: [dryrun, 'Dry-run', true, true],
};

// every module is loaded and run: the rest of a screen's time is its API
// calls and rendering (the browser test reports both)
performance.mark('hub:app');

const main = document.getElementById('main');
let renderSeq = 0;

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, query] = raw.split('?');
  let parts;
  try {
    parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  } catch {
    parts = ['not-found']; // a malformed %-escape in a pasted link: not a screen
  }
  return { name: parts[0] || 'overview', arg: parts[1] || null, params: new URLSearchParams(query || '') };
}

function renderNav(current) {
  const nav = document.getElementById('nav');
  fill(nav, Object.entries(screens)
    .filter(([, s]) => s[3] && (!s[2] || session.operator))
    .map(([name, s]) => h('a', { href: `#/${name}`, class: name === current ? 'current' : null }, s[1])));
  const who = document.getElementById('who');
  fill(who, session.operator ? 'operator (admin token)' : `tenant ${session.tenant || ''}`);
  const out = document.getElementById('signout');
  out.hidden = false;
}

function renderSignIn(error) {
  fill(document.getElementById('nav'));
  fill(document.getElementById('who'));
  document.getElementById('signout').hidden = true;
  const input = h('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', size: 52,
    placeholder: 'admin token or tenant API key (shk_…)', 'aria-label': 'Token' });
  const status = h('div', { id: 'signin-status' }, error ? problem(error) : null);
  const form = h('form', { class: 'signin', id: 'signin' },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'The admin token opens every tenant (operator view); a tenant API key opens that tenant only. ',
      'The token is kept in this tab only (session storage) and sent to this hub only.'),
    input, h('button', { type: 'submit' }, 'Sign in'), status);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    fill(status, h('span', { class: 'muted' }, 'Checking…'));
    try {
      await signIn(input.value);
      route();
    } catch (e) {
      fill(status, problem(e));
    }
  });
  fill(main, form);
  document.body.dataset.ready = 'signin';
  input.focus();
}

async function route() {
  const seq = ++renderSeq;
  delete document.body.dataset.ready;
  if (!session.token) {
    renderSignIn();
    return;
  }
  const { name, arg, params } = parseHash();
  const screen = screens[name] && (!screens[name][2] || session.operator) ? screens[name] : null;
  renderNav(name);
  if (!screen) {
    fill(main, h('h1', {}, 'Not found'), h('p', {}, 'No such screen. ', h('a', { href: '#/overview' }, 'Overview')));
    return;
  }
  document.title = `${screen[1]} · streaming-hub`;
  const el = h('section', { class: `screen ${name}` });
  fill(main, el);
  try {
    await screen[0].render(el, { arg, params, operator: session.operator, tenant: session.tenant });
  } catch (e) {
    // a token revoked since sign-in: back to the form, saying why
    if (e.status === 401) {
      session.clear();
      renderSignIn(e);
      return;
    }
    el.appendChild(problem(e));
  }
  if (seq === renderSeq) {
    performance.mark('hub:data');
    document.body.dataset.ready = name;
  }
}

document.getElementById('signout').addEventListener('click', () => {
  session.clear();
  location.hash = '#/overview';
  renderSignIn();
});
window.addEventListener('hashchange', route);
route();
