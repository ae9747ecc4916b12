import type {
	IDataObject,
	IExecuteFunctions,
	INodeExecutionData,
	INodeType,
	INodeTypeDescription,
} from 'n8n-workflow';
import { NodeOperationError, sleep } from 'n8n-workflow';

import { nodeProperties } from './descriptions';
import { GOOD_KEY_HINT, KeyProblem, checkKey, keyFromParts } from './keys';
import type { OnceguardAnswer } from './transport';
import { isReplayed, onceguardRequest, problemError, retryAfterSeconds, traceparentUse } from './transport';
import { itemTraceparent, traceIdOf } from './trace';

// The Claim operation's outputs, in order.
const PROCEED = 0;
const REPLAYED = 1;
const RETRY_LATER = 2;
const NEEDS_HUMAN = 3;
const RETRY_LATER_CODES = new Set(['operation_in_progress', 'operation_retry_scheduled']);
const NEEDS_HUMAN_CODES = new Set(['operation_needs_reconciliation']);

// Version 2: every row of the design's claim-answer table has exactly one named output, and a
// replayed failure is a failure, not "already done" (v1 sent both down Replayed).
const V2_PROCEED = 0;
const V2_ALREADY_DONE = 1;
const V2_FAILED = 2;
const V2_RETRY_LATER = 3;
const V2_NEEDS_HUMAN = 4;
// Version 2's Submit: in flight (wire it to a Wait node for the callback), or finished.
const V2_IN_FLIGHT = 0;
const V2_SUCCEEDED = 1;
const V2_SUBMIT_FAILED = 2;
// An operation in one of these states is finished (ledger.models.TERMINAL_STATES).
const FAILED_STATES = new Set(['failed', 'abandoned']);
const FINISHED_STATES = new Set(['succeeded', ...FAILED_STATES]);
// Submit's own wait (v2): how often it asks, in milliseconds (doubling up to the cap).
const POLL_FIRST_MS = 500;
const POLL_MAX_MS = 5000;

// DESIGN §3's failure classes, for an error a node's error output carries.
const TRANSIENT_STATUSES = new Set([408, 425, 429, 503]);
const TRANSIENT_CODES = ['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH'];
const AMBIGUOUS_CODES = ['ETIMEDOUT', 'ECONNRESET', 'ESOCKETTIMEDOUT', 'EPIPE', 'ECONNABORTED'];

interface Routed {
	output: number;
	// One item per input item, or (Get Dead-Letter Entries) one per entry found.
	item: INodeExecutionData | INodeExecutionData[];
}

type Operation = (this: IExecuteFunctions, index: number, item: INodeExecutionData) => Promise<Routed>;

function nodeVersion(ctx: IExecuteFunctions): number {
	return Number(ctx.getNode().typeVersion ?? 1);
}

function options(ctx: IExecuteFunctions, index: number): IDataObject {
	return ctx.getNodeParameter('options', index, {}) as IDataObject;
}

function resultField(ctx: IExecuteFunctions, index: number): string {
	return String(options(ctx, index).resultField || 'onceguard');
}

/** The item's own fields, plus Onceguard's answer in the result field. */
function withResult(ctx: IExecuteFunctions, index: number, item: INodeExecutionData, result: IDataObject): INodeExecutionData {
	return { json: { ...item.json, [resultField(ctx, index)]: result }, pairedItem: { item: index } };
}

/** The trace id on an output item's result object (version 2), where the workflow finds it. */
function withTraceId(ctx: IExecuteFunctions, index: number, item: INodeExecutionData, traceId: string): void {
	const result = item.json[resultField(ctx, index)];
	if (result && typeof result === 'object' && !Array.isArray(result)) (result as IDataObject).trace_id = traceId;
}

function jsonParameter(ctx: IExecuteFunctions, name: string, index: number): unknown {
	const value = ctx.getNodeParameter(name, index, '{}');
	if (typeof value !== 'string') return value;
	if (!value.trim()) return undefined;
	try {
		return JSON.parse(value);
	} catch {
		throw new NodeOperationError(ctx.getNode(), `The parameter "${name}" is not valid JSON.`, { itemIndex: index });
	}
}

