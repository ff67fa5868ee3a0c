// Prints one value of a ConfigMap in a manifest file, as the pod will see it mounted:
//   node deploy/validate/configmap_value.mjs FILE.yaml CONFIGMAP_NAME KEY
// (scripts/validate_manifests.sh: haproxy -c on haproxy.yaml's haproxy.cfg). Exits 1 naming what
// is missing.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const [file, name, key] = process.argv.slice(2);
if (!file || !name || !key) {
  console.error("usage: node configmap_value.mjs FILE.yaml CONFIGMAP_NAME KEY");
  process.exit(2);
}
const cm = parseAllDocuments(readFileSync(file, "utf8"))
  .map((d) => d.toJS())
  .find((o) => o?.kind === "ConfigMap" && o.metadata?.name === name);
const value = cm?.data?.[key];
if (typeof value !== "string") {
  console.error(`${file}: no ConfigMap '${name}' with data key '${key}'`);
  process.exit(1);
}
process.stdout.write(value);
