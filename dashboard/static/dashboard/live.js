// Live updates for every dashboard page.
//
// One WebSocket per page, subscribed to what the page shows; the server sends
// {"html": ...}: fragments it rendered (and escaped) that replace elements by id
// (htmx out-of-band swaps). If the socket cannot connect, the page polls the
// same fragments over HTTP instead, doubling the interval (up to a maximum)
// whenever nothing changed or the answer was slow, and keeps trying the socket.
(function () {
  "use strict";
  var el = document.getElementById("live");
  if (!el || !window.htmx) return;

  var page = el.dataset.page;
  var base = Number(el.dataset.pollBase) || 2000;
  var max = Number(el.dataset.pollMax) || 30000;
  var slow = Number(el.dataset.pollSlow) || 1000;
  var interval = base;
  var socket = null;
  var pollTimer = null;
  var reconnectTimer = null;
  var attempts = 0;
  var lastBody = null;
  var lastVersionHeader = null;
  var pending = null;
  var stopped = false;

  function setState(state, text) {
    el.dataset.state = state;
    el.dataset.interval = String(interval);
    var label = el.querySelector(".live-text");
    if (label) label.textContent = text;
  }

  // --- what the page currently shows ---------------------------------------------
  // The seq live updates continue after: the last entry shown, or further when
  // the level filter hid later events (the page's data-cursor, kept by settleTimeline).
  function lastSeq() {
    var list = document.getElementById("timeline");
    if (!list) return 0;
    var items = list.querySelectorAll("#timeline > [data-seq]");
    var last = items.length ? Number(items[items.length - 1].dataset.seq) : 0;
    return Math.max(last, Number(list.dataset.cursor) || 0);
  }
  function rows() { return Array.prototype.slice.call(document.querySelectorAll("#job-rows tr[data-job-id]")); }
  function rowIds() { return rows().map(function (r) { return r.dataset.jobId; }); }
  function newest() {
    var body = document.getElementById("job-rows");
    if (!body || body.dataset.firstPage !== "1") return "";
    var first = body.querySelector("tr[data-created]");
    return first ? first.dataset.created : (body.dataset.loadedAt || "");
  }
  function subscription() {
    if (page === "job") return { page: "job", job: el.dataset.job, after: lastSeq() };
    if (page === "jobs") {
      var n = newest();
      var body = document.getElementById("job-rows");
      return {
        page: "jobs", ids: rowIds(), query: el.dataset.query || "", newest: n, first_page: Boolean(n),
        rendered_at: body ? body.dataset.loadedAt || "" : "",
      };
    }
    if (page === "workflow") return { page: "workflow", workflow: el.dataset.job };
    return { page: page };
  }
  function pollUrl() {
    var url = el.dataset.poll;
    var params = new URLSearchParams();
    if (page === "job") {
      params.set("after", String(lastSeq()));
    } else if (page === "jobs") {
      new URLSearchParams(el.dataset.query || "").forEach(function (v, k) { params.append(k, v); });
      params.set("ids", rowIds().join(","));
      var n = newest();
      if (n) params.set("newest", n);
    } else {
      return url;
    }
    return url + (url.indexOf("?") >= 0 ? "&" : "?") + params.toString();
  }

  // --- applying server fragments ----------------------------------------------------
  // Someone is using a form in a region that live updates replace (a queue's
  // cap, say): hold the update until focus leaves that form.
  function editing() {
    var a = document.activeElement;
    return Boolean(a && a.closest && a.closest("[data-live-hold] form") &&
      a.matches("input, textarea, select, button"));
  }
  // --- the timeline ------------------------------------------------------------------
  // Entries arrive in seq order: live ones at the end, earlier pages at the start,
  // each rendered alone. Settling the list drops repeats, records the highest seq
  // seen (the cursor, even for an entry the filter then hides), applies the page's
  // level filter (attempt headers stay) and folds a run of progress-only ticks of
  // the same name and message into its latest entry, as the server does per page.
  var LEVELS = { info: 0, warning: 1, error: 2 };
  function messageOf(item) {
    var message = item.querySelector(".ev-message");
    return message ? message.textContent : "";
  }
  function fold(previous, item) {
    var count = (Number(previous.dataset.count) || 1) + (Number(item.dataset.count) || 1);
    item.dataset.count = String(count);
    item.dataset.fromSeq = previous.dataset.fromSeq || previous.dataset.seq;
    var label = item.querySelector(".ev-folded");
    if (label) { label.textContent = count + " progress updates"; label.hidden = false; }
    var seq = item.querySelector(".ev-seq");
    if (seq) seq.title = "Events #" + item.dataset.fromSeq + " to #" + item.dataset.seq;
    previous.remove();
  }
  function settleTimeline() {
    var list = document.getElementById("timeline");
    if (!list) return;
    var min = LEVELS[list.dataset.level] || 0;
    var cursor = Number(list.dataset.cursor) || 0;
    var seen = -1;
    var previous = null;
    list.querySelectorAll("#timeline > [data-seq]").forEach(function (item) {
      var seq = Number(item.dataset.seq);
      if (seq <= seen) { item.remove(); return; }
      seen = seq;
      cursor = Math.max(cursor, seq);
      if (min && (LEVELS[item.dataset.level] || 0) < min && !item.hasAttribute("data-attempt")) {
        item.remove();
        return;
      }
      if (previous && item.dataset.tick && previous.dataset.tick === item.dataset.tick &&
          messageOf(previous) === messageOf(item)) {
        fold(previous, item);
      }
      previous = item;
    });
    list.dataset.cursor = String(cursor);
  }
  // An earlier page arrives by an htmx request (one event per inserted entry): settle once.
  var settleQueued = false;
  document.addEventListener("htmx:oobAfterSwap", function () {
    if (settleQueued) return;
    settleQueued = true;
    setTimeout(function () { settleQueued = false; settleTimeline(); }, 0);
  });
  function apply(html) {
    if (!html) return;
    if (editing()) { pending = (pending || "") + html; return; } // someone is typing: later, in order
    var checked = {};
    rows().forEach(function (r) {
      var box = r.querySelector('input[name="ids"]');
      if (box && box.checked) checked[r.dataset.jobId] = true;
    });
    window.htmx.swap(document.body, html, { swapStyle: "none" });
    rows().forEach(function (r) {
      var box = r.querySelector('input[name="ids"]');
      if (box && checked[r.dataset.jobId]) box.checked = true;
    });
    settleTimeline();
    document.dispatchEvent(new CustomEvent("live:applied"));
  }
  document.addEventListener("focusout", function () {
    setTimeout(function () {
      if (pending && !editing()) { var html = pending; pending = null; apply(html); }
    }, 0);
  });

  // --- polling fallback ----------------------------------------------------------------
  function socketOpen() { return socket !== null && socket.readyState === 1; }
  function schedule() {
    if (stopped || socketOpen()) return;
    clearTimeout(pollTimer);
    setState("polling", "Polling every " + Math.round(interval / 1000) + " s");
    pollTimer = setTimeout(poll, interval);
  }
  function poll() {
    pollTimer = null;
    if (socketOpen()) return;
    var started = performance.now();
    fetch(pollUrl(), { headers: { "HX-Request": "true" }, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.redirected || response.status === 401 || response.status === 403) {
          stopped = true;
          setState("off", "Signed out: reload");
          return null;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        lastVersionHeader = response.headers.get("X-Live-Version");
        return response.text();
      })
      .then(function (body) {
        if (body === null) return;
        var took = performance.now() - started;
        // A page whose answer carries a version (the job page: its last event's
        // seq) changed only if the version did; others compare the whole answer.
        var version = lastVersionHeader || body;
        var changed = version !== lastBody;
        lastBody = version;
        if (changed) apply(body);
        interval = changed && took < slow ? base : Math.min(interval * 2, max);
        schedule();
      })
      .catch(function () {
        interval = Math.min(interval * 2, max);
        schedule();
      });
  }
  function startPolling() {
    if (pollTimer === null && !stopped) schedule();
  }
  function stopPolling() {
    clearTimeout(pollTimer);
    pollTimer = null;
    interval = base;
    lastBody = null;
  }

  // --- the WebSocket -----------------------------------------------------------------
  function connect() {
    reconnectTimer = null;
    if (stopped) return;
    if (!window.WebSocket) { startPolling(); return; }
    var ws;
    try {
      ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + el.dataset.ws);
    } catch (error) {
      startPolling();
      return;
    }
    socket = ws;
    ws.onopen = function () {
      attempts = 0;
      stopPolling();
      ws.send(JSON.stringify({ subscribe: subscription() }));
    };
    ws.onmessage = function (event) {
      var data;
      try { data = JSON.parse(event.data); } catch (error) { return; }
      if (!data) return;
      if (typeof data.html === "string") apply(data.html);
      if (data.subscribed) setState("live", "Live"); // after any catch-up it sent
    };
    ws.onclose = function () {
      if (socket === ws) socket = null;
      if (stopped) return;
      startPolling();
      attempts += 1;
      clearTimeout(reconnectTimer);
      reconnectTimer = setTimeout(connect, Math.min(1000 * Math.pow(2, attempts), 30000));
    };
  }

  window.__live = {
    state: function () { return el.dataset.state; },
    interval: function () { return interval; },
  };
  settleTimeline();
  setState("connecting", "Connecting…");
  connect();
})();
