// Version 2 of the node (v1 keeps its behaviour): one named output per row of the claim-answer
// table, `replayed` on every item, Submit that never waits for what is finished, and Fail whose
// default class follows the sent marker. Run on the built dist/ (`npm test`).
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { Onceguard } = require('../dist/nodes/Onceguard/Onceguard.node.js');

const BASE = 'http://onceguard.test';

function context({ parameters, version = 2, items = [{ json: { order_id: 'o-1' } }], answers = [] }) {
	const sent = [];
	const node = { name: 'Onceguard', type: 'n8n-nodes-onceguard.onceguard', typeVersion: version, parameters };
	return {
		sent,
		getInputData: () => items,
		getNode: () => node,
		getWorkflow: () => ({ id: 'wf1', name: 'charges' }),
		getExecutionId: () => '77',
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
				const answer = answers.shift();
				if (!answer) throw new Error('no answer scripted');
				return { statusCode: answer.status, headers: answer.headers ?? {}, body: answer.body ?? {} };
			},
		},
	};
}

async function run(ctx) {
	return await new Onceguard().execute.call(ctx);
}

const REPLAYED = { 'idempotent-replayed': 'true' };
const CLAIM = {
	operation: 'claim',
	keySource: 'key',
	key: 'order-1:charge:v1',
	provider: 'charges',
	action: 'charge',
	requestSource: 'fields',
	requestFields: 'order_id',
	sendPayload: false,
};
const SUBMIT = {
	operation: 'submit',
	keySource: 'key',
	key: 'order-1:charge:v1',
	provider: 'charges',
	action: 'charge',
	method: 'POST',
	path: '/charges',
	body: '{"amount": 1999}',
	sendPayload: false,
};

/** Which output (by index) each item came out of. */
function routes(outputs) {
	return outputs.flatMap((items, index) => items.map(() => index));
}

const CLAIM_ROWS = [
	['a new key', { status: 201, body: { id: 1, lease_token: 't', status: 'claimed', attempt: 1 } }, 0, 'proceed', false],
	['a key that succeeded', { status: 200, headers: REPLAYED, body: { id: 1, status: 'succeeded', provider_ref: 'ch_1' } }, 1, 'already_done', true],
	['a key that failed (a declined charge)', { status: 200, headers: REPLAYED, body: { id: 1, status: 'failed', error_class: 'invalid_input', last_error: 'card declined' } }, 2, 'failed', true],
	['a key that was abandoned', { status: 200, headers: REPLAYED, body: { id: 1, status: 'abandoned' } }, 2, 'failed', true],
	['an older version', { status: 409, body: { code: 'operation_version_superseded', detail: 'v2 exists', replaced_by: 9 } }, 1, 'superseded', true],
	['a key in progress', { status: 409, headers: { 'retry-after': '3' }, body: { code: 'operation_in_progress', detail: 'held' } }, 3, 'retry_later', false],
	['a key whose retry is scheduled', { status: 409, body: { code: 'operation_retry_scheduled', detail: 'later' } }, 3, 'retry_later', false],
	['a key being reconciled', { status: 409, body: { code: 'operation_needs_reconciliation', detail: 'uncertain' } }, 4, 'needs_human', false],
	['a key reused with another request', { status: 422, body: { code: 'key_reused_with_different_request', detail: 'differs' } }, 4, 'needs_human', false],
	['an execute-mode key', { status: 409, body: { code: 'operation_managed_by_service', detail: 'submitted' } }, 4, 'needs_human', false],
];

for (const [row, answer, output, outcome, replayed] of CLAIM_ROWS) {
	test(`v2 Claim: ${row} comes out of output ${output} as ${outcome}, replayed ${replayed}`, async () => {
		const outputs = await run(context({ parameters: CLAIM, answers: [answer] }));
		assert.equal(outputs.length, 5);
		assert.deepEqual(routes(outputs), [output]);
		const result = outputs[output][0].json.onceguard;
		assert.equal(result.outcome, outcome);
		assert.equal(result.replayed, replayed);
	});
}

test('v2 Claim: a replayed failure carries the recorded error', async () => {
	const answer = CLAIM_ROWS[2][1];
	const outputs = await run(context({ parameters: CLAIM, answers: [answer] }));
	const result = outputs[2][0].json.onceguard;
	assert.equal(result.error_class, 'invalid_input');
	assert.equal(result.last_error, 'card declined');
});

test('v1 Claim keeps its four outputs: a replayed failure still comes out of Replayed', async () => {
	const outputs = await run(context({ parameters: CLAIM, version: 1, answers: [CLAIM_ROWS[2][1]] }));
	assert.equal(outputs.length, 4);
	assert.deepEqual(routes(outputs), [1]);
	assert.equal(outputs[1][0].json.onceguard.outcome, 'replayed');
});

