// The oncely console's only script: an element with data-refresh="URL" (the in-flight
// table) is fetched again every data-every milliseconds and its content replaced.
// Everything else works without script.
"use strict";
(function () {
  function refresh(el) {
    var every = parseInt(el.getAttribute("data-every") || "2000", 10);
    var url = el.getAttribute("data-refresh");
    var stamp = document.getElementById("refreshed");
    function tick() {
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (res) {
          if (res.redirected || !res.ok) { throw new Error("status " + res.status); }
          return res.text();
        })
        .then(function (html) {
          el.innerHTML = html;
          el.setAttribute("data-refreshed", String(Date.now()));
          if (stamp) { stamp.textContent = "(last at " + new Date().toLocaleTimeString() + ")"; }
        })
        .catch(function (e) {
          if (stamp) { stamp.textContent = "(refresh failed: " + e.message + ")"; }
        })
        .then(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    var els = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < els.length; i++) { refresh(els[i]); }
  });
})();
