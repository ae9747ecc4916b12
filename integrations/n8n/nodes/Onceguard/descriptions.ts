import type { INodeProperties } from 'n8n-workflow';

const CLAIM_OR_SUBMIT = ['claim', 'submit'];
const HOLDER_OPERATIONS = ['markSent', 'complete', 'fail'];

export const operationProperty: INodeProperties = {
	displayName: 'Operation',
	name: 'operation',
	type: 'options',
	noDataExpression: true,
	default: 'claim',
	options: [
		{
			name: 'Claim',
			value: 'claim',
			description:
				'Claim the key before your workflow performs the effect; branches by the answer (Proceed, Already Done, Failed, Retry Later, Needs a Human)',
			action: 'Claim an idempotency key',
		},
		{
			name: 'Complete',
			value: 'complete',
			description: 'Record the outcome of the effect you performed (provider reference and response)',
			action: 'Complete an operation',
		},
		{
			name: 'Derive Key',
			value: 'deriveKey',
			description:
				'Hash personal data (an e-mail address, a phone number) into a key Onceguard accepts: the same lead always gets the same key',
			action: 'Derive a key from personal data',
		},
		{
			name: 'Fail',
			value: 'fail',
			description: 'Record a failure and its class (transient, invalid input, permission, ambiguous)',
			action: 'Fail an operation',
		},
		{
			name: 'Get Dead-Letter Entries',
			value: 'deadLetterGet',
			description: 'Read DLQ entries by their original key, or the newest ones: one item per entry',
			action: 'Get dead letter entries',
		},
		{
			name: 'Get Operation',
			value: 'get',
			description: 'Read one operation (its status, outcome and attempts)',
			action: 'Get an operation',
		},
		{
			name: 'Mark Sent',
			value: 'markSent',
			description: 'Write the sent marker right before the effect',
			action: 'Mark an operation as sent',
		},
		{
			name: 'Send to Dead-Letter Queue',
			value: 'deadLetter',
			description: 'Store the current item and its error in the DLQ, one entry per item, for replay',
			action: 'Send an item to the dead letter queue',
		},
		{
			name: 'Submit Operation',
			value: 'submit',
			description: 'Hand the effect to Onceguard (execute mode): it calls the provider, retries and reconciles',
			action: 'Submit an operation',
		},
		{
			name: 'Upload File',
			value: 'upload',
			description: "Store the item's file in Onceguard; an intent names it by the key and sha256 this returns",
			action: 'Upload a file',
		},
	],
};

const keyProperties: INodeProperties[] = [
	{
		displayName: 'Key',
		name: 'keySource',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { operation: CLAIM_OR_SUBMIT } },
		default: 'parts',
		options: [
			{
				name: 'From Parts (Record, Action, Version)',
				value: 'parts',
				description: 'The node builds {record}:{action}:v{version}',
			},
			{ name: 'Expression', value: 'key', description: 'Write the whole key yourself' },
		],
	},
	{
		displayName: 'Record',
		name: 'record',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: CLAIM_OR_SUBMIT, keySource: ['parts'] } },
		default: '',
		placeholder: 'e.g. {{ $json.order_id }}',
		description:
			'The business record the effect is about (order ID, call ID, invoice number). Never an execution ID, a timestamp or personal data.',
	},
	{
		displayName: 'Version',
		name: 'version',
		type: 'number',
		typeOptions: { minValue: 1, numberPrecision: 0 },
		displayOptions: { show: { operation: CLAIM_OR_SUBMIT, keySource: ['parts'] } },
		default: 1,
		description: 'Raise it only when you deliberately want the effect to happen again for the same record',
	},
	{
		displayName: 'Idempotency Key',
		name: 'key',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: CLAIM_OR_SUBMIT, keySource: ['key'] } },
		default: '',
		placeholder: 'e.g. {{ $json.order_id }}:charge:v1',
		description: 'Printable ASCII, at most 255 characters, no personal data: keys are logged',
	},
	{
		displayName: 'Provider',
		name: 'provider',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: CLAIM_OR_SUBMIT } },
		default: '',
		placeholder: 'e.g. stripe',
		description: "The provider's slug as configured in Onceguard",
	},
	{
		displayName: 'Action',
		name: 'action',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: CLAIM_OR_SUBMIT } },
		default: '',
		placeholder: 'e.g. charge',
		description: 'The effect: charge, crm-contact, email. Also the key\'s middle part when the key is built from parts.',
	},
];

