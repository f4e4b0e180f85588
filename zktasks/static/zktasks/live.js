/* zktasks dashboard: keep an open page current without reloading it.
 *
 * Every 2 s, fetch the live endpoint (numbers kept in memory by the server, fed by
 * ZooKeeper watches). Elements with data-live="a.b" get the value at that path as
 * text; when a topic this page declares (data-zk-topics) changed, fetch the page again
 * and swap in its [data-zk-region] (server-rendered, escaped HTML). When ZooKeeper or
 * the server cannot be reached, show the banner instead of failing silently.
 * No framework, no build step; nothing user-supplied is ever inserted as HTML.
 */
(function () {
  "use strict";
  var root = document.getElementById("zk-dashboard");
  if (!root || !root.dataset.zkLive) { return; }
  var url = root.dataset.zkLive;
  var topics = (root.dataset.zkTopics || "").split(/\s+/).filter(Boolean);
  var banner = document.getElementById("zk-banner");
  var bannerText = document.getElementById("zk-banner-text");
  var indicator = document.getElementById("zk-live-indicator");
  var PERIOD = 2000;
  var last = root.dataset.zkSig || null;
  var busy = false;
  var retry = false;  // the last refresh of the region failed: do it again

  function lookup(data, path) {
    return path.split(".").reduce(function (value, key) {
      return value === null || value === undefined ? undefined : value[key];
    }, data);
  }

  function showBanner(message) {
    if (!banner) { return; }
    bannerText.textContent = message;
    banner.hidden = false;
    if (indicator) { indicator.classList.add("zk-stale"); }
  }

  function hideBanner() {
    if (banner) { banner.hidden = true; }
    if (indicator) { indicator.classList.remove("zk-stale"); }
  }

  function updateNumbers(data) {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var value = lookup(data, el.dataset.live);
      if (value !== undefined && value !== null && el.textContent !== String(value)) {
        el.textContent = String(value);
      }
    });
  }

  function signature(data) {
    var all = data.topics || {};
    return topics.map(function (t) { return t + "=" + (all[t] === undefined ? "" : all[t]); })
      .join("|");
  }

  function detailsKey(el, i) {
    return el.dataset.zkKey ? "key:" + el.dataset.zkKey : "place:" + i;
  }

  function refreshRegion() {
    return fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Requested-With": "XMLHttpRequest" },
      cache: "no-store"
    }).then(function (response) {
      if (!response.ok) {
        // The page could not be read (a 503 and its banner, say, while live.json still
        // answers): keep what is shown, say why, and read it again at the next poll.
        // Swapped in, its body emptied the region and the banner stayed hidden.
        retry = true;
        throw new Error("this page could not be read (HTTP " + response.status + ")");
      }
      return response.text();
    }).then(function (html) {
      retry = false;
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.getElementById("zk-region");
      var current = document.getElementById("zk-region");
      if (!fresh || !current) { return; }
      // Keep open <details> open across the swap, by their key (a dead letter's name,
      // an error's number), else their place: rows come and go above them.
      var open = {};
      current.querySelectorAll("details").forEach(function (el, i) {
        if (el.open) { open[detailsKey(el, i)] = true; }
      });
      current.replaceChildren.apply(current, Array.prototype.slice.call(fresh.childNodes)
        .map(function (node) { return document.importNode(node, true); }));
      current.querySelectorAll("details").forEach(function (el, i) {
        if (open[detailsKey(el, i)]) { el.open = true; }
      });
      document.dispatchEvent(new CustomEvent("zktasks:refreshed"));
    });
  }

  function poll() {
    if (busy) { return; }
    busy = true;
    fetch(url, {
      credentials: "same-origin",
      headers: { "Accept": "application/json" },
      cache: "no-store"
    }).then(function (response) {
      var type = response.headers.get("Content-Type") || "";
      if (type.indexOf("application/json") === -1) {
        throw new Error("the dashboard answered HTTP " + response.status +
          (response.redirected ? " (logged out?)" : ""));
      }
      return response.json();
    }).then(function (data) {
      if (data.ok) { hideBanner(); } else { showBanner(data.error || "ZooKeeper cannot be read."); }
      if (indicator) { indicator.hidden = false; }
      updateNumbers(data);
      if (!data.topics) { return null; }
      var sig = signature(data);
      var changed = (last !== null && sig !== last) || retry;
      last = sig;
      return changed && topics.length ? refreshRegion() : null;
    }).catch(function (error) {
      showBanner("Lost contact with the dashboard: " + error.message + ".");
    }).then(function () {
      busy = false;
    });
  }

  poll();
  window.setInterval(function () {
    if (!document.hidden) { poll(); }
  }, PERIOD);
}());
