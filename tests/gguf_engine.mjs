// Runs a GGUF file in llama.cpp (node-llama-cpp's prebuilt CPU build) for
// the export tests. usage: node gguf_engine.mjs NODE_DIR MODEL.gguf REQUEST.json
// REQUEST: {"tokens": [...], "logits": "OUT.f32", "text": "...", "generate": N}
// Prints {"tokenized": [...], "generated": [...]}; logits of every position
// (len(tokens) x vocab float32) go to REQUEST.logits.
import {writeFileSync, readFileSync} from "node:fs";
import {pathToFileURL} from "node:url";

const [dir, modelPath, requestPath] = process.argv.slice(2);
const {getLlama} = await import(pathToFileURL(`${dir}/node_modules/node-llama-cpp/dist/index.js`).href);
const req = JSON.parse(readFileSync(requestPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const out = {};
if (req.text !== undefined)
    out.tokenized = Array.from(model.tokenize(req.text));
const n = req.tokens.length + (req.generate || 0);
// exact comparisons: no flash attention, an F32 KV cache
const ctx = await model.createContext({contextSize: Math.max(64, n + 8), batchSize: Math.max(64, n + 8),
                                       flashAttention: false, threads: 1, experimentalKvCacheKeyType: "F32",
                                       experimentalKvCacheValueType: "F32"});
const seq = ctx.getSequence();
const res = await seq.controlledEvaluate(req.tokens.map(t => [t, {generateNext: {logits: true}}]));
const rows = res.map(r => r.next.logits);
const V = rows[0].size, buf = new Float32Array(rows.length * V);
rows.forEach((m, i) => { for (const [tok, v] of m) buf[i * V + tok] = v; });
writeFileSync(req.logits, Buffer.from(buf.buffer));
if (req.generate) {
    await seq.clearHistory();
    out.generated = [];
    for await (const t of seq.evaluate([req.tokens[0]], {temperature: 0}))
        if (out.generated.push(t) >= req.generate)
            break;
}
await ctx.dispose();
await model.dispose();
console.log(JSON.stringify(out));
