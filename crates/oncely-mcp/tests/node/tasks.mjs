// Issue 23's second client: what the TypeScript SDK and a raw Node client see of oncely's
// guard on task-augmented calls and of the tasks extension. The SDK
// (@modelcontextprotocol/sdk 1.32) speaks revisions up to 2025-11-25 and has no
// io.modelcontextprotocol/tasks extension (2026-07-28), so:
//   - "sdk": the SDK's Client in 2025-11-25 lists the tools, calls `render` plainly, with
//     a `task` parameter (2025-11-25's task augmentation), and through its experimental
//     callToolStream;
//   - "raw": fetch() in 2026-07-28, the extension declared on each request: a slow call
//     that becomes a task and is polled to `completed`; a call with and without `task`;
//     a call that fails as a task, called again, and its first task read once more.
// Run: node tasks.mjs URL   (MCP_AUTH: the Authorization header)
// Prints one JSON document: {sdk, raw: {..., messages: [items for validate.py]}}.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url] = process.argv.slice(2);
const auth = process.env.MCP_AUTH ?? "";
const MODERN = "2026-07-28";

async function sdk() {
  const client = new Client({ name: "oncely-tasks", version: "0.0.0" }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: auth } },
  });
  await client.connect(transport);
  const tools = (await client.listTools()).tools;
  const taskSupport = Object.fromEntries(tools.map((t) => [t.name, t.execution?.taskSupport ?? null]));
  const args = { mode: "ok", by: "sdk" };
  const plain = await client.callTool({ name: "render", arguments: args });
  const augmented = await client.request(
    { method: "tools/call", params: { name: "render", arguments: args, task: { ttl: 60000 } } },
    CallToolResultSchema,
  );
  let stream = null;
  for await (const message of client.experimental.tasks.callToolStream({ name: "render", arguments: args })) {
    if (message.type === "result") stream = message.result;
    if (message.type === "error") stream = { error: String(message.error) };
  }
  await client.close();
  return { protocol: transport.protocolVersion ?? null, taskSupport, plain, augmented, stream };
}

const messages = [];
let nextId = 1;

async function rpc(method, name, params) {
  const body = {
    jsonrpc: "2.0",
    id: nextId++,
    method,
    params: {
      ...params,
      _meta: {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } },
      },
    },
  };
  const res = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      authorization: auth,
      "mcp-protocol-version": MODERN,
      "mcp-method": method,
      "mcp-name": name,
    },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  try {
    return JSON.parse(text);
  } catch {
    const data = text.split("\n").find((l) => l.startsWith("data:"));
    return data ? JSON.parse(data.slice(5)) : { http_status: res.status, text };
  }
}

const call = (args, extra = {}) => rpc("tools/call", "render", { name: "render", arguments: args, ...extra });
const get = (taskId) => rpc("tasks/get", taskId, { taskId });
const keep = (name, kind, message) => messages.push({ name: `node: ${name}`, era: MODERN, kind, message });

async function untilDone(taskId) {
  for (let i = 0; i < 200; i++) {
    const got = await get(taskId);
    if (got.result?.status !== "working") return got;
    await new Promise((r) => setTimeout(r, Math.max(100, Math.min(got.result?.pollIntervalMs ?? 250, 500))));
  }
  throw new Error(`task ${taskId} still working`);
}

async function raw() {
  const happyArgs = { mode: "slow", ms: 1500, by: "node" };
  const created = await call(happyArgs);
  keep("CreateTaskResult", "task", created);
  const done = await untilDone(created.result.taskId);
  keep("GetTaskResult completed", "get_task", done);

  const paramArgs = { mode: "ok", by: "node" };
  const taskParam = [
    await call(paramArgs, { task: { ttl: 60000 } }),
    await call(paramArgs),
    await call(paramArgs, { task: { ttl: 1000 } }),
  ];
  taskParam.forEach((m, i) => keep(`task parameter ${i}`, "tool_result", m));

  const failArgs = { mode: "fail_once", ms: 1200, by: "node" };
  const firstCreated = await call(failArgs);
  const firstId = firstCreated.result.taskId;
  const first = await untilDone(firstId);
  keep("GetTaskResult failed", "get_task", first);
  const secondCreated = await call(failArgs);
  const secondId = secondCreated.result?.taskId ?? null;
  if (secondId) await untilDone(secondId);
  const firstAgain = await get(firstId);
  keep("GetTaskResult failed, read again", "get_task", firstAgain);
  return { happy: { created, done }, taskParam, failed: { firstId, first, secondId, firstAgain }, messages };
}

const out = { sdk: await sdk(), raw: await raw() };
console.log(JSON.stringify(out));