const claimProperties: INodeProperties[] = [
	{
		displayName: 'Request From',
		name: 'requestSource',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { operation: ['claim'] } },
		default: 'fields',
		options: [
			{
				name: 'Fields of the Item',
				value: 'fields',
				description: 'Name the fields that define the effect; the node copies only those',
			},
			{ name: 'JSON', value: 'json', description: 'Write the request object yourself' },
		],
		description:
			'What defines the effect, e.g. amount and currency. The same key with a different request is refused (422), so leave out what changes between retries (timestamps, execution data).',
	},
	{
		displayName: 'Request Fields',
		name: 'requestFields',
		type: 'string',
		displayOptions: { show: { operation: ['claim'], requestSource: ['fields'] } },
		default: '',
		placeholder: 'e.g. amount, currency, order.number',
		description: 'Comma-separated field names (dot paths allowed) read from the incoming item',
		hint: 'Only what defines the effect: the same key with other values here is refused as a reused key',
	},
	{
		displayName: 'Request (JSON)',
		name: 'requestJson',
		type: 'json',
		displayOptions: { show: { operation: ['claim'], requestSource: ['json'] } },
		default: '{}',
	},
	{
		displayName: 'Store the Item as Payload',
		name: 'sendPayload',
		type: 'boolean',
		displayOptions: { show: { operation: CLAIM_OR_SUBMIT } },
		default: true,
		description:
			'Whether to store the incoming item with the operation (encrypted, masked in the console), so a reviewer or a replay has the data',
	},
];

const submitProperties: INodeProperties[] = [
	{
		displayName: 'Send',
		name: 'submitAs',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { operation: ['submit'] } },
		default: 'request',
		options: [
			{
				name: 'Request',
				value: 'request',
				description: "The provider's request: method, path below its base URL, body",
			},
			{
				name: 'Intent',
				value: 'intent',
				description:
					"The fields the provider's intent schema declares; Onceguard renders the provider's request from its template",
			},
		],
	},
	{
		displayName: 'Intent (JSON)',
		name: 'intent',
		type: 'json',
		required: true,
		displayOptions: { show: { operation: ['submit'], submitAs: ['intent'] } },
		default: '{}',
		description:
			'The declared fields only: unknown ones and values outside an enum are refused, never rounded. An upload field source is sent as source_key and source_sha256 (the key and sha256 Upload File returns).',
	},
	{
		displayName: 'Method',
		name: 'method',
		type: 'options',
		displayOptions: { show: { operation: ['submit'], submitAs: ['request'] } },
		default: 'POST',
		options: [
			{ name: 'DELETE', value: 'DELETE' },
			{ name: 'GET', value: 'GET' },
			{ name: 'PATCH', value: 'PATCH' },
			{ name: 'POST', value: 'POST' },
			{ name: 'PUT', value: 'PUT' },
		],
	},
	{
		displayName: 'Path',
		name: 'path',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: ['submit'], submitAs: ['request'] } },
		default: '',
		placeholder: 'e.g. /charges',
		description: "Relative to the provider's base URL (it can never name another host)",
	},
	{
		displayName: 'Body (JSON)',
		name: 'body',
		type: 'json',
		displayOptions: { show: { operation: ['submit'], submitAs: ['request'] } },
		default: '{}',
	},
	{
		displayName: 'Wait Here Up To (Seconds)',
		name: 'waitSeconds',
		type: 'number',
		typeOptions: { minValue: 0 },
		displayOptions: { show: { operation: ['submit'], '@version': [2] } },
		default: 0,
		description:
			'0: an operation in flight comes out of In Flight at once (wait for the callback with a Wait node). More: this node asks Onceguard until the operation finishes; past this many seconds it fails (use the error output). A finished one always comes out at once.',
	},
	{
		displayName: 'Callback URL',
		name: 'callbackUrl',
		type: 'string',
		displayOptions: { show: { operation: ['submit'] } },
		default: '',
		placeholder: 'e.g. {{ $execution.resumeUrl }}',
		description:
			"Onceguard POSTs the finished operation here (signed). Use a Wait node's resume URL to continue the workflow when the operation finishes; the tenant's callback allow-list must name the n8n host.",
	},
];

