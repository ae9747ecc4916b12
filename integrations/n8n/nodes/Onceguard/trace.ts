/**
 * W3C Trace Context for version 2 of the node: every call to Onceguard carries a `traceparent`,
 * so the claim, the service's worker, the provider call and the callback are one trace with the
 * n8n execution (Onceguard's ADR 0015). n8n hands a node no trace of its own; the node continues
 * the one the item carries — a `traceparent` field (an earlier Onceguard node's output, or set by
 * the workflow) or the `headers.traceparent` of a Webhook trigger's item — and otherwise starts
 * one per execution: its trace id is derived from the workflow and execution ids, so every
 * Onceguard node of one execution, in any worker process, sends the same trace.
 */
import { createHash, randomBytes } from 'crypto';
import type { IDataObject, INodeExecutionData } from 'n8n-workflow';

// version-traceid-parentid-flags, lower-case hex (W3C Trace Context, level 1).
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const ZERO_TRACE = '0'.repeat(32);
const ZERO_SPAN = '0'.repeat(16);

/** The value as a traceparent the service will continue, or undefined (malformed, all-zero ids, version ff). */
export function validTraceparent(value: unknown): string | undefined {
	if (typeof value !== 'string') return undefined;
	const match = TRACEPARENT.exec(value.trim().toLowerCase());
	if (!match) return undefined;
	const [, version, traceId, spanId] = match;
	if (version === 'ff' || traceId === ZERO_TRACE || spanId === ZERO_SPAN) return undefined;
	return match[0];
}

/** The traceparent an item carries: its own field, else its Webhook trigger's header. */
function carried(item: INodeExecutionData): string | undefined {
	const json = (item.json ?? {}) as IDataObject;
	const headers = json.headers && typeof json.headers === 'object' ? (json.headers as IDataObject) : {};
	return validTraceparent(json.traceparent) ?? validTraceparent(headers.traceparent);
}

/** A new span id: 16 hex digits, never all zero. */
function spanId(): string {
	const id = randomBytes(8).toString('hex');
	return id === ZERO_SPAN ? spanId() : id;
}

/** The trace of one execution when nothing is carried: the same for every node and item of it. */
function executionTraceId(workflowId: string, executionId: string): string {
	if (!executionId) return randomBytes(16).toString('hex');
	return createHash('sha256').update(`onceguard-n8n:${workflowId}:${executionId}`).digest('hex').slice(0, 32);
}

/** The traceparent an item's calls send. */
export function itemTraceparent(item: INodeExecutionData, workflowId: string, executionId: string): string {
	return carried(item) ?? `00-${executionTraceId(workflowId, executionId)}-${spanId()}-01`;
}

/** The 32-hex trace id of a traceparent (what the node outputs as `trace_id`). */
export function traceIdOf(traceparent: string): string {
	return traceparent.split('-')[1] ?? '';
}
