// SPDX-License-Identifier: MIT
/*
 * key.c - the XXH3-128 key chain. Hot path: kvshm_key_chain hashes one
 * small buffer per block (parent, tokens, extra digest) with the inlined
 * XXH3 so that a 256-block prefix costs a few microseconds.
 */
#include <stdbool.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "key.h"

uint64_t kvshm_key_test_mask;

static struct kvshm_key from_xxh(XXH128_hash_t x)
{
	struct kvshm_key k = { x.low64, x.high64 };
	return k;
}

struct kvshm_key kvshm_ns_id(const struct kvshm_ns *ns)
{
	/* Canonical bytes: fixed-width fields in a fixed order, then model.
	 * No tensor-parallel rank or size: every TP size of a model is one
	 * namespace (its pages hold all heads). */
	uint64_t buf[8 + KVSHM_MODEL_NAME / 8 + 1];
	bool staged = ns->pp_size > 1;
	size_t n;

	memset(buf, 0, sizeof(buf));
	buf[0] = 0x6b7663616368656eull;	/* domain separator */
	buf[1] = ns->dtype_bytes;
	buf[2] = ns->layers;
	buf[3] = ns->kv_heads;
	buf[4] = ns->head_dim;
	buf[5] = ns->block_tokens;
	buf[6] = ns->pos_kind;
	buf[7] = ns->page_bytes;
	n = strnlen(ns->model, KVSHM_MODEL_NAME);
	memcpy(&buf[8], ns->model, n);
	if (ns->kind != KVSHM_NS_TOKENS)	/* a namespace of engine keys: */
		buf[0] ^= (uint64_t)ns->kind << 56;	/* never a token one's id */
	if (ns->layout != KVSHM_KV_SPLIT)	/* a latent (MLA) page: never */
		buf[0] ^= (uint64_t)ns->layout << 48;	/* a K/V one's id */
	if (!staged)	/* the identity an unstaged model always had */
		return from_xxh(XXH3_128bits(buf, sizeof(buf) - 8));
	buf[8 + KVSHM_MODEL_NAME / 8] = (uint64_t)ns->pp_rank << 32 |
		(uint64_t)ns->pp_size << 48;
	return from_xxh(XXH3_128bits(buf, sizeof(buf)));
}

struct kvshm_key kvshm_key_root(struct kvshm_key ns_id, const void *salt,
				size_t salt_len)
{
	XXH128_hash_t seed = { ns_id.lo, ns_id.hi };
	XXH3_state_t st;

	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, &seed, sizeof(seed));
	if (salt && salt_len)
		XXH3_128bits_update(&st, salt, salt_len);
	return from_xxh(XXH3_128bits_digest(&st));
}

struct kvshm_key kvshm_key_extra(const void *extra, size_t extra_len)
{
	struct kvshm_key zero = { 0, 0 };

	if (!extra || !extra_len)
		return zero;
	return from_xxh(XXH3_128bits(extra, extra_len));
}

struct kvshm_key kvshm_key_block(struct kvshm_key root, struct kvshm_key parent,
				 const uint32_t *tokens, uint32_t bt,
				 struct kvshm_key extra)
{
	/* parent (16) | tokens (4 * bt) | extra (16), hashed in one call. */
	uint8_t buf[32 + 4 * KVSHM_MAX_BLOCK_TOKENS];
	size_t tb = (size_t)bt * 4;
	struct kvshm_key k;

	memcpy(buf, &parent, 16);
	memcpy(buf + 16, tokens, tb);
	memcpy(buf + 16 + tb, &extra, 16);
	k = from_xxh(XXH3_128bits(buf, 32 + tb));
	/* Into the root's key space: after the hash, where no input the
	 * publisher chooses can cancel it (shm/key.h). */
	k.lo ^= root.lo;
	k.hi ^= root.hi;
	if (kvshm_key_test_mask) {
		k.lo &= kvshm_key_test_mask;
		k.hi &= kvshm_key_test_mask;
	}
	return k;
}

struct kvshm_key kvshm_key_engine(struct kvshm_key root, const void *ekey, size_t len,
				  uint32_t *tokens, uint32_t bt)
{
	const struct kvshm_key zero = { 0, 0 };
	XXH128_hash_t d = XXH3_128bits_withSeed(ekey, len, KVSHM_ENGINE_SEED), w;
	uint32_t j, q;

	for (j = 0; j < bt; j += 4) {
		w = XXH3_128bits_withSeed(&d, sizeof(d), j / 4 + 1);
		for (q = 0; q < 4 && j + q < bt; q++)
			tokens[j + q] = (uint32_t)((q < 2 ? w.low64 : w.high64) >> (32 * (q & 1)));
	}
	return kvshm_key_block(root, root, tokens, bt, zero);
}

size_t kvshm_key_chain(struct kvshm_key root, struct kvshm_key parent, struct kvshm_key extra,
		       const uint32_t *tokens, size_t n_tokens, uint32_t bt,
		       struct kvshm_key *keys)
{
	size_t n = kvshm_blocks(n_tokens, bt), i;

	for (i = 0; i < n; i++) {
		keys[i] = kvshm_key_block(root, parent, tokens + i * bt, bt, extra);
		parent = keys[i];
	}
	return n;
}