function readPath(source: IDataObject, path: string): unknown {
	let value: unknown = source;
	for (const part of path.split('.')) {
		if (value === null || typeof value !== 'object' || !(part in (value as IDataObject))) return undefined;
		value = (value as IDataObject)[part];
	}
	return value;
}

function context(ctx: IExecuteFunctions): { workflowId: string; workflowName: string; executionId: string } {
	const workflow = ctx.getWorkflow();
	return {
		workflowId: String(workflow.id ?? ''),
		workflowName: String(workflow.name ?? ''),
		executionId: String(ctx.getExecutionId() ?? ''),
	};
}

function theKey(ctx: IExecuteFunctions, index: number): string {
	const source = ctx.getNodeParameter('keySource', index) as string;
	const key =
		source === 'parts'
			? keyFromParts(
					String(ctx.getNodeParameter('record', index, '')),
					String(ctx.getNodeParameter('action', index, '')),
					Number(ctx.getNodeParameter('version', index, 1)),
				)
			: String(ctx.getNodeParameter('key', index, ''));
	if (options(ctx, index).checkKey === false) return key;
	const names = source === 'parts' ? ['record', 'action', 'version'] : ['key'];
	return checkKey(key, context(ctx).executionId, rawParameters(ctx, names));
}

/** Parameters as written in the workflow, before evaluation (expressions included). */
function rawParameters(ctx: IExecuteFunctions, names: string[]): string[] {
	const parameters = ctx.getNode().parameters ?? {};
	return names.map((name) => parameters[name]).filter((value): value is string => typeof value === 'string');
}

function effectRequest(ctx: IExecuteFunctions, index: number, item: INodeExecutionData): unknown {
	if (ctx.getNodeParameter('requestSource', index) === 'json') return jsonParameter(ctx, 'requestJson', index);
	const names = String(ctx.getNodeParameter('requestFields', index, ''))
		.split(',')
		.map((name) => name.trim())
		.filter(Boolean);
	const request: IDataObject = {};
	for (const name of names) {
		const value = readPath(item.json, name);
		if (value === undefined) {
			throw new NodeOperationError(ctx.getNode(), `The item has no field "${name}" (named in Request Fields).`, {
				itemIndex: index,
				description: 'Request Fields name the item fields that define the effect, e.g. amount, currency.',
			});
		}
		request[name] = value as IDataObject[keyof IDataObject];
	}
	return request;
}

/** The fields every ledger write accepts about where it came from. */
function origin(ctx: IExecuteFunctions, index: number): IDataObject {
	const { workflowId, workflowName, executionId } = context(ctx);
	const opts = options(ctx, index);
	// The name lets the console and API find the operation by its workflow's name.
	const body: IDataObject = { workflow_id: workflowId, workflow_name: workflowName, execution_id: executionId };
	if (opts.correlationId) body.correlation_id = String(opts.correlationId);
	if (opts.reconciliationHandle) body.reconciliation_handle = String(opts.reconciliationHandle);
	return body;
}

function operationId(ctx: IExecuteFunctions, index: number): number {
	const raw = ctx.getNodeParameter('operationId', index);
	const id = Number(raw);
	if (!Number.isInteger(id) || id < 1) {
		throw new NodeOperationError(ctx.getNode(), `"${String(raw)}" is not an operation ID.`, {
			itemIndex: index,
			description: 'Operation ID comes from the Claim (by default {{ $json.onceguard.operation_id }}).',
		});
	}
	return id;
}

function problemCode(answer: OnceguardAnswer): string {
	return typeof answer.body.code === 'string' ? answer.body.code : '';
}

