// A plancache client written from the contract alone (the .proto, its
// comments, docs/canonical-form.md and the key vectors), in JavaScript with
// Node's crypto: no code shared with the Python client. It checks
//   1. keys: every vector's canonical bytes (RFC 8785), spec hash, options id,
//      target id and plan key, recomputed here;
//   2. (with --server) Compile, GetPlan and Prefetch of every example: the key
//      it computes is the server's, each plan's signature verifies over the
//      envelope documented on PlanSignature, the blob matches its sha256;
//   3. (with --server) rich errors: NOT_FOUND, TargetUnavailable and
//      CompileFailed told apart by google.rpc.ErrorInfo's reason; and
//      GetSigningKeys: key ids, fingerprints and endorsements recomputed
//      from the PEMs (results.signing_keys);
//   4. (with --catalog) the whole graph API: a normalizer for specs made of
//      ops whose catalog entry says "rules": "frontend", written from
//      docs/canonical-form.md and catalog.json alone; it builds a
//      layernorm_backward and an rmsnorm_backward graph itself and computes
//      their spec hashes and keys (results.frontend_ops); with --server it
//      compiles the first (the server's key must be the one computed here)
//      and sends bad specs for new ops, each of which must be refused with
//      INVALID_ARGUMENT / SpecError naming the node (results.refusals).
// It prints one JSON document (results) and exits 1 when a check fails.
//
//   node conformance.mjs --vectors FILE --proto-dir DIR --googleapis DIR
//        [--catalog FILE] [--server HOST:PORT --public-key PEM --target JSON]

