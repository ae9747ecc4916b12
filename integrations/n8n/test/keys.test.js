// The key checks the node runs before calling Onceguard (on the built dist/: `npm test`).
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { keyProblem, keyFromParts, KeyProblem } = require('../dist/nodes/Onceguard/keys.js');

test('a business key passes', () => {
	assert.equal(keyProblem('order-1001:charge:v1', '1001'), '');
	assert.equal(keyProblem('call_sample_1:crm-contact:v1', '1'), '');
	assert.equal(keyProblem('report:2026-12-01:email:v1', '7'), '', 'a business date is not a timestamp');
});

test('the execution id, or an expression that changes every run, is refused', () => {
	assert.match(keyProblem('4812', '4812'), /execution's id/);
	assert.match(keyProblem('order-7:charge:4812', '4812', ['=order-7:charge:{{ $execution.id }}']), /execution id/);
	assert.match(keyProblem('order-7:1796150000', '9', ['={{ $json.id }}:{{ $now.toSeconds() }}']), /current time/);
	assert.match(keyProblem('x', '9', ['={{ Date.now() }}']), /current time/);
	assert.match(keyProblem('x', '9', ['={{ $runIndex }}']), /run index/);
});

test('timestamps and bare numbers are refused from the value alone', () => {
	assert.match(keyProblem('order-7:2026-12-01T18:14:06Z', ''), /timestamp/);
	assert.match(keyProblem('order-7:1796150000', ''), /timestamp/);
	assert.match(keyProblem('order-7:1796150000123', ''), /timestamp/);
	assert.match(keyProblem('4812', ''), /bare number/);
});

test('a part an expression left empty is refused', () => {
	assert.match(keyProblem(':crm-contact:v1', ''), /empty part/);
	assert.match(keyProblem('undefined:charge:v1', ''), /empty part/);
	assert.match(keyProblem('order-7::v1', ''), /empty part/);
});

test('shape: empty, blanks, control characters, length', () => {
	assert.match(keyProblem('', ''), /empty/);
	assert.match(keyProblem(' order-7:charge:v1', ''), /blanks/);
	assert.match(keyProblem('order-7:\ncharge:v1', ''), /control/);
	assert.match(keyProblem('order-\uff43:charge:v1', ''), /printable ASCII/);
	assert.match(keyProblem('caf\u00e9-7', ''), /printable ASCII/);
	assert.equal(keyProblem('order-7 charge:v1', ''), '');
	assert.match(keyProblem('k'.repeat(256), ''), /longer than 255/);
});

test('keys from parts', () => {
	assert.equal(keyFromParts('order-1001', 'charge', 1), 'order-1001:charge:v1');
	assert.equal(keyFromParts(' call_7f3c ', 'crm-contact', 2), 'call_7f3c:crm-contact:v2');
	assert.throws(() => keyFromParts('', 'charge', 1), KeyProblem);
	assert.throws(() => keyFromParts('order-1', 'charge:now', 1), KeyProblem);
	assert.throws(() => keyFromParts('order-1', 'charge', 1.5), KeyProblem);
	assert.throws(() => keyFromParts('order-1', 'charge', 0), KeyProblem);
});
