// ctxlock's runner for @huggingface/jinja (the Jinja engine of transformers.js), started by ctxlock.lint._engines.
//
// Reads one JSON job from stdin: {"source": template text, "contexts": [variables, ...], "now": ISO instant,
// "max_chars": output bound}. Writes one JSON line per context to stdout, in order: {"text": ...} or
// {"error": ..., "phase": "parse" | "render" | "limit", "construct": ...}. The package is imported from the directory in $CTXLOCK_HF_JINJA
// (an unpacked @huggingface/jinja: its package.json and dist/); a first line {"engine": version} says which.
// The template is compiled once, as transformers.js does (`new Template(source)`, which lexes with trim_blocks and
// lstrip_blocks), and each context rendered with `template.render(context)`. `strftime_now` reads a fixed clock
// (`now`), so the text is the same in every run; the parent runs node with TZ=UTC.
//
// @huggingface/jinja's errors name no template line (its tokens and syntax nodes keep no position). So that the
// parent can find the line, a failed render also names the construct that failed: the innermost syntax node whose
// evaluation threw, written back as template text by the package's own formatter (`Template.prototype.format`),
// first line only ("for tool in tools", "messages[0].content|min").
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const out = (value) => process.stdout.write(JSON.stringify(value) + "\n");
const message = (err) => String(err && err.message !== undefined ? err.message : err).slice(0, 2000);

const dir = process.env.CTXLOCK_HF_JINJA;
if (!dir) {
	out({ fatal: "CTXLOCK_HF_JINJA is not set" });
	process.exit(2);
}
let pkg;
let jinja;
try {
	pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
} catch (err) {
	out({ fatal: `cannot read ${join(dir, "package.json")}: ${message(err)}` });
	process.exit(2);
}
if (pkg === null || typeof pkg !== "object" || pkg.name !== "@huggingface/jinja") {
	out({ fatal: `${dir} is not the @huggingface/jinja package (its name is ${JSON.stringify(pkg && pkg.name)})` });
	process.exit(2);
}
try {
	const entry = (pkg.exports && pkg.exports["."] && pkg.exports["."].import) || pkg.module || "dist/index.js";
	jinja = await import(pathToFileURL(join(dir, entry)).href);
} catch (err) {
	out({ fatal: `cannot load @huggingface/jinja from ${dir}: ${message(err)}` });
	process.exit(2);
}
if (typeof jinja.Template !== "function" || typeof jinja.Interpreter !== "function") {
	out({ fatal: `@huggingface/jinja ${pkg.version} in ${dir} has no Template and Interpreter to run` });
	process.exit(2);
}

const job = JSON.parse(readFileSync(0, "utf8"));
const fixed = Date.parse(job.now);
const RealDate = Date;
// `new Date()` and `Date.now()` read the fixed instant; every other use of Date is unchanged.
globalThis.Date = class extends RealDate {
	constructor(...args) {
		if (args.length === 0) super(fixed);
		else super(...args);
	}
	static now() {
		return fixed;
	}
};

// Each error is tagged with the innermost statement or expression being evaluated when it was thrown: the
// interpreter's `evaluate`, and the three statements its blocks run without it (`renderIf`, `renderFor`,
// `executeSet`), are wrapped. A whole program or block is never the construct.
const NODE = Symbol("ctxlock.node");
const tagging = (method) =>
	function (node, ...rest) {
		try {
			return method.call(this, node, ...rest);
		} catch (err) {
			const fresh = err !== null && typeof err === "object" && !Object.prototype.hasOwnProperty.call(err, NODE);
			if (fresh && node && node.type !== "Program") {
				try {
					Object.defineProperty(err, NODE, { value: node });
				} catch {
					// a frozen error object: no construct named
				}
			}
			throw err;
		}
	};
for (const name of ["evaluate", "renderIf", "renderFor", "executeSet"]) {
	const method = jinja.Interpreter.prototype[name];
	if (typeof method === "function") jinja.Interpreter.prototype[name] = tagging(method);
}
const construct = (err) => {
	const node = err !== null && typeof err === "object" ? err[NODE] : undefined;
	if (node === undefined) return null;
	try {
		const text = jinja.Template.prototype.format.call({ parsed: { type: "Program", body: [node] } }, {});
		const first = text.split("\n")[0].trim();
		return first.replace(/^(\{\{|\{%)-? ?/, "").replace(/ ?-?(\}\}|%\})$/, "").slice(0, 500);
	} catch {
		return null;
	}
};
const failure = (err) => {
	const phase = err instanceof RangeError ? "limit" : "render";
	return { error: message(err), phase, construct: construct(err) };
};

out({ engine: String(pkg.version) });
let template = null;
let parseError = null;
try {
	template = new jinja.Template(job.source);
} catch (err) {
	parseError = message(err);
}
for (const context of job.contexts) {
	if (parseError !== null) {
		out({ error: parseError, phase: "parse" });
		continue;
	}
	try {
		const text = template.render(context);
		if (typeof text !== "string") out({ error: `render returned ${typeof text}, not a string`, phase: "render" });
		else if (text.length > job.max_chars) out({ error: `output over ${job.max_chars} characters`, phase: "limit" });
		else out({ text });
	} catch (err) {
		out(failure(err));
	}
}
