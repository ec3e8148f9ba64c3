/*
 * bpe_builtin.c — the tokenizers make-model writes: a byte-level BPE trained here, at write time,
 * by bpe_train(), saved as a real HF tokenizer.json (Split with the Bailing/LLaDA regex + ByteLevel,
 * BPE, ByteLevel decoder) with LLaDA's special tokens, plus tokenizer_config.json carrying the real
 * LLaDA-8B-Instruct chat template and special_tokens_map.json. The built-in one is trained on a small
 * embedded English + code corpus (deterministic); tokenizer_write_trained() trains on a caller's
 * corpus (`make-model --tokenizer-corpus`, the trained bundled model) and adds infilling markers.
 * tokenizer_write_builtin_qwen2() writes the same corpus trained with the Qwen2 regex in the slow
 * Qwen2 / Dream layout (vocab.json + merges.txt + added_tokens.json) for Dream-layout checkpoints.
 *
 * Not here: loading (tokenizer.c), weights/config.json (make_model.c). Threads: any (main at
 * make-model time).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/bpe_train.h"
#include "text/tokenizer.h"
#include "util/fileio.h"
#include "util/log.h"

#define BUILTIN_MERGES 1200

#define BAILING_REGEX tokenizer_split_regex(TOKENIZER_SPLIT_BAILING)

/* Verbatim from LLaDA-8B-Instruct's tokenizer_config.json. */
static const char LLADA_CHAT_TEMPLATE[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";

/* LLaDA's added tokens, in LLaDA's order (ids follow the BPE vocabulary). */
static const char *const SPECIALS[] = {
    "<|startoftext|>", "<|endoftext|>", "[CLS]", "[gMASK]", "<|mdm_mask|>", "<role>", "</role>",
    "<|arithmetic_start|>", "<|arithmetic_end|>", "<|number_start|>", "<|number_end|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
};
#define N_SPECIALS ((int)(sizeof SPECIALS / sizeof SPECIALS[0]))

/* Infilling markers (StarCoder / Qwen names) after LLaDA's, in trained tokenizers only. unmask
 * infills natively (prefix ++ masks ++ suffix), so they are reserved ids for FIM-style training and
 * clients that send them; the built-in tokenizer keeps LLaDA's exact list. */
static const char *const FIM_SPECIALS[] = {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"};
#define N_FIM_SPECIALS ((int)(sizeof FIM_SPECIALS / sizeof FIM_SPECIALS[0]))

/* Training text: plain English about the project, chat-style turns and some code. */
static const char CORPUS[] =
    "The quick brown fox jumps over the lazy dog. A diffusion language model does not write from left to "
    "right. It starts from a canvas where every answer position is masked, and at each step it predicts all "
    "of the masked tokens at once. The decoder then keeps the predictions it is most confident about and "
    "leaves the others masked for the next step. After enough steps, every position holds a token and the "
    "answer is complete.\n\n"
    "This server streams that process as it happens. A browser can watch the text appear out of the masks, "
    "a chat client can show each finished block, and an editor can ask for a completion between a prefix "
    "and a suffix. The same events travel over WebSockets, over server-sent events for the OpenAI style "
    "API, and over plain HTTP for clients that only want the final result.\n\n"
    "What is the capital of France? The capital of France is Paris. How many legs does a spider have? A "
    "spider has eight legs. Can you write a short poem about the sea? The sea is wide and the sea is deep, "
    "it sings the sailors into sleep. Please summarize the following paragraph in one sentence. Thank you "
    "for your help! You are welcome; let me know if there is anything else I can do.\n\n"
    "user: Hello, who are you?\nassistant: I am a helpful assistant. I can answer questions, explain "
    "ideas, and help you write or debug code.\nuser: Explain what a tokenizer does.\nassistant: A "
    "tokenizer turns text into a sequence of integer ids that the model understands, and turns ids back "
    "into text. Byte pair encoding starts from single bytes and repeatedly merges the most frequent pair "
    "of neighbouring symbols into a new symbol, so common words become one token while rare words are "
    "spelled out in pieces.\n\n"
    "It's time to go. I'm sure they're right, but we've been here before and you'll see that he'd agree. "
    "Don't worry; it isn't hard. There are 3 apples, 12 oranges and 365 days in a year; 2024 was a leap "
    "year, and 1.5 plus 2.5 equals 4.0. The meeting starts at 10:30 on Monday, June 3rd.\n\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2048 4096 65536. Symbols: + - * / = < > ( ) [ ] { } ; : , . "
    "! ? ' \" # $ % & | ~ ^ _ @ \\ `\n\n"
    "#include <stdio.h>\n#include <stdlib.h>\n\nint main(int argc, char **argv) {\n    if (argc < 2) {\n"
    "        fprintf(stderr, \"usage: %s FILE\\n\", argv[0]);\n        return 1;\n    }\n"
    "    for (int i = 1; i < argc; i++) {\n        printf(\"%d: %s\\n\", i, argv[i]);\n    }\n"
    "    return 0;\n}\n\n"
    "static size_t count_lines(const char *text, size_t len) {\n    size_t n = 0;\n"
    "    for (size_t i = 0; i < len; i++)\n        if (text[i] == '\\n') n++;\n    return n;\n}\n\n"
    "def fibonacci(n):\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n    a, b = 0, 1\n"
    "    result = []\n    for _ in range(n):\n        result.append(a)\n        a, b = b, a + b\n"
    "    return result\n\n\nif __name__ == \"__main__\":\n    print(fibonacci(10))\n\n"
    "class Tokenizer:\n    def __init__(self, vocab, merges):\n        self.vocab = vocab\n"
    "        self.merges = {pair: rank for rank, pair in enumerate(merges)}\n\n"
    "    def encode(self, text):\n        return [self.vocab[token] for token in self.split(text)]\n\n"
    "function render(messages) {\n  return messages\n    .map((m) => `${m.role}: ${m.content}`)\n"
    "    .join('\\n');\n}\n\nconst socket = new WebSocket('wss://localhost:8443/ws');\n"
    "socket.onmessage = (event) => {\n  const data = JSON.parse(event.data);\n"
    "  if (data.type === 'step') console.log(data.progress);\n};\n\n"
    "{\"model\": \"llada\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi there\"}], "
    "\"stream\": true, \"max_tokens\": 128, \"temperature\": 0.0}\n\n"
    "SELECT name, count(*) AS total FROM requests WHERE status = 'done' GROUP BY name ORDER BY total DESC;\n\n"
    "In the morning the streets were quiet. She opened the window, made a cup of tea and read the news. "
    "Later that day they walked along the river, talking about books, music, travel and the weather. "
    "Nobody knew exactly when the rain would stop, but everyone agreed that the garden needed it. The "
    "children played in the park while their parents watched from a bench under the old trees.\n\n"
    "Machine learning models are trained on large collections of text. They learn patterns of language "
    "such as grammar, facts about the world and common ways of reasoning. A smaller model is faster and "
    "cheaper to run; a larger model usually gives better answers. Researchers measure quality with "
    "benchmarks for question answering, mathematics, coding and translation.\n";

/* The Ling-2.0 family's role-tag chat template (LLaDA-MoE, LLaDA2) as docs/model-spec.md describes it,
 * with the default "detailed thinking off" system line; the same text as
 * tests/tokenizer/templates/ling2_chat_template.jinja without its comment. */
static const char LING_CHAT_TEMPLATE[] =
    "{%- set thinking_option = 'off' -%}\n"
    "{{- '<role>SYSTEM</role>' }}\n"
    "{%- if messages[0].role == 'system' %}\n"
    "    {{- messages[0].content + '\\n' }}\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call>\\n\" }}\n"
    "{%- endif %}\n"
    "{{- 'detailed thinking ' + thinking_option + '<|role_end|>' }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == 'user' %}\n"
    "        {{- '<role>HUMAN</role>' + message.content + '<|role_end|>' }}\n"
    "    {%- elif message.role == 'system' and not loop.first %}\n"
    "        {{- '<role>SYSTEM</role>' + message.content + '<|role_end|>' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<role>ASSISTANT</role>' }}\n"
    "        {%- if message.content %}\n"
    "            {{- message.content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if tool_call.function is defined %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}\n"
    "                {{- tool_call.arguments | tojson }}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|role_end|>' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}\n"
    "            {{- '<role>OBSERVATION</role>' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}\n"
    "            {{- '<|role_end|>' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<role>ASSISTANT</role>' }}\n"
    "{%- endif %}";

/* The Ling-2.0 added tokens as the LLaDA MoE checkpoints number them (<|endoftext|> right after
 * <|startoftext|>, <|mask|> three later), then the role tags; ids follow the BPE vocabulary. */
static const char *const LING_SPECIALS[] = {
    "<|startoftext|>", "<|endoftext|>", "[CLS]", "[gMASK]", "<|mask|>", "<|role_end|>", "<role>", "</role>",
};

/* What differs between the tokenizer families written by write_tokenizer_files. */
typedef struct tok_flavor {
    const char *const *specials;
    int                n_specials;
    const char        *chat_template;
    const char        *mask_token, *eot_token;   /* names in specials */
    const char *const *additional;               /* additional_special_tokens */
    int                n_additional;
} tok_flavor;

static const char *const LLADA_ADDITIONAL[] = {"<role>", "</role>", "<|arithmetic_start|>", "<|arithmetic_end|>",
                                               "<|number_start|>", "<|number_end|>"};
static const char *const LING_ADDITIONAL[] = {"<role>", "</role>", "<|role_end|>"};
static const tok_flavor k_llada_flavor = {SPECIALS, N_SPECIALS, LLADA_CHAT_TEMPLATE, "<|mdm_mask|>", "<|eot_id|>",
                                          LLADA_ADDITIONAL, 6};
static const tok_flavor k_ling_flavor = {LING_SPECIALS, (int)(sizeof LING_SPECIALS / sizeof LING_SPECIALS[0]),
                                         LING_CHAT_TEMPLATE, "<|mask|>", "<|role_end|>", LING_ADDITIONAL, 3};

static json_t *additional_list(const tok_flavor *fl) {
    json_t *a = json_array();
    for (int i = 0; i < fl->n_additional; i++) json_array_append_new(a, json_string(fl->additional[i]));
    return a;
}

static int special_index(const tok_flavor *fl, const char *name) {
    for (int i = 0; i < fl->n_specials; i++)
        if (strcmp(fl->specials[i], name) == 0) return i;
    return -1;
}

static json_t *added_entry(int id, const char *content) {
    return json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", content, "single_word", 0, "lstrip", 0,
                     "rstrip", 0, "normalized", 0, "special", 1);
}

static int dump(json_t *j, const char *dir, const char *name, um_err *err) {
    char path[4096];
    path_join(path, sizeof path, dir, name);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) return um_err_set(err, UM_ERR_INTERNAL, "%s: JSON encoding failed", path);
    size_t len = strlen(s);
    int rc = file_write_all(path, s, len, err);
    free(s);
    return rc;
}

