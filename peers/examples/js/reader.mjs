#!/usr/bin/env node
// A BCP reader peer for bcpbus, in plain Node.js with the `ws` package.
//
// It connects to the bus, authenticates, subscribes to its inbox `agent:<name>`, and then:
//   - answers every `processMessage` request the bus sends it (JSON-RPC 2.0);
//   - on `bcp_subscriptions_active`, publishes one push on the first Cat-1 subscription;
//   - on `bcp_query`, answers from a small table of canned answers keyed by field name;
//   - logs each `bcp_validation_result` it receives, and retries a query whose answer failed
//     validation, replacing the values the gateway named with ones the spec allows.
//
// Everything it does is logged as one JSON object per line on stdout ({"event": ...}), so that
// a program can follow it; diagnostics go to stderr. SIGTERM or SIGINT closes the connection
// and exits 0.
//
// Usage: node reader.mjs [URL] [CLIENT_ID] [TOKEN]
//   or the environment variables BCPBUS_URL, BCPBUS_CLIENT_ID, BCPBUS_TOKEN (an argument wins).
//   Prefer BCPBUS_TOKEN: other users of the machine can read a process's arguments.
//
// The wire is described in docs/protocol.md; section names from it are quoted below.

import { randomUUID } from "node:crypto";
import process from "node:process";
import WebSocket from "ws";

const URL_ = process.argv[2] ?? process.env.BCPBUS_URL ?? "ws://127.0.0.1:8765";
const CLIENT_ID = process.argv[3] ?? process.env.BCPBUS_CLIENT_ID ?? "agent:researcher";
const TOKEN = process.argv[4] ?? process.env.BCPBUS_TOKEN;
// "BCP over the bus": agents are `agent:<name>`; the name is used in topics.
const NAME = CLIENT_ID.slice(CLIENT_ID.indexOf(":") + 1);
const REQUEST_TIMEOUT_MS = 30_000;

// Canned answers. Cat-1 values by field name, Cat-2 texts by question id.
const CANNED = {
  has_breaking_news: true,
  priority: "high",
  confidence: 4,
  is_urgent: false,
  sentiment: "neutral",
  topic: "Quantum networking",
  finding: "A new relay design doubles the range of entangled links.",
  relevance: "4",
  summary: "The document announces a relay design that doubles the range of quantum links.",
};

// A Cat-2 answer for a question with no canned text, by its expected_format.
const BY_FORMAT = {
  short_text: "unknown",
  person_name: "Ada Lovelace",
  date: "2024-03-15",
  email: "info@example.org",
  integer: "1",
  number: "1",
  short_list: "none",
  yes_no: "no",
};

// Output

/** Write one event as a JSON line on stdout. */
function log(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

/** Write a diagnostic line on stderr. */
function warn(...parts) {
  console.error(`reader.mjs: ${parts.join(" ")}`);
}

// JSON-RPC over one WebSocket ("JSON-RPC on this bus")

/** An error answer from the bus; `code` is the JSON-RPC error code ("Errors"). */
class RpcError extends Error {
  constructor({ code, message, data }) {
    super(`${message} (${code})`);
    this.code = code;
    this.data = data;
  }
}

// Our requests' ids. The bus numbers its own requests independently (they may be equal to
// ours), so a frame is told apart by its shape, never by its id alone.
let nextId = 1;
const pending = new Map(); // id -> { resolve, reject, timer }
let ws;
let closing = false;

/** Send a request to the bus and resolve with its result (or reject with an RpcError). */
function request(method, params) {
  const id = nextId++;
  const frame = { jsonrpc: "2.0", id, method };
  if (params !== undefined) frame.params = params;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      pending.delete(id);
      reject(new Error(`no answer to ${method} within ${REQUEST_TIMEOUT_MS} ms`));
    }, REQUEST_TIMEOUT_MS);
    pending.set(id, { resolve, reject, timer });
    ws.send(JSON.stringify(frame));
  });
}

