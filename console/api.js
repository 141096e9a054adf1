// api.js — the hub's HTTP API as the signed-in user.  The token lives in
// this tab's sessionStorage only (never a cookie, never the URL), so it is
// gone when the tab closes and is never sent by the browser on its own.

const TOKEN = 'streaming-hub.token';
const ROLE = 'streaming-hub.role';
const TENANT = 'streaming-hub.tenant';

// An answer that was not 2xx: status, the problem+json detail (or the
// status text) as message, and its errors[] naming fields when there are.
export class ApiError extends Error {
  constructor(status, detail, errors) {
    super(detail);
    this.status = status;
    this.errors = errors || [];
  }
}

export const session = {
  get token() { return sessionStorage.getItem(TOKEN); },
  // "operator" (the admin token) or "tenant" (a tenant API key)
  get role() { return sessionStorage.getItem(ROLE); },
  get tenant() { return sessionStorage.getItem(TENANT); },
  get operator() { return this.role === 'operator'; },
  clear() { sessionStorage.removeItem(TOKEN); sessionStorage.removeItem(ROLE); sessionStorage.removeItem(TENANT); },
};

async function request(token, method, path, body) {
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, `the hub did not answer (${e.message})`);
  }
  const text = await res.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = null; }
  if (!res.ok) {
    const detail = (json && (json.detail || json.title)) || `${res.status} ${res.statusText}`;
    throw new ApiError(res.status, detail, json && json.errors);
  }
  return json;
}

// One API call with the session's token; resolves to the JSON answer.
export function api(method, path, body) {
  return request(session.token, method, path, body);
}

// A path with query parameters, the empty ones left out.
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

// /metrics as text (it needs no token).
export async function metricsText() {
  const res = await fetch('/metrics', { cache: 'no-store', credentials: 'omit' });
  if (!res.ok) throw new ApiError(res.status, `/metrics answered ${res.status}`);
  return res.text();
}

// Signs in with token: the admin token opens the operator's view, a tenant
// key its tenant's.  Tries the admin API first, then the tenant API;
// throws an ApiError with a sentence for the sign-in form otherwise.
export async function signIn(token) {
  token = token.trim();
  if (!token) throw new ApiError(400, 'Enter the admin token or a tenant API key.');
  try {
    await request(token, 'GET', '/admin/tenants?limit=1');
    sessionStorage.setItem(TOKEN, token);
    sessionStorage.setItem(ROLE, 'operator');
    sessionStorage.removeItem(TENANT);
    return 'operator';
  } catch (e) {
    if (e.status !== 401) throw e;
  }
  try {
    const stats = await request(token, 'GET', '/v1/stats');
    sessionStorage.setItem(TOKEN, token);
    sessionStorage.setItem(ROLE, 'tenant');
    sessionStorage.setItem(TENANT, stats.tenant || '');
    return 'tenant';
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      throw new ApiError(e.status, `Sign-in failed: this is neither the admin token nor an active tenant's API key (${e.message}).`);
    }
    throw e;
  }
}
