// leasekeeper dashboard: live updates without a build step.
// - [data-poll]: every data-every seconds, fetch this page again with "X-Fragment: 1" (the
//   server answers with the live part only) and swap it in. Polling pauses while the tab is
//   hidden and backs off after a failed fetch.
// - [data-left]: seconds left on a lease when the part was drawn, counted down locally.
"use strict";

(function () {
  function drawn(root) {
    var now = performance.now();
    root.querySelectorAll("[data-left]").forEach(function (el) {
      el.dataset.t0 = String(now);
    });
  }

  function tick() {
    var now = performance.now();
    document.querySelectorAll("[data-left]").forEach(function (el) {
      var left = parseFloat(el.dataset.left) - (now - parseFloat(el.dataset.t0 || now)) / 1000;
      el.textContent = left > 0 ? left.toFixed(1) + " s left" : "expired " + (-left).toFixed(1) + " s ago";
      el.classList.toggle("expired", left <= 0);
    });
  }

  function poll(el) {
    var every = Math.max(0.2, parseFloat(el.dataset.every || "2")) * 1000;
    var failures = 0;
    var last = null;
    function again(delay) {
      window.setTimeout(run, delay);
    }
    function run() {
      if (document.hidden) {
        again(every);
        return;
      }
      fetch(window.location.href, { headers: { "X-Fragment": "1" }, credentials: "same-origin" })
        .then(function (response) {
          if (!response.ok) throw new Error(String(response.status));
          return response.text();
        })
        .then(function (html) {
          failures = 0;
          if (html !== last) {  // unchanged parts keep their nodes: a click is never eaten
            last = html;
            el.innerHTML = html;
            drawn(el);
            tick();
          }
          el.classList.remove("stale");
          again(every);
        })
        .catch(function () {
          failures += 1;
          el.classList.add("stale");
          again(Math.min(every * Math.pow(2, failures), 60000));
        });
    }
    again(every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawn(document);
    tick();
    window.setInterval(tick, 100);
    document.querySelectorAll("[data-poll]").forEach(poll);
  });
})();
