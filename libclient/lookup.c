// SPDX-License-Identifier: MIT
/*
 * lookup.c - the hot path: key chain and longest verified prefix, pinned.
 *
 * No system call and no lock shared with another process: the index and
 * page table are read from the read-only segment mapping, pins go to our
 * own ledger. The only lock is the in-process slot-stack mutex, taken once
 * per lookup (an uncontended futex is a couple of atomic instructions).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "../shm/index.h"
#include "../shm/key.h"
#include "../shm/page.h"

#define PREFETCH_AHEAD 8

static int check_tokens(const uint32_t *tokens, size_t n_tokens,
			const void *extra, size_t extra_len)
{
	if ((!tokens && n_tokens) || (!extra && extra_len))
		return -EINVAL;
	if (n_tokens > KVC_MAX_TOKENS || extra_len > KVC_MAX_EXTRA)
		return -E2BIG;
	return 0;
}

int kvc_keys(kvc_t *c, const uint32_t *tokens, size_t n_tokens,
	     const void *extra, size_t extra_len, struct kvc_key *keys,
	     size_t max_keys)
{
	struct kvshm_key parent, ex;
	size_t n, i;
	int rc;

	if (!c || (!keys && max_keys))
		return -EINVAL;
	if ((rc = check_tokens(tokens, n_tokens, extra, extra_len)))
		return rc;
	n = n_tokens / c->bt;
	ex = kvshm_key_extra(extra, extra_len);
	parent = c->root;
	for (i = 0; i < n && i < max_keys; i++) {
		parent = kvshm_key_block(parent, tokens + i * c->bt, c->bt, ex);
		keys[i].lo = parent.lo;
		keys[i].hi = parent.hi;
	}
	return (int)n;
}

int kvc_req_new(kvc_t *c, const uint32_t *tokens, size_t n_tokens,
		const void *extra, size_t extra_len, struct kvc_req **out)
{
	struct kvc_req *r;
	size_t n, i, head, small;
	int rc;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!c)
		return -EINVAL;
	if ((rc = check_tokens(tokens, n_tokens, extra, extra_len)))
		return rc;
	n = n_tokens / c->bt;
	/*
	 * One allocation for the request and its per-block arrays: a 1-block
	 * lookup spent more on six malloc/free pairs than on the lookup.
	 * Keys first (8-byte aligned), the small arrays the lookup writes,
	 * the tokens last. n <= KVC_MAX_TOKENS: the sum cannot overflow.
	 */
	head = (sizeof(*r) + 15) & ~(size_t)15;
	small = (n * (sizeof(*r->keys) + 3 * sizeof(uint32_t) + 1) + 3) & ~(size_t)3;
	r = malloc(head + small + n * c->bt * sizeof(uint32_t));
	if (!r)
		return -ENOMEM;
	memset(r, 0, sizeof(*r));
	r->c = c;
	r->n = n;
	r->n_tokens = n_tokens;
	if (n) {
		r->keys = (struct kvshm_key *)((char *)r + head);
		r->page = (uint32_t *)(r->keys + n);
		r->gen = r->page + n;
		r->slot = r->gen + n;
		r->state = (uint8_t *)(r->slot + n);
		r->tokens = (uint32_t *)((char *)r + head + small);
		memset(r->state, 0, n);
		memcpy(r->tokens, tokens, n * c->bt * sizeof(uint32_t));
		kvshm_key_chain(c->root, kvshm_key_extra(extra, extra_len), r->tokens,
				n * c->bt, c->bt, r->keys);
		for (i = 0; i < n; i++)
			r->slot[i] = UINT32_MAX;
	}
	*out = r;
	return 0;
}

int kvc_req_label(struct kvc_req *r, const char *label)
{
	size_t n;

	if (!r || r->stage != 0)
		return -EINVAL;
	n = label ? strnlen(label, KVSHM_LABEL) : 0;
	if (n >= KVSHM_LABEL)
		return -E2BIG;
	memset(r->label, 0, sizeof(r->label));
	if (n)
		memcpy(r->label, label, n);
	return 0;
}

size_t kvc_req_blocks(const struct kvc_req *r)
{
	return r ? r->n : 0;
}

int kvc_lookup(struct kvc_req *r)
{
	const struct kvshm_header *h;
	struct kvshm_ledger *l;
	struct kvshm_key parent;
	kvc_t *c;
	size_t i, k, got;
	uint32_t bt;

	if (!r || r->stage != 0)
		return -EINVAL;
	c = r->c;
	if ((k = (size_t)-kvc_usable(c)))
		return -(int)k;	/* dead or forked: no hits from a stale view */
	h = c->seg;
	l = c->ledger;
	bt = c->bt;
	r->stage = 1;
	parent = c->root;
	for (k = 0; k < r->n && k < PREFETCH_AHEAD; k++)
		kvshm_index_prefetch(h, r->keys[k]);
	/* All the pin slots this lookup can use, in one lock round. */
	got = kvc_slots_get(c, r->slot, (uint32_t)r->n);
	for (i = 0; i < got; i++) {
		uint32_t page, gen;

		if (i + PREFETCH_AHEAD < r->n)
			kvshm_index_prefetch(h, r->keys[i + PREFETCH_AHEAD]);
		page = kvshm_index_find(h, r->keys[i]);
		if (page == UINT32_MAX ||
		    !kvshm_page_verify(h, page, c->ns_id, r->keys[i], parent,
				       r->tokens + i * bt, &gen))
			break;
		if (!kvshm_ledger_pin(l, r->slot[i], h, page, gen)) {
			atomic_fetch_add_explicit(&l->pin_failures, 1, memory_order_relaxed);
			break;
		}
		kvshm_ledger_touch(l, page);
		r->page[i] = page;
		r->gen[i] = gen;
		r->state[i] = KVC_B_PINNED;
		parent = r->keys[i];
	}
	/* Slots past the hit prefix go back (when got < n, the pin quota
	 * ended the prefix and the rest is a miss). */
	if (got > i)
		kvc_slots_put(c, r->slot + i, (uint32_t)(got - i));
	for (k = i; k < got; k++)
		r->slot[k] = UINT32_MAX;
	r->hits = (uint32_t)i;
	if (i)
		kvshm_ledger_hit(l, r->keys[0], (uint64_t)i * bt, r->label);
	atomic_fetch_add_explicit(&l->lookup_tokens, r->n_tokens, memory_order_relaxed);
	atomic_fetch_add_explicit(&l->hit_tokens, (uint64_t)i * bt, memory_order_relaxed);
	atomic_fetch_add_explicit(&l->lookups, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&l->hit_blocks, i, memory_order_relaxed);
	atomic_fetch_add_explicit(&l->miss_blocks, r->n - i, memory_order_relaxed);
	atomic_fetch_add_explicit(&l->pins_held, i, memory_order_relaxed);
	return (int)i;
}

void *kvc_block(struct kvc_req *r, size_t i)
{
	if (!r || i >= r->n || r->state[i] == KVC_B_NONE)
		return NULL;
	return r->c->pool + (uint64_t)r->page[i] * r->c->slot_bytes;
}

int64_t kvc_block_page(const struct kvc_req *r, size_t i)
{
	if (!r || i >= r->n)
		return -EINVAL;
	if (r->state[i] == KVC_B_NONE)
		return -ENOENT;
	return r->page[i];
}
