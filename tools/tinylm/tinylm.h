/* SPDX-License-Identifier: MIT */
/*
 * tinylm.h - a small decoder-only transformer (RMSNorm, RoPE, grouped-query
 * attention, SwiGLU MLP; the llama2.c architecture) that uses kvcached the
 * way a serving engine does: prefill looks the prompt up, gathers the hit
 * pages into its own KV cache, computes only the missed tokens and
 * publishes their blocks. The reference inference process of issue #7.
 *
 * Exactness is the point: a token's output depends only on its own input
 * and the KV of the slots it attends to, never on how many tokens are
 * computed together, so a warm prefill (KV of a cached prefix gathered from
 * pool pages) gives the very same bits as a cold one. Every kernel below
 * reduces in a fixed order that does not depend on the batch, and the
 * library is built with -ffp-contract=off so that no path fuses a multiply
 * and an add that another path does not.
 *
 * CPU only. The parts a GPU path replaces are exactly tlm_forward (the
 * math) and tlm_kv_gather / tlm_kv_scatter (page <-> engine layout, what
 * kernels/ does on a GPU); the cache logic in engine.c and compose.c only
 * moves blocks and calls those.
 */
#ifndef TINYLM_H
#define TINYLM_H

#include <stddef.h>
#include <stdint.h>

#include "../../libclient/kvclient.h"

/* llama2.c run.c header: 7 int32 fields, in this order. */
struct tlm_config {
	int32_t dim;		/* model width */
	int32_t hidden_dim;	/* MLP width */
	int32_t n_layers;
	int32_t n_heads;
	int32_t n_kv_heads;
	int32_t vocab_size;	/* in the file: negative = unshared classifier */
	int32_t seq_len;	/* largest position + 1 */
};

struct tlm_model {
	struct tlm_config cfg;	/* vocab_size positive here */
	int shared_cls;		/* classifier is the embedding table */
	int head_dim, kv_dim;
	/* Namespace name for kvc_open: identifies the weights (seed and
	 * geometry, or a hash of the checkpoint file). */
	char name[64];
	float *mem;		/* all weights, owned */
	/* llama2.c order. Matrices are stored transposed, [in][out], so the
	 * matmul kernel runs along contiguous output columns. */
	float *emb;		/* [vocab][dim] */
	float *rms_att;		/* [layer][dim] */
	float *wq, *wk, *wv, *wo; /* [layer][in][out] */
	float *rms_ffn;		/* [layer][dim] */
	float *w1, *w2, *w3;	/* [layer][in][out] */
	float *rms_final;	/* [dim] */
	float *wcls;		/* [dim][vocab] */
};

/* Token ids of the byte tokenizer: llama2.c's byte-fallback ids (byte b is
 * b + 3), so byte prompts also mean something to a Llama-2 checkpoint. */
#define TLM_BOS 1
#define TLM_BYTE0 3
#define TLM_MIN_VOCAB 259

/*
 * A model with weights drawn from `seed` (splitmix64, uniform, scaled by
 * 1/sqrt(fan-in)). cfg->vocab_size 0 means 259 (the byte tokenizer).
 * Returns 0, -EINVAL (bad geometry; err says which field) or -ENOMEM.
 */
int tlm_model_generate(struct tlm_model *m, const struct tlm_config *cfg, uint64_t seed,
		       char *err, size_t errlen);
/*
 * Load a llama2.c checkpoint (run.c format: the 7-field header, then fp32
 * weights; negative vocab_size: an unshared classifier follows). Returns 0,
 * -EINVAL (bad header, or the file size does not match the header; err
 * says which and the numbers), -ENOMEM, or the errno of open/read.
 */
int tlm_model_load(struct tlm_model *m, const char *path, char *err, size_t errlen);
/* Write m as a llama2.c checkpoint (tests; tools). 0 or -errno. */
int tlm_model_save(const struct tlm_model *m, const char *path);
void tlm_model_free(struct tlm_model *m);
/* Fill a kvc_model for m: fp32 pages, RoPE, the given block size. */
struct kvc_model tlm_kvc_model(const struct tlm_model *m, uint32_t block_tokens);

/*
 * One sequence's KV cache and scratch. Slots are KV rows in the order the
 * tokens were run; each slot has its own position id, so a slot need not
 * equal its position (prompt modules).
 */
struct tlm_state {
	const struct tlm_model *m;
	size_t cap;		/* slots */
	size_t n;		/* slots filled */
	float *kc, *vc;		/* [layer][slot][kv_dim] */
	float *scratch;
	float *att;		/* [cap] scores */
	float *logits;		/* [vocab] of the last token run */
};

int tlm_state_init(struct tlm_state *s, const struct tlm_model *m, size_t cap);
void tlm_state_free(struct tlm_state *s);
/* Forget every slot (keeps the memory). */
void tlm_state_reset(struct tlm_state *s);

