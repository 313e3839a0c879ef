/* SPDX-License-Identifier: MIT */
/*
 * tlm_fixture.h - what the integration tests that run tinylm share: the
 * tiny model (2 layers, width 64, 8 KiB pages at 16-token blocks, so that
 * the suites stay fast under ASan), attaching with it, and prompts of
 * byte tokens drawn from a seed. Header-only: only the tests that link
 * libtinylm include it.
 */
#ifndef KVT_TLM_FIXTURE_H
#define KVT_TLM_FIXTURE_H

#include <stdint.h>

#include "../../tools/tinylm/tinylm.h"

#define KVT_TLM_BT 16

/* The tiny model: weights from seed 7. 0 or what tlm_model_generate says. */
static inline int kvt_tlm_model(struct tlm_model *m, char *err, size_t errlen)
{
	struct tlm_config cfg = { .dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4,
				  .n_kv_heads = 2, .seq_len = 1024 };

	return tlm_model_generate(m, &cfg, 7, err, errlen);
}

/* Attach to the daemon at sock with model m's namespace, or NULL. */
static inline kvc_t *kvt_tlm_open(const struct tlm_model *m, const char *sock)
{
	struct kvc_model km = tlm_kvc_model(m, KVT_TLM_BT);
	struct kvc_options o = { .size = sizeof(o), .socket_path = sock };
	kvc_t *c = NULL;

	return kvc_open(&km, &o, &c) ? NULL : c;
}

/* n byte tokens drawn from seed (xorshift). */
static inline void kvt_tlm_prompt(uint32_t *t, size_t n, uint32_t seed)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		t[i] = TLM_BYTE0 + (s >> 24) % 256;
	}
}

#endif
