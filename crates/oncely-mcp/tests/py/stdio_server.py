"""A stdio MCP server written with the official Python SDK (`mcp` on PyPI), for the
`oncely mcp -- COMMAND` interop tests.

Run: stdio_server.py --log FILE [--junk]
Serves MCP over its stdin and stdout (newline-delimited JSON-RPC) until stdin closes.

Tools:
  render(prompt, seconds=0)  paid: logs, sleeps `seconds`, returns "rendered <prompt> #<n>"
                             (n counts render executions in this process)
  lookup(q)                  readOnlyHint: logs, returns "looked up <q> #<n>"
  ask(question)              asks the client to sample (sampling/createMessage), logs,
                             returns "asked <question>: <sampled text>"

Every execution appends one JSON line to FILE when it starts:
  {"event": "start", "tool": ..., "prompt"|"q"|"question": ..., "key": <the call's
   _meta["dev.oncely/idempotency-key"] or null>, "pid": ...}
and render appends {"event": "done", ...} when its sleep is over (so a test can tell a
call that ran to its end from one that was killed or cancelled mid-way; an interrupted
render logs {"event": "cancelled", ...} when it can). Count executions with the "start"
lines.

--junk prints one line that is not JSON on stdout before serving (a server that writes
stray output to stdout).
"""

import argparse
import asyncio
import json
import os
import sys
import warnings

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import SamplingMessage, TextContent, ToolAnnotations

warnings.simplefilter("ignore")  # create_message is deprecated from 2026-07-28 on; this is stdio 2025-11-25

parser = argparse.ArgumentParser()
parser.add_argument("--log", required=True)
parser.add_argument("--junk", action="store_true", help="print one non-JSON line to stdout before serving")
args = parser.parse_args()

server = MCPServer("oncely-stdio-py")
counts: dict[str, int] = {}
KEY = "dev.oncely/idempotency-key"


def key_of(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    return meta.get(KEY)


def record(entry: dict) -> None:
    entry["pid"] = os.getpid()
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
    key = key_of(ctx)
    record({"event": "start", "tool": "render", "prompt": prompt, "key": key})
    finished = False
    try:
        if seconds > 0:
            await asyncio.sleep(seconds)
        finished = True
    finally:
        record({"event": "done" if finished else "cancelled", "tool": "render", "prompt": prompt, "key": key})
    return f"rendered {prompt} #{n}"


@server.tool(description="Looks something up; reads only.", annotations=ToolAnnotations(readOnlyHint=True))
async def lookup(q: str, ctx: Context) -> str:
    n = count("lookup")
    record({"event": "start", "tool": "lookup", "q": q, "key": key_of(ctx)})
    return f"looked up {q} #{n}"


@server.tool(description="Asks the client's model a question (sampling).")
async def ask(question: str, ctx: Context) -> str:
    count("ask")
    record({"event": "start", "tool": "ask", "question": question, "key": key_of(ctx)})
    sampled = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(type="text", text=question))],
        max_tokens=20,
        related_request_id=ctx.request_context.request_id,
    )
    content = sampled.content
    text = content.text if isinstance(content, TextContent) else json.dumps(content, default=str)
    return f"asked {question}: {text}"


if __name__ == "__main__":
    if args.junk:
        sys.stdout.write("this is not JSON-RPC: a stray print from the server\n")
        sys.stdout.flush()
    server.run("stdio")
