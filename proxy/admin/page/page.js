// mq-sidecar's admin page (proxy/admin/page.py, docs/operations.md "The admin page").
// No library, no build step. Reads /status every second and /events with fetch() and a
// stream reader (EventSource cannot send Authorization). The admin token, when the sidecar
// asks for one, lives in this script's memory only and goes out as an Authorization header:
// never a cookie, never a query string. Everything shown is set as text, never as HTML.
"use strict";

(() => {
  const STATUS_EVERY_MS = 1000;
  const CHART_SECONDS = 120; // the charts' time axis
  const FEED_MAX = 300; // entries kept in the feed
  const SESSIONS_MAX = 200; // rows drawn in the sessions table
  const SUBSCRIPTIONS_MAX = 200; // rows drawn in the subscriptions table
  const EVENT_RETRY_MIN_MS = 250; // first reconnect delay of the event stream; doubles...
  let eventRetryMaxMs = 5000; // ...up to the stream's own `retry:` (5000 from the sidecar)
  const LINE_MAX = 1 << 20; // a line of the event stream longer than this ends the stream
  const ARM_MS = 5000; // a dangerous button stays armed (second click acts) this long

  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";

  // -- state --------------------------------------------------------------------------------
  let token = null; // the admin token, memory only
  let access = "unknown"; // unknown | ok | token (needs one) | forbidden | unreachable
  let unreachableSince = null;
  let lastEventId = null;
  let eventReader = null; // the open /events stream's reader
  let lastUptime = null;
  let shown = false; // data is on the page
  const brokerStates = new Map(); // broker -> state last seen (the page's own observations)
  const samples = []; // {t, sends, messages, replays, forwarded}: /status counters
  const sleepers = new Set(); // the resolvers of the sleeps wake() cuts short

  // Wait `ms`, or less when wake() is called (a token entered, an action done).
  const sleep = (ms) =>
    new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        sleepers.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      sleepers.add(done);
    });

  const wake = () => {
    for (const done of [...sleepers]) done();
  };

  function authHeaders(extra) {
    const headers = Object.assign({}, extra || {});
    if (token) headers.Authorization = "Bearer " + token;
    return headers;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const badge = (text, cls) => el("span", { class: "badge " + (cls || text) }, text);

  function fmtBytes(n) {
    if (n === null || n === undefined) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }

  function fmtSeconds(s) {
    if (s === null || s === undefined) return "—";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return Math.round(s / 86400) + " d";
  }

  const fmtRate = (r) => (r === null ? "—" : (r < 10 ? r.toFixed(1) : Math.round(r)) + "/s");
  const clock = (date) => date.toTimeString().slice(0, 8);

  // -- the link to the sidecar ----------------------------------------------------------------
  function setLink(state, text) {
    const link = $("link");
    link.className = "link " + state;
    link.textContent = text;
    link.dataset.state = state;
  }

  function unreachable(why) {
    if (access !== "unreachable") {
      unreachableSince = new Date();
      if (shown) addPageEntry("sidecar-down", "the sidecar cannot be reached: " + why);
    }
    access = "unreachable";
    setLink("down", "cannot reach the sidecar since " + clock(unreachableSince) + " (" + why + "); retrying");
    $("data").classList.add("stale");
  }

  function reachable() {
    if (access === "unreachable" && shown) {
      addPageEntry("sidecar-up", "the sidecar answers again (unreachable since " + clock(unreachableSince) + ")");
    }
    access = "ok";
    unreachableSince = null;
    setLink("up", "connected");
    $("data").classList.remove("stale");
  }

  function hideData() {
    // Refused: nothing of what a token guards stays on the page.
    shown = false;
    $("data").hidden = true;
    for (const id of ["brokers", "sessions", "subscriptions"]) $(id).tBodies[0].replaceChildren();
    $("feed").replaceChildren();
    $("outbox").replaceChildren();
    delete $("outbox").dataset.frames;
    delete $("outbox").dataset.forwarded;
    $("summary").replaceChildren();
    $("version").textContent = "";
    samples.length = 0;
    brokerStates.clear();
    lastEventId = null;
    if (eventReader !== null) eventReader.cancel().catch(() => {}); // no event shown after this
  }

  function askToken(message) {
    access = "token";
    hideData();
    $("forbidden").hidden = true;
    $("auth").hidden = false;
    $("auth-message").textContent = message || "";
    $("auth-message").className = "message bad";
    setLink("auth", "admin token needed");
    if (document.activeElement !== $("token")) $("token").focus();
  }

  function forbidden(text) {
    access = "forbidden";
    hideData();
    $("auth").hidden = true;
    $("forbidden").hidden = false;
    $("forbidden").textContent = text.trim();
    setLink("down", "refused (403)");
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault(); // no navigation: the form is never submitted (form-action 'none')
    token = $("token").value.trim() || null;
    $("token").value = "";
    $("auth-message").textContent = "checking…";
    $("auth-message").className = "message";
    wake();
  });

  // -- /status --------------------------------------------------------------------------------
  async function pollStatus() {
    let response;
    try {
      response = await fetch("status", { headers: authHeaders(), cache: "no-store" });
    } catch (error) {
      unreachable("no answer");
      return;
    }
    if (response.status === 401) {
      askToken(token ? "refused: that is not the admin token (401)" : "");
      return;
    }
    if (response.status === 403) {
      forbidden(await response.text());
      return;
    }
    if (!response.ok) {
      unreachable("/status answered " + response.status);
      return;
    }
    let doc;
    try {
      doc = await response.json();
    } catch (error) {
      unreachable("/status is not JSON");
      return;
    }
    $("auth").hidden = true;
    $("forbidden").hidden = true;
    reachable();
    render(doc);
  }

  async function statusLoop() {
    for (;;) {
      const started = performance.now();
      await pollStatus();
      const wait = STATUS_EVERY_MS - (performance.now() - started);
      if (access === "token") {
        await sleep(60000); // until a token is entered (wake)
      } else {
        await new Promise((resolve) => setTimeout(resolve, Math.max(50, wait)));
      }
    }
  }

  function render(doc) {
    if (lastUptime !== null && doc.uptime_seconds !== null && doc.uptime_seconds < lastUptime) {
      addPageEntry("sidecar-up", "the sidecar restarted (uptime " + fmtSeconds(doc.uptime_seconds) + ")");
      samples.length = 0;
    }
    lastUptime = doc.uptime_seconds;
    $("version").textContent = doc.version;
    renderSummary(doc);
    renderBrokers(doc);
    renderSessions(doc);
    renderSubscriptions(doc);
    sample(doc);
    renderOutbox(doc);
    renderCharts();
    shown = true;
    $("data").hidden = false;
  }

  function renderSummary(doc) {
    const parts = [
      doc.ready ? el("span", {}, "ready") : el("span", { class: "bad" }, "not ready: " + doc.not_ready_reasons.join("; ")),
      " · STOMP " + (doc.listen || "—"),
      " · " + doc.sessions_open + " session(s) open, " + doc.sessions_total + " since start",
      " · up " + fmtSeconds(doc.uptime_seconds),
      " · config " + String(doc.config_digest || "").slice(7, 19),
    ];
    $("summary").replaceChildren(...parts);
  }

  function renderBrokers(doc) {
    const rows = [];
    for (const b of doc.brokers) {
      const before = brokerStates.get(b.broker);
      // A change between up and down (not the first check's verdict) is worth a line.
      if (before !== undefined && before !== "unknown" && before !== b.state && b.state !== "unknown") {
        addPageEntry(
          b.state === "up" ? "broker-up" : "broker-down",
          b.broker + " is " + b.state + (b.detail ? ": " + b.detail : ""),
          b.broker,
        );
      }
      brokerStates.set(b.broker, b.state);
      const check = el(
        "td",
        { class: "detail" },
        (b.last_outcome || "not checked yet") + (b.detail ? ": " + b.detail : ""),
        b.last_answer_age_seconds !== null ? el("br") : null,
        b.last_answer_age_seconds !== null ? "answered " + fmtSeconds(b.last_answer_age_seconds) + " ago" : null,
      );
      rows.push(
        el(
          "tr",
          { "data-broker": b.broker, "data-state": b.state },
          el("td", {}, el("code", {}, b.broker)),
          el("td", {}, badge(b.state), evacuatedBadge(b.evacuated)),
          el("td", { class: "num" }, b.sessions ? badge(b.sessions + " in use", "in-use") : "0"),
          check,
          tlsCell(b.tls),
          el("td", {}, actionButton("Evacuate", "evacuate", b.broker), " ", actionButton("Readmit", "readmit", b.broker)),
        ),
      );
    }
    $("brokers").tBodies[0].replaceChildren(...rows);
  }

  // /status's `evacuated` of a broker (the admin actions): null, or its reason and time left.
  function evacuatedBadge(evacuation) {
    if (!evacuation) return null;
    const left = evacuation.seconds_left;
    const until = left === null || left === undefined ? "until readmitted" : "for " + fmtSeconds(left) + " more";
    const title = (evacuation.reason || "evacuated") + ", " + until;
    return el("span", { class: "badge evacuated", title, "data-evacuated": "true" }, "evacuated " + until);
  }

  function tlsCell(tls) {
    if (!tls) return el("td", { class: "detail tls" }, "plain STOMP");
    const cell = el("td", { class: "detail tls", "data-expires": tls.not_after || null });
    if (tls.not_after) {
      const days = tls.expires_in_seconds / 86400;
      const text = "expires " + tls.not_after.slice(0, 10) + " (" + (days < 2 ? fmtSeconds(tls.expires_in_seconds) : Math.floor(days) + " days") + ")";
      cell.append(days < 14 ? el("span", { class: "problem" }, text) : text);
    } else {
      cell.append("no handshake yet");
    }
    if (tls.last_error) cell.append(el("br"), el("span", { class: "problem" }, "last failure: " + tls.last_error));
    return cell;
  }

  function renderSessions(doc) {
    const maxUnacked = doc.config && doc.config.max_unacked;
    const rows = [];
    for (const s of doc.sessions.slice(0, SESSIONS_MAX)) {
      const w = s.window;
      const window = w
        ? el("td", {}, el("meter", { min: 0, max: w.max_bytes, value: Math.min(w.bytes, w.max_bytes), high: w.max_bytes * 0.8 }),
          w.frames + " frames, " + fmtBytes(w.bytes) + " / " + fmtBytes(w.max_bytes))
        : el("td", {}, "—");
      const outage = s.reconnecting_for !== null && s.reconnecting_for !== undefined
        ? fmtSeconds(s.reconnecting_for) + (s.reconnect_attempts ? " (" + s.reconnect_attempts + " attempts)" : "")
        : "—";
      rows.push(
        el(
          "tr",
          { "data-session": s.session_id, "data-broker": s.broker || "", "data-state": s.state },
          el("td", {}, el("code", {}, s.session_id)),
          el("td", {}, el("code", {}, s.app_address || "—")),
          el("td", {}, badge(s.state)),
          el("td", {}, s.broker ? el("code", {}, s.broker) : "—"),
          window,
          el("td", { class: "num" }, s.unacked + (maxUnacked ? " / " + maxUnacked : "")),
          el("td", { class: "num" }, s.transactions),
          el("td", { class: "num" }, s.outbox_backlog === null || s.outbox_backlog === undefined ? "—" : s.outbox_backlog),
          el("td", { class: "num" }, outage),
        ),
      );
    }
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: 9 }, "no session open")));
    $("sessions").tBodies[0].replaceChildren(...rows);
    const more = doc.sessions_open > rows.length && doc.sessions.length ? " (first " + Math.min(SESSIONS_MAX, doc.sessions.length) + " shown)" : "";
    $("sessions-count").textContent = doc.sessions_open + " open" + more;
  }

  function renderSubscriptions(doc) {
    // Every subscription's state (live, restoring, cancelled_by_broker, waiting_for_queue).
    const subs = doc.subscriptions || [];
    const optional = (v, fmt) => (v === null || v === undefined ? "—" : fmt(v));
    const rows = subs.slice(0, SUBSCRIPTIONS_MAX).map((s) =>
      el(
        "tr",
        { "data-session": s.session_id, "data-subscription": s.id, "data-state": s.state },
        el("td", {}, el("code", {}, s.session_id)),
        el("td", {}, el("code", {}, s.id)),
        el("td", {}, el("code", {}, s.destination)),
        el("td", {}, s.kind),
        el("td", {}, s.ack),
        el("td", {}, badge(s.state.replaceAll("_", " "), { live: "up", restoring: "reconnecting" }[s.state] || "down")),
        el("td", { class: "num" }, optional(s.down_for_seconds, fmtSeconds)),
        el("td", { class: "num" }, optional(s.last_delivery_age_seconds, (v) => fmtSeconds(v) + " ago")),
        el("td", { class: "num" }, optional(s.stream_offset, String)),
      ),
    );
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: 9 }, "no subscription")));
    $("subscriptions").tBodies[0].replaceChildren(...rows);
    const down = subs.filter((s) => s.state !== "live").length;
    const more = subs.length > SUBSCRIPTIONS_MAX || doc.subscriptions_truncated ? " (first " + Math.min(SUBSCRIPTIONS_MAX, subs.length) + " shown)" : "";
    $("subscriptions-count").textContent = subs.length + (down ? ", " + down + " not live" : ", all live") + more;
  }

  function renderOutbox(doc) {
    const o = doc.outbox;
    const list = $("outbox");
    if (!o) {
      list.replaceChildren(el("dt", {}, "outbox"), el("dd", {}, "off (outbox = false)"));
      delete list.dataset.frames;
      return;
    }
    list.dataset.frames = o.frames;
    list.dataset.forwarded = o.forwarded_total;
    const pairs = [
      ["depth", [el("meter", { min: 0, max: o.max_bytes, value: Math.min(o.bytes, o.max_bytes), high: o.max_bytes * 0.8 }),
        o.frames + " frames, " + fmtBytes(o.bytes) + " / " + fmtBytes(o.max_bytes)]],
      ["oldest frame", [o.oldest_age_seconds === null ? "—" : fmtSeconds(o.oldest_age_seconds) + " old"]],
      ["forward rate", [fmtRate(rate("forwarded", 5))]],
      ["forwarded", [o.forwarded_total + " since start"]],
      ["sessions", [o.sessions + " with frames" + (o.unowned_sessions ? ", " + o.unowned_sessions + " left to the forwarder" : "")]],
      ["waiting for room", [String(o.room_waiters)]],
      ["recovery", [o.recovery.clean ? "clean (" + o.recovery.frames + " frames found)" : o.recovery.problems.join("; ")]],
    ];
    list.replaceChildren(...pairs.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, ...value)]));
  }

  // -- rate charts: the page's own samples of /status counters -------------------------------
  function sample(doc) {
    const totals = doc.totals || {};
    samples.push({
      t: performance.now() / 1000,
      sends: totals.sends,
      messages: totals.messages,
      replays: totals.replayed_frames,
      forwarded: doc.outbox ? doc.outbox.forwarded_total : null,
    });
    const oldest = samples[samples.length - 1].t - CHART_SECONDS - 5;
    while (samples.length && samples[0].t < oldest) samples.shift();
  }

  // Per second over the last `seconds`; null without two samples (or after a restart).
  function rate(key, seconds) {
    const last = samples[samples.length - 1];
    if (!last || last[key] === null || last[key] === undefined) return null;
    let first = null;
    for (let i = samples.length - 2; i >= 0 && last.t - samples[i].t <= seconds + 0.5; i--) first = samples[i];
    if (!first || first[key] === null || last[key] < first[key]) return null;
    return (last[key] - first[key]) / (last.t - first.t);
  }

  function series(key) {
    const points = [];
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1];
      const b = samples[i];
      if (a[key] === null || b[key] === null || b[key] < a[key] || b.t <= a.t) continue;
      points.push([b.t, (b[key] - a[key]) / (b.t - a.t)]);
    }
    return points;
  }

  function renderCharts() {
    const now = performance.now() / 1000;
    // The time axis spans the samples there are, 10 s at least, CHART_SECONDS at most.
    const span = Math.min(CHART_SECONDS, Math.max(10, samples.length ? now - samples[0].t : 0));
    for (const [key, id] of [["sends", "sends"], ["messages", "messages"], ["replays", "replays"]]) {
      const svg = $("chart-" + id);
      const points = series(key);
      const highest = points.length ? Math.max(...points.map((p) => p[1])) : null;
      const peak = Math.max(1, highest || 0); // the y scale: at least 1/s
      const xy = points.map(([t, r]) => [
        (240 * (t - (now - span))) / span,
        46 - (42 * r) / peak,
      ]);
      const children = [];
      if (xy.length) {
        const line = xy.map(([x, y]) => x.toFixed(1) + "," + y.toFixed(1)).join(" ");
        const first = xy[0][0].toFixed(1);
        const last = xy[xy.length - 1][0].toFixed(1);
        children.push(svgNode("polygon", { points: first + ",48 " + line + " " + last + ",48" }));
        children.push(svgNode("polyline", { points: line }));
      }
      svg.replaceChildren(...children);
      const peakText = highest === null ? "" : " · peak " + fmtRate(highest);
      $("rate-" + id).textContent = fmtRate(rate(key, 5)) + peakText;
    }
  }

  function svgNode(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    return node;
  }

  // -- actions (POST, with the token) ---------------------------------------------------------
  function actionButton(label, action, broker) {
    const button = el("button", { type: "button", "data-action": action, "data-broker": broker }, label);
    arm(button, label, action + " " + broker, () => act("actions/" + action, { broker }, label + " " + broker));
    return button;
  }

  // A dangerous button acts on a second click within ARM_MS (no modal dialog). The armed state
  // is kept by key, not in the button: the broker table is drawn anew every second.
  const armedUntil = new Map();

  function arm(button, label, key, run) {
    const isArmed = () => (armedUntil.get(key) || 0) > Date.now();
    const show = () => {
      button.textContent = isArmed() ? "Confirm " + label.toLowerCase().replace("…", "") + "?" : label;
    };
    show();
    button.addEventListener("click", () => {
      if (isArmed()) {
        armedUntil.delete(key);
        show();
        run();
        return;
      }
      armedUntil.set(key, Date.now() + ARM_MS);
      show();
      setTimeout(show, ARM_MS + 10);
    });
  }

  function actionMessage(text, ok) {
    const message = $("action-message");
    message.textContent = text;
    message.className = "message " + (ok ? "ok" : "bad");
    message.dataset.ok = ok ? "true" : "false";
  }

  async function act(path, body, label) {
    let response;
    try {
      response = await fetch(path, {
        method: "POST",
        headers: authHeaders({ "Content-Type": "application/json" }),
        body: JSON.stringify(body),
        cache: "no-store",
      });
    } catch (error) {
      actionMessage(label + ": the sidecar cannot be reached", false);
      return;
    }
    let answer = null;
    try {
      answer = await response.json();
    } catch (error) {
      answer = null;
    }
    const said = answer && typeof answer.message === "string" ? answer.message : (await response.text().catch(() => "")).trim();
    if (response.status === 404) {
      actionMessage(label + ": this sidecar has no such action (404)", false);
    } else if (response.status === 401) {
      actionMessage(label + ": refused, the admin token is needed (401)", false);
    } else {
      const ok = response.ok && !!(answer && answer.ok);
      actionMessage(label + ": " + (said || response.status + " " + response.statusText) + (ok ? "" : " (" + response.status + ")"), ok);
    }
    wake();
  }

  arm($("drain"), "Drain the sidecar…", "drain", () => act("actions/drain", {}, "drain"));

  // -- /events: Server-Sent Events read with fetch() ------------------------------------------
  function feedState(text) {
    $("feed-state").textContent = text;
    $("feed-state").dataset.state = text;
  }

  async function eventsLoop() {
    let delay = EVENT_RETRY_MIN_MS;
    for (;;) {
      if (access === "token" || access === "forbidden" || access === "unknown") {
        feedState(access === "token" ? "(waiting for the admin token)" : "");
        await sleep(access === "unknown" ? 100 : 1000);
        continue;
      }
      const headers = authHeaders({ Accept: "text/event-stream" });
      if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
      let response = null;
      try {
        response = await fetch("events", { headers, cache: "no-store" });
      } catch (error) {
        response = null;
      }
      if (response !== null && response.status === 401) {
        askToken(token ? "refused: that is not the admin token (401)" : "");
        continue;
      }
      if (response !== null && response.ok && response.body) {
        delay = EVENT_RETRY_MIN_MS;
        feedState("(live)");
        eventReader = response.body.getReader();
        try {
          await readEvents(eventReader);
        } catch (error) {
          // the connection broke: reconnect below
        }
        eventReader = null;
      }
      if (access === "token") continue;
      feedState("(reconnecting…)");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, eventRetryMaxMs);
    }
  }

  // The WHATWG "event stream interpretation": id, event, data, retry; ':' starts a comment.
  async function readEvents(reader) {
    const decoder = new TextDecoder();
    let buffer = "";
    let id = null;
    let kind = "";
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done || access === "token") return; // (refused: hideData cancelled the stream)
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        let line = buffer.slice(0, end);
        buffer = buffer.slice(end + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (id !== null) lastEventId = id;
          if (data.length) addEvent(kind || "message", data.join("\n"));
          id = null;
          kind = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "id" && !text.includes("\0")) id = text;
        else if (field === "event") kind = text;
        else if (field === "data") data.push(text);
        else if (field === "retry" && /^\d+$/.test(text)) eventRetryMaxMs = Math.max(EVENT_RETRY_MIN_MS, Number(text));
      }
      if (buffer.length > LINE_MAX) {
        reader.cancel();
        return;
      }
    }
  }

  function describe(kind, e) {
    const session = e.session_id ? "session " + e.session_id : "";
    const lost = e.frames_lost && e.frames_lost.length ? "; " + e.frames_lost.length + " frame(s) lost" : "";
    switch (kind) {
      case "RECONNECTING":
        return session + " lost " + (e.from_broker || "its broker") + ": " + e.reason;
      case "FAILOVER": {
        const route = e.reattached ? "reattached to " + e.to_broker : (e.from_broker || "?") + " → " + e.to_broker;
        const outage = e.outage_ms !== null && e.outage_ms !== undefined ? " after " + fmtSeconds(e.outage_ms / 1000) : "";
        const replayed = e.replayed_frames ? "; " + e.replayed_frames + " frame(s) replayed" : "";
        return session + " " + route + outage + " (" + e.reason + ")" + replayed + lost;
      }
      case "DISCONNECT":
        return session + " ended: " + e.reason + (e.attempts ? " after " + e.attempts + " attempt(s)" : "") + lost;
      case "OUTCOME": {
        // A frame's name as FrameReport.label gives it (a property: not in the JSON).
        const named = (e.frames || []).map(
          (f) => (f.receipt || f.mq_sidecar_id || f.command + " #" + f.seq) + " " + f.outcome,
        );
        const more = named.length > 5 ? " and " + (named.length - 5) + " more" : "";
        const frames = named.slice(0, 5).join(", ") + more;
        return session + ": " + (frames || e.reason) + (frames && e.reason ? " (" + e.reason + ")" : "");
      }
      case "SPOOLING":
      case "SPOOL_DRAINED":
        return session + ": " + e.reason + (e.spooled_frames !== null && e.spooled_frames !== undefined ? " (" + e.spooled_frames + " frame(s) in the outbox)" : "");
      case "GAP":
        return "events may have been missed while the page was away: " + e.reason;
      default:
        return session + (e.reason ? ": " + e.reason : "");
    }
  }

  function addEvent(kind, text) {
    let e;
    try {
      e = JSON.parse(text);
    } catch (error) {
      e = { reason: text };
    }
    const when = typeof e.timestamp === "number" ? new Date(e.timestamp * 1000) : new Date();
    addEntry(kind, kind, describe(kind, e), when, {
      "data-session": e.session_id,
      "data-from": e.from_broker,
      "data-to": e.to_broker,
      "data-reason": e.reason,
    });
  }

  // An observation of the page itself (a broker's state in /status, the sidecar's reachability).
  function addPageEntry(kind, text, broker) {
    addEntry(kind, kind.replace("-", " "), text, new Date(), { class: "page", "data-broker": broker });
  }

  function addEntry(kind, label, text, when, attrs) {
    const feed = $("feed");
    const item = el(
      "li",
      Object.assign({ "data-kind": kind }, attrs),
      el("time", { datetime: when.toISOString() }, clock(when) + "." + String(when.getMilliseconds()).padStart(3, "0")),
      el("span", {}, badge(label, kind)),
      el("span", { class: "what" }, text),
    );
    feed.prepend(item);
    while (feed.children.length > FEED_MAX) feed.lastElementChild.remove();
  }

  statusLoop();
  eventsLoop();
})();