test('v2 Submit: a finished key comes out at once, without asking again', async () => {
	const ctx = context({
		parameters: { ...SUBMIT, waitSeconds: 30 },
		answers: [{ status: 200, headers: REPLAYED, body: { id: 5, status: 'succeeded', provider_ref: 'ch_5' } }],
	});
	const outputs = await run(ctx);
	assert.deepEqual(routes(outputs), [1]);
	assert.equal(ctx.sent.length, 1);
	assert.equal(outputs[1][0].json.onceguard.replayed, true);
});

test('v2 Submit: a failed or abandoned key comes out of Failed at once', async () => {
	for (const status of ['failed', 'abandoned']) {
		const outputs = await run(
			context({ parameters: SUBMIT, answers: [{ status: 200, headers: REPLAYED, body: { id: 5, status } }] }),
		);
		assert.deepEqual(routes(outputs), [2]);
	}
});

test('v2 Submit: an operation in flight comes out of In Flight when the node is not told to wait', async () => {
	const outputs = await run(context({ parameters: SUBMIT, answers: [{ status: 202, body: { id: 5, status: 'queued' } }] }));
	assert.equal(outputs.length, 3);
	assert.deepEqual(routes(outputs), [0]);
	assert.equal(outputs[0][0].json.onceguard.outcome, 'in_flight');
});

test('v2 Submit: told to wait, it asks until the operation finishes', async () => {
	const ctx = context({
		parameters: { ...SUBMIT, waitSeconds: 10 },
		answers: [
			{ status: 202, body: { id: 5, status: 'queued' } },
			{ status: 200, body: { id: 5, status: 'claimed' } },
			{ status: 200, body: { id: 5, status: 'succeeded', provider_ref: 'ch_5' } },
		],
	});
	const outputs = await run(ctx);
	assert.deepEqual(routes(outputs), [1]);
	assert.deepEqual(
		ctx.sent.map((r) => `${r.method} ${r.url}`),
		[`POST ${BASE}/api/v1/operations`, `GET ${BASE}/api/v1/operations/5`, `GET ${BASE}/api/v1/operations/5`],
	);
	assert.equal(outputs[1][0].json.onceguard.provider_ref, 'ch_5');
});

test('v2 Submit: a wait that runs out is an error (for the error output), not a hang', async () => {
	const answers = [{ status: 202, body: { id: 5, status: 'queued' } }];
	for (let i = 0; i < 20; i++) answers.push({ status: 200, body: { id: 5, status: 'waiting' } });
	const ctx = context({ parameters: { ...SUBMIT, waitSeconds: 1 }, answers });
	await assert.rejects(run(ctx), /did not finish within 1 s \(it is waiting\)/);
});

test('v2 Fail: after the sent marker the default class is ambiguous, before it transient', async () => {
	const FAIL = { operation: 'fail', operationId: 5, leaseToken: 't', errorClass: 'auto', message: 'timeout' };
	for (const [sentAt, expected] of [
		['2026-12-06T20:00:00Z', 'ambiguous'],
		[null, 'transient'],
	]) {
		const ctx = context({
			parameters: FAIL,
			answers: [
				{ status: 200, body: { id: 5, status: 'claimed', sent_at: sentAt } },
				{ status: 200, body: { id: 5, status: 'retry_wait' } },
			],
		});
		await run(ctx);
		assert.equal(ctx.sent[1].url, `${BASE}/api/v1/operations/5/fail`);
		assert.equal(ctx.sent[1].body.error_class, expected);
	}
});

test('v2 Fail: a class chosen explicitly is sent as chosen, without reading the operation', async () => {
	const ctx = context({
		parameters: { operation: 'fail', operationId: 5, leaseToken: 't', errorClass: 'transient', message: 'x' },
		answers: [{ status: 200, body: { id: 5, status: 'retry_wait' } }],
	});
	await run(ctx);
	assert.equal(ctx.sent.length, 1);
	assert.equal(ctx.sent[0].body.error_class, 'transient');
});

test('the node offers versions 1 and 2, 2 by default, with subtitles in words', () => {
	const { description } = new Onceguard();
	assert.deepEqual(description.version, [1, 2]);
	assert.equal(description.defaultVersion, 2);
	assert.match(description.subtitle, /Claim/);
	assert.match(description.subtitle, / · /);
});

test('Get Dead-Letter Entries asks by original key and status and gives one item per entry', async () => {
	const entries = [
		{ id: 8, original_key: 'order-1:charge:v1', status: 'pending', occurrence_count: 2 },
		{ id: 3, original_key: 'order-1:charge:v1', status: 'replayed', occurrence_count: 1 },
	];
	const ctx = context({
		parameters: { operation: 'deadLetterGet', dlqLookupKey: 'order-1:charge:v1', dlqStatus: '', dlqLimit: 10 },
		answers: [{ status: 200, body: { results: entries, next: null } }],
	});
	const [items] = await run(ctx);
	assert.equal(ctx.sent[0].url, `${BASE}/api/v1/dlq/events`);
	assert.deepEqual(ctx.sent[0].qs, { page_size: 10, key: 'order-1:charge:v1' });
	assert.deepEqual(
		items.map((item) => item.json.onceguard.id),
		[8, 3],
	);
});