const claim: Operation = async function (index, item) {
	const key = theKey(this, index);
	const opts = options(this, index);
	const body: IDataObject = {
		key,
		provider: String(this.getNodeParameter('provider', index)),
		action: String(this.getNodeParameter('action', index)),
		request: effectRequest(this, index, item) as IDataObject,
		uses_sent_marker: opts.usesSentMarker === true,
		...origin(this, index),
	};
	if (this.getNodeParameter('sendPayload', index, true)) body.payload = item.json;
	if (Number(opts.leaseSeconds) > 0) body.lease_seconds = Number(opts.leaseSeconds);
	const answer = await onceguardRequest.call(this, { method: 'POST', path: '/api/v1/claims', body, itemIndex: index });
	const op = answer.body;
	const v2 = nodeVersion(this) >= 2;
	if (answer.status === 201) {
		return {
			output: v2 ? V2_PROCEED : PROCEED,
			item: withResult(this, index, item, {
				outcome: 'proceed',
				operation_id: op.id,
				key,
				lease_token: op.lease_token,
				attempt: op.attempt,
				status: op.status,
				replayed: false,
			}),
		};
	}
	if (answer.status === 200) {
		const failed = FAILED_STATES.has(String(op.status));
		return {
			output: !v2 ? REPLAYED : failed ? V2_FAILED : V2_ALREADY_DONE,
			item: withResult(this, index, item, {
				outcome: !v2 ? 'replayed' : failed ? 'failed' : 'already_done',
				operation_id: op.id,
				key,
				status: op.status,
				provider_ref: op.provider_ref,
				response: op.response,
				error_class: op.error_class,
				...(v2 ? { last_error: op.last_error ?? '' } : {}),
				replayed: isReplayed(answer),
				operation: op,
			}),
		};
	}
	const code = problemCode(answer);
	if (v2 && answer.status === 409 && code === 'operation_version_superseded') {
		// A newer version of the record and action took over: this one's effect is not wanted.
		return {
			output: V2_ALREADY_DONE,
			item: withResult(this, index, item, {
				outcome: 'superseded',
				operation_id: op.operation_id ?? null,
				key,
				code,
				detail: op.detail,
				replaced_by: op.replaced_by ?? null,
				replayed: true,
			}),
		};
	}
	// The key does not tell this request apart, or it belongs to execute mode: the workflow
	// needs a person's fix, not a retry.
	if (
		v2 &&
		((answer.status === 422 && code === 'key_reused_with_different_request') ||
			(answer.status === 409 && code === 'operation_managed_by_service'))
	) {
		return {
			output: V2_NEEDS_HUMAN,
			item: withResult(this, index, item, { outcome: 'needs_human', key, code, detail: op.detail, replayed: false }),
		};
	}
	if (answer.status === 409 && (RETRY_LATER_CODES.has(code) || NEEDS_HUMAN_CODES.has(code))) {
		const waiting = RETRY_LATER_CODES.has(code);
		return {
			output: waiting ? (v2 ? V2_RETRY_LATER : RETRY_LATER) : v2 ? V2_NEEDS_HUMAN : NEEDS_HUMAN,
			item: withResult(this, index, item, {
				outcome: waiting ? 'retry_later' : 'needs_human',
				operation_id: op.operation_id ?? null,
				key,
				code,
				detail: op.detail,
				status: op.operation_status ?? null,
				retry_after_seconds: waiting ? (retryAfterSeconds(answer) ?? 1) : null,
				...(v2 ? { replayed: false } : {}),
			}),
		};
	}
	throw problemError.call(this, answer, index);
};

function holderResult(op: IDataObject, item: INodeExecutionData, field: string): IDataObject {
	const previous = item.json[field];
	return {
		...(previous && typeof previous === 'object' && !Array.isArray(previous) ? (previous as IDataObject) : {}),
		operation_id: op.id,
		status: op.status,
		operation: op,
	};
}

async function holderCall(
	ctx: IExecuteFunctions,
	index: number,
	item: INodeExecutionData,
	verb: 'sent' | 'complete' | 'fail',
	extra: IDataObject,
): Promise<Routed> {
	const id = operationId(ctx, index);
	const body: IDataObject = { lease_token: String(ctx.getNodeParameter('leaseToken', index)), ...extra };
	const answer = await onceguardRequest.call(ctx, {
		method: 'POST',
		path: `/api/v1/operations/${id}/${verb}`,
		body,
		itemIndex: index,
	});
	if (answer.status !== 200) throw problemError.call(ctx, answer, index);
	const field = resultField(ctx, index);
	const result = holderResult(answer.body, item, field);
	// The lease token is spent once the outcome is recorded; keep it off the item from here on.
	if (verb !== 'sent') delete result.lease_token;
	return { output: 0, item: withResult(ctx, index, item, result) };
}

