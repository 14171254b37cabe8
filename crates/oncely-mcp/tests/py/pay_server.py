"""A payment MCP server written with the official Python SDK (`mcp` on PyPI) whose tools
take an idempotency key argument the model is told to make unique for every request, as
Square's MCP server's do.

Run: pay_server.py --log FILE [--http]
Serves MCP over stdio, or with --http Streamable HTTP at /mcp on 127.0.0.1 (an ephemeral
port, printed first as `PORT <n>`).

Tools:
  pay(amount, to, note="", idempotency_key)  returns "paid <amount> to <to> #<n>"
  pay_short(amount, idempotency_key)         its key has maxLength 16: no UUID fits

Every execution appends one JSON line to FILE:
  {"event": "start", "tool": ..., "amount": ..., "idempotency_key": ..., "auth": ...}
"""

import argparse
import asyncio
import json
import socket
from typing import Annotated

from pydantic import Field

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--log", required=True)
parser.add_argument("--http", action="store_true")
args = parser.parse_args()

server = MCPServer("oncely-pay-py")
counts: dict[str, int] = {}
PAID = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False)


def record(entry: dict, ctx: Context) -> None:
    request = ctx.request_context.request
    headers = getattr(request, "headers", None) if request is not None else None
    entry["auth"] = headers.get("authorization") if headers is not None else None
    with open(args.log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()


def count(tool: str) -> int:
    counts[tool] = counts.get(tool, 0) + 1
    return counts[tool]


@server.tool(
    description="Charges a payment. idempotency_key: a unique key for every request.",
    annotations=PAID,
)
async def pay(amount: int, to: str, idempotency_key: str, ctx: Context, note: str = "") -> str:
    n = count("pay")
    record({"event": "start", "tool": "pay", "amount": amount, "idempotency_key": idempotency_key}, ctx)
    return f"paid {amount} to {to} #{n}"


@server.tool(description="Charges a payment; its key is at most 16 characters.", annotations=PAID)
async def pay_short(amount: int, idempotency_key: Annotated[str, Field(max_length=16)], ctx: Context) -> str:
    n = count("pay_short")
    record({"event": "start", "tool": "pay_short", "amount": amount, "idempotency_key": idempotency_key}, ctx)
    return f"paid {amount} #{n}"


async def main() -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"PORT {port}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    if args.http:
        asyncio.run(main())
    else:
        server.run("stdio")