const uploadProperties: INodeProperties[] = [
	{
		displayName: 'Input Binary Field',
		name: 'binaryPropertyName',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: ['upload'] } },
		default: 'data',
		hint: 'The name of the input binary field containing the file to be uploaded',
		description:
			'PNG, JPEG, WebP or GIF, at most 10 MiB by default: Onceguard recognises the type from the content (415 otherwise)',
	},
];

const holderProperties: INodeProperties[] = [
	{
		displayName: 'Operation ID',
		name: 'operationId',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: [...HOLDER_OPERATIONS, 'get'] } },
		default: '={{ $json.onceguard.operation_id }}',
		description: 'The ID of the operation the Claim returned',
	},
	{
		displayName: 'Lease Token',
		name: 'leaseToken',
		type: 'string',
		typeOptions: { password: true },
		required: true,
		displayOptions: { show: { operation: HOLDER_OPERATIONS } },
		default: '={{ $json.onceguard.lease_token }}',
		description: 'The lease token the Claim returned (proves this execution still holds the operation)',
	},
	{
		displayName: 'Provider Reference',
		name: 'providerRef',
		type: 'string',
		displayOptions: { show: { operation: ['complete'] } },
		default: '={{ $json.id }}',
		description: "The provider's ID of what it created (charge ID, contact ID)",
	},
	{
		displayName: 'Response (JSON)',
		name: 'response',
		type: 'json',
		displayOptions: { show: { operation: ['complete'] } },
		default: '={{ $json }}',
		description: 'What later claims of the same key get back as the recorded outcome',
	},
	{
		displayName: 'Error Class',
		name: 'errorClass',
		type: 'options',
		displayOptions: { show: { operation: ['fail'], '@version': [2] } },
		default: 'auto',
		hint: 'After Mark Sent the effect may have happened: only choose Transient when you know it was not sent',
		options: [
			{
				name: 'Ambiguous (Sent, No Answer Seen)',
				value: 'ambiguous',
				description: 'Timeout or dropped connection after sending, 5xx: the outcome is unknown and gets reconciled',
			},
			{
				name: 'By the Sent Marker',
				value: 'auto',
				description:
					'Outcome unknown (ambiguous: reconciled or reviewed) once Mark Sent ran, else transient (retried)',
			},
			{
				name: 'Invalid Input',
				value: 'invalid_input',
				description: 'The provider refused the request (400, 402, 404, 422): no retry',
			},
			{ name: 'Permission', value: 'permission', description: '401/403, expired credentials: no retry' },
			{
				name: 'Transient (Not Sent, or Refused Before Acting)',
				value: 'transient',
				description: 'Refused before sending, 408, 429, 503: a retry is scheduled',
			},
		],
	},
	{
		displayName: 'Error Class',
		name: 'errorClass',
		type: 'options',
		displayOptions: { show: { operation: ['fail'], '@version': [1] } },
		default: 'transient',
		options: [
			{
				name: 'Ambiguous (Sent, No Answer Seen)',
				value: 'ambiguous',
				description: 'Timeout or dropped connection after sending, 5xx: the outcome is unknown and gets reconciled',
			},
			{
				name: 'Invalid Input',
				value: 'invalid_input',
				description: 'The provider refused the request (400, 402, 404, 422): no retry',
			},
			{ name: 'Permission', value: 'permission', description: '401/403, expired credentials: no retry' },
			{
				name: 'Transient (Not Sent, or Refused Before Acting)',
				value: 'transient',
				description: 'Refused before sending, 408, 429, 503: a retry is scheduled',
			},
		],
	},
	{
		displayName: 'Message',
		name: 'message',
		type: 'string',
		displayOptions: { show: { operation: ['fail'] } },
		default: '',
		description: 'Short and without personal data: operators read it',
	},
];

