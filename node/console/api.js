// The API client: same origin in production; a development page served elsewhere names the
// node in `<meta name="sift-api-base">` or `localStorage['sift.apiBase']` (never a key).
// The key lives in sessionStorage (this tab only) and travels as `Authorization: Bearer`.
import { readEvents } from './sse.js';

const KEY = 'sift.key';

export function apiBase() {
  const stored = localStorage.getItem('sift.apiBase');
  const meta = document.querySelector('meta[name="sift-api-base"]')?.content;
  return (stored || meta || '').replace(/\/$/, '');
}

export const key = {
  get: () => sessionStorage.getItem(KEY) || '',
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

/** An error answer of the API: `{error: {code, message, param}}` with its status. */
export class ApiError extends Error {
  constructor(status, code, message, param) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

function headers(extra = {}) {
  const result = { ...extra };
  const secret = key.get();
  if (secret) result.Authorization = `Bearer ${secret}`;
  return result;
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON
  }
  const error = body?.error || {};
  const failed = new ApiError(
    response.status,
    error.code || `http_${response.status}`,
    error.message || response.statusText || `HTTP ${response.status}`,
    error.param || null,
  );
  if (response.status === 401) {
    window.dispatchEvent(new CustomEvent('sift:unauthorized', { detail: failed }));
  }
  return failed;
}

/** Fetches `path` from the API; a network failure or an error answer is an ApiError. */
async function fetchOk(path, init) {
  let response;
  try {
    response = await fetch(apiBase() + path, init);
  } catch (error) {
    if (error.name === 'AbortError') throw error;
    throw new ApiError(0, 'unreachable', String(error.message || error), null);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

async function send(method, path, body, signal) {
  const init = { method, headers: headers(), signal };
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  return fetchOk(path, init);
}

/** Calls the API; resolves with the parsed JSON answer (null for an empty one). */
export async function api(method, path, body, signal) {
  const response = await send(method, path, body, signal);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

/**
 * Opens an event stream (GET, or POST with a JSON body) and calls `onEvent` for each
 * event; `lastEventId` resumes after that event. Resolves with the last id seen.
 */
export async function stream(path, { method = 'GET', body, lastEventId, onEvent, signal }) {
  const init = {
    method,
    headers: headers({ Accept: 'text/event-stream' }),
    signal,
  };
  if (lastEventId) init.headers['Last-Event-ID'] = String(lastEventId);
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetchOk(path, init);
  return readEvents(response, onEvent, signal);
}

export const enc = encodeURIComponent;

/**
 * The form field an API error is about, among `names`: its `param`; else the field its code
 * names (`invalid_mmr_lambda`); else the field its message starts with ("shards must be …").
 */
export function errorField(failed, names) {
  const candidates = [
    (failed.param || '').replace(/^retrieval\./, ''),
    (failed.code || '').replace(/^invalid_/, ''),
    (failed.message || '').split(/[\s:]/)[0],
  ];
  return candidates.find((name) => name && names.includes(name)) || null;
}
