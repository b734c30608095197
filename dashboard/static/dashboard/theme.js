// Light/dark theme: the system preference unless the person chose one (kept in localStorage).
// Loaded in <head> without defer so the page never flashes the wrong theme.
(function () {
  var KEY = "controlplane-theme";
  var root = document.documentElement;
  function stored() { try { return localStorage.getItem(KEY); } catch (e) { return null; } }
  function systemDark() { return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches; }
  var choice = stored();
  if (choice === "light" || choice === "dark") root.setAttribute("data-theme", choice);
  window.__toggleTheme = function () {
    var current = root.getAttribute("data-theme") || (systemDark() ? "dark" : "light");
    var next = current === "dark" ? "light" : "dark";
    root.setAttribute("data-theme", next);
    try { localStorage.setItem(KEY, next); } catch (e) { /* private mode: this page only */ }
  };
  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme-toggle");
    if (button) button.addEventListener("click", window.__toggleTheme);
  });
})();
