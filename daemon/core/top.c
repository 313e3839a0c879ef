// SPDX-License-Identifier: MIT
/*
 * top.c - the top-prefix sketch, fed from the hit rings clients write in
 * their ledgers and drained on the daemon's tick (the pin census, which
 * reads the ledgers' pin slots, is census.c).
 *
 * The sketch is space-saving (Metwally, Agrawal, El Abbadi 2005): KVSHM_TOP
 * counters for the prefix roots with the most hit tokens. A root not yet
 * counted takes over the entry with the fewest tokens and inherits that
 * count as its error bound, so any root whose true count exceeds
 * total / KVSHM_TOP is guaranteed to be in the sketch, with no scan of the
 * index and bounded memory. Everything read from a ledger is untrusted:
 * labels are copied, NUL-terminated and made printable here.
 */
#include <stdlib.h>
#include <string.h>

#include "kvd.h"
#include "top.h"
#include "../util/log.h"

static void top_add(struct kvshm_top *t, uint32_t ns_id, struct kvshm_key key,
		    uint64_t tokens, const char *label)
{
	struct kvshm_top_entry *e = NULL;
	uint32_t i, min = 0;

	for (i = 0; i < t->n; i++) {
		if (t->e[i].ns_id == ns_id && kvshm_key_eq(t->e[i].key, key)) {
			e = &t->e[i];
			break;
		}
		if (t->e[i].hit_tokens < t->e[min].hit_tokens)
			min = i;
	}
	kvshm_seq_write_begin(&t->seq);
	if (e) {
		__atomic_store_n(&e->hit_tokens, e->hit_tokens + tokens, __ATOMIC_RELAXED);
	} else {
		uint64_t base = 0;

		if (t->n < KVSHM_TOP) {
			e = &t->e[t->n];
			__atomic_store_n(&t->n, t->n + 1, __ATOMIC_RELAXED);
		} else {
			e = &t->e[min];
			base = e->hit_tokens;
		}
		__atomic_store_n(&e->key.lo, key.lo, __ATOMIC_RELAXED);
		__atomic_store_n(&e->key.hi, key.hi, __ATOMIC_RELAXED);
		__atomic_store_n(&e->ns_id, ns_id, __ATOMIC_RELAXED);
		__atomic_store_n(&e->err, base, __ATOMIC_RELAXED);
		__atomic_store_n(&e->hit_tokens, base + tokens, __ATOMIC_RELAXED);
		for (i = 0; i < KVSHM_LABEL; i++)
			__atomic_store_n(&e->label[i], 0, __ATOMIC_RELAXED);
	}
	if (label[0])
		for (i = 0; i < KVSHM_LABEL; i++)
			__atomic_store_n(&e->label[i], label[i], __ATOMIC_RELAXED);
	kvshm_seq_write_end(&t->seq);
}

void kvd_top_drain(struct kvd *d, struct kvd_client *c)
{
	struct kvshm_ledger *l = c->l;
	uint64_t head = atomic_load_explicit(&l->hit_head, memory_order_acquire), k, from;
	struct kvshm_hit rec[KVSHM_HIT_RING];
	uint32_t n = 0, i, j;

	if (head < c->hit_seen) {	/* a client rewound its own ring */
		c->hit_seen = head;
		return;
	}
	from = head - c->hit_seen > KVSHM_HIT_RING ? head - KVSHM_HIT_RING : c->hit_seen;
	for (k = from; k < head; k++, n++) {
		const struct kvshm_hit *src = &l->hits[k & (KVSHM_HIT_RING - 1)];

		rec[n].key_lo = __atomic_load_n(&src->key_lo, __ATOMIC_RELAXED);
		rec[n].key_hi = __atomic_load_n(&src->key_hi, __ATOMIC_RELAXED);
		rec[n].tokens = __atomic_load_n(&src->tokens, __ATOMIC_RELAXED);
		for (j = 0; j < KVSHM_LABEL; j++)
			rec[n].label[j] = __atomic_load_n(&src->label[j], __ATOMIC_RELAXED);
	}
	c->hit_seen = head;
	/* Records the client may have overwritten while we copied: drop. */
	k = atomic_load_explicit(&l->hit_head, memory_order_acquire);
	for (i = 0; i < n; i++) {
		struct kvshm_key key = { rec[i].key_lo, rec[i].key_hi };

		if (from + i + KVSHM_HIT_RING < k)
			continue;
		/* A lookup hits at most KVC_MAX_TOKENS tokens; more is a lie. */
		if (!rec[i].tokens || rec[i].tokens > (1ull << 22))
			continue;
		rec[i].label[KVSHM_LABEL - 1] = 0;
		for (j = 0; rec[i].label[j]; j++)
			if (rec[i].label[j] < 0x20 || rec[i].label[j] > 0x7e)
				rec[i].label[j] = '?';
		top_add(kvshm_top(d->h), c->ns_id, key, rec[i].tokens, rec[i].label);
	}
}

void kvd_top_reset(struct kvd *d)
{
	struct kvshm_top *t = kvshm_top(d->h);
	uint32_t i, k;

	kvshm_seq_write_begin(&t->seq);
	for (i = 0; i < t->n; i++) {
		__atomic_store_n(&t->e[i].hit_tokens, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&t->e[i].err, 0, __ATOMIC_RELAXED);
		for (k = 0; k < KVSHM_LABEL; k++)
			__atomic_store_n(&t->e[i].label[k], 0, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&t->n, 0, __ATOMIC_RELAXED);
	kvshm_seq_write_end(&t->seq);
}
