// A stdio MCP host written with the official TypeScript SDK (@modelcontextprotocol/sdk,
// Client + StdioClientTransport): it starts the server command itself and drives it
// through a scenario, for the `oncely mcp -- COMMAND` interop tests. The same scenarios
// and output as ../py/stdio_host.py.
//
// Run: node stdio_host.mjs SCENARIO [ARG] -- COMMAND [ARG]...
//   SCENARIO is a name (below) or a JSON plan: a list of steps, run in order, each one of
//     {"call": TOOL, "args": {...}, "timeout": SECONDS?, "meta": {...}?}
//     {"parallel": [STEP, ...]}           these steps at once
//     {"sleep": SECONDS}
//     {"list_tools": true}
//     {"call": ..., "close_after": SECONDS}  starts the call, and SECONDS later closes the
//                                         client without waiting for it (the SDK ends the
//                                         server's stdin, and after its grace period sends
//                                         SIGTERM, then SIGKILL); the last step of a plan
//   Names:
//     twice           render {"prompt": "a"} twice, one after the other
//     different       render {"prompt": "a"}, then render {"prompt": "b"}
//     readonly        lookup {"q": "x"} twice
//     giveup          render {"prompt": "slow", "seconds": 2} with a 0.5 s request timeout
//                     (the SDK gives up and sends notifications/cancelled), then the same
//                     call again without one
//     concurrent N    N identical render {"prompt": "together", "seconds": 1} calls at once
//     sampling        ask {"question": "hi"} twice (the server samples from this client)
//     close-mid-call  render {"prompt": "left", "seconds": S} (S = ARG, default 1.2), and
//                     closes the client 0.3 s later
//     render P [S]    one render {"prompt": P, "seconds": S}
// The sampling handler answers "sampled: <the first message's text>".
//
// Prints ONE JSON document on stdout:
//   {"protocol": ..., "server": ..., "steps": [OUTCOME, ...], "samplings": [TEXT, ...],
//    "close_seconds": how long client.close() took,
//    "exit": {"code": ..., "signal": ...} of the server process (a signal when the SDK
//    had to kill it)}
// where a call's OUTCOME is
//   {"text": first content text, "isError": ..., "meta": result _meta or null,
//    "result": the whole CallToolResult}
//   or {"error": {"kind": "timeout"|"mcp"|"other", "code": ..., "message": ...}}.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CreateMessageRequestSchema, ErrorCode } from "@modelcontextprotocol/sdk/types.js";

const argv = process.argv.slice(2);
const split = argv.indexOf("--");
if (split < 1) {
  console.error("usage: stdio_host.mjs SCENARIO [ARG] -- COMMAND [ARG]...");
  process.exit(2);
}
const [scenario, arg] = argv.slice(0, split);
const [command, ...commandArgs] = argv.slice(split + 1);

const render = (prompt, extra = {}) => ({ call: "render", args: { prompt, ...extra } });
function planOf(scenario, arg) {
  if (scenario.trimStart().startsWith("[")) return JSON.parse(scenario);
  switch (scenario) {
    case "twice":
      return [render("a"), render("a")];
    case "different":
      return [render("a"), render("b")];
    case "readonly":
      return [0, 1].map(() => ({ call: "lookup", args: { q: "x" } }));
    case "giveup":
      return [{ ...render("slow", { seconds: 2 }), timeout: 0.5 }, render("slow", { seconds: 2 })];
    case "concurrent":
      return [{ parallel: Array.from({ length: Number(arg ?? 3) }, () => render("together", { seconds: 1 })) }];
    case "sampling":
      return [0, 1].map(() => ({ call: "ask", args: { question: "hi" } }));
    case "close-mid-call":
      return [{ ...render("left", { seconds: Number(arg ?? 1.2) }), close_after: 0.3 }];
    case "render": {
      const [prompt, seconds] = (arg ?? "a").split(" ");
      return [render(prompt, { seconds: Number(seconds ?? 0) })];
    }
    default:
      console.error(`stdio_host.mjs: unknown scenario ${scenario}`);
      process.exit(2);
  }
}
const plan = planOf(scenario, arg);

const samplings = [];
const client = new Client({ name: "oncely-stdio-host", version: "0.0.0" }, { capabilities: { sampling: {} } });
client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
  const first = request.params.messages[0]?.content;
  const text = first?.type === "text" ? first.text : JSON.stringify(first);
  samplings.push(text);
  return { model: "test-model", role: "assistant", content: { type: "text", text: `sampled: ${text}` } };
});
const transport = new StdioClientTransport({ command, args: commandArgs });
await client.connect(transport);
const serverProcess = transport._process; // to report how the server ended

async function call(step) {
  try {
    const options = step.timeout !== undefined ? { timeout: step.timeout * 1000 } : undefined;
    const params = { name: step.call, arguments: step.args ?? {} };
    if (step.meta) params._meta = step.meta;
    const result = await client.callTool(params, undefined, options);
    return {
      text: result.content?.[0]?.text ?? null,
      isError: result.isError ?? false,
      meta: result._meta ?? null,
      result,
    };
  } catch (e) {
    const kind = e.code === ErrorCode.RequestTimeout ? "timeout" : e.code !== undefined ? "mcp" : "other";
    return { error: { kind, code: e.code ?? null, message: String(e.message ?? e) } };
  }
}

async function runStep(step) {
  if (step.sleep !== undefined) {
    await new Promise((r) => setTimeout(r, step.sleep * 1000));
    return { slept: step.sleep };
  }
  if (step.parallel) return { parallel: await Promise.all(step.parallel.map(runStep)) };
  if (step.list_tools) return { tools: (await client.listTools()).tools };
  return call(step);
}

const out = {
  protocol: transport.protocolVersion ?? null, // the stdio transport does not keep it: null
  server: client.getServerVersion()?.name ?? null,
  steps: [],
};
for (const step of plan) {
  if (step.close_after !== undefined) {
    call(step); // abandoned: rejected with "Connection closed" when the client closes
    await new Promise((r) => setTimeout(r, step.close_after * 1000));
    out.steps.push({ abandoned: step.call });
    break;
  }
  out.steps.push(await runStep(step));
}
const closing = performance.now();
await client.close();
out.close_seconds = Math.round(performance.now() - closing) / 1000;
out.exit = { code: serverProcess?.exitCode ?? null, signal: serverProcess?.signalCode ?? null };
out.samplings = samplings;
console.log(JSON.stringify(out));