const deadLetterProperties: INodeProperties[] = [
	{
		displayName: 'Payload',
		name: 'payloadSource',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { operation: ['deadLetter'] } },
		default: 'item',
		options: [
			{
				name: 'The Current Item',
				value: 'item',
				description: 'The item as it arrived, without its error field: what a replay sends again',
			},
			{ name: 'JSON', value: 'json', description: 'Write the payload yourself' },
		],
	},
	{
		displayName: 'Payload (JSON)',
		name: 'payloadJson',
		type: 'json',
		displayOptions: { show: { operation: ['deadLetter'], payloadSource: ['json'] } },
		default: '={{ $json }}',
	},
	{
		displayName: 'Original Key',
		name: 'dlqKey',
		type: 'string',
		displayOptions: { show: { operation: ['deadLetter'] } },
		default: "={{ $json.onceguard?.key ?? '' }}",
		placeholder: 'e.g. {{ $json.customFields.call_id }}:crm-contact:v1',
		description:
			"The idempotency key of the failed effect: a replay sends it again in the target's idempotency header, so the receiver dedups against the first try",
	},
	{
		displayName: 'Error Message',
		name: 'errorMessage',
		type: 'string',
		displayOptions: { show: { operation: ['deadLetter'] } },
		default: '',
		description: "Leave empty to use the item's error (what a node's error output adds to the item)",
	},
	{
		displayName: 'Error Class',
		name: 'dlqErrorClass',
		type: 'options',
		displayOptions: { show: { operation: ['deadLetter'] } },
		default: 'auto',
		options: [
			{ name: 'Ambiguous', value: 'ambiguous' },
			{ name: 'From the Error (HTTP Status or Network Code)', value: 'auto' },
			{ name: 'Invalid Input', value: 'invalid_input' },
			{ name: 'Permission', value: 'permission' },
			{ name: 'Transient', value: 'transient' },
		],
	},
	{
		displayName: 'Replay Target',
		name: 'replayTarget',
		type: 'string',
		displayOptions: { show: { operation: ['deadLetter'] } },
		default: '',
		placeholder: 'e.g. n8n-retry',
		description: "Slug of the replay target (empty: the tenant's default)",
	},
];

const deadLetterGetProperties: INodeProperties[] = [
	{
		displayName: 'Original Key',
		name: 'dlqLookupKey',
		type: 'string',
		displayOptions: { show: { operation: ['deadLetterGet'] } },
		default: '',
		placeholder: 'e.g. call_7f3c2a9e41b04d6f:crm-contact:v1',
		description: 'Every entry of this key, newest first; empty: the newest entries',
	},
	{
		displayName: 'Status',
		name: 'dlqStatus',
		type: 'options',
		displayOptions: { show: { operation: ['deadLetterGet'] } },
		default: '',
		options: [
			{ name: 'Any', value: '' },
			{ name: 'Discarded', value: 'discarded' },
			{ name: 'Pending', value: 'pending' },
			{ name: 'Replayed', value: 'replayed' },
			{ name: 'Replaying', value: 'replaying' },
			{ name: 'Resolved', value: 'resolved' },
		],
	},
	{
		displayName: 'Limit',
		name: 'dlqLimit',
		type: 'number',
		typeOptions: { minValue: 1, maxValue: 500 },
		displayOptions: { show: { operation: ['deadLetterGet'] } },
		default: 50,
		description: 'Max number of results to return',
	},
];

