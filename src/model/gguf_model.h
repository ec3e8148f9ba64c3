/*
 * gguf_model.h — a GGUF file as written by llama.cpp's converter (convert_hf_to_gguf.py) for the
 * architectures "llada" (LLaDA-8B, LLaDA-1.5), "dream" (Dream-7B) and "llada-moe" (LLaDA-MoE),
 * turned into what a checkpoint directory gives: the model config (from the metadata), the tensors
 * under their Hugging Face names and shapes (the checkpoint struct the binding code reads), the
 * tokenizer (tokenizer.ggml.*) and the chat template (tokenizer.chat_template). docs/gguf.md
 * describes the mapping.
 *
 * Tensor types F32, F16, BF16, Q8_0 and Q4_0 are used as they are (quantized ones reach the backend
 * as DTYPE_Q8_0 / DTYPE_Q4_0); any other type of a tensor the model uses is refused by name. The
 * converter's LLaDA q/k row permutation (its rotary layout) is undone in place, in the process's
 * private (copy-on-write) pages of the mapping; the MoE experts stacked in one tensor become
 * per-expert views.
 * Does not: bind tensors to the forward pass (model/llada.c), read LLaDA2 (llama.cpp's converter
 * has no such architecture). Load time, any thread.
 */
#ifndef UM_GGUF_MODEL_H
#define UM_GGUF_MODEL_H

#include "model/model_types.h"

/* Fill m->cfg, m->ck, m->tok and m->chat from the GGUF file at path (m zeroed by the caller; on
 * error the caller frees m). */
int gguf_model_load(const char *path, model *m, um_err *err);
/* The tokenizer and chat template of the GGUF file at path (*tok / *chat NULL when the file has
 * none; chat may be NULL when not wanted). No tensor is touched. */
int gguf_model_tokenizer(const char *path, struct tokenizer **tok, struct chat_template **chat, um_err *err);
/* The GGUF name of the Hugging Face tensor name hf of an architecture ("blk.3.attn_q.weight"), in
 * buf, for messages; NULL when it has none. */
const char *gguf_model_file_name(enum model_arch arch, const char *hf, char *buf, size_t cap);
/* What can be checked without touching tensor data or parsing the tokenizer (cheap: before a server
 * listens): the container, the architecture, the config from the metadata, and every tensor's
 * name, type and rank — a malformed file, an unsupported type (named) or architecture is an error. */
int gguf_model_check(const char *path, um_err *err);

/* The name of tensor `name` (a Hugging Face name) in m's files, for messages: name itself, or its
 * GGUF name (in buf) for a GGUF model. */
const char *model_tensor_label(const model *m, const char *name, char *buf, size_t cap);

#endif /* UM_GGUF_MODEL_H */
