// The n8n community-node rules (eslint-plugin-n8n-nodes-base) on the node, the credential and
// package.json, plus TypeScript parsing. `npm run lint` runs `tsc --noEmit` first.
import tsParser from '@typescript-eslint/parser';
import jsoncParser from 'jsonc-eslint-parser';
import n8nNodesBase from 'eslint-plugin-n8n-nodes-base';

const plugins = { 'n8n-nodes-base': n8nNodesBase };

export default [
	{ ignores: ['dist/**', 'node_modules/**', 'workflows/**', 'scripts/**', 'package-lock.json'] },
	{
		files: ['package.json'],
		languageOptions: { parser: jsoncParser },
		plugins,
		rules: { ...n8nNodesBase.configs.community.rules },
	},
	{
		files: ['credentials/**/*.ts'],
		languageOptions: { parser: tsParser, parserOptions: { sourceType: 'module' } },
		plugins,
		rules: {
			...n8nNodesBase.configs.credentials.rules,
			// "Only applicable to nodes in the main repository" (the rule's own docs): a community
			// credential links to its docs with a full URL, which the community rules check.
			'n8n-nodes-base/cred-class-field-documentation-url-miscased': 'off',
		},
	},
	{
		files: ['nodes/**/*.ts'],
		languageOptions: { parser: tsParser, parserOptions: { sourceType: 'module' } },
		plugins,
		rules: {
			...n8nNodesBase.configs.nodes.rules,
			// Claim has four outputs (Proceed, Replayed, Retry Later, Needs a Human), the other
			// operations one: the outputs are an expression on the operation, which this rule,
			// written for fixed arrays, does not read.
			'n8n-nodes-base/node-class-description-outputs-wrong': 'off',
		},
	},
];
