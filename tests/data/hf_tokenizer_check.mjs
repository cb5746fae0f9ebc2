// Checks an export's Hugging Face tokenizer files with Hugging Face's own JavaScript
// implementations, independent of llama3-hpc: @huggingface/tokenizers reads tokenizer.json and
// tokenizer_config.json, @huggingface/jinja renders the chat_template.
//
//   node hf_tokenizer_check.mjs EXPORT_DIR GOLDEN.jsonl CHATS.jsonl PREP_IDS.jsonl
//
// GOLDEN.jsonl: {"text", "ids"} (Meta's reference ids): encoded without special tokens, every
// text must give its ids. CHATS.jsonl: {"messages"} records; PREP_IDS.jsonl: for each, the ids
// `llama3-hpc tokenize --prep sft` gives (prep's chat format): the template rendered with
// bos_token and encoded without special tokens must give the same ids. Exit 0 when all hold.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";

const [dir, goldenPath, chatsPath, prepPath] = process.argv.slice(2);
const json = (path) => JSON.parse(readFileSync(path, "utf8"));
const lines = (path) =>
  readFileSync(path, "utf8").split("\n").filter((line) => line.trim() !== "").map((l) => JSON.parse(l));

const tokenizerJson = json(`${dir}/tokenizer.json`);
const config = json(`${dir}/tokenizer_config.json`);
const tokenizer = new Tokenizer(tokenizerJson, config);
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
let failures = 0;
const fail = (what, got, want) => {
  failures += 1;
  if (failures <= 5) console.log(`FAIL ${what}\n  got  ${JSON.stringify(got).slice(0, 300)}\n  want ${JSON.stringify(want).slice(0, 300)}`);
};

const golden = lines(goldenPath);
for (const { text, ids } of golden) {
  const got = tokenizer.encode(text, { add_special_tokens: false }).ids;
  if (!same(got, ids)) fail(`encode(${JSON.stringify(text).slice(0, 60)})`, got, ids);
}
console.log(`${golden.length} golden texts encoded`);

const template = new Template(config.chat_template);
const chats = lines(chatsPath);
const prep = lines(prepPath);
if (chats.length !== prep.length) {
  console.log(`FAIL ${chats.length} conversations, ${prep.length} lines of prep's ids`);
  process.exit(1);
}
chats.forEach(({ messages }, i) => {
  const rendered = template.render({ messages, bos_token: config.bos_token, add_generation_prompt: false });
  const got = tokenizer.encode(rendered, { add_special_tokens: false }).ids;
  if (!same(got, prep[i].ids)) fail(`chat template of conversation ${i + 1}`, got, prep[i].ids);
  // With the generation prompt: the same ids up to the last answer's header.
  const prompt = template.render({
    messages: messages.slice(0, -1), bos_token: config.bos_token, add_generation_prompt: true,
  });
  const promptIds = tokenizer.encode(prompt, { add_special_tokens: false }).ids;
  if (!same(promptIds, prep[i].ids.slice(0, promptIds.length)) || promptIds.length >= prep[i].ids.length)
    fail(`generation prompt of conversation ${i + 1}`, promptIds, prep[i].ids);
});
console.log(`${chats.length} conversations rendered and encoded`);
// BOS comes from the post-processor when special tokens are added, and decoding gives the text.
const withBos = tokenizer.encode("Hello", { add_special_tokens: true }).ids;
if (withBos[0] !== tokenizerJson.added_tokens.find((t) => t.content === config.bos_token).id)
  fail("BOS added by the post-processor", withBos, "begin_of_text first");
const decoded = tokenizer.decode(tokenizer.encode(golden[0].text, { add_special_tokens: false }).ids);
if (decoded !== golden[0].text) fail("decode", decoded, golden[0].text);
if (failures > 0) {
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
console.log("the exported tokenizer files give llama3-hpc's ids under Hugging Face's implementations");
