#!/usr/bin/env node
// A BCP controller peer for bcpbus that asks a sealed question and forwards the answer unread.
//
// It connects as a controller (`agent:main` of the reference agents), then:
//   - asks its reader one Cat-2 question with `"sealed": true` (bcp_query_request);
//   - gets a bcp_response_delivery whose value is a sealed value: a handle, the format, the
//     word count, the bits and the findings, never the text;
//   - sends the text on to a person with bcp_forward, `{"$sealed": HANDLE}` where it goes;
//   - waits for the gateway's bcp_forward_result, and exits 0 if the forward was made.
//
// It prints JSON lines on stdout ({"event": ...}: ready, sealed, forwarded, refused) and
// diagnostics on stderr. The text itself never reaches this process: that is the point.
//
// Usage: node controller.mjs [URL] [CLIENT_ID] [READER] [TO]
//   or BCPBUS_URL, BCPBUS_CLIENT_ID, BCPBUS_READER, BCPBUS_FORWARD_TO; the token in BCPBUS_TOKEN.
//
// The wire is described in docs/protocol.md, "Sealed values: bcp_forward and bcp_forward_result".

import { randomUUID } from "node:crypto";
import process from "node:process";
import WebSocket from "ws";

const URL_ = process.argv[2] ?? process.env.BCPBUS_URL ?? "ws://127.0.0.1:8765";
const CLIENT_ID = process.argv[3] ?? process.env.BCPBUS_CLIENT_ID ?? "agent:main";
const READER = process.argv[4] ?? process.env.BCPBUS_READER ?? "researcher";
const TO = process.argv[5] ?? process.env.BCPBUS_FORWARD_TO ?? "tg:alice";
const TOKEN = process.env.BCPBUS_TOKEN;
const NAME = CLIENT_ID.slice(CLIENT_ID.indexOf(":") + 1);
const TIMEOUT_MS = 30_000;

const SPEC = {
  category: 2,
  sealed: true, // every free-text answer of the spec comes back as a handle
  questions: [
    { id: "finding", question: "What is the key finding?", max_words: 50, expected_format: "short_text" },
  ],
};

function log(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

function warn(...parts) {
  console.error(`controller.mjs: ${parts.join(" ")}`);
}

let nextId = 1;
const calls = new Map(); // our request id -> resolve/reject
const waiting = new Map(); // a BCP message we wait for, by "type:id" -> resolve
let ws;

function request(method, params) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    calls.set(id, { resolve, reject });
    ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
  });
}

function sendMessage(topic, type, content) {
  const payload = { messageId: randomUUID(), type, from: CLIENT_ID, timestamp: new Date().toISOString(), content };
  return request("sendMessage", { topic, payload });
}

/** Resolve once the gateway sends `type` whose `key` field is `id` (or reject on timeout). */
function expect(type, id) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${type} for ${id}`)), TIMEOUT_MS);
    waiting.set(`${type}:${id}`, (content) => {
      clearTimeout(timer);
      resolve(content);
    });
  });
}

function onFrame(text) {
  const item = JSON.parse(text);
  if (item.method === "processMessage" && item.id !== undefined) {
    const { type, content } = item.params.payload;
    const key = `${type}:${content.query_id ?? content.forward_id}`;
    const resolve = waiting.get(key);
    waiting.delete(key);
    ws.send(JSON.stringify({ jsonrpc: "2.0", id: item.id, result: { processed: true, status: "ok", message: "" } }));
    if (resolve) resolve(content);
    else if (type === "bcp_query_failed") warn("query failed:", content.error, content.detail);
  } else if (calls.has(item.id)) {
    const { resolve, reject } = calls.get(item.id);
    calls.delete(item.id);
    if ("error" in item) reject(new Error(`${item.error.message} (${item.error.code})`));
    else resolve(item.result);
  }
}

async function run() {
  // The token in the handshake too: it passes the bus's cap on sockets not yet initialized.
  ws = new WebSocket(URL_, { perMessageDeflate: false, headers: { Authorization: `Bearer ${TOKEN}` } });
  ws.on("message", (data, isBinary) => isBinary || onFrame(data.toString("utf8")));
  await new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  await request("initialize", { clientId: CLIENT_ID, auth: { token: TOKEN }, clientInfo: { name: "bcpbus-js-controller", version: "0.1.0" } });
  await request("subscribe", { topic: `agent:${NAME}` });
  log("ready", { clientId: CLIENT_ID });

  const topic = `bcp:${NAME}:${READER}`;
  const queryId = `q-${randomUUID().slice(0, 12)}`;
  const delivered = expect("bcp_response_delivery", queryId);
  await sendMessage(topic, "bcp_query_request", { query_id: queryId, ...SPEC });
  const delivery = await delivered;
  const value = delivery.response.finding;
  // A sealed value: {sealed, format, words, bits, findings}. There is no text to read here.
  if (typeof value !== "object" || typeof value.sealed !== "string") throw new Error("not sealed");
  log("sealed", { query_id: queryId, format: value.format, words: value.words, bits: value.bits, findings: value.findings });

  const forwardId = `f-${randomUUID().slice(0, 12)}`;
  const result = expect("bcp_forward_result", forwardId);
  await sendMessage(topic, "bcp_forward", {
    forward_id: forwardId,
    to: TO,
    type: "tg_reply",
    content: { text: { $sealed: value.sealed } },
  });
  const outcome = await result;
  log(outcome.success ? "forwarded" : "refused", { to: outcome.to, error: outcome.error ?? null, detail: outcome.detail });
  process.exitCode = outcome.success ? 0 : 1;
}

if (!TOKEN) {
  warn("no token: set BCPBUS_TOKEN");
  process.exit(2);
}
run()
  .catch((error) => {
    warn("failed:", error.message);
    process.exitCode = 1;
  })
  .finally(() => ws?.close(1000, "controller done"));
