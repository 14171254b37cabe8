"""A remote MCP server over Streamable HTTP written with the official Python SDK (`mcp`
on PyPI), for the `oncely mcp --url URL` interop tests: the tools of stdio_server.py.

Run: http_server.py --log FILE [--token TOKEN] [--port N]
Prints `PORT <n>` on its first line once it listens on 127.0.0.1 (port N, else an
ephemeral one: a test restarts a server on the port it had),
then serves MCP Streamable HTTP at /mcp (sessions, answers as event streams). With
--token, a request without `Authorization: Bearer TOKEN` gets 401.

Tools:
  render(prompt, seconds=0)  paid: logs, sleeps `seconds`, returns "rendered <prompt> #<n>"
  lookup(q)                  readOnlyHint: logs, returns "looked up <q> #<n>"
  ask(question)              asks the client to sample (sampling/createMessage) during the
                             call, logs, returns "asked <question>: <sampled text>"

Every execution appends one JSON line to FILE when it starts:
  {"event": "start", "tool": ..., "prompt"|"q"|"question": ..., "key": <the call's
   _meta["dev.oncely/idempotency-key"] or null>, "auth": <its Authorization or null>}
and render appends {"event": "done"|"cancelled", ...} when its sleep is over or was
interrupted. Count executions with the "start" lines. A session's end (`DELETE`) appends
{"event": "delete", "tool": null}.
"""

import argparse
import asyncio
import json
import socket
import warnings

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import SamplingMessage, TextContent, ToolAnnotations
from starlette.responses import JSONResponse

warnings.simplefilter("ignore")  # create_message is deprecated from 2026-07-28 on; the tests sample on 2025-11-25

parser = argparse.ArgumentParser()
parser.add_argument("--log", required=True)
parser.add_argument("--token")
parser.add_argument("--port", type=int, default=0)
args = parser.parse_args()

server = MCPServer("oncely-http-py")
counts: dict[str, int] = {}
KEY = "dev.oncely/idempotency-key"


def key_of(ctx: Context) -> str | None:
    return (ctx.request_context.meta or {}).get(KEY)


def auth_of(ctx: Context) -> str | None:
    request = getattr(ctx.request_context, "request", None)
    return request.headers.get("authorization") if request is not None else None


def record(entry: dict) -> None:
    with open(args.log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()


def count(tool: str) -> int:
    counts[tool] = counts.get(tool, 0) + 1
    return counts[tool]


@server.tool(
    description="Renders a prompt. Slow, and paid per call.",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False),
)
async def render(prompt: str, ctx: Context, seconds: float = 0) -> str:
    n = count("render")
    entry = {"tool": "render", "prompt": prompt, "key": key_of(ctx)}
    record({"event": "start", **entry, "auth": auth_of(ctx)})
    finished = False
    try:
        if seconds > 0:
            await asyncio.sleep(seconds)
        finished = True
    finally:
        record({"event": "done" if finished else "cancelled", **entry})
    return f"rendered {prompt} #{n}"


@server.tool(description="Looks something up; reads only.", annotations=ToolAnnotations(readOnlyHint=True))
async def lookup(q: str, ctx: Context) -> str:
    n = count("lookup")
    record({"event": "start", "tool": "lookup", "q": q, "key": key_of(ctx), "auth": auth_of(ctx)})
    return f"looked up {q} #{n}"


@server.tool(description="Asks the client's model a question (sampling).")
async def ask(question: str, ctx: Context) -> str:
    count("ask")
    record({"event": "start", "tool": "ask", "question": question, "key": key_of(ctx), "auth": auth_of(ctx)})
    sampled = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(type="text", text=question))],
        max_tokens=20,
        related_request_id=ctx.request_context.request_id,
    )
    content = sampled.content
    text = content.text if isinstance(content, TextContent) else json.dumps(content, default=str)
    return f"asked {question}: {text}"


def guarded(app, token: str | None):
    """`app`, logging each `DELETE` and, with a token, refusing (401) a request without
    `Authorization: Bearer TOKEN`."""

    async def checked(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if token and headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
            if scope["method"] == "DELETE":
                record({"event": "delete", "tool": None})
        await app(scope, receive, send)

    return checked


async def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    app = guarded(server.streamable_http_app(), args.token)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"PORT {port}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    asyncio.run(main())