const markSent: Operation = async function (index, item) {
	const handle = options(this, index).reconciliationHandle;
	return await holderCall(this, index, item, 'sent', handle ? { reconciliation_handle: String(handle) } : {});
};

const complete: Operation = async function (index, item) {
	const opts = options(this, index);
	const extra: IDataObject = {
		provider_ref: String(this.getNodeParameter('providerRef', index, '') ?? ''),
		response: jsonParameter(this, 'response', index) as IDataObject,
	};
	if (Number(opts.responseStatus) > 0) extra.response_status = Number(opts.responseStatus);
	return await holderCall(this, index, item, 'complete', extra);
};

/** Version 2's default class: once the sent marker is set the effect may have happened, so
 * the failure is "outcome unknown" (reconciled, or reviewed, by its provider's class), never
 * a retry that could do it twice; before the marker it is transient. */
async function defaultFailClass(ctx: IExecuteFunctions, index: number): Promise<string> {
	const answer = await onceguardRequest.call(ctx, {
		method: 'GET',
		path: `/api/v1/operations/${operationId(ctx, index)}`,
		itemIndex: index,
	});
	if (answer.status !== 200) throw problemError.call(ctx, answer, index);
	return answer.body.sent_at ? 'ambiguous' : 'transient';
}

const fail: Operation = async function (index, item) {
	const opts = options(this, index);
	let errorClass = String(this.getNodeParameter('errorClass', index));
	if (errorClass === 'auto') errorClass = await defaultFailClass(this, index);
	const extra: IDataObject = {
		error_class: errorClass,
		message: String(this.getNodeParameter('message', index, '')),
	};
	if (Number(opts.responseStatus) > 0) extra.response_status = Number(opts.responseStatus);
	if (Number(opts.retryAfterSeconds) > 0) extra.retry_after_seconds = Number(opts.retryAfterSeconds);
	return await holderCall(this, index, item, 'fail', extra);
};

const get: Operation = async function (index, item) {
	const answer = await onceguardRequest.call(this, {
		method: 'GET',
		path: `/api/v1/operations/${operationId(this, index)}`,
		itemIndex: index,
	});
	if (answer.status !== 200) throw problemError.call(this, answer, index);
	return { output: 0, item: withResult(this, index, item, holderResult(answer.body, item, resultField(this, index))) };
};

/** What Submit sends: the provider's request, or an intent in the provider's declared fields
 * (Onceguard renders the request from it); only the chosen one is read and sent. */
function submission(ctx: IExecuteFunctions, index: number): IDataObject {
	if (ctx.getNodeParameter('submitAs', index, 'request') === 'intent') {
		const intent = jsonParameter(ctx, 'intent', index);
		if (!intent || typeof intent !== 'object' || Array.isArray(intent)) {
			throw new NodeOperationError(ctx.getNode(), 'The parameter "Intent (JSON)" must be a JSON object.', {
				itemIndex: index,
				description: 'The fields the provider\'s intent schema declares, e.g. {"preset_id": "studio", "source_key": "up_…"}.',
			});
		}
		return { intent: intent as IDataObject };
	}
	const method = String(ctx.getNodeParameter('method', index, 'POST'));
	const request: IDataObject = { method, path: String(ctx.getNodeParameter('path', index)) };
	if (method !== 'GET' && method !== 'DELETE') request.body = jsonParameter(ctx, 'body', index) as IDataObject;
	return { request };
}

