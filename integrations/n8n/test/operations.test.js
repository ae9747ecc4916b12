// Parameters → the request the node sends, and Onceguard's answer → the item or the error, for
// Submit Operation (request or intent) and Upload File, run on the built dist/ (`npm test`)
// against a stand-in for n8n's execution context that records each HTTP request.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { Onceguard } = require('../dist/nodes/Onceguard/Onceguard.node.js');

const BASE = 'http://onceguard.test';
const PNG = Buffer.from('89504e470d0a1a0a0000000d49484452', 'hex');

/** An n8n execution context: node parameters, input items, and one canned answer per request. */
function context({ parameters, items = [{ json: {} }], answers = [], continueOnFail = false }) {
	const sent = [];
	const node = { name: 'Onceguard', type: 'n8n-nodes-onceguard.onceguard', typeVersion: 1, parameters };
	const ctx = {
		sent,
		getInputData: () => items,
		getNode: () => node,
		getWorkflow: () => ({ id: 'wf1', name: 'renders' }),
		getExecutionId: () => '77',
		continueOnFail: () => continueOnFail,
		getCredentials: async () => ({ baseUrl: `${BASE}/`, apiKey: 'og_test' }),
		getNodeParameter(name, index, fallback) {
			const value = name in parameters ? parameters[name] : fallback;
			if (value === undefined) throw new Error(`no parameter ${name}`);
			return typeof value === 'function' ? value(items[index]) : value;
		},
		helpers: {
			async httpRequestWithAuthentication(credential, options) {
				sent.push({ credential, ...options });
				const answer = answers.shift();
				if (!answer) throw new Error('no answer scripted');
				return { statusCode: answer.status, headers: answer.headers ?? {}, body: answer.body ?? {} };
			},
			assertBinaryData(index, property) {
				const binary = items[index].binary?.[property];
				if (!binary) throw new Error(`This operation expects the node's input data to contain a binary file '${property}', but none was found [item ${index}]`);
				return binary;
			},
			async getBinaryDataBuffer(index, property) {
				return Buffer.from(items[index].binary[property].data, 'base64');
			},
		},
	};
	return ctx;
}

async function run(ctx) {
	return await new Onceguard().execute.call(ctx);
}

const SUBMIT = { operation: 'submit', keySource: 'key', key: 'render-881:v1', provider: 'renders', action: 'render' };
const ACCEPTED = { status: 202, body: { id: 42, status: 'queued' } };

test('Submit without "Send" set sends the request, as before the option existed', async () => {
	const ctx = context({
		parameters: { ...SUBMIT, method: 'POST', path: '/charges', body: '{"amount": 1999}', sendPayload: false },
		answers: [ACCEPTED],
	});
	const [[item]] = await run(ctx);
	const [request] = ctx.sent;
	assert.equal(request.url, `${BASE}/api/v1/operations`);
	assert.deepEqual(request.body.request, { method: 'POST', path: '/charges', body: { amount: 1999 } });
	assert.equal('intent' in request.body, false);
	assert.equal(item.json.onceguard.operation_id, 42);
});

test('Submit as intent sends the intent object and no request, whatever Method/Path/Body hold', async () => {
	const intent = { preset_id: 'studio', aspect_class: 'portrait', source_key: 'up_ab', source_sha256: 'ab' };
	const ctx = context({
		parameters: {
			...SUBMIT,
			submitAs: 'intent',
			intent: JSON.stringify(intent),
			method: 'POST',
			path: '/ignored',
			body: '{"ignored": true}',
			sendPayload: false,
		},
		answers: [ACCEPTED],
	});
	const [[item]] = await run(ctx);
	const [request] = ctx.sent;
	assert.equal(request.method, 'POST');
	assert.deepEqual(request.body.intent, intent);
	assert.equal('request' in request.body, false);
	assert.equal(request.body.key, 'render-881:v1');
	assert.equal(request.body.provider, 'renders');
	assert.equal(request.body.workflow_id, 'wf1');
	assert.equal(request.json, true);
	assert.deepEqual(item.json.onceguard, {
		outcome: 'accepted',
		operation_id: 42,
		key: 'render-881:v1',
		status: 'queued',
		replayed: false,
		operation: { id: 42, status: 'queued' },
	});
});

test('an intent an expression made (an object, not text) is sent as it is', async () => {
	const ctx = context({
		parameters: { ...SUBMIT, submitAs: 'intent', intent: (item) => ({ source_key: item.json.up.key }), sendPayload: false },
		items: [{ json: { up: { key: 'up_1' } } }],
		answers: [ACCEPTED],
	});
	await run(ctx);
	assert.deepEqual(ctx.sent[0].body.intent, { source_key: 'up_1' });
});

test('an intent that is not a JSON object is refused before Onceguard is called', async () => {
	for (const intent of ['[1, 2]', '"studio"', '{not json']) {
		const ctx = context({ parameters: { ...SUBMIT, submitAs: 'intent', intent }, answers: [ACCEPTED] });
		await assert.rejects(run(ctx), /Intent \(JSON\)|not valid JSON/);
		assert.equal(ctx.sent.length, 0, intent);
	}
});

