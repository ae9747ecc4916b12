import type { IDataObject, IExecuteFunctions, IHttpRequestMethods, JsonObject } from 'n8n-workflow';

/** A file's bytes as n8n hands them over (a Buffer). */
export type FileBytes = Awaited<ReturnType<IExecuteFunctions['helpers']['getBinaryDataBuffer']>>;
import { NodeApiError } from 'n8n-workflow';

export const CREDENTIAL = 'onceguardApi';
export const REPLAYED_HEADER = 'idempotent-replayed';

/** One answer from Onceguard, whatever its status: the caller decides what a status means. */
export interface OnceguardAnswer {
	status: number;
	headers: IDataObject;
	body: IDataObject;
}

export interface OnceguardRequest {
	method: IHttpRequestMethods;
	path: string;
	body?: IDataObject;
	/** Instead of a JSON body: a file's bytes, sent as they are with their media type. */
	file?: { bytes: FileBytes; mimeType: string };
	qs?: IDataObject;
	headers?: IDataObject;
	itemIndex: number;
}

// Version 2: the traceparent the calls of the item being run send (set per item by execute()).
const ITEM_TRACEPARENT = new WeakMap<object, string>();

/** Send `traceparent` with every call this node context makes from now on (undefined: none). */
export function traceparentUse(ctx: IExecuteFunctions, traceparent: string | undefined): void {
	if (traceparent) ITEM_TRACEPARENT.set(ctx, traceparent);
	else ITEM_TRACEPARENT.delete(ctx);
}

function baseUrl(raw: unknown): string {
	return String(raw ?? '').trim().replace(/\/+$/, '');
}

function parseBody(body: unknown): IDataObject {
	if (body && typeof body === 'object') return body as IDataObject;
	const text = String(body ?? '');
	if (!text.trim()) return {};
	try {
		const parsed: unknown = JSON.parse(text);
		return parsed && typeof parsed === 'object' ? (parsed as IDataObject) : { value: parsed as string };
	} catch {
		// Not JSON (a proxy's HTML error page): keep a short excerpt for the error message.
		return { text: text.slice(0, 500) };
	}
}

/**
 * Call Onceguard with the node's credential. HTTP error statuses come back as answers (never
 * thrown), so each operation maps them itself; a request that never got an answer is thrown
 * as a readable NodeApiError naming the base URL.
 */
export async function onceguardRequest(this: IExecuteFunctions, request: OnceguardRequest): Promise<OnceguardAnswer> {
	const credentials = await this.getCredentials(CREDENTIAL, request.itemIndex);
	const base = baseUrl(credentials.baseUrl);
	// A file goes as the raw body (Onceguard reads its type from the content; the header is the
	// sender's word, kept for the logs); the answer is JSON either way.
	const file = request.file;
	const headers: IDataObject = { Accept: 'application/json, application/problem+json' };
	if (file) headers['Content-Type'] = file.mimeType || 'application/octet-stream';
	const traceparent = ITEM_TRACEPARENT.get(this);
	if (traceparent) headers.traceparent = traceparent;
	try {
		const response = (await this.helpers.httpRequestWithAuthentication.call(this, CREDENTIAL, {
			method: request.method,
			url: `${base}${request.path}`,
			body: file ? file.bytes : request.body,
			qs: request.qs,
			headers: { ...headers, ...(request.headers ?? {}) },
			json: true,
			returnFullResponse: true,
			ignoreHttpStatusErrors: true,
			disableFollowRedirect: true,
			timeout: 30_000,
		})) as { statusCode: number; headers: IDataObject; body: unknown };
		const answered: IDataObject = {};
		for (const [name, value] of Object.entries(response.headers ?? {})) answered[name.toLowerCase()] = value;
		return { status: response.statusCode, headers: answered, body: parseBody(response.body) };
	} catch (error) {
		const cause = error as JsonObject & { code?: string; message?: string };
		throw new NodeApiError(this.getNode(), cause, {
			message: `Onceguard did not answer at ${base || '(no base URL in the credential)'}`,
			description: `${cause.code ?? ''} ${cause.message ?? ''}`.trim() || undefined,
			itemIndex: request.itemIndex,
		});
	}
}

/**
 * A problem+json answer as an n8n error: "<title> (<code>)" with the detail underneath, so a
 * failed execution says what Onceguard refused and why, never a bare status code.
 */
export function problemError(this: IExecuteFunctions, answer: OnceguardAnswer, itemIndex: number): NodeApiError {
	const body = answer.body;
	const code = typeof body.code === 'string' ? body.code : '';
	const title = typeof body.title === 'string' && body.title ? body.title : `HTTP ${answer.status}`;
	let detail = typeof body.detail === 'string' ? body.detail : '';
	if (!detail && typeof body.text === 'string') detail = body.text;
	const invalid = body.invalid_params ?? body.errors;
	if (invalid && typeof invalid === 'object') detail = `${detail} ${JSON.stringify(invalid)}`.trim();
	// An intent's refusal names what the schema takes (intent_unknown_field, intent_value_not_allowed).
	if (Array.isArray(body.allowed)) detail = `${detail} Allowed: ${body.allowed.join(', ')}.`.trim();
	return new NodeApiError(this.getNode(), body as JsonObject, {
		message: `Onceguard: ${title}${code ? ` (${code})` : ''}`,
		description: detail || undefined,
		httpCode: String(answer.status),
		itemIndex,
	});
}

/** The Retry-After header in seconds, or undefined. */
export function retryAfterSeconds(answer: OnceguardAnswer): number | undefined {
	const raw = answer.headers['retry-after'];
	if (raw === undefined || raw === null || raw === '') return undefined;
	const seconds = Number(raw);
	if (Number.isFinite(seconds)) return Math.max(0, seconds);
	const date = Date.parse(String(raw));
	return Number.isNaN(date) ? undefined : Math.max(0, Math.ceil((date - Date.now()) / 1000));
}

export function isReplayed(answer: OnceguardAnswer): boolean {
	return String(answer.headers[REPLAYED_HEADER] ?? '').toLowerCase() === 'true';
}