const submit: Operation = async function (index, item) {
	const key = theKey(this, index);
	const opts = options(this, index);
	const body: IDataObject = {
		key,
		provider: String(this.getNodeParameter('provider', index)),
		action: String(this.getNodeParameter('action', index)),
		...submission(this, index),
		...origin(this, index),
	};
	const callbackUrl = String(this.getNodeParameter('callbackUrl', index, '') ?? '').trim();
	if (callbackUrl) body.callback_url = callbackUrl;
	if (Number(opts.deadlineSeconds) > 0) body.deadline_seconds = Number(opts.deadlineSeconds);
	if (this.getNodeParameter('sendPayload', index, true)) body.payload = item.json;
	const answer = await onceguardRequest.call(this, { method: 'POST', path: '/api/v1/operations', body, itemIndex: index });
	// 202: accepted (or, replayed, the same open operation again); 200 + replayed: already
	// finished, here is its outcome. Both mean the effect is in Onceguard's hands exactly once.
	if (nodeVersion(this) >= 2 && (answer.status === 202 || (answer.status === 200 && isReplayed(answer)))) {
		return await submitted.call(this, index, item, key, answer);
	}
	if (answer.status === 202 || (answer.status === 200 && isReplayed(answer))) {
		const op = answer.body;
		return {
			output: 0,
			item: withResult(this, index, item, {
				outcome: answer.status === 202 ? 'accepted' : 'finished',
				operation_id: op.id,
				key,
				status: op.status,
				replayed: isReplayed(answer),
				operation: op,
			}),
		};
	}
	throw problemError.call(this, answer, index);
};

function submitResult(key: string, op: IDataObject, replayed: boolean): IDataObject {
	const failed = FAILED_STATES.has(String(op.status));
	const finished = FINISHED_STATES.has(String(op.status));
	return {
		outcome: !finished ? 'in_flight' : failed ? 'failed' : 'succeeded',
		operation_id: op.id,
		key,
		status: op.status,
		provider_ref: op.provider_ref ?? '',
		error_class: op.error_class ?? '',
		last_error: op.last_error ?? '',
		replayed,
		operation: op,
	};
}

function submitOutput(op: IDataObject): number {
	if (!FINISHED_STATES.has(String(op.status))) return V2_IN_FLIGHT;
	return FAILED_STATES.has(String(op.status)) ? V2_SUBMIT_FAILED : V2_SUCCEEDED;
}

/** Version 2: a finished operation (a replay of a key that succeeded, failed or was cancelled)
 * comes out at once on Succeeded or Failed; one in flight goes to In Flight (for a Wait node
 * and the callback) or, with "Wait Here Up To", is asked after until it finishes — its
 * expiry is an error (the node's error output, when wired), never a hang. */
async function submitted(
	this: IExecuteFunctions,
	index: number,
	item: INodeExecutionData,
	key: string,
	answer: OnceguardAnswer,
): Promise<Routed> {
	let op = answer.body;
	const replayed = isReplayed(answer);
	const waitSeconds = Number(this.getNodeParameter('waitSeconds', index, 0)) || 0;
	if (waitSeconds > 0 && !FINISHED_STATES.has(String(op.status))) {
		const deadline = Date.now() + waitSeconds * 1000;
		let pause = POLL_FIRST_MS;
		while (!FINISHED_STATES.has(String(op.status))) {
			const left = deadline - Date.now();
			if (left <= 0) {
				throw new NodeOperationError(
					this.getNode(),
					`Operation ${String(op.id)} did not finish within ${waitSeconds} s (it is ${String(op.status)})`,
					{
						itemIndex: index,
						description:
							'It goes on in Onceguard: its outcome is recorded there and a callback, if set, still comes. Wire the error output to handle the wait running out.',
					},
				);
			}
			await sleep(Math.min(pause, left));
			pause = Math.min(pause * 2, POLL_MAX_MS);
			const polled = await onceguardRequest.call(this, {
				method: 'GET',
				path: `/api/v1/operations/${String(op.id)}`,
				itemIndex: index,
			});
			if (polled.status !== 200) throw problemError.call(this, polled, index);
			op = polled.body;
		}
	}
	return { output: submitOutput(op), item: withResult(this, index, item, submitResult(key, op, replayed)) };
}

