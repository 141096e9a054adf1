// dom.js — the console's only way of making elements.  Every string a
// caller passes becomes a text node (never HTML), so tenant data — payload
// excerpts, headers, names — cannot turn into markup or script.

// h(tag, attrs, ...children): an element.  attrs keys: "class", "on<event>"
// (a listener), "dataset" (an object), anything else as an attribute;
// null/undefined/false attrs are skipped.  children: nodes, strings or
// numbers (as text), arrays of those, null/false (skipped).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2), v);
    } else if (k === 'dataset') {
      Object.assign(el.dataset, v);
    } else if (k === 'class') {
      el.className = v;
    } else if (k === 'value') {
      el.value = v;
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// Replaces el's content with children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// A table: columns [{title, cell(row) → node|string}], rows; empty says so.
export function table(columns, rows, empty) {
  if (rows.length === 0) return h('p', { class: 'muted empty' }, empty || 'Nothing here yet.');
  return h('table', {},
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', {}, c.title)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, columns.map((c) => h('td', {}, c.cell(r)))))));
}

// A short text of a value: JSON for objects, "—" for null.
export function show(v) {
  if (v === null || v === undefined) return '—';
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

// A problem (api.js ApiError or any error) as an alert element.
export function problem(err) {
  const lines = [err.message || String(err)];
  for (const e of err.errors || []) lines.push(`${e.field}: ${e.message}`);
  return h('div', { class: 'error', role: 'alert' }, lines.map((l) => h('div', {}, l)));
}

// A state word as a coloured badge (its class is the state, text as given).
export function badge(state) {
  const known = ['succeeded', 'dead', 'pending', 'in_flight', 'parked', 'active', 'failed',
    'tripped', 'ok', 'inactive', 'open', 'half_open', 'closed', 'enabled', 'disabled'];
  return h('span', { class: `badge ${known.includes(state) ? state : ''}` }, show(state));
}

// Decodes base64 to text (UTF-8, bad sequences replaced): for display only.
export function base64Text(b64) {
  if (b64 === null || b64 === undefined) return null;
  const bin = atob(b64);
  const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
  return new TextDecoder('utf-8', { fatal: false }).decode(bytes);
}
