// Schema check of Kubernetes manifests, offline: every YAML document of every file given must be
// a known apiVersion/kind whose object validates against the Kubernetes API's JSON schema
// (kubernetes-models bundles the schemas as compiled validators), with no unknown field.
//
// Unknown fields: the API's schemas do not forbid additional properties (the API server prunes
// or, with kubectl --validate=strict, rejects them), and the compiled validators carry no schema
// to look them up in. But a compiled validator reads each property its schema defines, by name,
// and enumerates the keys of a map (labels, data, resources). So the object is validated through
// proxies that record what the validator read: in an object it read by name and did not
// enumerate, a key it never read is one the schema does not define. An object the validator
// never looked into is free-form (preserve-unknown-fields) and is not judged.
//   node deploy/validate/validate.mjs FILE.yaml...
// Prints one line per document ("ok FILE: Kind/name") or per problem (FILE:LINE: ...); exits 1
// when any document failed, 2 on a usage error. scripts/validate_manifests.sh runs it.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

// "apps/v1" -> the module of that group version; the core group's "v1" is kubernetes-models/v1.
async function modelsOf(apiVersion) {
  if (!/^([a-z0-9.-]+\/)?v[0-9]+((alpha|beta)[0-9]+)?$/.test(apiVersion)) return null;
  try {
    return await import(`kubernetes-models/${apiVersion}`);
  } catch {
    return null;
  }
}

// A proxy of `value` (deeply) recording, per object, the keys the validator reads and whether it
// enumerates them; each object's record goes into `records` with its JSON path.
function tracked(value, path, records) {
  if (Array.isArray(value)) return value.map((v, i) => tracked(v, `${path}/${i}`, records));
  if (value === null || typeof value !== "object") return value;
  const copy = {};
  for (const [k, v] of Object.entries(value)) copy[k] = tracked(v, `${path}/${k}`, records);
  const record = { path, keys: Object.keys(value), read: new Set(), enumerated: false };
  records.push(record);
  return new Proxy(copy, {
    get(target, key, receiver) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.get(target, key, receiver);
    },
    has(target, key) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.has(target, key);
    },
    ownKeys(target) {
      record.enumerated = true;
      return Reflect.ownKeys(target);
    },
  });
}

function unknownFields(records) {
  const found = [];
  for (const r of records) {
    if (r.enumerated || r.read.size === 0) continue;
    for (const k of r.keys) if (!r.read.has(k)) found.push(`${r.path}/${k}`);
  }
  return found;
}

function lineOf(text, offset) {
  return text.slice(0, offset).split("\n").length;
}

async function checkDocument(file, text, doc) {
  const where = `${file}:${lineOf(text, doc.range?.[0] ?? 0)}`;
  if (doc.errors.length > 0) return [`${where}: YAML: ${doc.errors[0].message}`];
  const obj = doc.toJS();
  if (obj === null || obj === undefined) return [];  // an empty document (a trailing ---)
  if (typeof obj !== "object" || Array.isArray(obj)) return [`${where}: not a mapping`];
  const { apiVersion, kind } = obj;
  if (typeof apiVersion !== "string" || typeof kind !== "string") {
    return [`${where}: apiVersion and kind must be strings (got ${apiVersion}, ${kind})`];
  }
  const models = await modelsOf(apiVersion);
  const Model = models?.[kind];
  if (typeof Model !== "function" || Model.kind !== kind) {
    return [`${where}: no schema for apiVersion '${apiVersion}' kind '${kind}'`];
  }
  const name = obj.metadata?.name;
  if (typeof name !== "string" || name === "") return [`${where}: ${kind} without metadata.name`];
  const records = [];
  try {
    // The prototype's validate runs the compiled validator on `this`: here the tracked object
    // (new Model(obj) would validate a plain copy of it).
    Model.prototype.validate.call(tracked(obj, "", records));
  } catch (e) {
    // The validator's error lists every failed keyword with its JSON path.
    const details = (e.errors ?? []).map((x) => `${x.instancePath || "/"} ${x.message}` +
      (x.params?.additionalProperty ? ` ('${x.params.additionalProperty}')` : ""));
    return [`${where}: ${kind}/${name}: ${details.length ? details.join("; ") : e.message}`];
  }
  const unknown = unknownFields(records);
  if (unknown.length > 0) {
    return [`${where}: ${kind}/${name}: unknown field ${unknown.join(", ")}`];
  }
  console.log(`ok ${file}: ${kind}/${name}`);
  return [];
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node validate.mjs FILE.yaml...");
  process.exit(2);
}
let problems = 0;
for (const file of files) {
  let text;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    console.error(`${file}: cannot read: ${e.message}`);
    problems++;
    continue;
  }
  const docs = parseAllDocuments(text);
  if (!Array.isArray(docs)) {  // an empty stream
    console.error(`${file}: no YAML document`);
    problems++;
    continue;
  }
  for (const doc of docs) {
    for (const p of await checkDocument(file, text, doc)) {
      console.error(p);
      problems++;
    }
  }
}
process.exit(problems > 0 ? 1 : 0);