static json_t *token_obj(const char *content) {
    return json_pack("{s:s,s:b,s:b,s:b,s:b}", "content", content, "lstrip", 0, "normalized", 0, "rstrip", 0,
                     "single_word", 0);
}

/* Write tr with LLaDA's special tokens (then n_extra more) as tokenizer.json, tokenizer_config.json
 * and special_tokens_map.json into dir. Frees tr. */
static int write_tokenizer_files(const char *dir, bpe_trained *tr_in, const tok_flavor *fl, const char *const *extra,
                                 int n_extra, tokenizer_special *sp, um_err *err) {
    const char *const *SPECIALS_ = fl->specials;
    const int N_SPECIALS_ = fl->n_specials;
    bpe_trained tr = *tr_in;
    memset(tr_in, 0, sizeof *tr_in);
    int base = tr.n_tokens;

    /* tokenizer.json */
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    for (int i = 0; i < tr.n_tokens; i++) json_object_set_new(vocab, tr.token[i], json_integer(i));
    for (int i = 0; i < tr.n_merges; i++)
        json_array_append_new(merges, json_pack("[s,s]", tr.token[tr.merge[i][0]], tr.token[tr.merge[i][1]]));
    for (int i = 0; i < N_SPECIALS_; i++) json_array_append_new(added, added_entry(base + i, SPECIALS_[i]));
    for (int i = 0; i < n_extra; i++) json_array_append_new(added, added_entry(base + N_SPECIALS_ + i, extra[i]));
    json_t *bytelevel = json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                                  "use_regex", 0);
    json_t *pre = json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},O]}", "type", "Sequence", "pretokenizers", "type", "Split",
                            "pattern", "Regex", BAILING_REGEX, "behavior", "Isolated", "invert", 0, bytelevel);
    json_t *model = json_pack("{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout", "unk_token",
                              "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
                              "ignore_merges", 0, "vocab", vocab, "merges", merges);
    json_t *tj = json_pack("{s:s,s:n,s:n,s:o,s:n,s:o,s:n,s:o,s:o}", "version", "1.0", "truncation", "padding",
                           "added_tokens", added, "normalizer", "pre_tokenizer", pre, "post_processor", "decoder",
                           bytelevel, "model", model);
    bpe_trained_free(&tr);
    if (!tj) return um_err_set(err, UM_ERR_INTERNAL, "built-in tokenizer: JSON construction failed");
    if (dump(tj, dir, "tokenizer.json", err) != 0) return -1;

    /* tokenizer_config.json (key set of LLaDA-8B-Instruct's, plus mask_token) */
    json_t *dec = json_object();
    for (int i = 0; i < N_SPECIALS_; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", base + i);
        json_t *o = token_obj(SPECIALS_[i]);
        json_object_set_new(o, "special", json_true());
        json_object_set_new(dec, key, o);
    }
    for (int i = 0; i < n_extra; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", base + N_SPECIALS_ + i);
        json_t *o = token_obj(extra[i]);
        json_object_set_new(o, "special", json_true());
        json_object_set_new(dec, key, o);
    }
    json_t *cfg = json_object();
    json_object_set_new(cfg, "add_bos_token", json_false());
    json_object_set_new(cfg, "add_eos_token", json_false());
    json_object_set_new(cfg, "added_tokens_decoder", dec);
    json_object_set_new(cfg, "additional_special_tokens", additional_list(fl));
    json_object_set_new(cfg, "bos_token", json_string("<|startoftext|>"));
    json_object_set_new(cfg, "chat_template", json_string(fl->chat_template));
    json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(cfg, "cls_token", json_string("[CLS]"));
    json_object_set_new(cfg, "eos_token", json_string("<|endoftext|>"));
    json_object_set_new(cfg, "fast_tokenizer", json_true());
    json_object_set_new(cfg, "gmask_token", json_string("[gMASK]"));
    json_object_set_new(cfg, "mask_token", json_string(fl->mask_token));
    json_object_set_new(cfg, "model_input_names", json_pack("[s,s]", "input_ids", "attention_mask"));
    json_object_set_new(cfg, "model_max_length", json_integer(1000000000000000000LL));
    json_object_set_new(cfg, "pad_token", json_string("<|endoftext|>"));
    json_object_set_new(cfg, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    if (dump(cfg, dir, "tokenizer_config.json", err) != 0) return -1;

    json_t *stm = json_object();
    json_object_set_new(stm, "additional_special_tokens", additional_list(fl));
    json_object_set_new(stm, "bos_token", token_obj("<|startoftext|>"));
    json_object_set_new(stm, "cls_token", token_obj("[CLS]"));
    json_object_set_new(stm, "eos_token", token_obj("<|endoftext|>"));
    json_object_set_new(stm, "mask_token", token_obj(fl->mask_token));
    json_object_set_new(stm, "pad_token", token_obj("<|endoftext|>"));
    if (dump(stm, dir, "special_tokens_map.json", err) != 0) return -1;

    sp->vocab_size = base + N_SPECIALS_ + n_extra;
    sp->bos = base + 0;
    sp->eos = base + 1;
    sp->pad = base + 1;
    sp->mask = base + special_index(fl, fl->mask_token);
    sp->eot = base + special_index(fl, fl->eot_token);
    return 0;
}

