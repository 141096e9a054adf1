// Offline checks of deploy/kubernetes (tests/integration/test_deploy_manifests.sh).
//
//   node tests/deploy/validate.mjs DEPLOY_DIR [--version V] [--policies-out DIR]
//
// 1. Renders each entry kustomization (DEPLOY_DIR, DEPLOY_DIR/all,
//    DEPLOY_DIR/migrate) as kustomize would for the features they use
//    (resources, images; anything else is refused, so a rendering this script
//    does not understand cannot pass unchecked).
// 2. Validates every object against the Kubernetes OpenAPI schemas of the
//    kubernetes-models package (types, enums, required fields), and, like
//    `kubectl --validate=strict`, refuses fields the API does not have (read
//    from the package's type declarations): a misspelt `readinessprobe`
//    would otherwise pass and silently configure nothing.
// 3. Checks the deployment rules docs/deploy.md states: roles, probes,
//    grace period above the drain budget, resources, non-root read-only
//    pods, secrets from the Secret, policies from a ConfigMap directory
//    mount, PodDisruptionBudgets, scrape annotations, AUTO_MIGRATE=false,
//    the migration Job, the image tag of this release.
//
// Prints one "ok - ..." or "FAIL - ..." line per check (the suite's format)
// and exits 1 when any check failed.  --policies-out writes the policy
// ConfigMap's files into DIR for `streaming-hub check-policies`.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const modelsDir = path.join(here, "node_modules");

let failed = 0;
function ok(msg) {
    console.log(`ok - ${msg}`);
}
function fail(msg) {
    failed++;
    console.log(`FAIL - ${msg}`);
}
function check(cond, msg, detail = "") {
    if (cond) ok(msg);
    else fail(detail ? `${msg}: ${detail}` : msg);
    return cond;
}

// ------------------------------------------------------------- rendering --

const KUSTOMIZE_KEYS = new Set(["apiVersion", "kind", "resources", "images"]);

function readYamlDocs(file) {
    const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
    const out = [];
    for (const d of docs) {
        if (d.errors.length > 0) {
            throw new Error(`${file}: ${d.errors[0].message}`);
        }
        const v = d.toJS();
        if (v !== null && v !== undefined) out.push({ obj: v, file });
    }
    return out;
}

// The objects a kustomization directory renders to, with their source file.
function render(dir) {
    const kfile = path.join(dir, "kustomization.yaml");
    const k = YAML.parse(fs.readFileSync(kfile, "utf8"));
    for (const key of Object.keys(k)) {
        if (!KUSTOMIZE_KEYS.has(key)) {
            throw new Error(`${kfile}: "${key}" is not a feature this check renders`);
        }
    }
    if (k.kind !== "Kustomization") throw new Error(`${kfile}: kind is not Kustomization`);
    let objs = [];
    for (const r of k.resources ?? []) {
        const p = path.join(dir, r);
        if (fs.statSync(p).isDirectory()) objs = objs.concat(render(p));
        else objs = objs.concat(readYamlDocs(p));
    }
    for (const img of k.images ?? []) {
        for (const { obj } of objs) {
            for (const c of podSpec(obj)?.containers ?? []) {
                const [name, tag] = splitImage(c.image);
                if (name === img.name) {
                    c.image = `${img.newName ?? name}:${img.newTag ?? tag}`;
                }
            }
        }
    }
    return objs;
}

function splitImage(ref) {
    const at = ref.lastIndexOf(":");
    return at > ref.lastIndexOf("/") ? [ref.slice(0, at), ref.slice(at + 1)] : [ref, "latest"];
}

function podSpec(obj) {
    return obj?.spec?.template?.spec;
}

// --------------------------------------------------------------- schemas --

async function model(obj) {
    const [group, version] = obj.apiVersion.includes("/")
        ? obj.apiVersion.split("/")
        : [null, obj.apiVersion];
    const spec = `kubernetes-models/${group ? group + "/" : ""}${version}/${obj.kind}`;
    const mod = await import(spec);
    return { Model: mod[obj.kind], dts: path.join(modelsDir, spec + ".d.ts") };
}

