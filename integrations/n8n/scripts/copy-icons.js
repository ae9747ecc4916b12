// tsc compiles the TypeScript only; n8n reads each node's and credential's SVG icon from
// beside its compiled file (the `file:` icon path is relative to the .js in dist/).
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
let copied = 0;
for (const folder of ['icons', 'nodes', 'credentials']) {
  const stack = [path.join(root, folder)];
  while (stack.length) {
    const dir = stack.pop();
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const source = path.join(dir, entry.name);
      if (entry.isDirectory()) {
        stack.push(source);
      } else if (/\.(svg|png|json)$/.test(entry.name)) {
        const target = path.join(root, 'dist', path.relative(root, source));
        fs.mkdirSync(path.dirname(target), { recursive: true });
        fs.copyFileSync(source, target);
        copied += 1;
      }
    }
  }
}
console.log(`copy-icons: ${copied} file(s) copied into dist/`);