// Keys may not carry personal data (the server refuses them): Onceguard hashes it into one. The
// node holds no secret; the server's derivation key never rotates, so the key is stable.
const deriveKeyProperties: INodeProperties[] = [
	{
		displayName: 'Hash',
		name: 'deriveSource',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { operation: ['deriveKey'] } },
		default: 'value',
		options: [
			{ name: 'One Value', value: 'value', description: 'An e-mail address or a phone number, written as an expression' },
			{ name: 'Fields of the Item', value: 'fields', description: 'Several fields of the item, hashed together' },
		],
	},
	{
		displayName: 'Value',
		name: 'deriveValue',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: ['deriveKey'], deriveSource: ['value'] } },
		default: '',
		placeholder: 'e.g. {{ $json.email.trim().toLowerCase() }}',
		hint: 'Normalise it (trim, lowercase an address): the same lead must give the same value',
		description: 'Sent to Onceguard to be hashed; never stored or logged there',
	},
	{
		displayName: 'Fields',
		name: 'deriveFields',
		type: 'string',
		required: true,
		displayOptions: { show: { operation: ['deriveKey'], deriveSource: ['fields'] } },
		default: '',
		placeholder: 'e.g. email, list_id',
		description: 'Comma-separated names (dotted paths) of the item fields to hash together; strings or whole numbers',
	},
	{
		displayName: 'Key Prefix',
		name: 'derivePrefix',
		type: 'string',
		displayOptions: { show: { operation: ['deriveKey'] } },
		default: '',
		placeholder: 'e.g. lead',
		description: 'Put in front of the key in clear (lead gives lead:h1:…); letters, digits, dot, underscore and hyphen',
	},
];

export const optionsProperty: INodeProperties = {
	displayName: 'Options',
	name: 'options',
	type: 'collection',
	placeholder: 'Add Option',
	default: {},
	options: [
		{
			displayName: 'Check Key',
			name: 'checkKey',
			type: 'boolean',
			default: true,
			description:
				'Whether to refuse keys that contain an execution ID or a timestamp before calling Onceguard (they change on every retry, so they dedup nothing)',
		},
		{
			displayName: 'Correlation ID',
			name: 'correlationId',
			type: 'string',
			default: '',
			description: 'Your own ID tying this operation to a request or a trace (searchable; no personal data)',
		},
		{
			displayName: 'Deadline (Seconds)',
			name: 'deadlineSeconds',
			type: 'number',
			typeOptions: { minValue: 0 },
			default: 0,
			description: 'Submit Operation: give up (and not act) after this long; 0 = the provider\'s lifetime',
		},
		{
			displayName: 'Event ID',
			name: 'eventId',
			type: 'string',
			default: '',
			description:
				'Send to Dead-Letter Queue: the entry\'s identity. Default: n8n:{workflow}:{execution}:{node}:{item index}, one entry per item.',
		},
		{
			displayName: 'Lease (Seconds)',
			name: 'leaseSeconds',
			type: 'number',
			typeOptions: { minValue: 0 },
			default: 0,
			description: 'Claim: how long this execution holds the key; 0 = the server default (60 s)',
		},
		{
			displayName: 'Put Result in Field',
			name: 'resultField',
			type: 'string',
			default: 'onceguard',
			description: "The field of the outgoing item that gets Onceguard's answer; the item's own fields are kept",
		},
		{
			displayName: 'Reconciliation Handle',
			name: 'reconciliationHandle',
			type: 'string',
			default: '',
			description: 'A reference the provider can be searched by, when it cannot be searched by the key',
		},
		{
			displayName: 'Response Status',
			name: 'responseStatus',
			type: 'number',
			default: 0,
			description: 'Complete or Fail: the HTTP status the provider answered; 0 = not sent',
		},
		{
			displayName: 'Retry After (Seconds)',
			name: 'retryAfterSeconds',
			type: 'number',
			typeOptions: { minValue: 0 },
			default: 0,
			description: "Fail (transient): the provider's Retry-After; 0 = not sent",
		},
		{
			displayName: 'Uses Sent Marker',
			name: 'usesSentMarker',
			type: 'boolean',
			default: false,
			description:
				'Whether this workflow always runs Mark Sent before the effect. Then a claim whose lease ran out before the marker is known not to have been sent, and is retried instead of reconciled.',
		},
	],
};

export const nodeProperties: INodeProperties[] = [
	operationProperty,
	...keyProperties,
	...claimProperties,
	...submitProperties,
	...uploadProperties,
	...holderProperties,
	...deadLetterProperties,
	...deadLetterGetProperties,
	...deriveKeyProperties,
	optionsProperty,
];