// Type declarations, parsed once: file -> {props: {name: type}, imports: {T: file}}.
const dtsCache = new Map();

function parseDts(file) {
    if (dtsCache.has(file)) return dtsCache.get(file);
    const text = fs.readFileSync(file, "utf8").replace(/\/\*[\s\S]*?\*\//g, "");
    const imports = {};
    for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)";/g)) {
        const spec = m[2];
        const target = spec.startsWith(".")
            ? path.join(path.dirname(file), spec + ".d.ts")
            : path.join(modelsDir, spec + ".d.ts");
        for (const name of m[1].split(",")) imports[name.trim()] = target;
    }
    const start = text.search(/export interface \w+[^{]*\{/);
    let props = null;
    if (start >= 0) {
        let i = text.indexOf("{", start) + 1;
        const body = [];
        for (let depth = 1; depth > 0; i++) {
            if (text[i] === "{") depth++;
            if (text[i] === "}") depth--;
            if (depth > 0) body.push(text[i]);
        }
        props = parseProps(body.join(""));
    }
    const r = { props, imports };
    dtsCache.set(file, r);
    return r;
}

// "name"?: Type; ... at the top level of an interface body.
function parseProps(body) {
    const props = {};
    const re = /"([^"]+)"\??:\s*/g;
    let m;
    while ((m = re.exec(body)) !== null) {
        let i = re.lastIndex;
        let depth = 0;
        const start = i;
        for (; i < body.length; i++) {
            const c = body[i];
            if (c === "{" || c === "<" || c === "(") depth++;
            else if (c === "}" || c === ">" || c === ")") depth--;
            else if (c === ";" && depth === 0) break;
        }
        props[m[1]] = body.slice(start, i).trim();
        re.lastIndex = i + 1;
    }
    return props;
}

// Fields the API does not have, under obj, typed by `type` of dts file `file`.
function unknownFields(value, type, file, where, out) {
    const { imports } = parseDts(file);
    type = type.trim();
    let m;
    if ((m = /^Array<(.*)>$/s.exec(type))) {
        if (Array.isArray(value)) {
            value.forEach((v, i) => unknownFields(v, m[1], file, `${where}[${i}]`, out));
        }
        return;
    }
    if ((m = /^\{\s*\[key: string\]:\s*(.*?);?\s*\}$/s.exec(type))) {
        if (value && typeof value === "object") {
            for (const [k, v] of Object.entries(value)) unknownFields(v, m[1], file, `${where}.${k}`, out);
        }
        return;
    }
    if (imports[type] && value && typeof value === "object" && !Array.isArray(value)) {
        const target = imports[type];
        const { props } = parseDts(target);
        if (props === null) return; // a type alias (IntOrString, Quantity, Time)
        for (const [k, v] of Object.entries(value)) {
            if (!(k in props)) out.push(`${where}.${k}`);
            else unknownFields(v, props[k], target, `${where}.${k}`, out);
        }
    }
}

async function validateSchema(objs) {
    for (const { obj, file } of objs) {
        const what = `${path.basename(file)}: ${obj.kind} ${obj.metadata?.name}`;
        let m;
        try {
            m = await model(obj);
        } catch (e) {
            fail(`${what}: no schema for ${obj.apiVersion} ${obj.kind}`);
            continue;
        }
        try {
            new m.Model(obj).validate();
        } catch (e) {
            fail(`${what}: schema: ${e.message}`);
            continue;
        }
        const { props } = parseDts(m.dts);
        const unknown = [];
        for (const [k, v] of Object.entries(obj)) {
            if (!(k in props)) unknown.push(k);
            else unknownFields(v, props[k], m.dts, k, unknown);
        }
        check(unknown.length === 0, `${what}: valid against the Kubernetes schema`,
            `fields the API does not have: ${unknown.join(", ")}`);
    }
}

