"""A small shop's MCP tool server, written with the official Python SDK (`mcp` on PyPI),
for the `oncely inventory` tests: one tool of each kind the inventory tells apart.

Run: shop_server.py [--json]
Prints `PORT <n>` once it listens on 127.0.0.1 (an ephemeral port), then serves MCP
Streamable HTTP at /mcp (event-stream answers, or JSON with --json).
"""

import argparse
import asyncio
import socket

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--json", action="store_true", help="answer application/json instead of SSE")
args = parser.parse_args()

server = MCPServer("shop")


@server.tool(description="Looks an invoice up.", annotations=ToolAnnotations(readOnlyHint=True))
async def get_invoice(number: str) -> str:
    return f"invoice {number}: open"


@server.tool(description="Emails an invoice to the customer.")
async def send_invoice(number: str) -> str:
    return f"invoice {number} sent"


@server.tool(
    description="Ends a subscription at once.",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True),
)
async def cancel_subscription(customer: str) -> str:
    return f"subscription of {customer} cancelled"


@server.tool(
    description="Saves a draft note; saving it twice keeps one.",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True),
)
async def save_draft(text: str) -> str:
    return f"draft saved: {text}"


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