const upload: Operation = async function (index, item) {
	const property = String(this.getNodeParameter('binaryPropertyName', index, 'data')).trim();
	// Throws "no binary field …" naming the property when the item has none.
	const binary = this.helpers.assertBinaryData(index, property);
	const bytes = await this.helpers.getBinaryDataBuffer(index, property);
	const answer = await onceguardRequest.call(this, {
		method: 'POST',
		path: '/api/v1/uploads',
		file: { bytes, mimeType: binary.mimeType },
		itemIndex: index,
	});
	// 201: stored; 200: these bytes were stored already (the same key).
	if (answer.status !== 201 && answer.status !== 200) throw problemError.call(this, answer, index);
	const stored = answer.body;
	const routed = withResult(this, index, item, {
		key: stored.key,
		sha256: stored.sha256,
		size: stored.size,
		media_type: stored.media_type,
		width: stored.width ?? null,
		height: stored.height ?? null,
		created: answer.status === 201,
		content: stored.content,
	});
	// The file stays on the item for the nodes after this one.
	if (item.binary) routed.binary = item.binary;
	return { output: 0, item: routed };
};

interface FailureInfo {
	message: string;
	errorClass: string;
}

function classFor(status: number | undefined, code: string): string {
	if (status !== undefined && status >= 100 && status <= 599) {
		if (status < 300) return '';
		if (TRANSIENT_STATUSES.has(status)) return 'transient';
		if (status === 401 || status === 403) return 'permission';
		if (status >= 500) return 'ambiguous';
		return 'invalid_input';
	}
	const upper = code.toUpperCase();
	if (TRANSIENT_CODES.some((c) => upper.includes(c))) return 'transient';
	if (AMBIGUOUS_CODES.some((c) => upper.includes(c))) return 'ambiguous';
	return '';
}

/** What a node's error output put on the item: a message, or n8n's error object. */
function failureOf(item: INodeExecutionData): FailureInfo {
	const error = item.json.error ?? item.error;
	if (typeof error === 'string') return { message: error, errorClass: classFor(undefined, error) };
	if (!error || typeof error !== 'object') return { message: '', errorClass: '' };
	const e = error as IDataObject;
	const status = Number(e.httpCode ?? e.status ?? e.statusCode ?? NaN);
	const code = String(e.code ?? '');
	const known = Number.isFinite(status) ? status : undefined;
	// The description of an HTTP error often quotes the receiver's body (personal data): left out.
	const message = String(e.message ?? code ?? 'error');
	return {
		message: known !== undefined && !message.includes(String(known)) ? `${message} [${known}]` : message,
		errorClass: classFor(known, `${code} ${message}`),
	};
}

/** The node whose output fed this one (the failed node, when its error output is wired here). */
function failedNodeName(ctx: IExecuteFunctions): string {
	try {
		return ctx.getInputSourceData(0)?.previousNode || ctx.getNode().name;
	} catch {
		return ctx.getNode().name;
	}
}

function safePart(value: string): string {
	// The server splits identities on ':'; keep each part from smuggling one in.
	return value.replace(/:/g, '_');
}

const deadLetter: Operation = async function (index, item) {
	const { workflowId, workflowName, executionId } = context(this);
	const node = failedNodeName(this);
	const opts = options(this, index);
	const field = resultField(this, index);
	let payload: unknown;
	if (this.getNodeParameter('payloadSource', index) === 'json') {
		payload = jsonParameter(this, 'payloadJson', index);
	} else {
		// The item minus what is not the lead: the error the failed node added, and the lease
		// token of an earlier Claim (never stored in the DLQ).
		const { error: _error, [field]: _result, ...rest } = item.json;
		payload = rest;
	}
	const failure = failureOf(item);
	const message = String(this.getNodeParameter('errorMessage', index, '') || failure.message || 'failed');
	const chosenClass = String(this.getNodeParameter('dlqErrorClass', index, 'auto'));
	const errorClass = chosenClass === 'auto' ? failure.errorClass : chosenClass;
	const eventId = String(
		opts.eventId || `n8n:${safePart(workflowId)}:${safePart(executionId)}:${safePart(node)}:${index}`,
	);
	let executionUrl = '';
	try {
		executionUrl = `${this.getInstanceBaseUrl().replace(/\/+$/, '')}/workflow/${workflowId}/executions/${executionId}`;
	} catch {
		executionUrl = '';
	}
	const body: IDataObject = {
		type: 'onceguard.failed_event',
		event_id: eventId,
		error: { message, ...(errorClass ? { class: errorClass } : {}) },
		source: {
			workflow_id: workflowId,
			workflow_name: workflowName,
			execution_id: executionId,
			execution_url: executionUrl,
			node,
			mode: this.getMode(),
		},
		failed_at: new Date().toISOString(),
		payload: payload as IDataObject,
	};
	const key = String(this.getNodeParameter('dlqKey', index, '') ?? '').trim();
	if (key) {
		body.idempotency_key =
			opts.checkKey === false ? key : checkKey(key, executionId, rawParameters(this, ['dlqKey']));
	}
	const target = String(this.getNodeParameter('replayTarget', index, '') ?? '').trim();
	if (target) body.replay_target = target;
	const answer = await onceguardRequest.call(this, { method: 'POST', path: '/api/v1/dlq/events', body, itemIndex: index });
	if (answer.status !== 201 && answer.status !== 200) throw problemError.call(this, answer, index);
	const entry = answer.body;
	return {
		output: 0,
		item: {
			json: {
				...(payload && typeof payload === 'object' && !Array.isArray(payload) ? (payload as IDataObject) : {}),
				[field]: {
					dlq_entry_id: entry.id,
					event_id: entry.event_id,
					status: entry.status,
					created: answer.status === 201,
					original_key: entry.original_key,
					// What the entry recorded, so a Fail after this node can pass the same class on.
					error_class: entry.error_class,
				},
			},
			pairedItem: { item: index },
		},
	};
};

