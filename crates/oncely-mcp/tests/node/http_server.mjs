// A remote MCP server over Streamable HTTP written with the official TypeScript SDK
// (@modelcontextprotocol/sdk, McpServer + StreamableHTTPServerTransport on node:http), for
// the `oncely mcp --url URL` interop tests: the same server as ../py/http_server.py.
//
// Run: node http_server.mjs --log FILE [--token TOKEN] [--port N]
// Prints `PORT <n>` on its first line once it listens on 127.0.0.1 (port N, else an
// ephemeral one: a test restarts a server on the port it had),
// then serves MCP Streamable HTTP at /mcp, one session per initialize. With --token, a
// request without `Authorization: Bearer TOKEN` gets 401.
//
// Tools:
//   render(prompt, seconds=0)  paid: logs, sleeps `seconds`, returns "rendered <prompt> #<n>"
//                              (n counts render executions in this process)
//   lookup(q)                  readOnlyHint: logs, returns "looked up <q> #<n>"
//   ask(question)              asks the client to sample (sampling/createMessage) during
//                              the call, logs, returns "asked <question>: <sampled text>"
//
// Every execution appends one JSON line to FILE when it starts:
//   {"event": "start", "tool": ..., "prompt"|"q"|"question": ..., "key": <the call's
//    _meta["dev.oncely/idempotency-key"] or null>, "auth": <its Authorization or null>}
// and render appends {"event": "done"|"cancelled", ...} when its sleep is over or was
// interrupted. Count executions with the "start" lines. A session's end (`DELETE`)
// appends {"event": "delete", "tool": null}.

import { randomUUID } from "node:crypto";
import { appendFileSync } from "node:fs";
import { createServer } from "node:http";
import { parseArgs } from "node:util";

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const { values: opts } = parseArgs({
  options: { log: { type: "string" }, token: { type: "string" }, port: { type: "string" } },
});
if (!opts.log) {
  console.error("usage: http_server.mjs --log FILE [--token TOKEN]");
  process.exit(2);
}

const KEY = "dev.oncely/idempotency-key";
const counts = {};
const count = (tool) => (counts[tool] = (counts[tool] ?? 0) + 1);
const record = (entry) => appendFileSync(opts.log, JSON.stringify(entry) + "\n");
const keyOf = (extra) => extra._meta?.[KEY] ?? null;
const authOf = (extra) => extra.requestInfo?.headers?.authorization ?? null;
const text = (t) => ({ content: [{ type: "text", text: t }] });

/** A server with the three tools, for one session. */
function newServer() {
  const server = new McpServer({ name: "oncely-http-node", version: "0.0.0" });
  server.registerTool(
    "render",
    {
      description: "Renders a prompt. Slow, and paid per call.",
      inputSchema: { prompt: z.string(), seconds: z.number().default(0) },
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false },
    },
    async ({ prompt, seconds }, extra) => {
      const n = count("render");
      const entry = { tool: "render", prompt, key: keyOf(extra) };
      record({ event: "start", ...entry, auth: authOf(extra) });
      const finished = await new Promise((resolve) => {
        if (!(seconds > 0)) return resolve(true);
        const timer = setTimeout(() => resolve(true), seconds * 1000);
        extra.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          resolve(false);
        });
      });
      record({ event: finished ? "done" : "cancelled", ...entry });
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
      record({ event: "start", tool: "lookup", q, key: keyOf(extra), auth: authOf(extra) });
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
      record({ event: "start", tool: "ask", question, key: keyOf(extra), auth: authOf(extra) });
      const sampled = await server.server.createMessage(
        { messages: [{ role: "user", content: { type: "text", text: question } }], maxTokens: 20 },
        { relatedRequestId: extra.requestId },
      );
      const answer = sampled.content?.type === "text" ? sampled.content.text : JSON.stringify(sampled.content);
      return text(`asked ${question}: ${answer}`);
    },
  );
  return server;
}

/** The sessions' transports, by session id. */
const transports = new Map();

async function bodyOf(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const raw = Buffer.concat(chunks).toString("utf8");
  return raw ? JSON.parse(raw) : undefined;
}

const http = createServer(async (req, res) => {
  try {
    if (!req.url.startsWith("/mcp")) {
      res.writeHead(404).end();
      return;
    }
    if (opts.token && req.headers.authorization !== `Bearer ${opts.token}`) {
      res.writeHead(401, { "content-type": "application/json" }).end('{"error":"unauthorized"}');
      return;
    }
    if (req.method === "DELETE") record({ event: "delete", tool: null });
    const body = req.method === "POST" ? await bodyOf(req) : undefined;
    const id = req.headers["mcp-session-id"];
    let transport = id ? transports.get(id) : undefined;
    if (!transport && !id && req.method === "POST" && isInitializeRequest(body)) {
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => transports.set(sid, transport),
      });
      transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
      await newServer().connect(transport);
    }
    if (!transport) {
      res.writeHead(id ? 404 : 400, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32000, message: "no such session" } }));
      return;
    }
    await transport.handleRequest(req, res, body);
  } catch (e) {
    console.error("http_server.mjs:", e);
    if (!res.headersSent) res.writeHead(500).end();
  }
});

http.listen(Number(opts.port ?? 0), "127.0.0.1", () => {
  console.log(`PORT ${http.address().port}`);
});
