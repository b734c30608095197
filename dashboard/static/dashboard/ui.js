// Small behaviours of the dashboard: relative times, countdowns, confirmations,
// the CSRF token for forms rendered by live pushes, and row selection.
// Nothing here builds HTML from job data: it only sets textContent and attributes.
(function () {
  "use strict";

  function span(seconds) {
    var s = Math.abs(seconds);
    if (s < 1) return "now";
    if (s < 60) return Math.floor(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return (s / 3600).toFixed(s < 36000 ? 1 : 0) + " h";
    return (s / 86400).toFixed(s < 864000 ? 1 : 0) + " d";
  }

  function relative(iso) {
    var t = Date.parse(iso);
    if (isNaN(t)) return null;
    var diff = (t - Date.now()) / 1000;
    var text = span(diff);
    if (text === "now") return "just now";
    return diff < 0 ? text + " ago" : "in " + text;
  }

  // Every relative time shows its absolute UTC time on hover, in the server's
  // format (the reltime partial renders that title itself; ages and countdowns get it here).
  function absolute(el, iso) {
    if (el.hasAttribute("title")) return;
    var t = Date.parse(iso);
    if (!isNaN(t)) el.title = new Date(t).toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  function titles() {
    document.querySelectorAll("time[data-rel], [data-age], [data-countdown]").forEach(function (el) {
      absolute(el, el.getAttribute("datetime") || el.getAttribute("data-age") || el.getAttribute("data-countdown"));
    });
  }

  function tick() {
    document.querySelectorAll("time[data-rel]").forEach(function (el) {
      var text = relative(el.getAttribute("datetime"));
      if (text && el.textContent !== text) el.textContent = text;
    });
    document.querySelectorAll("[data-age]").forEach(function (el) {
      var t = Date.parse(el.getAttribute("data-age"));
      if (!isNaN(t)) {
        var text = span((Date.now() - t) / 1000);
        text = text === "now" ? "0 s" : text;
        if (el.textContent !== text) el.textContent = text;
      }
    });
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var t = Date.parse(el.getAttribute("data-countdown"));
      if (isNaN(t)) return;
      var left = (t - Date.now()) / 1000;
      var text = left > 0 ? "expires in " + span(left) : "expired " + span(left) + " ago";
      el.classList.toggle("is-expired", left <= 0);
      if (el.textContent !== text) el.textContent = text;
    });
  }

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  // Forms pushed over the WebSocket were rendered without a request, so they
  // carry no CSRF field: add the page's token before they are sent.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    var message = form.getAttribute("data-confirm");
    var submitter = event.submitter;
    if (submitter && submitter.getAttribute("data-confirm")) message = submitter.getAttribute("data-confirm");
    if (message && !window.confirm(message)) { event.preventDefault(); return; }
    if (form.method.toLowerCase() === "post" && !form.querySelector('input[name="csrfmiddlewaretoken"]')) {
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = "csrfmiddlewaretoken";
      input.value = csrfToken();
      form.appendChild(input);
    }
  }, true);

  // Filters submit only the fields that are set, so a shared address stays short.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || form.method.toLowerCase() !== "get") return;
    Array.prototype.forEach.call(form.elements, function (field) {
      if (field.name && !field.disabled && field.value === "") {
        field.disabled = true;
        setTimeout(function () { field.disabled = false; }, 0);
      }
    });
  });

  document.addEventListener("htmx:configRequest", function (event) {
    event.detail.headers["X-CSRFToken"] = csrfToken();
  });

  // Row selection for bulk actions.
  function boxes() { return Array.prototype.slice.call(document.querySelectorAll('#job-rows input[name="ids"]')); }
  function refreshSelection() {
    var count = boxes().filter(function (b) { return b.checked; }).length;
    var label = document.getElementById("selected-count");
    if (label) label.textContent = String(count);
    document.querySelectorAll("[data-needs-selection]").forEach(function (b) { b.disabled = count === 0; });
    var all = document.getElementById("select-all");
    if (all) {
      var total = boxes().length;
      all.checked = total > 0 && count === total;
      all.indeterminate = count > 0 && count < total;
    }
  }
  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.id === "select-all") {
      boxes().forEach(function (b) { b.checked = target.checked; });
    }
    refreshSelection();
  });
  window.__refreshSelection = refreshSelection;

  document.addEventListener("DOMContentLoaded", function () {
    titles();
    tick();
    refreshSelection();
    setInterval(tick, 1000);
  });
  document.addEventListener("htmx:afterSettle", function () { titles(); tick(); });
  document.addEventListener("live:applied", function () { titles(); tick(); refreshSelection(); });
})();
