"""Drives the Anthropic Python SDK (the `anthropic` package) against oncely.

Plan calls (argv[1], JSON {"calls": [...]}), each:
  {"op": "messages", "base_url": URL, "timeout": seconds, "max_retries": N,
   "key": optional Idempotency-Key (sent with extra_headers), "content": text}

- messages: client.messages.create(model=..., max_tokens=..., messages=[...]).

Each result: {"ok": true, "text", "attempts": [...]} or {"ok": false, "error": CLASS,
"status", "type", "message" (the body's error.message), "oncely_problem" (the header),
"attempts": [...]}.
"""

import anthropic
import httpx2

from _record import answer_into, attempt_of, plan, run


class Counting(httpx2.HTTPTransport):
    """Counts the SDK's HTTP attempts: each one the SDK's retry loop sends."""

    def __init__(self):
        super().__init__()
        self.attempts = []

    def handle_request(self, request):
        rec = attempt_of(request.headers)
        self.attempts.append(rec)
        try:
            response = super().handle_request(request)
        except Exception as e:
            rec["exception"] = type(e).__name__
            raise
        answer_into(rec, response.status_code, response.headers)
        return response


def one(call):
    transport = Counting()
    client = anthropic.Anthropic(
        api_key="sk-ant-test-alice",
        base_url=call["base_url"],
        timeout=call.get("timeout", 5.0),
        max_retries=call.get("max_retries", 2),
        http_client=httpx2.Client(transport=transport, trust_env=False),
    )
    extra = {"Idempotency-Key": call["key"]} if call.get("key") else None
    try:
        if call["op"] != "messages":
            raise ValueError(f"unknown op {call['op']!r}")
        raw = client.messages.with_raw_response.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": call["content"]}],
            extra_headers=extra,
        )
        message = raw.parse()
        return {
            "ok": True,
            "text": message.content[0].text,
            "oncely_status": raw.headers.get("oncely-status"),
            "attempts": transport.attempts,
        }
    except anthropic.APIStatusError as e:
        return {
            "ok": False,
            "error": type(e).__name__,
            "status": e.status_code,
            "type": e.type,
            "message": e.api_message,
            "oncely_problem": e.response.headers.get("oncely-problem"),
            "attempts": transport.attempts,
        }
    except anthropic.APIError as e:
        return {
            "ok": False,
            "error": type(e).__name__,
            "message": e.message,
            "attempts": transport.attempts,
        }
    finally:
        client.close()


if __name__ == "__main__":
    run("anthropic", anthropic.__version__, plan()["calls"], one)