const V1_CLAIM_OUTPUTS = ['Proceed', 'Replayed', 'Retry Later', 'Needs a Human'];
const V2_CLAIM_OUTPUTS = ['Proceed', 'Already Done', 'Failed', 'Retry Later', 'Needs a Human'];
const V2_SUBMIT_OUTPUTS = ['In Flight', 'Succeeded', 'Failed'];

function outputs(names: string[]): string {
	return JSON.stringify(names.map((displayName) => ({ type: 'main', displayName })));
}

// "Claim · charge-customer", "Submit · render", "Send to Dead-Letter Queue"…: the operation in
// words, and the action where it has one.
const SUBTITLE =
	'={{ ({ claim: "Claim", complete: "Complete", fail: "Fail", deriveKey: "Derive Key", get: "Get Operation", markSent: "Mark Sent", deadLetter: "Send to Dead-Letter Queue", deadLetterGet: "Get Dead-Letter Entries", submit: "Submit", upload: "Upload File" })[$parameter["operation"]] + ((["claim", "submit"].includes($parameter["operation"]) && $parameter["action"]) ? " · " + $parameter["action"] : "") }}';

/** Entries of the dead-letter queue, for workflows that handle their own failures: by original
 * key (every entry of it, newest first) or the newest ones, optionally of one status — one
 * item per entry (its payload stays in Onceguard: masked data is read in the console). */
const deadLetterGet: Operation = async function (index) {
	const key = String(this.getNodeParameter('dlqLookupKey', index, '') ?? '').trim();
	const status = String(this.getNodeParameter('dlqStatus', index, '') ?? '');
	const limit = Math.max(1, Math.min(500, Number(this.getNodeParameter('dlqLimit', index, 50)) || 50));
	const qs: IDataObject = { page_size: limit };
	if (key) qs.key = key;
	if (status) qs.status = status;
	const answer = await onceguardRequest.call(this, { method: 'GET', path: '/api/v1/dlq/events', qs, itemIndex: index });
	if (answer.status !== 200) throw problemError.call(this, answer, index);
	const entries = Array.isArray(answer.body.results) ? (answer.body.results as IDataObject[]) : [];
	return {
		output: 0,
		item: entries.map((entry) => ({ json: { [resultField(this, index)]: entry }, pairedItem: { item: index } })),
	};
};

/** A key for a lead known only by personal data, which a key may not carry: Onceguard hashes
 * the value (or the named fields) with its own never-rotating key, so the node holds no secret
 * and the same lead always gets the same key. The item goes on with `{key, key_id}`. */