// ----------------------------------------------------------------- rules --

function find(objs, kind, name) {
    return objs.map((o) => o.obj).find((o) => o.kind === kind && o.metadata?.name === name);
}

function durationSeconds(s) {
    let total = 0;
    for (const m of String(s).matchAll(/(\d+)(ms|s|m|h)/g)) {
        total += Number(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]];
    }
    return total;
}

function quantity(q, cpu) {
    const s = String(q);
    const m = /^([0-9.]+)([a-zA-Z]*)$/.exec(s);
    if (!m) return NaN;
    const units = { "": 1, m: 0.001, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, K: 1e3, M: 1e6, G: 1e9 };
    if (!(m[2] in units)) return NaN;
    return Number(m[1]) * (cpu && m[2] === "m" ? 0.001 : units[m[2]]);
}

// The environment a container sees: envFrom ConfigMaps of the render, then env.
function environment(objs, c) {
    const env = {};
    for (const src of c.envFrom ?? []) {
        const cm = src.configMapRef && find(objs, "ConfigMap", src.configMapRef.name);
        if (src.configMapRef && !cm) fail(`envFrom ConfigMap ${src.configMapRef.name} is not in the render`);
        Object.assign(env, cm?.data ?? {});
    }
    for (const e of c.env ?? []) env[e.name] = e.valueFrom ?? e.value;
    return env;
}

function selects(selector, labels) {
    return Object.entries(selector?.matchLabels ?? {}).every(([k, v]) => labels?.[k] === v);
}

const SECRET_VARS = ["STREAMING_HUB_POSTGRES_DSN", "STREAMING_HUB_KEK", "STREAMING_HUB_ADMIN_TOKEN"];

function checkSecurity(what, pod, c) {
    const psc = pod.securityContext ?? {};
    const csc = c.securityContext ?? {};
    check(psc.runAsNonRoot === true && Number.isInteger(psc.runAsUser) && psc.runAsUser > 0,
        `${what}: runs as a numeric non-root user`, JSON.stringify(psc));
    check(csc.readOnlyRootFilesystem === true, `${what}: read-only root file system`);
    check(csc.allowPrivilegeEscalation === false && (csc.capabilities?.drop ?? []).includes("ALL"),
        `${what}: no privilege escalation, every capability dropped`);
    const tmp = (c.volumeMounts ?? []).find((v) => v.mountPath === "/tmp");
    const vol = tmp && (pod.volumes ?? []).find((v) => v.name === tmp.name);
    check(vol?.emptyDir !== undefined, `${what}: /tmp is an emptyDir (the only writable path)`);
    check(pod.automountServiceAccountToken === false, `${what}: no service account token`);
}