test("Onceguard's refusal of an intent is the node's error: title, code, detail and what is allowed", async () => {
	const ctx = context({
		parameters: { ...SUBMIT, submitAs: 'intent', intent: '{"colour": "red"}', sendPayload: false },
		answers: [
			{
				status: 400,
				body: {
					title: 'Unknown intent field',
					code: 'intent_unknown_field',
					detail: "intent has fields the provider's intent schema does not declare: colour.",
					fields: ['colour'],
					allowed: ['preset_id', 'source'],
				},
			},
		],
	});
	await assert.rejects(run(ctx), (error) => {
		assert.equal(error.message, 'Onceguard: Unknown intent field (intent_unknown_field)');
		assert.match(error.description, /does not declare: colour\. Allowed: preset_id, source\./);
		assert.equal(error.httpCode, '400');
		return true;
	});
});

const UPLOAD = { operation: 'upload', binaryPropertyName: 'data' };
const STORED = {
	key: 'up_5f1c',
	sha256: '5f1c',
	size: 16,
	media_type: 'image/png',
	width: 1,
	height: 1,
	created_at: '2026-12-02T14:00:00Z',
	content: '/api/v1/uploads/up_5f1c/content',
};

function fileItem(property = 'data', mimeType = 'image/png') {
	return { json: { order: 7 }, binary: { [property]: { data: PNG.toString('base64'), mimeType, fileName: 'a.png' } } };
}

test("Upload File posts the binary field's bytes with its media type and puts the answer in the result field", async () => {
	const ctx = context({ parameters: UPLOAD, items: [fileItem()], answers: [{ status: 201, body: STORED }] });
	const [[item]] = await run(ctx);
	const [request] = ctx.sent;
	assert.equal(request.credential, 'onceguardApi');
	assert.equal(request.method, 'POST');
	assert.equal(request.url, `${BASE}/api/v1/uploads`);
	assert.ok(Buffer.isBuffer(request.body) && request.body.equals(PNG));
	assert.equal(request.headers['Content-Type'], 'image/png');
	assert.match(request.headers.Accept, /application\/problem\+json/);
	// What the JSON calls keep: no redirects followed, a bounded wait, statuses answered not thrown.
	assert.equal(request.timeout, 30000);
	assert.equal(request.disableFollowRedirect, true);
	assert.equal(request.ignoreHttpStatusErrors, true);
	assert.equal(item.json.order, 7);
	assert.deepEqual(item.json.onceguard, {
		key: 'up_5f1c',
		sha256: '5f1c',
		size: 16,
		media_type: 'image/png',
		width: 1,
		height: 1,
		created: true,
		content: '/api/v1/uploads/up_5f1c/content',
	});
	assert.ok(item.binary.data, 'the file stays on the item');
});

test('Upload File reads the named binary field, and says the same bytes were stored already (200)', async () => {
	const ctx = context({
		parameters: { operation: 'upload', binaryPropertyName: 'source', options: { resultField: 'up' } },
		items: [fileItem('source', '')],
		answers: [{ status: 200, body: STORED, headers: { 'idempotent-replayed': 'true' } }],
	});
	const [[item]] = await run(ctx);
	assert.equal(ctx.sent[0].headers['Content-Type'], 'application/octet-stream');
	assert.equal(item.json.up.key, 'up_5f1c');
	assert.equal(item.json.up.created, false);
});

test('an item without the binary field fails before Onceguard is called', async () => {
	const ctx = context({ parameters: UPLOAD, items: [{ json: {} }], answers: [{ status: 201, body: STORED }] });
	await assert.rejects(run(ctx), /binary file 'data'/);
	assert.equal(ctx.sent.length, 0);
});

test("Onceguard's 413 and 415 are errors; with Continue On Fail the item carries the error instead", async () => {
	const refusals = [
		{ status: 415, body: { title: 'Media type not allowed', code: 'upload_media_type_not_allowed', detail: 'The file is text/plain; accepted: image/png.' } },
		{ status: 413, body: { title: 'Payload too large', code: 'payload_too_large', detail: 'Larger than 10485760 bytes.' } },
	];
	for (const refusal of refusals) {
		const ctx = context({ parameters: UPLOAD, items: [fileItem()], answers: [refusal] });
		await assert.rejects(run(ctx), (error) => {
			assert.equal(error.message, `Onceguard: ${refusal.body.title} (${refusal.body.code})`);
			assert.equal(error.httpCode, String(refusal.status));
			return true;
		});
	}
	const ctx = context({
		parameters: UPLOAD,
		items: [fileItem(), fileItem()],
		answers: [refusals[0], { status: 201, body: STORED }],
		continueOnFail: true,
	});
	const [items] = await run(ctx);
	assert.equal(items.length, 2);
	assert.match(items[0].json.error, /upload_media_type_not_allowed/);
	assert.equal(items[1].json.onceguard.key, 'up_5f1c');
});
