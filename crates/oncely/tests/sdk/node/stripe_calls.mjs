// Drives the Stripe Node.js SDK (the npm `stripe` package) against oncely, as
// ../stripe_calls.py drives the Python one, with the same plan and result shapes.
//
//   node stripe_calls.mjs PLAN_JSON
//
// Plan calls: {"op": "customer" | "product", "api_base": URL (with a path, e.g.
// http://127.0.0.1:PORT/stripe/write), "timeout" (seconds), "max_network_retries",
// "idempotency_key" (optional), "params": [[name, value], ...] (a value that is a list of
// pairs is an object)}. The SDK's paths are fixed (`/v1/...`), so its own Node HTTP
// client is wrapped to send them under the api_base's path, as a reverse proxy mounted
// there would receive them; nothing else about the request changes. Prints one JSON line:
// {"sdk", "version", "results": [...]}; each result's "attempts" are what each attempt
// of the SDK's retry loop sent and got.
import Stripe from 'stripe';

const HEADERS = ['oncely-status', 'oncely-problem', 'x-should-retry', 'stripe-should-retry', 'content-type'];

function ordered(pairs) {
  return Object.fromEntries(pairs.map(([k, v]) => [k, Array.isArray(v) ? ordered(v) : v]));
}

/** The SDK's own Node HTTP client, under `prefix`, recording each attempt. */
function counting(prefix, attempts) {
  const inner = Stripe.createNodeHttpClient();
  const client = Object.create(inner);
  client.makeRequest = (host, port, path, method, headers, body, protocol, timeout) => {
    const lower = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
    const rec = {
      idempotency_key: lower['idempotency-key'] ?? null,
      content_type: (lower['content-type'] ?? '').split(';')[0] || null,
      accept_encoding: lower['accept-encoding'] ?? null,
      body: typeof body === 'string' ? body : null,
    };
    attempts.push(rec);
    return inner.makeRequest(host, port, prefix + path, method, headers, body, protocol, timeout).then(
      (res) => {
        rec.status = res.getStatusCode();
        const h = res.getHeaders();
        for (const name of HEADERS) if (h[name] !== undefined) rec[name] = h[name];
        return res;
      },
      (e) => {
        rec.exception = e.code ?? e.name;
        throw e;
      },
    );
  };
  return client;
}

async function one(call) {
  const attempts = [];
  const base = new URL(call.api_base);
  const stripe = new Stripe('sk_test_alice', {
    host: base.hostname,
    port: base.port,
    protocol: base.protocol.replace(':', ''),
    maxNetworkRetries: call.max_network_retries ?? 2,
    timeout: Math.round((call.timeout ?? 5) * 1000),
    telemetry: false,
    httpClient: counting(base.pathname.replace(/\/$/, ''), attempts),
  });
  const options = call.idempotency_key ? { idempotencyKey: call.idempotency_key } : {};
  const resource = { customer: stripe.customers, product: stripe.products }[call.op];
  try {
    const created = await resource.create(ordered(call.params), options);
    return {
      ok: true,
      id: created.id ?? null,
      // What the SDK resolved with, when it is not what was created.
      object: created.object ?? null,
      resolved_code: created.code ?? null,
      oncely_status: created.lastResponse?.headers?.['oncely-status'] ?? null,
      attempts,
    };
  } catch (e) {
    if (e instanceof Stripe.errors.StripeError) {
      return {
        ok: false,
        error: e.type,
        status: e.statusCode ?? null,
        code: e.code ?? null,
        error_code: e.code ?? null,
        error_type: e.rawType ?? null,
        message: e.message,
        oncely_problem: e.headers?.['oncely-problem'] ?? null,
        attempts,
      };
    }
    throw e;
  }
}

const plan = JSON.parse(process.argv[2]);
const results = [];
for (const call of plan.calls) {
  try {
    results.push(await one(call));
  } catch (e) {
    results.push({ harness_error: `${e.name}: ${e.message}`, traceback: String(e.stack) });
  }
}
console.log(JSON.stringify({ sdk: 'stripe (npm)', version: Stripe.PACKAGE_VERSION, results }));