function checkDeployment(objs, variant, d, secretKeys, version) {
    const what = `${variant}: Deployment ${d.metadata.name}`;
    const pod = podSpec(d);
    const role = d.metadata.labels?.["app.kubernetes.io/component"];
    const c = pod.containers.find((x) => x.name === "streaming-hub");
    if (!check(c !== undefined, `${what}: has the streaming-hub container`)) return;
    const env = environment(objs, c);

    check(selects(d.spec.selector, pod && d.spec.template.metadata.labels),
        `${what}: its selector matches its pods`);
    check(env.STREAMING_HUB_ROLE === role && ["all", "ingest", "delivery"].includes(role),
        `${what}: STREAMING_HUB_ROLE=${env.STREAMING_HUB_ROLE} matches its component label ${role}`);
    check(JSON.stringify(c.args) === '["serve"]' && c.command === undefined, `${what}: runs serve`);
    check(c.image === `streaming-hub:${version}` || c.image.endsWith(`/streaming-hub:${version}`),
        `${what}: image of this release (${version})`, c.image);
    const port = (c.ports ?? []).find((p) => p.containerPort === 8080);
    check(port?.name === "http", `${what}: port 8080 named http`);
    const probe = (p, pathWant) =>
        p?.httpGet?.path === pathWant && (p.httpGet.port === "http" || p.httpGet.port === 8080);
    check(probe(c.readinessProbe, "/readyz"), `${what}: readiness probe on /readyz`);
    check(probe(c.livenessProbe, "/healthz"), `${what}: liveness probe on /healthz`);
    if (c.startupProbe) {
        const window = (c.startupProbe.periodSeconds ?? 10) * (c.startupProbe.failureThreshold ?? 3);
        check(probe(c.startupProbe, "/healthz") && window >= 60,
            `${what}: startup probe covers the hub's minute of waiting for its database (${window} s)`);
    }
    const drain = durationSeconds(env.STREAMING_HUB_SHUTDOWN_TIMEOUT ?? "30s");
    const pre = c.lifecycle?.preStop?.exec?.command;
    const preSleep = pre && pre[0] === "sleep" ? Number(pre[1]) : 0;
    const grace = pod.terminationGracePeriodSeconds ?? 30;
    check(grace > drain + preSleep,
        `${what}: terminationGracePeriodSeconds ${grace} > SHUTDOWN_TIMEOUT ${drain} s + preStop ${preSleep} s`);
    for (const kind of ["cpu", "memory"]) {
        const req = quantity(c.resources?.requests?.[kind], kind === "cpu");
        const lim = quantity(c.resources?.limits?.[kind], kind === "cpu");
        check(req > 0 && lim >= req, `${what}: ${kind} request and limit (${c.resources?.requests?.[kind]} / ${c.resources?.limits?.[kind]})`);
    }
    checkSecurity(what, pod, c);
    for (const v of SECRET_VARS) {
        const ref = env[v]?.secretKeyRef;
        check(ref !== undefined && secretKeys[ref.name]?.includes(ref.key),
            `${what}: ${v} from the Secret (${ref ? ref.name + "/" + ref.key : "not a secretKeyRef"})`);
    }
    check(String(env.STREAMING_HUB_AUTO_MIGRATE) === "false", `${what}: AUTO_MIGRATE=false (the Job migrates)`);
    if (role !== "delivery") {
        check(typeof env.STREAMING_HUB_KAFKA_BROKERS === "string" && env.STREAMING_HUB_KAFKA_BROKERS !== "",
            `${what}: KAFKA_BROKERS is set (the image leaves it empty)`);
    }
    const pmount = (c.volumeMounts ?? []).find((v) => v.mountPath === "/etc/streaming-hub/policies");
    const pvol = pmount && (pod.volumes ?? []).find((v) => v.name === pmount.name);
    check(pvol?.configMap && find(objs, "ConfigMap", pvol.configMap.name) && !pmount.subPath,
        `${what}: policies from a ConfigMap mounted as a directory (no subPath: updates reach the pod)`);
    const ann = d.spec.template.metadata.annotations ?? {};
    check(ann["prometheus.io/scrape"] === "true" && ann["prometheus.io/port"] === "8080" &&
        ann["prometheus.io/path"] === "/metrics", `${what}: Prometheus scrape annotations`);
    const pdb = objs.map((o) => o.obj).find(
        (o) => o.kind === "PodDisruptionBudget" && selects(o.spec.selector, d.spec.template.metadata.labels));
    check(pdb !== undefined, `${what}: a PodDisruptionBudget covers its pods`);
    const ru = d.spec.strategy?.rollingUpdate;
    check(d.spec.strategy?.type === "RollingUpdate" && String(ru?.maxUnavailable) === "0",
        `${what}: rolling update that keeps every old pod until a new one is ready`);
}

