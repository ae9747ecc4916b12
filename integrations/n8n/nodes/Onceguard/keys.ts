/**
 * Idempotency keys, checked before any request. A key names one business effect: the same
 * order charged, the same lead written. A key made of an execution id or the current time is
 * new on every retry and every re-run, so it dedups nothing; those are refused here, with a
 * message that says what to use instead.
 */

export const MAX_KEY_LENGTH = 255;

// 2026-12-01T18:14:06, 2026-12-01 18:14 — a time of day, not a business date.
const ISO_DATETIME = /\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}/;
// Unix time in seconds (10 digits) or milliseconds (13 digits) standing alone in the key.
const EPOCH = /(?:^|[^0-9])(\d{10}|\d{13})(?:[^0-9]|$)/;
const ALL_DIGITS = /^\d+$/;
// ":charge:v1", "order-7::v1", "undefined:charge:v1": a part came out of an expression empty.
const EMPTY_PART = /(^:|::|:$)/;
const MISSING_VALUE = /(^|:)(undefined|null|NaN)(:|$)/;
// Seconds between 2001 and 2100: a 10-digit number in this range is read as a timestamp.
const EPOCH_MIN_SECONDS = 1_000_000_000;
const EPOCH_MAX_SECONDS = 4_102_444_800;

// Expressions whose value changes between runs of the same effect, and what to call them.
const CHANGING_EXPRESSIONS: Array<[RegExp, string]> = [
	[/\$execution\s*\.\s*(id|resumeUrl|resumeFormUrl)\b/, 'the execution id ($execution)'],
	[/\$(now|today)\b/, 'the current time ($now / $today)'],
	[/\bDate\s*\.\s*now\b|\bnew\s+Date\b/, 'the current time (Date)'],
	[/\$runIndex\b/, 'the run index ($runIndex)'],
	[/\$randomString\b|\bMath\s*\.\s*random\b|\$uuid\b|crypto\s*\.\s*randomUUID/, 'a random value'],
];

export const GOOD_KEY_HINT =
	'Build the key from the business record and the effect, e.g. {{ $json.order_id }}:charge:v1 ' +
	'(or use "Key From Parts"), so every retry and re-run of the same effect sends the same key.';

export class KeyProblem extends Error {}

function looksLikeEpoch(key: string): boolean {
	const match = EPOCH.exec(key);
	if (!match) return false;
	const value = Number(match[1]);
	const seconds = match[1].length === 13 ? value / 1000 : value;
	return seconds >= EPOCH_MIN_SECONDS && seconds <= EPOCH_MAX_SECONDS;
}

/** Why the key is not a good idempotency key, or '' when it is fine. */
export function keyProblem(key: string, executionId: string, sources: string[] = []): string {
	if (!key) return 'The idempotency key is empty.';
	if (key.length > MAX_KEY_LENGTH) return `The idempotency key is longer than ${MAX_KEY_LENGTH} characters.`;
	if (key.trim() !== key) return 'The idempotency key starts or ends with blanks.';
	if (/[\u0000-\u001f\u007f]/.test(key)) return 'The idempotency key contains control characters.';
	// The server's key rule: printable ASCII only (a Structured Field string), so a key never
	// needs encoding in a header or a URL and looks the same in every log.
	if (/[^\u0020-\u007e]/.test(key)) {
		return 'The idempotency key has a character outside printable ASCII (letters, digits, punctuation and spaces only).';
	}
	if (EMPTY_PART.test(key) || MISSING_VALUE.test(key)) {
		return `The idempotency key "${key}" has an empty part: an expression in it found nothing in this item.`;
	}
	if (executionId && key === executionId) {
		return `The idempotency key "${key}" is this execution's id: a retry or a re-run gets a new execution id, so the key would never repeat.`;
	}
	for (const source of sources) {
		const used = CHANGING_EXPRESSIONS.find(([pattern]) => pattern.test(source));
		if (used) {
			return `The idempotency key "${key}" is built from ${used[1]}, which changes on every run: a retry or a re-run would get a new key and repeat the effect.`;
		}
	}
	if (ALL_DIGITS.test(key)) {
		return `The idempotency key "${key}" is a bare number, like an execution id: it does not say which effect it guards.`;
	}
	if (ISO_DATETIME.test(key) || looksLikeEpoch(key)) {
		return `The idempotency key "${key}" contains a timestamp: a retry a second later would get a new key and repeat the effect.`;
	}
	return '';
}

/**
 * `sources` are the key's parameters as written (before n8n evaluates them): a value cannot
 * tell an order number from an execution id, the expression that made it can.
 */
export function checkKey(key: string, executionId: string, sources: string[] = []): string {
	const problem = keyProblem(key, executionId, sources);
	if (problem) throw new KeyProblem(problem);
	return key;
}

/** `{record}:{action}:v{version}`, the format of the runs/versions issue. */
export function keyFromParts(record: string, action: string, version: number): string {
	const rec = String(record ?? '').trim();
	const act = String(action ?? '').trim();
	if (!rec) throw new KeyProblem('The key part "Record" is empty: name the business record (an order id, a call id).');
	if (!act) throw new KeyProblem('The key part "Action" is empty: name the effect (charge, crm-contact, email).');
	if (act.includes(':')) throw new KeyProblem(`The key part "Action" ("${act}") must not contain ":".`);
	if (!Number.isInteger(version) || version < 1) {
		throw new KeyProblem(`The key part "Version" must be a whole number of at least 1 (got ${version}).`);
	}
	return `${rec}:${act}:v${version}`;
}
