// Drives the OpenAI TypeScript SDK (the npm `openai` package) against oncely, as
// ../openai_calls.py drives the Python one, with the same plan and result shapes.
//
//   node openai_calls.mjs PLAN_JSON
//
// Plan calls: {"op": "upload" | "chat", "base_url", "timeout" (seconds), "max_retries",
// "key" (optional Idempotency-Key), "content"}. Prints one JSON line:
// {"sdk", "version", "results": [...]}; every result has "attempts", what each attempt of
// the SDK's retry loop sent and got (a fetch wrapper counts them).
import OpenAI, { toFile } from 'openai';
import { VERSION } from 'openai/version';

const HEADERS = ['oncely-status', 'oncely-problem', 'x-should-retry', 'idempotent-replayed', 'content-type'];

/** A fetch that records each HTTP attempt: the request as fetch sends it (a Request
 * built from it, so a FormData body has its boundary) and the answer's headers. (The SDK
 * also fetches a `data:` URL of its own; that one is not an attempt.) */
function counting(attempts) {
  return async (url, init) => {
    const request = new Request(url, init);
    if (!/^https?:/.test(request.url)) return fetch(request); // not an HTTP attempt
    const contentType = request.headers.get('content-type') ?? '';
    const rec = {
      idempotency_key: request.headers.get('idempotency-key'),
      content_type: contentType.split(';')[0] || null,
      boundary: contentType.includes('boundary=') ? contentType.split('boundary=')[1].replace(/"/g, '') : null,
      retry_count: request.headers.get('x-stainless-retry-count'),
    };
    attempts.push(rec);
    try {
      const response = await fetch(request);
      rec.status = response.status;
      for (const name of HEADERS) {
        const v = response.headers.get(name);
        if (v !== null) rec[name] = v;
      }
      return response;
    } catch (e) {
      rec.exception = e.name;
      throw e;
    }
  };
}

async function one(call) {
  const attempts = [];
  const client = new OpenAI({
    apiKey: 'sk-test-alice',
    baseURL: call.base_url,
    timeout: Math.round((call.timeout ?? 5) * 1000),
    maxRetries: call.max_retries ?? 2,
    fetch: counting(attempts),
  });
  const options = call.key ? { headers: { 'Idempotency-Key': call.key } } : {};
  try {
    let data, response, text;
    if (call.op === 'upload') {
      const file = await toFile(Buffer.from(call.content), 'speech.wav', { type: 'audio/wav' });
      ({ data, response } = await client.audio.transcriptions
        .create({ file, model: 'whisper-1' }, options)
        .withResponse());
      text = data.text;
    } else if (call.op === 'chat') {
      ({ data, response } = await client.chat.completions
        .create({ model: 'gpt-test', messages: [{ role: 'user', content: call.content }] }, options)
        .withResponse());
      text = data.choices[0].message.content;
    } else {
      throw new Error(`unknown op ${call.op}`);
    }
    return { ok: true, text, oncely_status: response.headers.get('oncely-status'), attempts };
  } catch (e) {
    if (e instanceof OpenAI.APIError) {
      return {
        ok: false,
        error: e.constructor.name,
        status: e.status ?? null,
        code: e.code ?? null,
        type: e.type ?? null,
        message: e.message,
        oncely_problem: e.headers?.get?.('oncely-problem') ?? null,
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
console.log(JSON.stringify({ sdk: 'openai (npm)', version: VERSION, results }));
