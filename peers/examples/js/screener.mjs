#!/usr/bin/env node
// A BCP screener peer for bcpbus, in plain Node.js with the `ws` package.
//
// A channel that names this peer in `screeners:` has the gateway ask it about every valid
// Cat-2 and Cat-3 answer before the controller gets it. It connects to the bus as
// `system:<name>`, and for each `bcp_screen_request` from `system:gateway`:
//   - takes the request at once (processMessage result `processed: true`);
//   - runs a small table of deterministic rules over each text (NFKC, lowercase, invisible
//     characters dropped);
//   - answers with one `bcp_screen_verdict` to `system:gateway`: `reject` when a reject rule
//     matched, else `flag` when a flag rule matched, else `pass`, with one finding per rule
//     and text ({code, field}).
// This is the place to call a model instead: keep the verdict's shape, and the gateway
// does the rest (a screener that does not answer in time counts as a failure).
//
// Everything it does is logged as one JSON object per line on stdout ({"event": ...}); SIGTERM
// or SIGINT closes the connection and exits 0.
//
// Usage: node screener.mjs [URL] [CLIENT_ID] [TOKEN]
//   or BCPBUS_URL, BCPBUS_CLIENT_ID (default system:screener-js), BCPBUS_TOKEN.
//
// The wire is described in docs/protocol.md and docs/bcp.md ("Screeners").

import { randomUUID } from "node:crypto";
import process from "node:process";
import WebSocket from "ws";

const URL_ = process.argv[2] ?? process.env.BCPBUS_URL ?? "ws://127.0.0.1:8765";
const CLIENT_ID = process.argv[3] ?? process.env.BCPBUS_CLIENT_ID ?? "system:screener-js";
const TOKEN = process.argv[4] ?? process.env.BCPBUS_TOKEN;
const GATEWAY = "system:gateway";
const REQUEST_TIMEOUT_MS = 30_000;

// The rules: each pattern runs on the normalized text of one answer. Every repetition is
// bounded, so no input makes a pattern slow. `code` is one of the gateway's anomaly codes.
const RULES = [
  {
    name: "override",
    verdict: "reject",
    code: "instruction",
    pattern:
      /\b(ignore|disregard|forget|override)\b[^.!?\n]{0,40}\b(instructions?|rules|prompts?|everything|context)\b/,
  },
  {
    name: "role",
    verdict: "reject",
    code: "instruction",
    pattern: /\b(you are now|from now on,? you|act as|pretend to be|your new (role|name|task))\b/,
  },
  {
    name: "role-marker",
    verdict: "reject",
    code: "instruction",
    pattern: /###\s{0,3}\(?(system|assistant)|<\|?(system|im_start)\|?>|\[(system|inst)\]/,
  },
  {
    name: "shell",
    verdict: "reject",
    code: "code",
    pattern: /\b(bash|sh|nc|ncat|curl|wget|python3?)\s{1,3}-[a-z]/,
  },
  { name: "url", verdict: "flag", code: "url", pattern: /\bhttps?:\/\/|\bwww\./ },
];

const INVISIBLE = /[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;

/** The form the rules read: NFKC, invisible and bidi characters dropped, lowercase. */
function normalize(text) {
  return text.normalize("NFKC").replace(INVISIBLE, "").replace(/\s+/g, " ").toLowerCase();
}

/** Judge a request's texts: the bcp_screen_verdict content (without screen_id). */
function judge(texts) {
  const findings = [];
  const matched = new Set();
  let verdict = "pass";
  for (const { field, raw } of texts) {
    const text = normalize(raw);
    for (const rule of RULES) {
      if (!rule.pattern.test(text)) continue;
      matched.add(rule.name);
      if (findings.length < 32) findings.push({ code: rule.code, field });
      if (rule.verdict === "reject") verdict = "reject";
      else if (verdict === "pass") verdict = "flag";
    }
  }
  const detail = matched.size ? `rules: ${[...matched].join(", ")}` : "";
  return { verdict, findings, detail: detail.slice(0, 200) };
}

// Output

function log(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

function warn(...parts) {
  console.error(`screener.mjs: ${parts.join(" ")}`);
}

// JSON-RPC over one WebSocket (docs/protocol.md, "JSON-RPC on this bus")

class RpcError extends Error {
  constructor({ code, message }) {
    super(`${message} (${code})`);
    this.code = code;
  }
}

let nextId = 1;
const pending = new Map(); // id -> { resolve, reject, timer }
let ws;
let closing = false;

function request(method, params) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      pending.delete(id);
      reject(new Error(`no answer to ${method} within ${REQUEST_TIMEOUT_MS} ms`));
    }, REQUEST_TIMEOUT_MS);
    pending.set(id, { resolve, reject, timer });
    ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
  });
}

