// client.js — the unmask WebSocket protocol client (docs/protocol.md) for the browser UI.
//
// Keeps one session across network drops: on reconnect it sends session.resume {session, last_seq}
// and the server replays exactly the events this client missed. Deduplicates by seq, acknowledges
// what it has processed (so the server can release its replay buffer), and reports everything as
// DOM events: 'status' {state, attempt}, 'session' {token, model, defaults, limits, resumed},
// 'message' {msg} (every server event, in seq order), 'lost' {ids} (generations that could not be
// resumed). Not here: rendering (canvas.js, runs.js).

const HANDSHAKE_TIMEOUT_MS = 6000;
const RESUME_FAIL_CODES = new Set(['unknown_session', 'session_overflow', 'resume_not_allowed']);

export class UnmaskClient extends EventTarget {
  constructor(url, apiKey = '') {
    super();
    this.url = url;
    this.apiKey = apiKey;       // sent as the subprotocol "unmask-key.<key>" (browsers cannot set headers)
    this.everOpened = false;
    this.ws = null;
    this.token = null;          // session we belong to
    this.lastSeq = 0;           // last seq processed in that session
    this.ackedSeq = 0;
    this.resuming = false;      // sent session.resume, waiting to learn the outcome
    this.freshToken = null;     // the new connection's own session (adopted if resume fails)
    this.attempt = 0;
    this.closedByUser = false;
    this.ackTimer = null;
    this.eventCounter = 0;
    this.outbox = [];           // messages sent while disconnected
    this.stats = { events: 0, reconnects: 0, replayed: 0 };
  }

  connect() {
    this.closedByUser = false;
    this.#open();
  }

  close() {
    this.closedByUser = true;
    if (this.ws) this.ws.close(1000, 'bye');
  }

  // Test/demo helper: drop the connection as a network failure would; the client reconnects.
  dropConnection() {
    if (this.ws) this.ws.close(4000, 'simulated network drop');
  }

  get connected() {
    return this.ws && this.ws.readyState === WebSocket.OPEN && !this.resuming;
  }

  send(msg) {
    if (!msg.event_id) msg.event_id = `ev_${++this.eventCounter}`;
    const text = JSON.stringify(msg);
    if (this.connected) this.ws.send(text);
    else this.outbox.push(text);
    return msg.event_id;
  }

  generate(id, body) {
    return this.send({ type: 'generate', id, ...body });
  }

  cancel(id) {
    return this.send({ type: 'cancel', id });
  }

  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  #open() {
    this.#emit('status', { state: this.attempt ? 'reconnecting' : 'connecting', attempt: this.attempt });
    let ws;
    try {
      ws = new WebSocket(this.url, this.apiKey ? ['unmask', `unmask-key.${this.apiKey}`] : ['unmask']);
    } catch (e) {
      this.#scheduleReconnect();
      return;
    }
    this.ws = ws;
    // a handshake that hangs (a server going down mid-accept, a stalled proxy) would stall the
    // reconnect loop: give it up after a while, which closes the socket and schedules the next try
    const handshake = setTimeout(() => {
      if (ws.readyState === WebSocket.CONNECTING) ws.close();
    }, HANDSHAKE_TIMEOUT_MS);
    ws.onopen = () => {
      clearTimeout(handshake);
      this.everOpened = true;
    };
    ws.onmessage = (ev) => this.#onMessage(ev.data);
    ws.onclose = (ev) => {
      clearTimeout(handshake);
      if (this.ws !== ws) return;
      this.ws = null;
      this.resuming = false;
      clearTimeout(this.ackTimer);
      this.ackTimer = null;
      if (this.closedByUser) {
        this.#emit('status', { state: 'closed', code: ev.code });
        return;
      }
      this.#scheduleReconnect(ev.code);
    };
  }

  #scheduleReconnect(code) {
    this.attempt++;
    const delay = Math.min(8000, 250 * 2 ** Math.min(this.attempt - 1, 5)) * (0.8 + Math.random() * 0.4);
    // a handshake that never succeeds is most likely an API key the server wants
    this.#emit('status', { state: 'offline', attempt: this.attempt, code, retryIn: delay, refused: !this.everOpened && this.attempt >= 2 });
    setTimeout(() => this.#open(), delay);
  }

  #flushOutbox() {
    while (this.outbox.length && this.connected) this.ws.send(this.outbox.shift());
  }

  #ackSoon() {
    if (this.lastSeq - this.ackedSeq >= 32) return this.#ackNow();
    if (!this.ackTimer) this.ackTimer = setTimeout(() => this.#ackNow(), 500);
  }

  #ackNow() {
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN || this.resuming) return;
    if (this.lastSeq > this.ackedSeq) {
      this.ws.send(JSON.stringify({ type: 'ack', seq: this.lastSeq }));
      this.ackedSeq = this.lastSeq;
    }
  }

  #onMessage(data) {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    if (msg.type === 'session.created') {
      this.freshToken = msg.session;
      if (this.token) {
        // a reconnect: ask for our old session back
        this.resuming = true;
        this.ws.send(JSON.stringify({ type: 'session.resume', session: this.token, last_seq: this.lastSeq }));
        this.#emit('session', { ...msg, resumed: false, pending: true });
        return;
      }
      this.token = msg.session;
      this.lastSeq = msg.seq;
      this.attempt = 0;
      this.#emit('status', { state: 'open' });
      this.#emit('session', { ...msg, resumed: false });
      this.#flushOutbox();
      this.#ackSoon();
      return;
    }
    if (this.resuming) {
      if (msg.type === 'error' && msg.error && (RESUME_FAIL_CODES.has(msg.error.code) || msg.error.param === 'last_seq') && !msg.id) {
        // the old session is gone: continue in the connection's fresh session
        this.resuming = false;
        const lostFrom = this.token;
        this.token = this.freshToken;
        this.lastSeq = msg.seq;
        this.ackedSeq = 0;
        this.attempt = 0;
        this.#emit('lost', { session: lostFrom, reason: msg.error.message, code: msg.error.code });
        this.#emit('status', { state: 'open' });
        this.#flushOutbox();
        return;
      }
      // anything else belongs to the resumed session: replayed events, then session.resumed
      if (msg.type === 'session.resumed') {
        this.resuming = false;
        this.attempt = 0;
        this.stats.reconnects++;
        this.stats.replayed += msg.replayed || 0;
        this.#accept(msg);
        this.#emit('status', { state: 'open', resumed: true, replayed: msg.replayed });
        this.#flushOutbox();
        return;
      }
    }
    this.#accept(msg);
  }

  #accept(msg) {
    if (typeof msg.seq === 'number') {
      if (msg.seq <= this.lastSeq) return; // already seen (never happens with a correct server)
      this.lastSeq = msg.seq;
    }
    this.stats.events++;
    this.#emit('message', { msg });
    this.#ackSoon();
  }
}
