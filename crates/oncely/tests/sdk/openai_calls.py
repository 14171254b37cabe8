"""Drives the OpenAI Python SDK (the `openai` package) against oncely.

Plan calls (argv[1], JSON {"calls": [...]}), each:
  {"op": "upload" | "chat", "base_url": URL, "timeout": seconds, "max_retries": N,
   "key": optional Idempotency-Key (sent with extra_headers), "content": text}

- upload: client.audio.transcriptions.create(file=(name, bytes, "audio/wav"), model=...);
  the file's bytes are `content` encoded.
- chat: client.chat.completions.create(model=..., messages=[{"role": "user", ...}]).

Each result: {"ok": true, "text", "attempts": [...]} or {"ok": false, "error": CLASS,
"status", "code", "type", "message", "oncely_problem", "attempts": [...]}; every attempt
is what the SDK sent and what it got (an httpx transport counts them).
"""

import httpx2
import openai

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
    client = openai.OpenAI(
        api_key="sk-test-alice",
        base_url=call["base_url"],
        timeout=call.get("timeout", 5.0),
        max_retries=call.get("max_retries", 2),
        http_client=httpx2.Client(transport=transport, trust_env=False),
    )
    extra = {"Idempotency-Key": call["key"]} if call.get("key") else None
    try:
        if call["op"] == "upload":
            raw = client.audio.transcriptions.with_raw_response.create(
                file=("speech.wav", call["content"].encode(), "audio/wav"),
                model="whisper-1",
                extra_headers=extra,
            )
            text = raw.parse().text
        elif call["op"] == "chat":
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-test",
                messages=[{"role": "user", "content": call["content"]}],
                extra_headers=extra,
            )
            text = raw.parse().choices[0].message.content
        else:
            raise ValueError(f"unknown op {call['op']!r}")
        return {
            "ok": True,
            "text": text,
            "oncely_status": raw.headers.get("oncely-status"),
            "attempts": transport.attempts,
        }
    except openai.APIStatusError as e:
        return {
            "ok": False,
            "error": type(e).__name__,
            "status": e.status_code,
            "code": e.code,
            "type": e.type,
            "message": e.message,
            "oncely_problem": e.response.headers.get("oncely-problem"),
            "attempts": transport.attempts,
        }
    except openai.APIError as e:
        return {
            "ok": False,
            "error": type(e).__name__,
            "message": e.message,
            "attempts": transport.attempts,
        }
    finally:
        client.close()


if __name__ == "__main__":
    run("openai", openai.__version__, plan()["calls"], one)