import { createHash, createPublicKey, verify as verifySignature } from "node:crypto";
import { readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const { values: args } = parseArgs({
  options: {
    vectors: { type: "string" },
    "proto-dir": { type: "string" },
    googleapis: { type: "string" },
    server: { type: "string" },
    "public-key": { type: "string" },
    target: { type: "string" },
    catalog: { type: "string" },
  },
});

const results = { keys: [], frontend_ops: [], live: [], errors: {}, refusals: {}, signing_keys: [], failures: [] };
const fail = (what) => results.failures.push(what);
const sha256hex = (bytes) => createHash("sha256").update(bytes).digest("hex");

// ---- RFC 8785 (JCS) -----------------------------------------------------------
// JSON.stringify already writes numbers and strings as JCS requires
// (ECMAScript Number-to-String; minimal escapes); JCS adds member order by
// UTF-16 code units, which is JavaScript's default string comparison.
function jcs(value) {
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value)) throw new Error(`${value} is not a JSON number`);
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(jcs).join(",")}]`;
  const names = Object.keys(value).sort();
  return `{${names.map((n) => `${JSON.stringify(n)}:${jcs(value[n])}`).join(",")}}`;
}

// ---- ids ------------------------------------------------------------------------------
const slug = (text) => text.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "");

function targetId(t) {
  const parts = [t.compute_capability, `cudnn-${t.cudnn_version}`, `fe-${t.frontend_version}`];
  if (t.device_name) parts.push(`dev-${slug(t.device_name)}`);
  if (Number(t.sm_count)) parts.push(`sms-${Number(t.sm_count)}`);
  return parts.join("/");
}

function normalizedOptions(o = {}) {
  const modes = [...new Set((o.heuristic_modes ?? []).map((m) => m.toUpperCase()))];
  return {
    autotune: o.autotune ?? true,
    heuristic_modes: modes.length ? modes : ["A", "FALLBACK"],
    workspace_limit: Number(o.workspace_limit ?? 0),
    excluded_behavior_notes: [...(o.excluded_behavior_notes ?? [])],
  };
}

const optionsId = (o) => `opt-${sha256hex(jcs(normalizedOptions(o))).slice(0, 16)}`;

// ---- 1. keys -------------------------------------------------------------------
const vectors = JSON.parse(readFileSync(args.vectors, "utf8"));
if (targetId(vectors.target) !== vectors.target.id) fail(`target id ${targetId(vectors.target)} != ${vectors.target.id}`);
for (const c of vectors.cases) {
  const canonical = jcs(c.canonical);
  const reparsed = jcs(JSON.parse(c.canonical_bytes));
  const specHash = sha256hex(Buffer.from(canonical, "utf8"));
  const row = { name: c.name, canonical_matches: canonical === c.canonical_bytes, reparsed_matches: reparsed === c.canonical_bytes, spec_hash: specHash, keys: [] };
  if (!row.canonical_matches) fail(`${c.name}: canonical bytes differ`);
  if (!row.reparsed_matches) fail(`${c.name}: canonical bytes do not survive a parse and re-serialization`);
  if (specHash !== c.spec_hash) fail(`${c.name}: spec hash ${specHash} != ${c.spec_hash}`);
  for (const k of c.keys) {
    const key = `${specHash}/${targetId(vectors.target)}/${optionsId(k.options)}`;
    row.keys.push(key);
    if (jcs(normalizedOptions(k.options)) !== k.options_canonical) fail(`${c.name}: options canonical bytes differ`);
    if (key !== k.key) fail(`${c.name}: key ${key} != ${k.key}`);
  }
  results.keys.push(row);
}

// ---- 4. the whole graph API: ops with "rules": "frontend" ------------------------
// A normalizer written from docs/canonical-form.md ("The whole graph API:
// catalog.json") and catalog.json: for specs whose every node is an op the
// catalog marks "rules": "frontend" (plus graph inputs). Specs are "as
// written" (the vectors' `spec` field: data type names, numbers).
class SpecError extends Error {}

const MAX_UID = 2 ** 53;
const DTYPE_ALIASES = { fp16: "half", float16: "half", bf16: "bfloat16", fp32: "float", float32: "float" };
const isInt = (v) => typeof v === "number" && Number.isInteger(v);
const rowMajor = (dim) => dim.map((_, i) => dim.slice(i + 1).reduce((a, b) => a * b, 1));

function dataType(catalog, name, where) {
  if (typeof name !== "string") throw new SpecError(`${where}: data type ${JSON.stringify(name)} is not a name`);
  const lower = name.toLowerCase();
  const canonical = DTYPE_ALIASES[lower] ?? lower;
  if (!catalog.data_types.includes(canonical)) throw new SpecError(`${where}: unknown data type ${JSON.stringify(name)}`);
  return canonical;
}

function intList(value, where, { positive = false } = {}) {
  if (!Array.isArray(value) || !value.every(isInt)) throw new SpecError(`${where}: ${JSON.stringify(value)} is not a list of integers`);
  if (positive && !value.every((d) => d >= 1)) throw new SpecError(`${where}: ${JSON.stringify(value)}: every dim must be >= 1`);
  return [...value];
}

// output_presence: which outputs a node produces.
function present(rule, attributes, ports) {
  if ("all" in rule) return rule.all.every((r) => present(r, attributes, ports));
  if ("input" in rule) return ports.has(rule.input);
  if ("param_not_false" in rule) return attributes[rule.param_not_false] !== false;
  if ("param_truthy" in rule) return Boolean(attributes[rule.param_truthy]);
  if ("param_is" in rule) return String(attributes[rule.param_is[0]] ?? "").toUpperCase() === rule.param_is[1];
  if ("param_not" in rule) return String(attributes[rule.param_not[0]] ?? "").toUpperCase() !== rule.param_not[1];
  throw new SpecError(`output presence rule ${JSON.stringify(rule)} is not implemented by this client`);
}

// output_dims: needed only where the op pushes its outputs' dims.
function ruleDims(rule, inputDims, attributes) {
  if ("like" in rule) return inputDims[rule.like]?.length ? [...inputDims[rule.like]] : null;
  if ("fixed" in rule) return [...rule.fixed];
  if ("permute" in rule) {
    const source = inputDims[rule.permute];
    const by = attributes[rule.by];
    return source && by ? by.map((axis) => source[axis]) : null;
  }
  if ("stats_like" in rule) {
    const source = inputDims[rule.stats_like];
    return source ? source.map((d, i) => (rule.keep.includes(i) ? d : 1)) : null;
  }
  throw new SpecError(`output dims rule ${JSON.stringify(rule)} is not implemented by this client`);
}

function attributeValue(spec, value, where, catalog) {
  const bad = (what) => new SpecError(`${where}: ${JSON.stringify(value)} is not ${what}`);
  switch (spec.kind) {
    case "bool":
      if (typeof value !== "boolean") throw bad("a bool");
      return value;
    case "int":
      if (!isInt(value)) throw bad("an integer");
      return value;
    case "float":
      if (typeof value !== "number" || !Number.isFinite(value)) throw bad("a number");
      return value;
    case "string":
      if (typeof value !== "string") throw bad("a string");
      return value;
    case "enum": {
      // Member names; the normal form writes them as the catalog spells them.
      const choices = spec.choices ?? catalog.enums[spec.enum];
      const member = typeof value === "string" ? choices.find((c) => c === value.toUpperCase()) : undefined;
      if (member === undefined) throw bad(`one of ${choices.join(", ")}`);
      return member;
    }
    case "int_list":
      if (!Array.isArray(value) || !value.every(isInt)) throw bad("a list of integers");
      return [...value];
    case "slices":
      if (!Array.isArray(value) || !value.every((s) => Array.isArray(s) && s.length === 3 && s.every((b) => b === null || isInt(b)))) throw bad("a list of [start, stop, step]");
      return value.map((s) => [...s]);
    case "scalar":
      if (typeof value !== "boolean" && (typeof value !== "number" || !Number.isFinite(value))) throw bad("a bool or a number");
      return value;
    default:
      throw new SpecError(`${where}: attribute kind ${spec.kind} is not implemented by this client`);
  }
}

// Members this normalizer handles; the others (graph arguments such as
// sm_count, ragged tensors, reordering_type, constants ...) change the key, so
// a spec using them is refused here rather than hashed wrongly.
const GRAPH_MEMBERS = new Set(["name", "io_data_type", "intermediate_data_type", "compute_data_type", "tensors", "nodes"]);
const TENSOR_MEMBERS = new Set(["uid", "name", "dim", "stride", "data_type", "is_virtual", "is_pass_by_value", "is_output", "scalar_value"]);
const NODE_MEMBERS = new Set(["name", "op", "inputs", "outputs", "attributes", "compute_data_type"]);

function normalizeFrontendSpec(spec, catalog) {
  const unhandled = (object, known, where) => {
    const extra = Object.keys(object).filter((k) => !known.has(k) && object[k] != null);
    if (extra.length) throw new SpecError(`${where}: ${extra.join(", ")} not implemented by this client`);
  };
  unhandled(spec, GRAPH_MEMBERS, "graph");
  (spec.tensors ?? []).forEach((t, i) => unhandled(t, TENSOR_MEMBERS, `tensor ${i}`));
  (spec.nodes ?? []).forEach((n, i) => unhandled(n, NODE_MEMBERS, `node ${i} (${n.name || n.op})`));
  const graph = {
    io_data_type: spec.io_data_type == null ? null : dataType(catalog, spec.io_data_type, "graph io_data_type"),
    intermediate_data_type: dataType(catalog, spec.intermediate_data_type ?? "float", "graph intermediate_data_type"),
    compute_data_type: dataType(catalog, spec.compute_data_type ?? "float", "graph compute_data_type"),
  };
  // Tensors: uids (absent: the smallest free positive one, in tensor order).
  const declared = (spec.tensors ?? []).map((t, i) => ({ ...t, where: `tensor ${i}${t.name ? ` (${t.name})` : ""}` }));
  const taken = new Set();
  for (const t of declared) {
    if (t.uid === undefined || t.uid === null) continue;
    if (!isInt(t.uid) || Math.abs(t.uid) > MAX_UID) throw new SpecError(`${t.where}: uid ${JSON.stringify(t.uid)} is not an integer of magnitude at most 2^53`);
    if (taken.has(t.uid)) throw new SpecError(`${t.where}: uid ${t.uid} is used twice`);
    taken.add(t.uid);
  }
  let candidate = 1;
  for (const t of declared) {
    if (t.uid !== undefined && t.uid !== null) continue;
    while (taken.has(candidate)) candidate += 1;
    t.uid = candidate;
    taken.add(candidate);
  }
  const byUid = new Map(declared.map((t) => [t.uid, t]));
  const producer = new Map(); // uid -> node index
  (spec.nodes ?? []).forEach((n, i) => Object.values(n.outputs ?? {}).forEach((uid) => producer.set(uid, i)));

  const readers = new Map(); // uid -> the nodes reading it, for messages
  (spec.nodes ?? []).forEach((n, i) => Object.values(n.inputs ?? {}).forEach((uid) => readers.set(uid, [...(readers.get(uid) ?? []), `node ${i} (${n.name || n.op})`])));
  const tensors = new Map(); // uid -> normalized tensor
  for (const t of declared) {
    const readBy = readers.has(t.uid) ? ` (read by ${readers.get(t.uid).join(", ")})` : "";
    if (!readers.has(t.uid) && !producer.has(t.uid)) throw new SpecError(`${t.where}: declared but no node uses it`);
    if (t.dim !== undefined) intList(t.dim, `${t.where}${readBy} dim`, { positive: true });
    if (t.stride !== undefined) intList(t.stride, `${t.where} stride`);
    if (t.dim && t.stride?.length && t.stride.length !== t.dim.length) throw new SpecError(`${t.where}: ${t.stride.length} strides for ${t.dim.length} dims`);
    const passByValue = Boolean(t.is_pass_by_value);
    const isResult = producer.has(t.uid);
    const isOutput = Boolean(t.is_output);
    const isVirtual = isResult ? !isOutput : false;
    if (!isResult && isOutput) throw new SpecError(`${t.where}: marked as an output but no node produces it`);
    if (!isResult && !t.dim?.length) throw new SpecError(`${t.where}: a graph input needs its dims`);
    let type;
    if (t.data_type != null) type = dataType(catalog, t.data_type, t.where);
    else if (isVirtual) type = graph.intermediate_data_type;
    else if (passByValue) type = "float";
    else if (graph.io_data_type) type = graph.io_data_type;
    else throw new SpecError(`${t.where}: no data type and the graph has no io_data_type`);
    tensors.set(t.uid, {
      uid: t.uid,
      dim: t.dim ? [...t.dim] : [],
      stride: t.stride?.length ? [...t.stride] : isResult ? [] : rowMajor(t.dim),
      data_type: type,
      is_virtual: isVirtual,
      is_pass_by_value: passByValue,
      is_output: isOutput,
      scalar_value: passByValue && typeof t.scalar_value === "number" ? t.scalar_value : null,
    });
  }

  const produced = new Set(); // uids produced so far
  const nodes = (spec.nodes ?? []).map((n, index) => {
    const where = `node ${index} (${n.name || n.op})`;
    const op = catalog.ops[n.op];
    if (!op) throw new SpecError(`${where}: unknown op ${JSON.stringify(n.op)}`);
    if (op.rules !== "frontend") throw new SpecError(`${where}: op ${n.op} follows the classic rules, which this client leaves to the server`);
    // Ports.
    const inputs = n.inputs ?? {};
    const listPort = (port) => op.list_inputs.find((p) => new RegExp(`^${p}_(0|[1-9][0-9]*)$`).test(port));
    for (const [port, uid] of Object.entries(inputs)) {
      if (!op.inputs.includes(port) && !op.optional_inputs.includes(port) && !listPort(port)) throw new SpecError(`${where}: ${n.op} has no input port ${JSON.stringify(port)}`);
      const t = tensors.get(uid);
      if (!t) throw new SpecError(`${where}: input ${port} refers to uid ${JSON.stringify(uid)}, which no tensor has`);
      if (producer.has(uid) && !produced.has(uid)) throw new SpecError(`${where}: input ${port} (uid ${uid}) is produced by a later node`);
    }
    for (const port of op.inputs) if (!(port in inputs)) throw new SpecError(`${where}: ${n.op} needs its ${port} port`);
    for (const p of op.list_inputs) {
      const given = Object.keys(inputs).filter((port) => listPort(port) === p).map((port) => Number(port.slice(p.length + 1))).sort((a, b) => a - b);
      if (given.some((k, i) => k !== i)) throw new SpecError(`${where}: list port ${p} is not numbered ${p}_0, ${p}_1, ... in order`);
    }
    // Attributes: kinds checked, required ones present, defaults filled.
    const attributes = {};
    for (const [name, value] of Object.entries(n.attributes ?? {})) {
      const a = op.attributes[name];
      if (!a) throw new SpecError(`${where}: ${n.op} has no attribute ${JSON.stringify(name)}`);
      attributes[name] = attributeValue(a, value, `${where} attribute ${name}`, catalog);
    }
    for (const [name, a] of Object.entries(op.attributes)) {
      if (name in attributes) continue;
      if (a.required) throw new SpecError(`${where}: ${n.op} needs its ${name} attribute`);
      if ("default" in a) attributes[name] = a.default;
    }
    // Outputs: exactly those the presence rules give.
    const ports = new Set(Object.keys(inputs));
    const outputsGiven = n.outputs ?? {};
    for (const port of Object.keys(outputsGiven)) {
      if (op.given_outputs.includes(port)) throw new SpecError(`${where}: given output ${port} is not implemented by this client`);
      if (!op.outputs.includes(port)) throw new SpecError(`${where}: ${n.op} has no output ${JSON.stringify(port)}`);
      const rule = op.output_presence[port];
      if (rule && !present(rule, attributes, ports)) throw new SpecError(`${where}: ${n.op} does not produce ${port} with these inputs and attributes`);
    }
    for (const port of op.outputs) {
      const rule = op.output_presence[port];
      if ((!rule || present(rule, attributes, ports)) && !(port in outputsGiven)) throw new SpecError(`${where}: ${n.op} produces ${port}, which the spec does not name`);
    }
    const inputDims = Object.fromEntries(Object.entries(inputs).map(([port, uid]) => [port, tensors.get(uid).dim]));
    for (const [port, uid] of Object.entries(outputsGiven)) {
      const t = tensors.get(uid);
      if (!t) throw new SpecError(`${where}: output ${port} refers to uid ${JSON.stringify(uid)}, which no tensor has`);
      if (produced.has(uid) || producer.get(uid) !== index) throw new SpecError(`${where}: output ${port} (uid ${uid}) is produced twice`);
      if (op.pushes_output_dims && !t.dim.length) {
        const dims = op.output_dims[port] && ruleDims(op.output_dims[port], inputDims, attributes);
        if (!dims) throw new SpecError(`${where}: ${n.op} needs the dims of ${port}: neither given nor inferred`);
        t.dim = dims;
      }
      if (op.pushes_output_strides && !t.stride.length && t.dim.length) t.stride = rowMajor(t.dim);
    }
    Object.values(outputsGiven).forEach((uid) => produced.add(uid));
    const compute = n.compute_data_type != null ? dataType(catalog, n.compute_data_type, where) : op.takes_compute_type ? graph.compute_data_type : null;
    return { op: n.op, inputs: { ...inputs }, outputs: { ...outputsGiven }, attributes, compute_data_type: compute };
  });
  return { graph, tensors, nodes };
}

// The canonical structure (docs/canonical-form.md section 1) of a normalized spec.
function canonicalStructure({ graph, tensors, nodes }) {
  const names = new Map(); // virtual uid -> "v<k>", by first mention
  const name = (uid) => {
    if (!tensors.get(uid).is_virtual) return uid;
    if (!names.has(uid)) names.set(uid, `v${names.size}`);
    return names.get(uid);
  };
  const canonicalNodes = nodes.map((n) => ({
    op: n.op,
    inputs: Object.fromEntries(Object.entries(n.inputs).map(([p, uid]) => [p, name(uid)])),
    outputs: Object.fromEntries(Object.entries(n.outputs).map(([p, uid]) => [p, name(uid)])),
    attributes: n.attributes,
    compute_data_type: n.compute_data_type,
  }));
  for (const t of tensors.values()) if (t.is_virtual && !names.has(t.uid)) throw new SpecError(`virtual tensor ${t.uid} is used by no node`);
  const all = [...tensors.values()];
  const bound = all.filter((t) => !t.is_virtual).sort((a, b) => a.uid - b.uid);
  const virtual = all.filter((t) => t.is_virtual).sort((a, b) => Number(names.get(a.uid).slice(1)) - Number(names.get(b.uid).slice(1)));
  return {
    version: "plancache.spec.v2",
    io_data_type: graph.io_data_type,
    intermediate_data_type: graph.intermediate_data_type,
    compute_data_type: graph.compute_data_type,
    tensors: [...bound, ...virtual].map((t) => ({ ...t, uid: name(t.uid) })),
    nodes: canonicalNodes,
  };
}

// A spec as written -> the GraphSpec proto message as protobuf JSON (what Compile takes).
function specProto(spec, catalog) {
  const dt = (name) => (name == null ? undefined : `DATA_TYPE_${dataType(catalog, name, "spec").toUpperCase()}`);
  const attribute = (kind, value) => {
    if (kind === "int_list" && Array.isArray(value)) return { int_list: { values: value.map(String) } };
    if (kind === "slices" && Array.isArray(value)) return { slice_list: { slices: value.map(([start, stop, step]) => ({ start: start ?? undefined, stop: stop ?? undefined, step: step ?? undefined })) } };
    if (typeof value === "boolean") return { bool_value: value };
    if (typeof value === "string") return { string_value: value };
    if (kind === "float" || !Number.isInteger(value)) return { float_value: value };
    return { int_value: String(value) };
  };
  return {
    name: spec.name ?? "",
    io_data_type: dt(spec.io_data_type),
    intermediate_data_type: dt(spec.intermediate_data_type),
    compute_data_type: dt(spec.compute_data_type),
    tensors: spec.tensors.map((t) => ({
      uid: t.uid === undefined ? undefined : String(t.uid),
      name: t.name ?? "",
      dim: (t.dim ?? []).map(String),
      stride: (t.stride ?? []).map(String),
      data_type: dt(t.data_type),
      is_virtual: Boolean(t.is_virtual),
      is_pass_by_value: Boolean(t.is_pass_by_value),
      is_output: Boolean(t.is_output),
      scalar_value: t.scalar_value ?? undefined,
    })),
    nodes: spec.nodes.map((n) => ({
      name: n.name ?? "",
      op: n.op,
      inputs: Object.fromEntries(Object.entries(n.inputs ?? {}).map(([p, uid]) => [p, String(uid)])),
      outputs: Object.fromEntries(Object.entries(n.outputs ?? {}).map(([p, uid]) => [p, String(uid)])),
      attributes: Object.fromEntries(Object.entries(n.attributes ?? {}).map(([a, v]) => [a, attribute(catalog.ops[n.op]?.attributes[a]?.kind, v)])),
      compute_data_type: dt(n.compute_data_type),
    })),
  };
}

// The graphs this client builds by itself (the Python test builds the same ones).
function normBackward(op, { hasDbias } = {}) {
  const stats = (uid, name) => ({ uid, name, dim: [8, 1, 1, 1], data_type: "float" });
  const tensors = [
    { uid: 1, name: "dY", dim: [8, 64, 1, 1] },
    { uid: 0, name: "X", dim: [8, 64, 1, 1] },
    { uid: 2, name: "scale", dim: [1, 64, 1, 1] },
    ...(op === "layernorm_backward" ? [stats(3, "mean")] : []),
    stats(4, "inv_variance"),
    { uid: 5, name: "DX", is_output: true },
    { uid: 6, name: "DScale", is_output: true, data_type: "float" },
  ];
  const inputs = { grad: 1, input: 0, scale: 2, ...(op === "layernorm_backward" ? { mean: 3 } : {}), inv_variance: 4 };
  const outputs = { DX: 5, DScale: 6 };
  if (op === "layernorm_backward" || hasDbias) {
    tensors.push({ uid: 7, name: "DBias", is_output: true, data_type: "float" });
    outputs.DBias = 7;
  }
  const attributes = op === "rmsnorm_backward" ? { has_dbias: hasDbias } : {};
  return { name: `node-${op}`, io_data_type: "half", tensors, nodes: [{ name: `${op}_0`, op, inputs, outputs, attributes }] };
}

const frontendSpecs = {
  layernorm_backward_fp16: normBackward("layernorm_backward"),
  rmsnorm_backward_no_dbias_fp16: normBackward("rmsnorm_backward", { hasDbias: false }),
};
const catalog = args.catalog ? JSON.parse(readFileSync(args.catalog, "utf8")) : null;
const frontendHash = (spec) => sha256hex(Buffer.from(jcs(canonicalStructure(normalizeFrontendSpec(spec, catalog))), "utf8"));
if (catalog) {
  if (catalog.canonical_version !== "plancache.spec.v2") fail(`catalog is for ${catalog.canonical_version}`);
  for (const [name, spec] of Object.entries(frontendSpecs)) {
    try {
      const canonical = canonicalStructure(normalizeFrontendSpec(spec, catalog));
      const bytes = jcs(canonical);
      const specHash = sha256hex(Buffer.from(bytes, "utf8"));
      results.frontend_ops.push({ name, spec_hash: specHash, key: `${specHash}/${targetId(vectors.target)}/${optionsId({})}`, canonical_bytes: bytes, spec });
    } catch (e) {
      fail(`${name}: ${e.message}`);
    }
  }
  // This client refuses bad input too, naming the node (the server's refusals are checked live).
  const refusedHere = {};
  for (const [name, spec] of Object.entries(badFrontendSpecs())) {
    try {
      frontendHash(spec);
      fail(`${name}: this client accepted a bad spec`);
    } catch (e) {
      if (!(e instanceof SpecError)) throw e;
      refusedHere[name] = e.message;
    }
  }
  results.refused_by_client = refusedHere;
}

// Bad specs for new ops: each must be refused, naming its node.
function badFrontendSpecs() {
  const noMean = normBackward("layernorm_backward");
  delete noMean.nodes[0].inputs.mean;
  noMean.tensors = noMean.tensors.filter((t) => t.uid !== 3);
  noMean.name = "bad-missing-port";
  noMean.nodes[0].name = "lnb_missing_mean";
  const transpose = {
    name: "bad-hostile-param", io_data_type: "half",
    tensors: [{ uid: 1, name: "x", dim: [2, 3, 4] }, { uid: 2, name: "y", is_output: true }],
    nodes: [{ name: "transpose_hostile", op: "transpose", inputs: { input: 1 }, outputs: { OUT_0: 2 }, attributes: { permutation: "0,2,1; DROP TABLE plans" } }],
  };
  const rope = {
    name: "bad-zero-dim", io_data_type: "half",
    tensors: [{ uid: 1, name: "x", dim: [2, 0, 8, 64] }, { uid: 2, name: "freqs", dim: [1, 1, 8, 64], data_type: "float" }, { uid: 3, name: "y", is_output: true }],
    nodes: [{ name: "rope_zero_dim", op: "rope", inputs: { input: 1, freqs: 2 }, outputs: { OUT_0: 3 } }],
  };
  const dbias = normBackward("rmsnorm_backward", { hasDbias: true });
  dbias.name = "bad-dbias-number";
  dbias.nodes[0].name = "rmsb_dbias_number";
  dbias.nodes[0].attributes.has_dbias = 1;
  return { missing_port: noMean, hostile_param: transpose, zero_dim: rope, bool_as_number: dbias };
}

// ---- 2 and 3. a live server -----------------------------------------------------
if (args.server) {
  const protoFile = join(args["proto-dir"], "plancache/v1/plancache.proto");
  const definition = protoLoader.loadSync(protoFile, { keepCase: true, longs: String, enums: String, defaults: false, oneofs: true, includeDirs: [args["proto-dir"]] });
  const PlanCache = grpc.loadPackageDefinition(definition).plancache.v1.PlanCache;
  const client = new PlanCache(args.server, grpc.credentials.createInsecure());
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => [args["proto-dir"], args.googleapis].map((d) => join(d, target)).find((p) => { try { readFileSync(p); return true; } catch { return false; } }) ?? target;
  root.loadSync(["plancache/v1/plancache.proto", "google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
  const PlanMetadata = root.lookupType("plancache.v1.PlanMetadata");
  const Status = root.lookupType("google.rpc.Status");
  const ErrorInfo = root.lookupType("google.rpc.ErrorInfo");
  const publicKey = createPublicKey(readFileSync(args["public-key"]));
  const rawKey = publicKey.export({ format: "der", type: "spki" }).subarray(-32);
  const target = JSON.parse(args.target);

  const call = (method, request) => new Promise((resolve, reject) => client[method](request, { deadline: Date.now() + 30000 }, (e, r) => (e ? reject(e) : resolve(r))));

  // The verification documented on PlanSignature, step by step.
  function verifiedPlan(plan, expectedKey, where) {
    const sig = plan.signature;
    if (!sig || !sig.signed_metadata?.length) return fail(`${where}: plan is not signed (v2)`);
    const m = PlanMetadata.decode(sig.signed_metadata);
    const envelope = ["plancache/plan-signature/v2", m.key, m.blob_sha256, sha256hex(sig.signed_metadata)].join("\n");
    if (sig.key_id !== sha256hex(rawKey).slice(0, 16)) fail(`${where}: key id ${sig.key_id} is not the trusted key's`);
    if (!verifySignature(null, Buffer.from(envelope, "utf8"), publicKey, sig.signature)) fail(`${where}: signature does not verify`);
    if (sha256hex(plan.blob) !== m.blob_sha256) fail(`${where}: blob sha256 differs from the signed metadata`);
    if (m.key !== expectedKey) fail(`${where}: signed key ${m.key} is not the key asked for (${expectedKey})`);
    return { key: m.key, blob_sha256: sha256hex(plan.blob) };
  }

  function errorReason(e) {
    const raw = e.metadata?.get("grpc-status-details-bin")?.[0];
    if (!raw) return { code: grpc.status[e.code], reason: null };
    const status = Status.decode(raw);
    const info = status.details.find((d) => d.type_url.endsWith("/google.rpc.ErrorInfo"));
    return { code: grpc.status[e.code], status_code: status.code, reason: info ? ErrorInfo.decode(info.value).reason : null, domain: info ? ErrorInfo.decode(info.value).domain : null };
  }

  const targetIdLive = targetId(target);
  for (const c of vectors.cases) {
    const expected = `${c.spec_hash}/${targetIdLive}/${optionsId({})}`;
    const row = { name: c.name, expected_key: expected };
    try {
      const compiled = await call("Compile", { spec: c.spec_proto_json, target, options: {}, tuned_only: true });
      row.compile = verifiedPlan(compiled.plan, expected, `${c.name} Compile`);
      const fetched = await call("GetPlan", { ref: { key: expected } });
      row.get = verifiedPlan(fetched.plan, expected, `${c.name} GetPlan`);
    } catch (e) {
      fail(`${c.name}: ${e.message}`);
    }
    results.live.push(row);
  }
  // GetSigningKeys, from its comments alone: each key's id and fingerprint recomputed from its PEM, the
  // trusted key served as current, an endorsement checked over its documented envelope.
  try {
    const served = (await call("GetSigningKeys", {})).keys ?? [];
    const byId = new Map();
    for (const k of served) {
      const pub = createPublicKey(k.public_key_pem);
      const fingerprint = sha256hex(pub.export({ format: "der", type: "spki" }).subarray(-32));
      if (k.fingerprint !== fingerprint) fail(`GetSigningKeys: ${k.key_id}'s fingerprint is not its PEM's`);
      if (k.key_id !== fingerprint.slice(0, 16)) fail(`GetSigningKeys: ${k.key_id} is not its PEM's key id`);
      byId.set(k.key_id, pub);
    }
    for (const k of served) {
      const row = { key_id: k.key_id, state: k.state, endorsed_by: k.endorsed_by ?? "", endorsement_verifies: null };
      if (row.endorsed_by) {
        const endorser = byId.get(row.endorsed_by);
        const envelope = Buffer.from(`plancache/key-endorsement/v1\n${k.fingerprint}`, "utf8");
        row.endorsement_verifies = Boolean(endorser && verifySignature(null, envelope, endorser, k.endorsement));
        if (!row.endorsement_verifies) fail(`GetSigningKeys: ${k.key_id}'s endorsement does not verify`);
      }
      results.signing_keys.push(row);
    }
    const trusted = sha256hex(rawKey).slice(0, 16);
    if (!served.some((k) => k.key_id === trusted && k.state === "SIGNING_KEY_STATE_CURRENT")) fail("GetSigningKeys: the trusted key is not served as current");
  } catch (e) {
    fail(`GetSigningKeys: ${e.message}`);
  }
  // Prefetch: every key in one stream.
  const keys = results.live.map((r) => r.expected_key);
  const items = await new Promise((resolve, reject) => {
    const got = [];
    const stream = client.Prefetch({ refs: keys.map((key) => ({ key })) }, { deadline: Date.now() + 60000 });
    stream.on("data", (item) => got.push(item));
    stream.on("end", () => resolve(got));
    stream.on("error", reject);
  });
  for (const item of items) {
    const index = item.index ?? 0; // proto3: a zero is not on the wire
    const row = results.live[index];
    if (item.plan) row.prefetch = verifiedPlan(item.plan, keys[index], `${row.name} Prefetch`);
    else fail(`${row.name} Prefetch: ${JSON.stringify(item.error)}`);
  }
  if (items.length !== keys.length) fail(`Prefetch answered ${items.length} of ${keys.length} refs`);

  // Rich errors.
  const missingKey = `${"0".repeat(64)}/${targetIdLive}/${optionsId({})}`;
  const attempts = {
    not_found: () => call("GetPlan", { ref: { key: missingKey } }),
    target_unavailable: () => call("Compile", { spec: vectors.cases[0].spec_proto_json, target: { ...target, compute_capability: "sm_75" }, options: {} }),
    // The stand-in worker refuses graphs named standin-reject, as cuDNN refuses some graphs;
    // another batch size makes it a key not built yet (names are not part of keys).
    compile_failed: () => {
      const matmul = vectors.cases.find((c) => c.name === "matmul_fp16");
      const spec = JSON.parse(JSON.stringify(matmul.spec_proto_json));
      spec.name = "standin-reject";
      spec.tensors.filter((t) => t.dim?.length).forEach((t) => { t.dim[0] = "3"; });
      return call("Compile", { spec, target, options: {} });
    },
  };
  for (const [name, attempt] of Object.entries(attempts)) {
    try {
      await attempt();
      results.errors[name] = { code: "OK" };
    } catch (e) {
      results.errors[name] = errorReason(e);
    }
  }

  // 4, live: the server keys a Node-built frontend-op graph as this client does,
  // and refuses bad specs for new ops, naming the node.
  if (catalog) {
    const built = results.frontend_ops.find((r) => r.name === "layernorm_backward_fp16");
    const expected = `${built.spec_hash}/${targetIdLive}/${optionsId({})}`;
    const row = { name: built.name, expected_key: expected };
    try {
      const compiled = await call("Compile", { spec: specProto(built.spec, catalog), target, options: {}, tuned_only: true });
      row.server_key = compiled.plan.metadata.key;
      if (row.server_key !== expected) fail(`${built.name}: the server keyed it ${row.server_key}, this client ${expected}`);
      row.compile = verifiedPlan(compiled.plan, expected, `${built.name} Compile`);
    } catch (e) {
      fail(`${built.name}: ${e.message}`);
    }
    results.frontend_live = row;
    const bad = badFrontendSpecs();
    const protos = Object.fromEntries(Object.entries(bad).map(([name, spec]) => [name, specProto(spec, catalog)]));
    // The hostile param as the wire carries it: a string where an int list belongs.
    protos.hostile_param.nodes[0].attributes.permutation = { string_value: bad.hostile_param.nodes[0].attributes.permutation };
    protos.bool_as_number.nodes[0].attributes.has_dbias = { int_value: "1" };
    for (const [name, spec] of Object.entries(protos)) {
      try {
        await call("Compile", { spec, target, options: {} });
        results.refusals[name] = { code: "OK" };
        fail(`${name}: the server accepted a bad spec`);
      } catch (e) {
        results.refusals[name] = { ...errorReason(e), message: e.details, node: bad[name].nodes[0].name };
      }
    }
  }
  client.close();
}

// Written synchronously: process.exit() right after an asynchronous write to a
// pipe drops what did not fit the pipe's buffer (64 KiB), cutting the JSON short.
writeSync(1, JSON.stringify(results, null, 1) + "\n");
process.exit(results.failures.length ? 1 : 0);