int tokenizer_write_builtin(const char *dir, tokenizer_special *sp, um_err *err) {
    bpe_trained tr;
    if (bpe_train(CORPUS, sizeof CORPUS - 1, BAILING_REGEX, BUILTIN_MERGES, 1, &tr, err) != 0)
        return um_err_prefix(err, "built-in tokenizer");
    return write_tokenizer_files(dir, &tr, &k_llada_flavor, NULL, 0, sp, err);
}

int tokenizer_write_trained(const char *dir, const char *corpus, size_t len, int max_merges, int min_count,
                            tokenizer_special *sp, um_err *err) {
    if (max_merges < 1 || max_merges > 1000000)
        return um_err_param(err, "merges", "merges must be between 1 and 1000000, got %d", max_merges);
    bpe_trained tr;
    if (bpe_train(corpus, len, BAILING_REGEX, max_merges, min_count, &tr, err) != 0)
        return um_err_prefix(err, "tokenizer training");
    return write_tokenizer_files(dir, &tr, &k_llada_flavor, FIM_SPECIALS, N_FIM_SPECIALS, sp, err);
}

int tokenizer_write_builtin_ling(const char *dir, tokenizer_special *sp, um_err *err) {
    bpe_trained tr;
    if (bpe_train(CORPUS, sizeof CORPUS - 1, BAILING_REGEX, BUILTIN_MERGES, 1, &tr, err) != 0)
        return um_err_prefix(err, "built-in Ling tokenizer");
    return write_tokenizer_files(dir, &tr, &k_ling_flavor, NULL, 0, sp, err);
}