/*
 * Run n tokens into slots s->n .. s->n+n-1. pos[i] is token i's position
 * id (NULL: its slot number); lo[i] the first slot token i attends to
 * (NULL: 0); it attends to slots lo[i] .. its own. Leaves the last token's
 * logits in s->logits when want_logits. Returns 0, or -EINVAL (a token,
 * position or lo out of range; nothing run) or -ENOSPC (cap).
 */
int tlm_forward(struct tlm_state *s, const uint32_t *tok, const uint32_t *pos,
		const uint32_t *lo, size_t n, int want_logits);
/* Index of the largest logit (the first, on ties). */
uint32_t tlm_argmax(const float *logits, size_t n);

/* Page <-> engine layout for `bt` slots from `slot`: the page is
 * [layer][k|v][token][kv_head][head_dim], fp32. */
void tlm_kv_gather(struct tlm_state *s, size_t slot, const void *page, size_t bt);
void tlm_kv_scatter(const struct tlm_state *s, size_t slot, void *page, size_t bt);

/* Byte tokenizer. Returns the token count (<= max; BOS first if bos). */
size_t tlm_tokenize(const char *text, size_t len, int bos, uint32_t *out, size_t max);
/* Text of one token: the byte, or "<id>" (buf of at least 16 bytes). */
const char *tlm_token_str(uint32_t tok, char *buf);

/* What one prefill did. */
struct tlm_run {
	size_t tokens;		/* prompt tokens */
	size_t hit_tokens;	/* read from cached pages */
	size_t computed;	/* tokens run through the model */
	size_t published;	/* blocks this call wrote and published */
	int cache_err;		/* a kvc_ error that made it skip the cache, or 0 */
	size_t wait_tokens;	/* of hit_tokens, got by waiting for another
				 * process's prefill (single flight) */
	size_t spill_tokens;	/* of hit_tokens, restored from this host's disk */
	size_t remote_tokens;	/* of hit_tokens, fetched from the remote tier */
	size_t missed;		/* blocks after the hits it asked pages for */
	int short_err;		/* why fewer than `missed` were granted
				 * (kvc_req_short_reason), or 0 */
};

/* tlm_prefill flags */
#define TLM_NO_LOOKUP 1u	/* cold: compute everything (still publishes) */
#define TLM_NO_PUBLISH 2u	/* read hits, publish nothing */
#define TLM_NO_WAIT 4u		/* compute blocks others are writing now too */

/* Longest a prefill waits for blocks another process is writing. */
#define TLM_WAIT_MS 60000

/*
 * Prefill tok[0..n) at positions 0..n-1 into an empty state, using kvcached
 * through c (NULL: no cache at all). The cached prefix's KV is gathered
 * from the pinned pages into the state (a copy of ~7 GB/s against a
 * prefill of the same tokens, and the attention then reads one layout on
 * the cold and the warm path alike); the missed tokens are run; the full
 * blocks that missed are written to pages granted by kvc_alloc and
 * published in one round trip. At least the last token is always run, so
 * its logits are in s->logits. `extra` goes to kvc_req_new; label to
 * kvc_req_label (both may be NULL). Blocks another process is writing
 * right now are waited for (up to TLM_WAIT_MS) and then gathered like
 * hits, unless flags has TLM_NO_WAIT (single flight, kvclient.h).
 * A failing cache call does not fail the prefill: it is noted in
 * run->cache_err and the tokens are computed. Returns 0, or what
 * tlm_forward returns.
 */
int tlm_prefill(struct tlm_state *s, kvc_t *c, const uint32_t *tok, size_t n,
		const void *extra, size_t extra_len, const char *label, unsigned flags,
		struct tlm_run *run);

/* Monotonic seconds. */
double tlm_now(void);

/* The model kvdemo and kvbench's ttft mode use by default: generated
 * weights from TLM_DEMO_SEED, 4 layers, width 256, MLP 768, 8 heads, 4 KV
 * heads, the byte vocabulary, 8192 positions (64 KiB pages at 16 tokens
 * per block). */
#define TLM_DEMO_SEED 42
#define TLM_DEMO_CONFIG                                                        \
	{ .dim = 256, .hidden_dim = 768, .n_layers = 4, .n_heads = 8, .n_kv_heads = 4, \
	  .seq_len = 8192 }

/*
 * The long-document QA prompts (prompts.c): a table document of exactly n
 * tokens (BOS + n-1 bytes) drawn from seed, and question i of exactly n
 * tokens (no BOS; n up to 4,096). Return the token count, 0 when n < 2 or
 * out of memory (the document).
 */
size_t tlm_make_doc(uint32_t *out, size_t n, uint64_t seed);
size_t tlm_make_question(uint32_t *out, size_t n, int i);

#endif
