// api.js — the API key the pages share and the authenticated fetch of the HTTP APIs. The key (only
// needed when the server requires one) is kept in localStorage (`unmask.apiKey`); the chat page
// sets it, both pages send it: as a bearer token on HTTP requests here, as a WebSocket subprotocol
// in client.js. Not here: the WebSocket protocol (client.js), reading the responses.

const KEY = 'unmask.apiKey';

export function apiKey() {
  return localStorage.getItem(KEY) || '';
}

// Remember key (empty: forget it).
export function setApiKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

// POST body (an object, sent as JSON) to path with the stored key; resolves to the fetch Response.
export function postJson(path, body, signal) {
  const headers = { 'content-type': 'application/json' };
  const key = apiKey();
  if (key) headers.authorization = `Bearer ${key}`;
  return fetch(path, { method: 'POST', headers, body: JSON.stringify(body), signal });
}
