import type { IAuthenticateGeneric, ICredentialTestRequest, ICredentialType, INodeProperties } from 'n8n-workflow';

export class OnceguardApi implements ICredentialType {
	name = 'onceguardApi';

	displayName = 'Onceguard API';

	icon = 'file:../icons/onceguard.svg' as const;

	documentationUrl = 'https://onceguard.invalid/docs/n8n#create-the-credential';

	properties: INodeProperties[] = [
		{
			displayName: 'Base URL',
			name: 'baseUrl',
			type: 'string',
			default: 'http://127.0.0.1:8000',
			placeholder: 'e.g. https://onceguard.example.com',
			description: 'Where Onceguard answers, without /api/v1',
			required: true,
		},
		{
			displayName: 'API Key',
			name: 'apiKey',
			type: 'string',
			typeOptions: { password: true },
			default: '',
			description: 'A tenant API key (manage.py apikey_create) with the read and write scopes',
			required: true,
		},
	];

	authenticate: IAuthenticateGeneric = {
		type: 'generic',
		properties: {
			headers: {
				Authorization: '=Bearer {{$credentials.apiKey}}',
			},
		},
	};

	// A read that needs a valid key and changes nothing: one page of one key's operations.
	test: ICredentialTestRequest = {
		request: {
			baseURL: '={{$credentials.baseUrl.replace(/\\/+$/, "")}}',
			url: '/api/v1/operations',
			qs: { key: 'n8n-credential-test' },
			method: 'GET',
		},
	};
}
