/* SPDX-License-Identifier: MIT */
/*
 * table.h - kvbench's in-process peer: an open-addressing hash table of
 * 128-byte entries (key, parent key, 16 tokens, page), each found by its
 * key's high bits with linear probing, and checked as kvcached checks a
 * page's identity (stored parent equals the previous block's key, stored
 * tokens equal the query's). What a serving process would build for
 * itself. The lookup mode races kvc_lookup against it; the flat mode
 * runs it at the same numbers of cached blocks as the segments it times.
 */
#ifndef KVBENCH_TABLE_H
#define KVBENCH_TABLE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

struct peer_ent {
	struct kvc_key key;
	struct kvc_key parent;
	uint32_t tokens[BT];
	uint32_t page;		/* page + 1; 0: empty */
	uint32_t pad[7];
};
_Static_assert(sizeof(struct peer_ent) == 128, "peer entry: two cache lines");

struct peer {
	struct peer_ent *e;
	uint32_t mask;
};

static inline void peer_init(struct peer *p, uint32_t cap)
{
	void *m = NULL;

	if (posix_memalign(&m, 64, (size_t)cap * sizeof(*p->e)))
		die("out of memory (peer table)");
	memset(m, 0, (size_t)cap * sizeof(*p->e));
	p->e = m;
	p->mask = cap - 1;
}

static inline void peer_insert(struct peer *p, struct kvc_key k, struct kvc_key parent,
			const uint32_t *tokens, uint32_t page)
{
	uint32_t i = (uint32_t)(k.hi >> 32) & p->mask, n;

	for (n = 0; p->e[i].page; n++, i = (i + 1) & p->mask) {
		if (n > p->mask)
			die("internal: peer table full");
		if (p->e[i].key.lo == k.lo && p->e[i].key.hi == k.hi)
			return;
	}
	p->e[i].key = k;
	p->e[i].parent = parent;
	memcpy(p->e[i].tokens, tokens, sizeof(p->e[i].tokens));
	p->e[i].page = page + 1;
}

static inline const struct peer_ent *peer_find(const struct peer *p, struct kvc_key k)
{
	uint32_t i = (uint32_t)(k.hi >> 32) & p->mask;

	for (;;) {
		const struct peer_ent *e = &p->e[i];

		if (!e->page)
			return NULL;
		if (e->key.lo == k.lo && e->key.hi == k.hi)
			return e;
		i = (i + 1) & p->mask;
	}
}

/* Longest verified prefix, pages[] filled: the peer of kvc_lookup. */
static __attribute__((noinline, unused)) size_t
peer_lookup(const struct peer *p, const struct kvc_key *keys, const uint32_t *tokens,
	    size_t n, uint32_t *pages)
{
	struct kvc_key parent = { 0, 0 };
	size_t i;

	for (i = 0; i < n; i++) {
		const struct peer_ent *e = peer_find(p, keys[i]);

		if (!e || e->parent.lo != parent.lo || e->parent.hi != parent.hi ||
		    memcmp(e->tokens, tokens + i * BT, sizeof(e->tokens)))
			break;
		pages[i] = e->page - 1;
		parent = keys[i];
	}
	return i;
}

static inline void peer_free(struct peer *p)
{
	free(p->e);
	p->e = NULL;
}

#endif
