"""A slow, paid MCP tool server written with the official Python SDK (`mcp` on PyPI).

Run: paid_server.py --log FILE [--delay SECONDS] [--json]
Prints `PORT <n>` on its first line once it listens on 127.0.0.1 (an ephemeral port),
then serves MCP Streamable HTTP at /mcp in both protocol eras (the SDK serves the
initialize-handshake era and 2026-07-28 on one endpoint).

Every tool execution appends one JSON line to FILE: {"event": "start"|"done"|"cancelled",
"tool": ..., "text": ...}, so a test counts what really ran (and what was abandoned).
"""

import argparse
import asyncio
import json
import socket
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--log", required=True)
parser.add_argument("--delay", type=float, default=2.0)
parser.add_argument("--json", action="store_true", help="answer application/json instead of SSE")
args = parser.parse_args()

server = MCPServer("paid-render")


def record(event: str, tool: str, text: str | None = None) -> None:
    with open(args.log, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, "tool": tool, "text": text}) + "\n")
        f.flush()


def executions(tool: str) -> int:
    try:
        with open(args.log, encoding="utf-8") as f:
            return sum(1 for line in f if (e := json.loads(line))["event"] == "start" and e["tool"] == tool)
    except FileNotFoundError:
        return 0


@server.tool(
    description="Renders text to audio. Slow, and charged per character.",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False),
)
async def render(text: str, ctx: Context) -> str:
    record("start", "render", text)
    finished = False
    try:
        steps = 4
        for i in range(steps):
            await ctx.report_progress(i, steps, f"rendering {i}/{steps}")
            await asyncio.sleep(args.delay / steps)
        finished = True
    finally:
        record("done" if finished else "cancelled", "render", text)
    n = executions("render")
    return f"audio for {text!r}: {len(text)} characters charged (render #{n})"


@server.tool(description="How many renders were charged.", annotations=ToolAnnotations(readOnlyHint=True))
async def balance() -> str:
    record("start", "balance")
    return f"{executions('render')} renders charged"


@server.tool(description="Fails with a JSON-RPC error on its first run, then succeeds.")
async def flaky(text: str) -> str:
    record("start", "flaky", text)
    if executions("flaky") == 1:
        raise MCPError(-32050, "upstream briefly unavailable")
    return f"flaky ok for {text!r} (run #{executions('flaky')})"


async def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = server.streamable_http_app(json_response=args.json)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"PORT {port}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    asyncio.run(main())
