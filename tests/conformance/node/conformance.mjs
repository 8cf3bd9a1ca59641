// A plancache client written from the contract alone (the .proto, its
// comments, docs/canonical-form.md and the key vectors), in JavaScript with
// Node's crypto: no code shared with the Python client. It checks
//   1. keys: every vector's canonical bytes (RFC 8785), spec hash, options id,
//      target id and plan key, recomputed here;
//   2. (with --server) Compile, GetPlan and Prefetch of every example: the key
//      it computes is the server's, each plan's signature verifies over the
//      envelope documented on PlanSignature, the blob matches its sha256;
//   3. (with --server) rich errors: NOT_FOUND, TargetUnavailable and
//      CompileFailed told apart by google.rpc.ErrorInfo's reason.
// It prints one JSON document (results) and exits 1 when a check fails.
//
//   node conformance.mjs --vectors FILE --proto-dir DIR --googleapis DIR
//        [--server HOST:PORT --public-key PEM --target JSON]

import { createHash, createPublicKey, verify as verifySignature } from "node:crypto";
import { readFileSync } from "node:fs";
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
  },
});

const results = { keys: [], live: [], errors: {}, failures: [] };
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
  client.close();
}

process.stdout.write(JSON.stringify(results, null, 1) + "\n");
process.exit(results.failures.length ? 1 : 0);
