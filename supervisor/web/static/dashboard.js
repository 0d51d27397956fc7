// leasekeeper dashboard: live updates without a build step.
// - [data-poll]: the page's live part. Fetched again with "X-Fragment: 1" (the server answers
//   with the live part only) and swapped in when it changed.
// - [data-stream]: where the browser has EventSource, the part follows that event stream
//   (GET /events/stream, one per page; a run's page: ?run=ID) and fetches itself again after
//   an event of a kind in data-kinds, at most once per DEBOUNCE ms, instead of on a timer.
//   The stream is closed while the tab is hidden (a browser allows few connections per site).
//   Without a stream, or once it failed, the part polls every data-every seconds (pausing
//   while the tab is hidden, backing off after a failed fetch) and tries the stream again later.
// - [data-left]: seconds left on a lease when the part was drawn, counted down locally.
// - [data-run-stream]: a run's stream, appended to as it is written (runStream).
"use strict";

(function () {
  var DEBOUNCE = 250;  // ms: at most one fetch per this, however many events arrive
  var RETRY_FIRST = 5000;  // ms before a failed stream is tried again, doubling up to RETRY_MAX
  var RETRY_MAX = 60000;

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

  function live(el) {
    var every = Math.max(0.2, parseFloat(el.dataset.every || "2")) * 1000;
    var kinds = (el.dataset.kinds || "").split(" ").filter(Boolean);
    var failures = 0;
    var last = null;
    var timer = null;  // the next poll, while polling
    var source = null;  // the event stream, while open
    var retry = null;  // the next try of the stream, after it failed
    var retries = 0;
    var debounce = null;
    var lastFetch = -Infinity;
    var busy = false;
    var again = false;

    function poll(delay) {
      window.clearTimeout(timer);
      timer = window.setTimeout(function () {
        timer = null;
        if (document.hidden) poll(every);
        else refetch();
      }, delay);
    }

    function refetch() {
      if (busy) {  // the answer in flight may predate the event: fetch once more after it
        again = true;
        return;
      }
      busy = true;
      lastFetch = performance.now();
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
          if (!source) poll(every);
        })
        .catch(function () {
          failures += 1;
          el.classList.add("stale");
          if (!source) poll(Math.min(every * Math.pow(2, failures), 60000));
        })
        .finally(function () {
          busy = false;
          if (again) {
            again = false;
            soon();
          }
        });
    }

    function soon() {  // debounced: at most one fetch per DEBOUNCE ms
      if (debounce !== null) return;
      var wait = Math.max(0, lastFetch + DEBOUNCE - performance.now());
      debounce = window.setTimeout(function () {
        debounce = null;
        refetch();
      }, wait);
    }

    function openStream() {
      retry = null;
      if (source || document.hidden) return;
      source = new EventSource(el.dataset.stream, { withCredentials: true });
      source.onopen = function () {
        window.clearTimeout(timer);  // the stream drives the updates now: no timer
        timer = null;
        retries = 0;
        el.dataset.live = "stream";
        soon();  // what happened between drawing the page and opening the stream
      };
      kinds.forEach(function (kind) {
        source.addEventListener(kind, soon);
      });
      source.onerror = function () {  // refused (503), dropped, or the server went away
        closeStream();
        el.dataset.live = "poll";
        poll(every);
        retry = window.setTimeout(openStream, Math.min(RETRY_FIRST * Math.pow(2, retries), RETRY_MAX));
        retries += 1;
      };
    }

    function closeStream() {
      if (source) {
        source.close();
        source = null;
      }
    }

    if (!el.dataset.stream || !window.EventSource) {
      el.dataset.live = "poll";
      poll(every);
      return;
    }
    document.addEventListener("visibilitychange", function () {
      if (document.hidden) {
        if (source) {
          closeStream();
          poll(every);  // idles while hidden; a fetch on the way back
        }
      } else if (!source && retry === null) {
        openStream();
      }
    });
    el.dataset.live = "poll";
    poll(every);  // until the stream is open
    openStream();
  }

  // A run's stream (B21), live: each step's text in a <pre> of its own; a reset (a new attempt
  // took the step over) clears its step's; "end" (the run is over) closes the EventSource,
  // which otherwise reconnects by itself after a dropped connection, sending Last-Event-ID.
  function runStream(el) {
    if (!el.dataset.runStream || !window.EventSource) {
      return;
    }
    var box = el.querySelector("#run-stream");
    var state = el.querySelector("#stream-state");
    var after = el.dataset.after || "0";  // the last offset shown
    var source = null;
    function stepBox(step) {
      var pre = box.querySelector('pre[data-step="' + step + '"]');
      if (!pre) {
        pre = document.createElement("pre");
        pre.className = "stream-step";
        pre.dataset.step = String(step);
        box.appendChild(pre);
      }
      return pre;
    }
    function open() {
      source = new EventSource(el.dataset.runStream + "?after=" + after,
                               { withCredentials: true });
      source.onopen = function () {
        el.dataset.live = "stream";
      };
      source.onerror = function () {  // dropped: it reconnects by itself, with Last-Event-ID
        el.dataset.live = "retrying";
        if (source.readyState === EventSource.CLOSED) {  // refused: open anew after a while
          window.setTimeout(open, 5000);
        }
      };
      source.addEventListener("data", function (e) {
        var c = JSON.parse(e.data);
        var pre = stepBox(c.step);
        pre.textContent += typeof c.data === "string" ? c.data : JSON.stringify(c.data) + "\n";
        pre.scrollTop = pre.scrollHeight;
        after = String(c.offset);
        state.textContent = "live, up to offset " + c.offset;
      });
      source.addEventListener("reset", function (e) {
        var c = JSON.parse(e.data);
        stepBox(c.step).textContent = "";
        after = String(c.offset);
        state.textContent = "attempt " + c.attempt + " took the step over: it starts again";
      });
      source.addEventListener("end", function (e) {
        source.close();
        el.dataset.live = "ended";
        state.textContent = "the run " + JSON.parse(e.data) + ": the stream is whole";
      });
    }
    open();
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawn(document);
    tick();
    window.setInterval(tick, 100);
    document.querySelectorAll("[data-poll]").forEach(live);
    document.querySelectorAll("[data-run-stream]").forEach(runStream);
  });
})();
