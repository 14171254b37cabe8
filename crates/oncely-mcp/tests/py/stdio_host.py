"""A stdio MCP host written with the official Python SDK (`mcp` on PyPI): it starts the
server command itself (`mcp.client.stdio.stdio_client`) and drives a `ClientSession`
through a scenario, for the `oncely mcp -- COMMAND` interop tests.

Run: stdio_host.py SCENARIO [ARG] -- COMMAND [ARG]...
  SCENARIO is a name (below) or a JSON plan: a list of steps, run in order, each one of
    {"call": TOOL, "args": {...}, "timeout": SECONDS?, "meta": {...}?}
    {"parallel": [STEP, ...]}           these steps at once
    {"sleep": SECONDS}
    {"list_tools": true}
    {"call": ..., "close_after": SECONDS}  starts the call, and SECONDS later leaves the
                                        session without waiting for it (the SDK sends
                                        notifications/cancelled for it, closes the server's
                                        stdin and, after its grace period, kills it); the
                                        last step of a plan
  Names:
    twice           render {"prompt": "a"} twice, one after the other
    different       render {"prompt": "a"}, then render {"prompt": "b"}
    readonly        lookup {"q": "x"} twice
    giveup          render {"prompt": "slow", "seconds": 2} with a 0.5 s read timeout (the
                    SDK gives up and sends notifications/cancelled), then the same call
                    again without a timeout
    concurrent N    N identical render {"prompt": "together", "seconds": 1} calls at once
                    (N defaults to 3)
    sampling        ask {"question": "hi"} twice (the server samples from this client)
    close-mid-call  render {"prompt": "left", "seconds": S} (S = ARG, default 1.2), and
                    leaves the session 0.3 s later
    render P [S]    one render {"prompt": P, "seconds": S}
The sampling callback answers "sampled: <the first message's text>".
The server gets the SDK's default environment plus each variable `$HOST_ENV` names
(comma-separated), as a host's config `env` gives a server its API keys.

Prints ONE JSON document on stdout:
  {"protocol": ..., "server": ..., "steps": [OUTCOME, ...], "samplings": [TEXT, ...],
   "close_seconds": how long leaving the session (stdio_client's shutdown) took}
where a call's OUTCOME is
  {"text": first content text, "isError": ..., "meta": result _meta or null,
   "result": the whole CallToolResult as JSON}
  or {"error": {"kind": "timeout"|"mcp"|"other", "code": ..., "message": ...}}.
"""

import json
import os
import sys
import time

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.shared.exceptions import MCPError


def plan_of(scenario: str, arg: str | None) -> list:
    if scenario.lstrip().startswith("["):
        return json.loads(scenario)
    render = lambda prompt, **kw: {"call": "render", "args": {"prompt": prompt, **kw}}  # noqa: E731
    if scenario == "twice":
        return [render("a"), render("a")]
    if scenario == "different":
        return [render("a"), render("b")]
    if scenario == "readonly":
        return [{"call": "lookup", "args": {"q": "x"}}] * 2
    if scenario == "giveup":
        return [{**render("slow", seconds=2), "timeout": 0.5}, render("slow", seconds=2)]
    if scenario == "concurrent":
        n = int(arg or 3)
        return [{"parallel": [render("together", seconds=1)] * n}]
    if scenario == "sampling":
        return [{"call": "ask", "args": {"question": "hi"}}] * 2
    if scenario == "close-mid-call":
        return [{**render("left", seconds=float(arg or 1.2)), "close_after": 0.3}]
    if scenario == "render":
        prompt, _, seconds = (arg or "a").partition(" ")
        return [render(prompt, seconds=float(seconds or 0))]
    raise SystemExit(f"stdio_host.py: unknown scenario {scenario!r}")


samplings: list[str] = []


async def on_sampling(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    first = params.messages[0].content
    text = first.text if isinstance(first, types.TextContent) else str(first)
    samplings.append(text)
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"sampled: {text}"), model="test-model"
    )


def outcome_of(result: types.CallToolResult) -> dict:
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    content = dumped.get("content") or []
    return {
        "text": content[0].get("text") if content else None,
        "isError": dumped.get("isError", False),
        "meta": dumped.get("_meta"),
        "result": dumped,
    }


async def call(session: ClientSession, step: dict) -> dict:
    try:
        result = await session.call_tool(
            step["call"], step.get("args", {}), read_timeout_seconds=step.get("timeout"), meta=step.get("meta")
        )
    except MCPError as e:
        kind = "timeout" if e.code == types.REQUEST_TIMEOUT or "timed out" in str(e).lower() else "mcp"
        return {"error": {"kind": kind, "code": e.code, "message": str(e)}}
    except TimeoutError as e:
        return {"error": {"kind": "timeout", "code": None, "message": str(e)}}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": {"kind": "other", "code": None, "message": f"{type(e).__name__}: {e}"}}
    return outcome_of(result)


async def run_step(session: ClientSession, step: dict) -> dict:
    if "sleep" in step:
        await anyio.sleep(step["sleep"])
        return {"slept": step["sleep"]}
    if "parallel" in step:
        results: list = [None] * len(step["parallel"])

        async def one(i: int, s: dict) -> None:
            results[i] = await run_step(session, s)

        async with anyio.create_task_group() as tg:
            for i, s in enumerate(step["parallel"]):
                tg.start_soon(one, i, s)
        return {"parallel": results}
    if "list_tools" in step:
        listed = await session.list_tools()
        return {"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]}
    return await call(session, step)


async def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit("usage: stdio_host.py SCENARIO [ARG] -- COMMAND [ARG]...")
    split = argv.index("--")
    mine, command = argv[:split], argv[split + 1 :]
    plan = plan_of(mine[0], mine[1] if len(mine) > 1 else None)
    passed = [v for v in os.environ.get("HOST_ENV", "").split(",") if v in os.environ]
    env = {**get_default_environment(), **{v: os.environ[v] for v in passed}}
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    out: dict = {"steps": []}
    closing_at = None
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, sampling_callback=on_sampling) as session:
            init = await session.initialize()
            out["protocol"] = init.protocol_version
            out["server"] = init.server_info.name
            for step in plan:
                if "close_after" in step:
                    # Start the call, and leave without waiting for it.
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(call, session, step)
                        await anyio.sleep(step["close_after"])
                        out["steps"].append({"abandoned": step["call"]})
                        closing_at = time.monotonic()
                        tg.cancel_scope.cancel()
                    break
                out["steps"].append(await run_step(session, step))
            if closing_at is None:
                closing_at = time.monotonic()
    out["close_seconds"] = round(time.monotonic() - closing_at, 3)
    out["samplings"] = samplings
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main)
