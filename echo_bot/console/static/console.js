// The queue, kept live from /console/events (Server-Sent Events). Everything works
// without this script: it only saves reloading the page.
"use strict";
(function () {
  var queue = document.getElementById("queue");
  if (!queue || !window.EventSource) {
    return;
  }
  var live = document.getElementById("live");
  var lost = document.getElementById("lost");
  var source = new EventSource(queue.getAttribute("data-live"));
  source.addEventListener("open", function () {
    if (live) { live.hidden = false; }
    if (lost) { lost.hidden = true; }
  });
  source.addEventListener("error", function () {
    // The browser tries again by itself; until then what is shown may be out of date.
    if (live) { live.hidden = true; }
    if (lost) { lost.hidden = false; }
    if (source.readyState === EventSource.CLOSED) {
      // Refused (signed out meanwhile, too many pages open): a browser never tries an
      // answer other than 200 again. The page does, in a while: it signs in or waits.
      window.setTimeout(function () { window.location.reload(); }, 10000);
    }
  });
  source.addEventListener("queue", function (event) {
    // Server-rendered and escaped, as the page itself.
    queue.innerHTML = event.data;
  });
  source.addEventListener("replaced", function () {
    // A newer page of this sign-in is live in its place: this one stays as it is.
    source.close();
    if (live) { live.hidden = true; }
    if (lost) { lost.hidden = false; }
  });
  source.addEventListener("signed-out", function () {
    source.close();
    window.location.assign("/console/login");
  });
})();