/* ---------------------------------------------------------------- Qwen2 / Dream layout */

/* The Qwen2 pre-tokenizer regex (the slow Qwen2 / Dream tokenizer's). */
#define QWEN2_REGEX tokenizer_split_regex(TOKENIZER_SPLIT_QWEN2)

/* Verbatim from Dream-v0-Instruct-7B's tokenizer_config.json (Qwen2.5 ChatML with a default system
 * prompt and tool calls). */
static const char DREAM_CHAT_TEMPLATE[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

/* Dream's added tokens in Dream's order (ids follow the BPE vocabulary), and whether each is special. */
static const struct {
    const char *content;
    int         special;
} DREAM_ADDED[] = {
    {"<|endoftext|>", 1},     {"<|im_start|>", 1},   {"<|im_end|>", 1},      {"<|object_ref_start|>", 1},
    {"<|object_ref_end|>", 1}, {"<|box_start|>", 1}, {"<|box_end|>", 1},     {"<|quad_start|>", 1},
    {"<|quad_end|>", 1},      {"<|vision_start|>", 1}, {"<|vision_end|>", 1}, {"<|vision_pad|>", 1},
    {"<|image_pad|>", 1},     {"<|video_pad|>", 1},  {"<tool_call>", 0},     {"</tool_call>", 0},
    {"<|fim_prefix|>", 0},    {"<|fim_middle|>", 0}, {"<|fim_suffix|>", 0},  {"<|fim_pad|>", 0},
    {"<|repo_name|>", 0},     {"<|file_sep|>", 0},   {"<|beginoftext|>", 1}, {"<|mask|>", 1},
};
#define N_DREAM_ADDED ((int)(sizeof DREAM_ADDED / sizeof DREAM_ADDED[0]))

int tokenizer_write_builtin_qwen2(const char *dir, tokenizer_special *sp, um_err *err) {
    bpe_trained tr;
    if (bpe_train(CORPUS, sizeof CORPUS - 1, QWEN2_REGEX, BUILTIN_MERGES, 1, &tr, err) != 0)
        return um_err_prefix(err, "built-in Qwen2 tokenizer");
    const int base = tr.n_tokens;
    json_t *vocab = json_object();
    for (int i = 0; i < tr.n_tokens; i++) json_object_set_new(vocab, tr.token[i], json_integer(i));
    size_t cap = 64, n = 0;
    for (int i = 0; i < tr.n_merges; i++)
        cap += strlen(tr.token[tr.merge[i][0]]) + strlen(tr.token[tr.merge[i][1]]) + 2;
    char *merges = xmalloc(cap);
    n += (size_t)snprintf(merges, cap, "#version: 0.2\n");
    for (int i = 0; i < tr.n_merges; i++)
        n += (size_t)snprintf(merges + n, cap - n, "%s %s\n", tr.token[tr.merge[i][0]], tr.token[tr.merge[i][1]]);
    bpe_trained_free(&tr);
    if (dump(vocab, dir, "vocab.json", err) != 0) {
        free(merges);
        return -1;
    }
    char path[4096];
    path_join(path, sizeof path, dir, "merges.txt");
    int rc = file_write_all(path, merges, n, err);
    free(merges);
    if (rc != 0) return -1;
    json_t *added = json_object(), *dec = json_object();
    for (int i = 0; i < N_DREAM_ADDED; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", base + i);
        json_object_set_new(added, DREAM_ADDED[i].content, json_integer(base + i));
        json_t *o = token_obj(DREAM_ADDED[i].content);
        json_object_set_new(o, "special", json_boolean(DREAM_ADDED[i].special));
        json_object_set_new(dec, key, o);
    }
    if (dump(added, dir, "added_tokens.json", err) != 0) {
        json_decref(dec);
        return -1;
    }
    /* tokenizer_config.json: the key set of Dream-v0-Instruct-7B's */
    json_t *cfg = json_object();
    json_object_set_new(cfg, "add_bos_token", json_false());
    json_object_set_new(cfg, "add_prefix_space", json_false());
    json_object_set_new(cfg, "added_tokens_decoder", dec);
    json_object_set_new(cfg, "additional_special_tokens", json_pack("[s,s]", "<|beginoftext|>", "<|mask|>"));
    json_object_set_new(cfg, "bos_token", json_string("<|beginoftext|>"));
    json_object_set_new(cfg, "chat_template", json_string(DREAM_CHAT_TEMPLATE));
    json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(cfg, "eos_token", json_string("<|endoftext|>"));
    json_object_set_new(cfg, "errors", json_string("replace"));
    json_object_set_new(cfg, "mask_token", json_string("<|mask|>"));
    json_object_set_new(cfg, "model_max_length", json_integer(131072));
    json_object_set_new(cfg, "pad_token", json_string("<|endoftext|>"));
    json_object_set_new(cfg, "split_special_tokens", json_false());
    json_object_set_new(cfg, "tokenizer_class", json_string("DreamTokenizer"));
    json_object_set_new(cfg, "unk_token", json_null());
    if (dump(cfg, dir, "tokenizer_config.json", err) != 0) return -1;
    json_t *stm = json_object();
    json_object_set_new(stm, "additional_special_tokens", json_pack("[s,s]", "<|beginoftext|>", "<|mask|>"));
    json_object_set_new(stm, "bos_token", token_obj("<|beginoftext|>"));
    json_object_set_new(stm, "eos_token", token_obj("<|endoftext|>"));
    json_object_set_new(stm, "mask_token", token_obj("<|mask|>"));
    json_object_set_new(stm, "pad_token", token_obj("<|endoftext|>"));
    if (dump(stm, dir, "special_tokens_map.json", err) != 0) return -1;
    sp->vocab_size = base + N_DREAM_ADDED;
    sp->eos = base + 0;
    sp->pad = base + 0;
    sp->eot = base + 2;               /* <|im_end|> */
    sp->bos = base + 22;              /* <|beginoftext|> */
    sp->mask = base + 23;             /* <|mask|> */
    return 0;
}
