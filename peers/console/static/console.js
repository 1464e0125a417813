// bcpbus console: live approvals over server-sent events. Served by the bus; no other script.
// The server renders every approval card (escaped by its templates); this file only swaps
// whole cards, never builds HTML from strings, and keeps a card the reader is working in.
"use strict";

(function () {
  const root = document.getElementById("approvals");
  if (!root || !window.EventSource) {
    return;
  }
  const status = document.getElementById("live-status");
  const source = new EventSource(root.dataset.events);

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  // Bring `list` in line with `fresh`: keep the cards whose state did not change (so a reason
  // being typed or a focused button stays), add new ones, drop those gone.
  function sync(list, fresh) {
    const old = new Map(Array.from(list.children, (li) => [li.id, li]));
    let cursor = list.firstElementChild;
    let added = 0;
    for (const li of Array.from(fresh.children)) {
      const kept = old.get(li.id);
      old.delete(li.id);
      let node = kept;
      if (!kept || kept.dataset.state !== li.dataset.state) {
        node = document.adoptNode(li);
        if (kept) {
          if (cursor === kept) {
            cursor = kept.nextElementSibling;
          }
          kept.replaceWith(node);
          continue;
        }
        added += 1;
      }
      if (node === cursor) {
        cursor = cursor.nextElementSibling;
      } else {
        list.insertBefore(node, cursor);
      }
    }
    for (const li of old.values()) {
      li.remove();
    }
    return added;
  }

  source.addEventListener("approvals", (event) => {
    const doc = new DOMParser().parseFromString(event.data, "text/html");
    let added = 0;
    for (const id of ["pending", "decided"]) {
      const list = document.getElementById(id);
      const fresh = doc.getElementById(id);
      if (list && fresh) {
        const count = sync(list, fresh);
        if (id === "pending") {
          added = count;
        }
      }
    }
    for (const counter of document.querySelectorAll("[data-count]")) {
      const fresh = doc.querySelector(`[data-count="${counter.dataset.count}"]`);
      if (fresh) {
        counter.textContent = fresh.textContent;
      }
    }
    root.dataset.live = "open";
    const time = new Date().toLocaleTimeString();
    say(added ? `${added} new request(s) at ${time}` : `Live: up to date at ${time}`);
  });

  source.addEventListener("signout", (event) => {
    source.close();
    window.location.assign(event.data);
  });

  source.addEventListener("open", () => say("Live: new requests appear here as they arrive."));
  source.addEventListener("error", () => say("Live updates interrupted; reconnecting…"));
})();
