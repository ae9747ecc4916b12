// Version 2 sends W3C Trace Context (Onceguard's ADR 0015): every call carries a traceparent —
// the item's own (a field, or a Webhook trigger's header), else one per execution — and the
// item's result names the trace id. Version 1 sends none. Run on the built dist/ (`npm test`).
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { Onceguard } = require('../dist/nodes/Onceguard/Onceguard.node.js');
const { validTraceparent } = require('../dist/nodes/Onceguard/trace.js');

const BASE = 'http://onceguard.test';
const TRACEPARENT = /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/;
const INCOMING = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

function context({ version = 2, items, executionId = '77' }) {
	const sent = [];
	const parameters = {
		operation: 'claim',
		keySource: 'key',
		key: 'order-1:charge:v1',
		provider: 'charges',
		action: 'charge',
		requestSource: 'fields',
		requestFields: 'order_id',
		sendPayload: false,
		options: {},
	};
	const node = { name: 'Onceguard', type: 'n8n-nodes-onceguard.onceguard', typeVersion: version, parameters };
	return {
		sent,
		getInputData: () => items,
		getNode: () => node,
		getWorkflow: () => ({ id: 'wf1', name: 'charges' }),
		getExecutionId: () => executionId,
		continueOnFail: () => false,
		getCredentials: async () => ({ baseUrl: `${BASE}/`, apiKey: 'og_test' }),
		getNodeParameter(name, index, fallback) {
			const value = name in parameters ? parameters[name] : fallback;
			if (value === undefined) throw new Error(`no parameter ${name}`);
			return value;
		},
		helpers: {
			async httpRequestWithAuthentication(credential, options) {
				sent.push({ credential, ...options });
				return { statusCode: 201, headers: {}, body: { id: sent.length, lease_token: 't', attempt: 1, status: 'claimed' } };
			},
		},
	};
}

async function run(ctx) {
	return await new Onceguard().execute.call(ctx);
}

test('v2 starts one trace per execution: both items, and a rerun of the node in it, send its trace id', async () => {
	const ctx = context({ items: [{ json: { order_id: 'o-1' } }, { json: { order_id: 'o-2' } }] });
	const [proceed] = await run(ctx);
	const [first, second] = ctx.sent.map((r) => r.headers.traceparent);
	assert.match(first, TRACEPARENT);
	assert.match(second, TRACEPARENT);
	const traceId = first.split('-')[1];
	assert.equal(second.split('-')[1], traceId);
	// Each call is its own parent span.
	assert.notEqual(first.split('-')[2], second.split('-')[2]);
	assert.deepEqual(
		proceed.map((item) => item.json.onceguard.trace_id),
		[traceId, traceId],
	);
	const again = context({ items: [{ json: { order_id: 'o-3' } }] });
	await run(again);
	assert.equal(again.sent[0].headers.traceparent.split('-')[1], traceId);
	const other = context({ items: [{ json: { order_id: 'o-3' } }], executionId: '78' });
	await run(other);
	assert.notEqual(other.sent[0].headers.traceparent.split('-')[1], traceId);
});

test("v2 continues the trace an item carries: its traceparent field, or its Webhook trigger's header", async () => {
	const ctx = context({
		items: [
			{ json: { order_id: 'o-1', traceparent: INCOMING } },
			{ json: { order_id: 'o-2', headers: { traceparent: INCOMING.toUpperCase() } } },
			{ json: { order_id: 'o-3', traceparent: '00-00000000000000000000000000000000-00f067aa0ba902b7-01' } },
		],
	});
	const [proceed] = await run(ctx);
	const sent = ctx.sent.map((r) => r.headers.traceparent);
	assert.deepEqual(sent.slice(0, 2), [INCOMING, INCOMING]);
	// An all-zero trace id is no trace: the execution's own is started instead.
	assert.match(sent[2], TRACEPARENT);
	assert.notEqual(sent[2].split('-')[1], '0'.repeat(32));
	assert.equal(proceed[0].json.onceguard.trace_id, '4bf92f3577b34da6a3ce929d0e0e4736');
});

test('v1 sends no traceparent and outputs no trace id', async () => {
	const ctx = context({ version: 1, items: [{ json: { order_id: 'o-1', traceparent: INCOMING } }] });
	const [proceed] = await run(ctx);
	assert.equal('traceparent' in ctx.sent[0].headers, false);
	assert.equal('trace_id' in proceed[0].json.onceguard, false);
});

test('a traceparent is valid only in the W3C form, without all-zero ids or version ff', () => {
	assert.equal(validTraceparent(INCOMING), INCOMING);
	assert.equal(validTraceparent(` ${INCOMING.toUpperCase()} `), INCOMING);
	for (const bad of [
		'',
		'nonsense',
		'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
		'00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01',
		'00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01',
		42,
		undefined,
	]) {
		assert.equal(validTraceparent(bad), undefined, String(bad));
	}
});
