import type {
	IDataObject,
	IExecuteFunctions,
	INodeExecutionData,
	INodeType,
	INodeTypeDescription,
} from 'n8n-workflow';
import { NodeOperationError } from 'n8n-workflow';

import { nodeProperties } from './descriptions';
import { GOOD_KEY_HINT, KeyProblem, checkKey, keyFromParts } from './keys';
import type { OnceguardAnswer } from './transport';
import { isReplayed, onceguardRequest, problemError, retryAfterSeconds } from './transport';

// The Claim operation's outputs, in order.
const PROCEED = 0;
const REPLAYED = 1;
const RETRY_LATER = 2;
const NEEDS_HUMAN = 3;
const RETRY_LATER_CODES = new Set(['operation_in_progress', 'operation_retry_scheduled']);
const NEEDS_HUMAN_CODES = new Set(['operation_needs_reconciliation']);

// DESIGN §3's failure classes, for an error a node's error output carries.
const TRANSIENT_STATUSES = new Set([408, 425, 429, 503]);
const TRANSIENT_CODES = ['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH'];
const AMBIGUOUS_CODES = ['ETIMEDOUT', 'ECONNRESET', 'ESOCKETTIMEDOUT', 'EPIPE', 'ECONNABORTED'];

interface Routed {
	output: number;
	item: INodeExecutionData;
}

type Operation = (this: IExecuteFunctions, index: number, item: INodeExecutionData) => Promise<Routed>;

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
	if (answer.status === 201) {
		return {
			output: PROCEED,
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
		return {
			output: REPLAYED,
			item: withResult(this, index, item, {
				outcome: 'replayed',
				operation_id: op.id,
				key,
				status: op.status,
				provider_ref: op.provider_ref,
				response: op.response,
				error_class: op.error_class,
				replayed: isReplayed(answer),
				operation: op,
			}),
		};
	}
	const code = problemCode(answer);
	if (answer.status === 409 && (RETRY_LATER_CODES.has(code) || NEEDS_HUMAN_CODES.has(code))) {
		const waiting = RETRY_LATER_CODES.has(code);
		return {
			output: waiting ? RETRY_LATER : NEEDS_HUMAN,
			item: withResult(this, index, item, {
				outcome: waiting ? 'retry_later' : 'needs_human',
				operation_id: op.operation_id ?? null,
				key,
				code,
				detail: op.detail,
				status: op.operation_status ?? null,
				retry_after_seconds: waiting ? (retryAfterSeconds(answer) ?? 1) : null,
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

const fail: Operation = async function (index, item) {
	const opts = options(this, index);
	const extra: IDataObject = {
		error_class: String(this.getNodeParameter('errorClass', index)),
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
				},
			},
			pairedItem: { item: index },
		},
	};
};

const OPERATIONS: Record<string, Operation> = { claim, markSent, complete, fail, get, submit, upload, deadLetter };

export class Onceguard implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Onceguard',
		name: 'onceguard',
		icon: 'file:../../icons/onceguard.svg',
		group: ['transform'],
		version: 1,
		subtitle: '={{$parameter["operation"]}}',
		description: 'Make side effects happen once: claim keys, record outcomes, submit jobs, upload files, dead-letter failed items',
		defaults: { name: 'Onceguard' },
		inputs: ['main'],
		// Claim branches four ways, so a workflow needs no IF node to read the answer.
		outputs: `={{ $parameter["operation"] === "claim" ? [{ "type": "main", "displayName": "Proceed" }, { "type": "main", "displayName": "Replayed" }, { "type": "main", "displayName": "Retry Later" }, { "type": "main", "displayName": "Needs a Human" }] : [{ "type": "main" }] }}`,
		credentials: [{ name: 'onceguardApi', required: true }],
		properties: nodeProperties,
	};

	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const operation = this.getNodeParameter('operation', 0) as string;
		const run = OPERATIONS[operation];
		if (!run) throw new NodeOperationError(this.getNode(), `Unknown operation "${operation}".`);
		const outputs: INodeExecutionData[][] = operation === 'claim' ? [[], [], [], []] : [[]];
		for (let index = 0; index < items.length; index++) {
			try {
				const routed = await run.call(this, index, items[index]);
				outputs[routed.output].push(routed.item);
			} catch (caught) {
				const error =
					caught instanceof KeyProblem
						? new NodeOperationError(this.getNode(), caught.message, { itemIndex: index, description: GOOD_KEY_HINT })
						: caught;
				if (!this.continueOnFail()) throw error;
				// An item that failed must never flow down Proceed: it goes where a human looks
				// (or to the error output, which n8n takes it to when one is wired).
				outputs[operation === 'claim' ? NEEDS_HUMAN : 0].push({
					json: { error: (error as Error).message },
					pairedItem: { item: index },
				});
			}
		}
		return outputs;
	}
}