function checkVariant(objs, variant, roles, secretKeys, version) {
    const deps = objs.map((o) => o.obj).filter((o) => o.kind === "Deployment");
    const got = deps.map((d) => d.metadata.labels?.["app.kubernetes.io/component"]).sort();
    check(JSON.stringify(got) === JSON.stringify(roles), `${variant}: Deployments for ${roles.join(", ")}`,
        `got ${got.join(", ")}`);
    for (const d of deps) checkDeployment(objs, variant, d, secretKeys, version);
    const svc = objs.map((o) => o.obj).filter((o) => o.kind === "Service");
    for (const s of svc) {
        const served = deps.filter((d) => Object.entries(s.spec.selector ?? {})
            .every(([k, v]) => d.spec.template.metadata.labels?.[k] === v));
        check(served.length === deps.length, `${variant}: Service ${s.metadata.name} selects every hub pod`);
    }
    check(!objs.some((o) => o.obj.kind === "Job"), `${variant}: no Job (migrations run before the rollout)`);
}

function checkJob(objs, secretKeys, version) {
    const jobs = objs.map((o) => o.obj).filter((o) => o.kind === "Job");
    if (!check(jobs.length === 1, "migrate: one Job")) return;
    const j = jobs[0];
    const pod = podSpec(j);
    const c = pod.containers[0];
    const what = `migrate: Job ${j.metadata.name}`;
    check(JSON.stringify(c.args) === '["migrate"]', `${what}: runs streaming-hub migrate`);
    check(c.image === `streaming-hub:${version}` || c.image.endsWith(`/streaming-hub:${version}`),
        `${what}: image of this release (${version})`, c.image);
    const ref = (c.env ?? []).find((e) => e.name === "STREAMING_HUB_POSTGRES_DSN")?.valueFrom?.secretKeyRef;
    check(ref && secretKeys[ref.name]?.includes(ref.key), `${what}: DSN from the Secret`);
    check(["OnFailure", "Never"].includes(pod.restartPolicy), `${what}: restartPolicy ${pod.restartPolicy}`);
    checkSecurity(what, pod, c);
    check(j.spec.template.metadata.labels?.["app.kubernetes.io/name"] !== "streaming-hub",
        `${what}: its pod is not selected by the hub's Service`);
}

// ------------------------------------------------------------------ main --

async function main() {
    const args = process.argv.slice(2);
    const dir = args[0];
    const opt = (name) => {
        const i = args.indexOf(name);
        return i > 0 ? args[i + 1] : undefined;
    };
    const version = opt("--version") ?? "0.1.0";

    // The Secret is made out of band; secret.example.yaml documents its keys.
    const secretFile = path.join(dir, "secret.example.yaml");
    const secrets = readYamlDocs(secretFile);
    await validateSchema(secrets);
    const secretKeys = {};
    for (const { obj } of secrets) {
        secretKeys[obj.metadata.name] = Object.keys({ ...obj.data, ...obj.stringData });
    }

    const variants = [
        [".", ["delivery", "ingest"]],
        ["all", ["all"]],
        ["migrate", null],
    ];
    for (const [sub, roles] of variants) {
        const vdir = path.join(dir, sub);
        const name = sub === "." ? "per-role" : sub;
        let objs;
        try {
            objs = render(vdir);
        } catch (e) {
            fail(`${name}: cannot render: ${e.message}`);
            continue;
        }
        ok(`${name}: rendered ${objs.length} objects`);
        await validateSchema(objs);
        if (roles) checkVariant(objs, name, roles, secretKeys, version);
        else checkJob(objs, secretKeys, version);

        const pols = find(objs, "ConfigMap", "streaming-hub-policies");
        if (roles && pols) {
            const bad = Object.keys(pols.data ?? {}).filter((k) => !/^[A-Za-z0-9_-]{1,64}\.lua$/.test(k));
            check(bad.length === 0, `${name}: policy ConfigMap keys are policy file names`, bad.join(", "));
            const out = opt("--policies-out");
            if (out && sub === ".") {
                fs.mkdirSync(out, { recursive: true });
                for (const [k, v] of Object.entries(pols.data ?? {})) fs.writeFileSync(path.join(out, k), v);
            }
        }
    }
    process.exit(failed > 0 ? 1 : 0);
}

main().catch((e) => {
    console.log(`FAIL - ${e.stack}`);
    process.exit(1);
});
