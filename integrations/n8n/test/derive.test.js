// Derive Key: the node asks Onceguard to hash personal data into a key (it holds no secret),
// sending the value or the named fields, and passes the item on with the key. Run on the
// built dist/ (`npm test`) against a stand-in for n8n's execution context.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { Onceguard } = require('../dist/nodes/Onceguard/Onceguard.node.js');

const BASE = 'http://onceguard.test';
const DERIVED = { status: 200, body: { key: 'lead:h1:abcdefghijklmnopqrstuvwxyz234567', key_id: 'h1' } };

function context({ parameters, items = [{ json: {} }], answers = [] }) {
	const sent = [];
	const node = { name: 'Onceguard', type: 'n8n-nodes-onceguard.onceguard', typeVersion: 2, parameters };
	return {
		sent,
		getInputData: () => items,
		getNode: () => node,
		getWorkflow: () => ({ id: 'wf1', name: 'leads' }),
		getExecutionId: () => '77',
		continueOnFail: () => false,
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
		},
	};
}

async function run(ctx) {
	return await new Onceguard().execute.call(ctx);
}

test('Derive Key sends one value and its prefix, and the item goes on with the key', async () => {
	const ctx = context({
		parameters: { operation: 'deriveKey', deriveSource: 'value', deriveValue: (item) => item.json.email, derivePrefix: 'lead' },
		items: [{ json: { email: 'jane@example.com', name: 'Jane' } }],
		answers: [DERIVED],
	});
	const [[item]] = await run(ctx);
	const [request] = ctx.sent;
	assert.equal(request.url, `${BASE}/api/v1/keys/derive`);
	assert.equal(request.method, 'POST');
	assert.deepEqual(request.body, { prefix: 'lead', value: 'jane@example.com' });
	assert.equal(request.credential, 'onceguardApi');
	assert.equal(item.json.onceguard.key, DERIVED.body.key);
	assert.equal(item.json.name, 'Jane');
});

test('Derive Key from fields sends them as named parts, dotted paths read from the item', async () => {
	const ctx = context({
		parameters: { operation: 'deriveKey', deriveSource: 'fields', deriveFields: 'contact.email, list', derivePrefix: '' },
		items: [{ json: { contact: { email: 'jane@example.com' }, list: 7 } }],
		answers: [DERIVED],
	});
	await run(ctx);
	assert.deepEqual(ctx.sent[0].body, { parts: { 'contact.email': 'jane@example.com', list: 7 } });
});

test('Derive Key refuses an item without a named field before calling Onceguard', async () => {
	const ctx = context({
		parameters: { operation: 'deriveKey', deriveSource: 'fields', deriveFields: 'email' },
		items: [{ json: { phone: '+61412345678' } }],
	});
	await assert.rejects(run(ctx), /no value in the field "email"/);
	assert.equal(ctx.sent.length, 0);
});

test("Derive Key turns Onceguard's refusal into an error for the item", async () => {
	const refused = {
		status: 400,
		body: { code: 'validation_error', title: 'Request is not valid', detail: '`value` must be a string of 1 to 10000 characters.' },
	};
	const ctx = context({ parameters: { operation: 'deriveKey', deriveSource: 'value', deriveValue: '' }, answers: [refused] });
	await assert.rejects(run(ctx), (error) => /validation_error/.test(error.message) && /must be a string/.test(error.description ?? ''));
});
