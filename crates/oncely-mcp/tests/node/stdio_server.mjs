// A stdio MCP server written with the official TypeScript SDK (@modelcontextprotocol/sdk,
// McpServer + StdioServerTransport), for the `oncely mcp -- COMMAND` interop tests: the
// same server as ../py/stdio_server.py.
//
// Run: node stdio_server.mjs --log FILE [--junk]
// Serves MCP over its stdin and stdout (newline-delimited JSON-RPC) until stdin closes.
//
// Tools:
//   render(prompt, seconds=0)  paid: logs, sleeps `seconds`, returns "rendered <prompt> #<n>"
//                              (n counts render executions in this process); a
//                              notifications/cancelled for it interrupts the sleep
//   lookup(q)                  readOnlyHint: logs, returns "looked up <q> #<n>"
//   ask(question)              asks the client to sample (sampling/createMessage), logs,
//                              returns "asked <question>: <sampled text>"
//
// Every execution appends one JSON line to FILE when it starts:
//   {"event": "start", "tool": ..., "prompt"|"q"|"question": ..., "key": <the call's
//    _meta["dev.oncely/idempotency-key"] or null>, "pid": ...}
// and render appends {"event": "done"|"cancelled", ...} when its sleep is over or was
// interrupted. Count executions with the "start" lines.
//
// --junk prints one line that is not JSON on stdout before serving.

import { appendFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const { values: opts } = parseArgs({
  options: { log: { type: "string" }, junk: { type: "boolean", default: false } },
});
if (!opts.log) {
  console.error("usage: stdio_server.mjs --log FILE [--junk]");
  process.exit(2);
}

const KEY = "dev.oncely/idempotency-key";
const counts = {};
const count = (tool) => (counts[tool] = (counts[tool] ?? 0) + 1);
const record = (entry) =>
  appendFileSync(opts.log, JSON.stringify({ ...entry, pid: process.pid }) + "\n");
const keyOf = (extra) => extra._meta?.[KEY] ?? null;
const text = (t) => ({ content: [{ type: "text", text: t }] });

const server = new McpServer({ name: "oncely-stdio-node", version: "0.0.0" });

server.registerTool(
  "render",
  {
    description: "Renders a prompt. Slow, and paid per call.",
    inputSchema: { prompt: z.string(), seconds: z.number().default(0) },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false },
  },
  async ({ prompt, seconds }, extra) => {
    const n = count("render");
    const key = keyOf(extra);
    record({ event: "start", tool: "render", prompt, key });
    const finished = await new Promise((resolve) => {
      if (!(seconds > 0)) return resolve(true);
      const timer = setTimeout(() => resolve(true), seconds * 1000);
      extra.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve(false);
      });
    });
    record({ event: finished ? "done" : "cancelled", tool: "render", prompt, key });
    return text(`rendered ${prompt} #${n}`);
  },
);

server.registerTool(
  "lookup",
  {
    description: "Looks something up; reads only.",
    inputSchema: { q: z.string() },
    annotations: { readOnlyHint: true },
  },
  async ({ q }, extra) => {
    const n = count("lookup");
    record({ event: "start", tool: "lookup", q, key: keyOf(extra) });
    return text(`looked up ${q} #${n}`);
  },
);

server.registerTool(
  "ask",
  {
    description: "Asks the client's model a question (sampling).",
    inputSchema: { question: z.string() },
  },
  async ({ question }, extra) => {
    count("ask");
    record({ event: "start", tool: "ask", question, key: keyOf(extra) });
    const sampled = await server.server.createMessage(
      { messages: [{ role: "user", content: { type: "text", text: question } }], maxTokens: 20 },
      { relatedRequestId: extra.requestId },
    );
    const answer = sampled.content?.type === "text" ? sampled.content.text : JSON.stringify(sampled.content);
    return text(`asked ${question}: ${answer}`);
  },
);

if (opts.junk) {
  process.stdout.write("this is not JSON-RPC: a stray print from the server\n");
}
await server.connect(new StdioServerTransport());
