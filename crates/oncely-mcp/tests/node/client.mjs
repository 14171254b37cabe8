// Drives the official TypeScript MCP SDK client (@modelcontextprotocol/sdk) for
// oncely-mcp's interop tests.
//
// Run: node client.mjs URL SCENARIO
//   SCENARIO "timeout":    calls `render` with a 2 s request timeout (the SDK then sends
//                          notifications/cancelled), then calls it again without one.
//   SCENARIO "everything": against server-everything: tools, resources, prompts, a tool
//                          with progress notifications, and a sampling tool called twice.
// Optional environment: MCP_AUTH (sent as the Authorization header).
// Prints one JSON document on standard output.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CreateMessageRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, scenario] = process.argv.slice(2);
const headers = process.env.MCP_AUTH ? { Authorization: process.env.MCP_AUTH } : {};

let samplings = 0;
const client = new Client(
  { name: "oncely-interop", version: "0.0.0" },
  { capabilities: { sampling: {} } },
);
client.setRequestHandler(CreateMessageRequestSchema, async () => {
  samplings += 1;
  return {
    model: "test-model",
    role: "assistant",
    content: { type: "text", text: `sampled answer #${samplings}` },
  };
});
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers },
});
await client.connect(transport);

async function outcome(promise) {
  try {
    return { result: await promise };
  } catch (e) {
    return { error: { code: e.code ?? null, message: String(e.message ?? e) } };
  }
}

const out = { protocol: transport.protocolVersion ?? null };
if (scenario === "timeout") {
  const args = { name: "render", arguments: { text: "chapter one" } };
  out.first = await outcome(client.callTool(args, undefined, { timeout: 2000 }));
  out.retry = await outcome(client.callTool(args));
} else if (scenario === "everything") {
  out.tools = (await client.listTools()).tools.map((t) => ({
    name: t.name,
    readOnly: t.annotations?.readOnlyHint ?? null,
  }));
  const resources = (await client.listResources()).resources;
  out.resources = resources.map((r) => r.uri);
  out.read = await client.readResource({ uri: resources[0].uri });
  out.prompts = (await client.listPrompts()).prompts.map((p) => p.name);
  out.prompt = await client.getPrompt({ name: "simple-prompt" });
  const progress = [];
  out.long = await outcome(
    client.callTool(
      { name: "trigger-long-running-operation", arguments: { duration: 1, steps: 2 } },
      undefined,
      { onprogress: (p) => progress.push(p) },
    ),
  );
  out.progress = progress;
  const sample = { name: "trigger-sampling-request", arguments: { prompt: "say hi", maxTokens: 10 } };
  out.sampled = await outcome(client.callTool(sample));
  out.sampledAgain = await outcome(client.callTool(sample));
  out.samplings = samplings;
} else {
  throw new Error(`unknown scenario ${scenario}`);
}
await client.close();
console.log(JSON.stringify(out));
