// The two functions of Node's `crypto` the trace helpers use (./trace.ts). The package does not
// depend on @types/node (n8n provides the runtime), so they are declared here.
declare module 'crypto' {
	interface Digest {
		update(data: string): Digest;
		digest(encoding: 'hex'): string;
	}
	export function createHash(algorithm: string): Digest;
	export function randomBytes(size: number): { toString(encoding: 'hex'): string };
}
