"""Drives the official Python MCP client (`mcp` on PyPI) through a scripted plan.

Run: client.py URL MODE PLAN_JSON
  MODE: "legacy" (initialize handshake, sessions: 2025-11-25 and older) or "2026-07-28".
  PLAN_JSON: a list of steps, run in order; a step is one of
    {"call": TOOL, "args": {...}, "timeout": SECONDS?, "meta": {...}?, "progress": true?}
    {"parallel": [STEP, ...]}         run these steps at once
    {"list_tools": true}
    {"sleep": SECONDS}
  Optional environment: MCP_AUTH (sent as the Authorization header).
Prints one JSON document: {"protocol": ..., "steps": [OUTCOME, ...]} where OUTCOME is
  {"result": CallToolResult as JSON (with _meta), "progress": [...]} or
  {"error": {"kind": "timeout"|"mcp"|"other", "code": ..., "message": ...}}.
"""

import asyncio
import json
import os
import sys

import anyio
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


async def run_step(client: Client, step: dict) -> dict:
    if "sleep" in step:
        await asyncio.sleep(step["sleep"])
        return {"slept": step["sleep"]}
    if "parallel" in step:
        results = await asyncio.gather(*(run_step(client, s) for s in step["parallel"]))
        return {"parallel": list(results)}
    if "list_tools" in step:
        listed = await client.list_tools()
        return {"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]}
    progress: list = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append([p, total, message])

    try:
        result = await client.call_tool(
            step["call"],
            step.get("args", {}),
            read_timeout_seconds=step.get("timeout"),
            progress_callback=on_progress if step.get("progress") else None,
            meta=step.get("meta"),
        )
    except MCPError as e:
        kind = "timeout" if "timed out" in str(e).lower() or "timeout" in str(e).lower() else "mcp"
        return {"error": {"kind": kind, "code": e.code, "message": str(e)}}
    except TimeoutError as e:
        return {"error": {"kind": "timeout", "message": str(e)}}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": {"kind": "other", "message": f"{type(e).__name__}: {e}"}}
    return {"result": result.model_dump(mode="json", by_alias=True, exclude_none=True), "progress": progress}


async def main() -> None:
    url, mode, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    headers = {}
    if os.environ.get("MCP_AUTH"):
        headers["Authorization"] = os.environ["MCP_AUTH"]
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120.0))
    transport = streamable_http_client(url, http_client=http)
    async with Client(transport, mode=mode) as client:
        steps = [await run_step(client, s) for s in plan]
        out = {"protocol": client.protocol_version, "steps": steps}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main)
