"""Drives the Stripe Python SDK (the `stripe` package) against oncely, the classic way:
module-level `stripe.api_key`, `stripe.api_base`, `stripe.max_network_retries` and a
`stripe.default_http_client` with a short timeout.

Plan calls (argv[1], JSON {"calls": [...]}), each:
  {"op": "customer" | "product", "api_base": URL, "timeout": seconds,
   "max_network_retries": N, "idempotency_key": optional,
   "params": [[name, value], ...]}

- customer: stripe.Customer.create(**params); product: stripe.Product.create(**params).
  The params are pairs (a value that is a list of pairs is a dict), so that their order
  is the caller's (the SDK form-encodes them in that order).

Each result: {"ok": true, "id", "attempts": [...]} or {"ok": false, "error": CLASS,
"status" (http_status), "code" (the error's .code), "error_code" and "error_type" (the
body's error.code and error.type, as `.error`), "message", "oncely_problem",
"attempts": [...]}; every attempt is what the SDK sent and what it got (a requests
adapter counts them).
"""

import requests
import stripe

from _record import answer_into, attempt_of, plan, run


class Counting(requests.adapters.HTTPAdapter):
    """Counts the SDK's HTTP attempts: each one its retry loop sends."""

    def __init__(self):
        super().__init__()
        self.attempts = []

    def send(self, request, *args, **kwargs):
        rec = attempt_of({k.lower(): v for k, v in request.headers.items()})
        body = request.body
        rec["body"] = body.decode() if isinstance(body, bytes) else body
        self.attempts.append(rec)
        try:
            response = super().send(request, *args, **kwargs)
        except Exception as e:
            rec["exception"] = type(e).__name__
            raise
        answer_into(rec, response.status_code, response.headers)
        return response


def ordered(pairs):
    """[[name, value], ...] as a dict in that order; a value that is a list of pairs too."""
    return {k: ordered(v) if isinstance(v, list) else v for k, v in pairs}


def one(call):
    adapter = Counting()
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", adapter)
    stripe.api_key = "sk_test_alice"
    stripe.api_base = call["api_base"]
    stripe.max_network_retries = call.get("max_network_retries", 2)
    stripe.enable_telemetry = False
    stripe.default_http_client = stripe.RequestsClient(
        timeout=call.get("timeout", 5.0), session=session
    )
    options = {}
    if call.get("idempotency_key"):
        options["idempotency_key"] = call["idempotency_key"]
    resource = {"customer": stripe.Customer, "product": stripe.Product}[call["op"]]
    try:
        created = resource.create(**ordered(call["params"]), **options)
        return {
            "ok": True,
            "id": created.id,
            "oncely_status": created.last_response.headers.get("oncely-status"),
            "attempts": adapter.attempts,
        }
    except stripe.StripeError as e:
        headers = {k.lower(): v for k, v in (e.headers or {}).items()}
        return {
            "ok": False,
            "error": type(e).__name__,
            "status": e.http_status,
            "code": e.code,
            "error_code": e.error.code if e.error is not None else None,
            "error_type": e.error.type if e.error is not None else None,
            "message": e.user_message,
            "oncely_problem": headers.get("oncely-problem"),
            "attempts": adapter.attempts,
        }
    finally:
        session.close()


if __name__ == "__main__":
    run("stripe", stripe.VERSION, plan()["calls"], one)
