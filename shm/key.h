/* SPDX-License-Identifier: MIT */
/*
 * key.h - block keys: the 128-bit XXH3 chain over token blocks.
 *
 *   root      = XXH3_128(namespace id || salt)
 *   key[i]    = XXH3_128(key[i-1] || tokens of block i || extra digest) ^ root
 *   extra     = XXH3_128(extra bytes), or all zero when there are none
 *
 * The namespace id is itself XXH3_128 of the namespace's canonical bytes
 * (kvshm_ns_id). Every key carries its chain's root (the key space of one
 * namespace and salt): the same parent, tokens and extra keys give another
 * key under another root, so a client that publishes a block with another
 * space's root as its parent makes a key of its own space, never one that
 * space looks up. The daemon recomputes every published key under the
 * publisher's own root (daemon/core/publish.c). Engine-keyed namespaces
 * (KVSHM_NS_ENGINE) key each block on its own from the engine's key
 * (kvshm_key_engine). Pure functions; used by clients, the daemon and
 * tests.
 */
#ifndef KVSHM_KEY_H
#define KVSHM_KEY_H

#include <stddef.h>
#include "segment.h"

/*
 * Test hook: when non-zero, every key computed by kvshm_key_block is ANDed
 * with this mask on both halves, so that different blocks collide on
 * purpose. Never set outside tests; not exported by libkvclient.
 */
extern uint64_t kvshm_key_test_mask;

/*
 * The identity of a namespace from its geometry, model name, kind, KV
 * layout and pipeline stage. Since layout 16 no tensor-parallel rank or
 * size: a model at TP 1, 2, 4 or 8 is one namespace with one id, so one
 * root and one key chain per prompt and salt; an unstaged model of the
 * SPLIT layout keeps the id it always had.
 */
struct kvshm_key kvshm_ns_id(const struct kvshm_ns *ns);

/* The root parent of a chain: namespace id mixed with an optional salt. */
struct kvshm_key kvshm_key_root(struct kvshm_key ns_id, const void *salt,
				size_t salt_len);

/* Digest of the request's extra keys (LoRA id, multimodal hashes). */
struct kvshm_key kvshm_key_extra(const void *extra, size_t extra_len);

/* Key of one block of `bt` tokens under `parent`, in the key space of
 * `root` (the chain's root: kvshm_key_root). */
struct kvshm_key kvshm_key_block(struct kvshm_key root, struct kvshm_key parent,
				 const uint32_t *tokens, uint32_t bt,
				 struct kvshm_key extra);

/*
 * A block of an engine-keyed namespace (KVSHM_NS_ENGINE): the engine's own
 * key for it (len bytes) becomes bt "tokens" (words of XXH3_128 digests of
 * the engine key, seeded apart from every other use) written to tokens[],
 * and the block's key is kvshm_key_block(root, root, tokens, bt, no extra): no
 * chain, every block's parent is the root. Stored and verified like any
 * block's tokens, so a hit is as exact as the engine key.
 */
#define KVSHM_ENGINE_SEED 0x6b7663656e67696eull	/* "kvcengin" */
struct kvshm_key kvshm_key_engine(struct kvshm_key root, const void *ekey, size_t len,
				  uint32_t *tokens, uint32_t bt);

/* Full blocks of bt tokens in n_tokens: 16-token blocks, the common
 * case, by a shift (a 64-bit division is a tenth of a one-block
 * request's time). */
static inline size_t kvshm_blocks(size_t n_tokens, uint32_t bt)
{
	return bt == 16 ? n_tokens >> 4 : n_tokens / bt;
}

/* Keys of the n full blocks of `tokens`, the first a child of `parent`,
 * in the key space of `root`; returns n = kvshm_blocks(n_tokens, bt). */
size_t kvshm_key_chain(struct kvshm_key root, struct kvshm_key parent, struct kvshm_key extra,
		       const uint32_t *tokens, size_t n_tokens, uint32_t bt,
		       struct kvshm_key *keys);

#endif