function write(frame) {
  if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(frame));
}

function onFrame(text) {
  let message;
  try {
    message = JSON.parse(text);
  } catch {
    warn("ignored a frame that is not JSON");
    return;
  }
  for (const item of Array.isArray(message) ? message : [message]) {
    if (typeof item?.method === "string") {
      onRequest(item).catch((error) => warn("request handler failed:", error.stack ?? error));
    } else if (pending.has(item?.id)) {
      const { resolve, reject, timer } = pending.get(item.id);
      pending.delete(item.id);
      clearTimeout(timer);
      if ("error" in item) reject(new RpcError(item.error));
      else resolve(item.result);
    }
  }
}

/** Answer processMessage at once; screen after, since the gateway waits for this answer. */
async function onRequest({ id, method, params }) {
  if (id === undefined) return;
  if (method !== "processMessage") {
    write({ jsonrpc: "2.0", id, error: { code: -32601, message: `Method not found: ${method}` } });
    return;
  }
  const { type, from, messageId, content } = params.payload;
  // Only the gateway may send bcp_screen_request (the bus enforces it); check all the same.
  if (type !== "bcp_screen_request" || from !== GATEWAY) {
    const message = `no handler for ${type} from ${from}`;
    write({ jsonrpc: "2.0", id, result: { processed: false, status: "no_handler", message } });
    return;
  }
  write({ jsonrpc: "2.0", id, result: { processed: true, status: "taken", message: "" } });
  log("request", { screen_id: content.screen_id, fields: content.texts.map((t) => t.field) });
  const verdict = { screen_id: content.screen_id, ...judge(content.texts) };
  const payload = {
    messageId: randomUUID(),
    type: "bcp_screen_verdict",
    from: CLIENT_ID,
    timestamp: new Date().toISOString(),
    correlationId: messageId,
    content: verdict,
  };
  const result = await request("sendMessage", { topic: GATEWAY, payload });
  log("verdict", { ...verdict, deliveredTo: result.deliveredTo });
}

// Connection

async function start() {
  if (!TOKEN) {
    warn("no token: pass it as the third argument or in BCPBUS_TOKEN");
    process.exit(2);
  }
  // The token in the handshake too: it passes the bus's cap on sockets not yet initialized.
  ws = new WebSocket(URL_, { perMessageDeflate: false, headers: { Authorization: `Bearer ${TOKEN}` } });
  ws.on("message", (data, isBinary) => {
    if (!isBinary) onFrame(data.toString("utf8"));
  });
  ws.on("error", (error) => warn("socket error:", error.message));
  ws.on("close", (code, reason) => {
    for (const { reject, timer } of pending.values()) {
      clearTimeout(timer);
      reject(new Error("connection closed"));
    }
    pending.clear();
    log("closed", { code, reason: reason.toString() });
    if (!closing) process.exitCode = 1;
  });
  await new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  const init = await request("initialize", {
    clientId: CLIENT_ID,
    auth: { token: TOKEN },
    clientInfo: { name: "bcpbus-js-screener", version: "0.1.0" },
  });
  // initialize subscribed us to our own clientId, where the gateway asks; subscribing again
  // fails loudly if the policy does not give this clientId the screener role.
  await request("subscribe", { topic: CLIENT_ID });
  log("ready", { clientId: CLIENT_ID, serverId: init.serverId, topics: init.capabilities.topics });
}

function stop(signal) {
  if (closing) return;
  closing = true;
  warn(`${signal}: closing`);
  if (!ws || ws.readyState === WebSocket.CLOSED) return;
  ws.close(1000, "screener stopping");
  setTimeout(() => ws.terminate(), 2000).unref();
}

process.on("SIGTERM", () => stop("SIGTERM"));
process.on("SIGINT", () => stop("SIGINT"));

start().catch((error) => {
  warn("could not start:", error.message);
  process.exitCode = 1;
  closing = true;
  ws?.terminate();
});