const deriveKey: Operation = async function (index, item) {
	const body: IDataObject = {};
	const prefix = String(this.getNodeParameter('derivePrefix', index, '') ?? '').trim();
	if (prefix) body.prefix = prefix;
	if (this.getNodeParameter('deriveSource', index, 'value') === 'fields') {
		const names = String(this.getNodeParameter('deriveFields', index, ''))
			.split(',')
			.map((name) => name.trim())
			.filter(Boolean);
		const parts: IDataObject = {};
		for (const name of names) {
			const value = readPath(item.json, name);
			if (value === undefined || value === null || value === '') {
				throw new NodeOperationError(this.getNode(), `The item has no value in the field "${name}" (named in Fields).`, {
					itemIndex: index,
				});
			}
			parts[name] = value as IDataObject[keyof IDataObject];
		}
		body.parts = parts;
	} else {
		body.value = String(this.getNodeParameter('deriveValue', index, '') ?? '');
	}
	const answer = await onceguardRequest.call(this, { method: 'POST', path: '/api/v1/keys/derive', body, itemIndex: index });
	if (answer.status !== 200) throw problemError.call(this, answer, index);
	return { output: 0, item: withResult(this, index, item, { key: answer.body.key, key_id: answer.body.key_id }) };
};

const OPERATIONS: Record<string, Operation> = {
	deriveKey,
	claim,
	markSent,
	complete,
	fail,
	get,
	submit,
	upload,
	deadLetter,
	deadLetterGet,
};

export class Onceguard implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Onceguard',
		name: 'onceguard',
		icon: 'file:../../icons/onceguard.svg',
		group: ['transform'],
		version: [1, 2],
		defaultVersion: 2,
		subtitle: SUBTITLE,
		description: 'Make side effects happen once: claim keys, record outcomes, submit jobs, upload files, dead-letter failed items',
		defaults: { name: 'Onceguard' },
		inputs: ['main'],
		// Claim branches four ways, so a workflow needs no IF node to read the answer.
		// Version 2: one named output per row of the claim-answer table, and Submit's three.
		outputs: `={{ $parameter["operation"] === "claim" ? ($nodeVersion >= 2 ? ${outputs(V2_CLAIM_OUTPUTS)} : ${outputs(V1_CLAIM_OUTPUTS)}) : ($parameter["operation"] === "submit" && $nodeVersion >= 2) ? ${outputs(V2_SUBMIT_OUTPUTS)} : [{ "type": "main" }] }}`,
		credentials: [{ name: 'onceguardApi', required: true }],
		properties: nodeProperties,
	};

	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const operation = this.getNodeParameter('operation', 0) as string;
		const run = OPERATIONS[operation];
		if (!run) throw new NodeOperationError(this.getNode(), `Unknown operation "${operation}".`);
		const v2 = nodeVersion(this) >= 2;
		const count = operation === 'claim' ? (v2 ? 5 : 4) : operation === 'submit' && v2 ? 3 : 1;
		const outputs: INodeExecutionData[][] = Array.from({ length: count }, () => []);
		const { workflowId, executionId } = context(this);
		for (let index = 0; index < items.length; index++) {
			// Version 2: the item's calls carry its trace (./trace.ts); its result names the trace id.
			const traceparent = v2 ? itemTraceparent(items[index], workflowId, executionId) : undefined;
			traceparentUse(this, traceparent);
			try {
				const routed = await run.call(this, index, items[index]);
				// One item per input item gets the trace id (a listing's entries are not this item's result).
				if (traceparent && !Array.isArray(routed.item)) withTraceId(this, index, routed.item, traceIdOf(traceparent));
				outputs[routed.output].push(...(Array.isArray(routed.item) ? routed.item : [routed.item]));
			} catch (caught) {
				const error =
					caught instanceof KeyProblem
						? new NodeOperationError(this.getNode(), caught.message, { itemIndex: index, description: GOOD_KEY_HINT })
						: caught;
				if (!this.continueOnFail()) throw error;
				// An item that failed must never flow down Proceed: it goes where a human looks
				// (or to the error output, which n8n takes it to when one is wired).
				outputs[operation === 'claim' ? (v2 ? V2_NEEDS_HUMAN : NEEDS_HUMAN) : 0].push({
					json: { error: (error as Error).message },
					pairedItem: { item: index },
				});
			}
		}
		return outputs;
	}
}