/** Write one frame if the socket is still open (an answer to a request of the bus, say). */
function write(frame) {
  if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(frame));
}

/** Handle one text frame: a request from the bus, or the answer to one of ours. */
function onFrame(text) {
  let message;
  try {
    message = JSON.parse(text);
  } catch {
    warn("ignored a frame that is not JSON");
    return;
  }
  // The bus never sends batches, but JSON-RPC allows them: handle each element alike.
  for (const item of Array.isArray(message) ? message : [message]) {
    if (typeof item?.method === "string") {
      // Never await here: each request runs on its own so the read loop keeps going.
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

/** Answer one request from the bus; `processMessage` is the only method a peer serves. */
async function onRequest({ id, method, params }) {
  if (id === undefined) return; // A notification: never answered.
  if (method !== "processMessage") {
    write({ jsonrpc: "2.0", id, error: { code: -32601, message: `Method not found: ${method}` } });
    return;
  }
  // "processMessage": answer at once with {processed, status, message}; do the work after,
  // because the sender is waiting for this answer.
  let reply;
  let followUp = null;
  try {
    [reply, followUp] = processMessage(params.topic, params.payload);
  } catch (error) {
    reply = { processed: false, status: "error", message: String(error.message).slice(0, 200) };
  }
  write({ jsonrpc: "2.0", id, result: reply });
  if (followUp) await followUp();
}

/**
 * Send a payload ("The payload envelope") to `topic`; resolve with the bus's
 * {accepted, messageId, deliveredTo}.
 */
async function sendMessage(topic, type, content, messageId = randomUUID()) {
  const payload = {
    messageId,
    type,
    from: CLIENT_ID, // must be our own clientId, or the bus refuses the message
    timestamp: new Date().toISOString(),
    content,
  };
  return request("sendMessage", { topic, payload });
}

// BCP ("BCP message types")

const queries = new Map(); // query_id -> { query, response, attempt }: asked and answered
let pushed = false;

/**
 * Decide what to do with one delivery. Returns [the processMessage result, work to do after
 * answering it (or null)].
 */
function processMessage(topic, payload) {
  const { type, content } = payload;
  switch (type) {
    case "bcp_subscriptions_active": {
      const ids = content.subscriptions.map((s) => s.subscription_id);
      log("subscriptions", { ids });
      const first = pushed ? undefined : content.subscriptions.find((s) => s.category === 1);
      if (first) pushed = true;
      return [{ processed: true, status: "ok", message: "" }, first ? () => push(first) : null];
    }
    case "bcp_query":
      // Taking the query means processed: true; processed: false would fail it for the
      // controller with reader_unavailable.
      log("query", { query_id: content.query_id, category: content.category });
      return [{ processed: true, status: "taken", message: "" }, () => answer(content)];
    case "bcp_validation_result":
      log("validation_result", { correlationId: payload.correlationId ?? null, ...content });
      return [{ processed: true, status: "ok", message: "" }, () => maybeRetry(content)];
    default:
      return [{ processed: false, status: "no_handler", message: `no handler for ${type}` }, null];
  }
}

/** Publish one push on a subscription ("bcp_response", with subscription_id + controller). */
async function push(subscription) {
  const messageId = randomUUID();
  const content = {
    subscription_id: subscription.subscription_id,
    controller: subscription.controller,
    response: buildResponse(subscription),
  };
  const result = await sendMessage(
    `bcp:${subscription.controller}:${NAME}`,
    "bcp_response",
    content,
    messageId,
  );
  log("push", { subscription_id: subscription.subscription_id, messageId, result });
}

/** Answer a query on its channel, bcp:<controller>:<reader>. */
async function answer(query, response = buildResponse(query), attempt = 1) {
  queries.set(query.query_id, { query, response, attempt });
  const messageId = randomUUID();
  const content = { query_id: query.query_id, response };
  const topic = `bcp:${query.controller}:${NAME}`;
  const result = await sendMessage(topic, "bcp_response", content, messageId);
  log("answer", { query_id: query.query_id, attempt, messageId, result });
}

/** After a failed answer, send a corrected one while the query allows retries. */
async function maybeRetry(verdict) {
  const asked = queries.get(verdict.query_id);
  if (!asked || verdict.success) return;
  if (verdict.error !== "validation_failed" || !(verdict.retries_left > 0)) return;
  // A reason with field null is about the answer as a whole: rebuild every value.
  const fields = new Set(verdict.reasons?.map((r) => r.field) ?? [null]);
  const corrected = buildResponse(asked.query, fields.has(null) ? null : fields);
  if (JSON.stringify(corrected) === JSON.stringify(asked.response)) return; // Nothing to fix.
  await answer(asked.query, corrected, asked.attempt + 1);
}

/**
 * The response object for a spec ("Answer shapes"): Cat-1 {field: value}, Cat-2
 * {question_id: "text"}, Cat-3 {summary: "text"}. Keys named in `avoidCanned` (all keys when
 * it is null) get a value derived from the spec instead of the canned one.
 */
function buildResponse(spec, avoidCanned = new Set()) {
  const canned = (key) => (avoidCanned === null || avoidCanned.has(key) ? undefined : CANNED[key]);
  const response = {};
  if (spec.category === 1) {
    for (const field of spec.fields) {
      response[field.name] = canned(field.name) ?? allowedValue(field);
    }
  } else if (spec.category === 2) {
    for (const q of spec.questions) {
      const text = canned(q.id) ?? BY_FORMAT[q.expected_format] ?? "unknown";
      response[q.id] = firstWords(text, q.max_words ?? spec.max_words);
    }
  } else {
    response.summary = firstWords(canned("summary") ?? "Nothing to report.", spec.max_words);
  }
  return response;
}

/** A value a Cat-1 field always accepts: false, the minimum, or the first enum value. */
function allowedValue(field) {
  if (field.type === "boolean") return false;
  if (field.type === "integer") return field.min;
  return field.values[0];
}

/** Keep at most `limit` whitespace-separated words of `text`. */
function firstWords(text, limit) {
  return limit ? text.split(/\s+/).slice(0, limit).join(" ") : text;
}

// Connection ("Connecting", "Authentication")

async function start() {
  if (!TOKEN) {
    warn("no token: pass it as the third argument or in BCPBUS_TOKEN");
    process.exit(2);
  }
  // No compression: the bus does not negotiate it. The token in the handshake too: it passes
  // the bus's cap on sockets that have not initialized, which strangers may have filled.
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
    // 4001 replaced, 4002 no initialize in time, 4003 authentication failed, 1001 bus stopping:
    // all unexpected unless we are the ones closing. Nothing is left to run, so node exits.
    if (!closing) process.exitCode = 1;
  });
  await new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  const init = await request("initialize", {
    clientId: CLIENT_ID,
    auth: { token: TOKEN },
    clientInfo: { name: "bcpbus-js-reader", version: "0.1.0" },
  });
  // initialize has already subscribed us to our own clientId, our inbox (that is where the
  // gateway sends bcp_subscriptions_active the moment we join). Subscribing again is harmless,
  // and fails loudly if the bus's policy does not let us read our inbox.
  await request("subscribe", { topic: `agent:${NAME}` });
  const { serverId, capabilities } = init;
  log("ready", { clientId: CLIENT_ID, serverId, topics: capabilities.topics });
}

function stop(signal) {
  if (closing) return;
  closing = true;
  warn(`${signal}: closing`);
  if (!ws || ws.readyState === WebSocket.CLOSED) return;
  ws.close(1000, "reader stopping"); // node exits once the close handshake is done
  setTimeout(() => ws.terminate(), 2000).unref(); // a bus that does not answer the close
}

process.on("SIGTERM", () => stop("SIGTERM"));
process.on("SIGINT", () => stop("SIGINT"));

start().catch((error) => {
  warn("could not start:", error.message); // an RpcError -32002: wrong clientId or token
  process.exitCode = 1;
  closing = true;
  ws?.terminate();
});
