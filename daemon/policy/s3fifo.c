// SPDX-License-Identifier: MIT
/*
 * s3fifo.c - S3-FIFO (policy.h; Yang et al., SOSP 2023): a small
 * FIFO of about a tenth of the blocks, a main FIFO of the rest and a
 * ghost history of blocks recently evicted from the small queue.
 *
 *   new block          ghost remembers it ? main : small
 *   use                freq = min(freq + 1, 3)
 *   small's cold end   freq ? to main (freq 0) : evict, remember in ghost
 *   main's cold end    freq ? freq - 1, to main's head : evict
 *
 * A block used once (a one-off document) leaves from the small queue and
 * never displaces the main queue's hot set. The ghost is a FIFO of the
 * last 2n fingerprints with an exact set for membership (open addressing,
 * linear probing, deletion by backward shift): a lossy table would send
 * a share of every scan straight to main. Twice the cache, because a
 * prompt is many blocks: a hot document must still be remembered after
 * the long one-off documents seen between two of its uses. Steps (second
 * chances) are paid for by earlier uses; policy.c caps them per pick.
 */
#include "policy.h"

#include <stdlib.h>

#define SMALL 1
#define MAIN 2
#define FREQ_MAX 3

struct s3 {
	uint32_t n_small, n_main;
	/* ghost: fingerprints in FIFO order, and the set of them (0: empty
	 * bucket; a fingerprint of 0 is stored as 1) */
	uint64_t *ring;
	uint32_t ring_cap, ring_n, ring_head;
	uint64_t *set;
	uint32_t set_mask;
};

static inline struct s3 *s3_of(struct kvd_policy *p)
{
	return p->priv;
}

static uint32_t fp_slot(const struct s3 *s, uint64_t fp)
{
	fp ^= fp >> 29;
	fp *= 0xbf58476d1ce4e5b9ull;
	fp ^= fp >> 32;
	return (uint32_t)fp & s->set_mask;
}

/* Fault every page of [p, p + n) in now: one write a page, through a
 * volatile pointer (a memset of zeros after malloc, the compiler turns
 * back into a calloc that touches nothing). */
static void touch(void *p, size_t n)
{
	volatile char *c = p;
	size_t i;

	for (i = 0; i < n; i += 4096)
		c[i] = 0;
}

static int s3_init(struct kvd_policy *p)
{
	struct s3 *s = calloc(1, sizeof(*s));
	uint32_t m = 16;

	if (!s)
		return -1;
	s->ring_cap = p->n ? 2 * p->n : 1;
	while (m < 2 * (uint64_t)s->ring_cap && m < (1u << 31))
		m <<= 1;
	s->set_mask = m - 1;
	s->ring = malloc(s->ring_cap * sizeof(*s->ring));
	s->set = calloc(m, sizeof(*s->set));
	if (!s->ring || !s->set) {
		free(s->ring);
		free(s->set);
		free(s);
		return -1;
	}
	/* Faulted in here, not left to calloc's untouched zero pages: the ghost
	 * set is written at random, so until each of its pages had its first
	 * write, an eviction took a page fault (and a page clear) inside an
	 * ALLOC's round trip: 20-35 us more per ALLOC on a full 16 GiB pool
	 * of 4 KiB pages (192 MB of ghost) than on 64 MiB. Now that is paid
	 * once, at start (48 bytes per pool page). */
	touch(s->set, m * sizeof(*s->set));
	touch(s->ring, s->ring_cap * sizeof(*s->ring));
	p->priv = s;
	return 0;
}

static void s3_fini(struct kvd_policy *p)
{
	struct s3 *s = s3_of(p);

	free(s->ring);
	free(s->set);
	free(s);
	p->priv = NULL;
}

/* The bucket holding fp, or the empty one where it would go. The set is
 * at most half full, so the probe ends. */
static uint32_t set_find(const struct s3 *s, uint64_t fp)
{
	uint32_t k = fp_slot(s, fp);

	while (s->set[k] && s->set[k] != fp)
		k = (k + 1) & s->set_mask;
	return k;
}

static bool ghost_has(const struct s3 *s, uint64_t fp)
{
	fp = fp ? fp : 1;
	return s->set[set_find(s, fp)] == fp;
}

/* Delete bucket k, shifting back the entries its probe runs passed. */
static void set_del(struct s3 *s, uint32_t k)
{
	uint32_t j = k, home;

	for (;;) {
		j = (j + 1) & s->set_mask;
		if (!s->set[j])
			break;
		home = fp_slot(s, s->set[j]);
		/* Stays if its home lies cyclically in (k, j]. */
		if (k <= j ? (k < home && home <= j) : (k < home || home <= j))
			continue;
		s->set[k] = s->set[j];
		k = j;
	}
	s->set[k] = 0;
}

static void ghost_add(struct s3 *s, uint64_t fp)
{
	uint32_t k;

	fp = fp ? fp : 1;
	k = set_find(s, fp);
	if (s->set[k] == fp)
		return;	/* remembered already (the ring keeps its first time) */
	if (s->ring_n == s->ring_cap) {
		uint32_t old = set_find(s, s->ring[s->ring_head]);

		if (s->set[old] == s->ring[s->ring_head])
			set_del(s, old);
		s->ring_head = (s->ring_head + 1) % s->ring_cap;
		s->ring_n--;
		k = set_find(s, fp);
	}
	s->ring[(s->ring_head + s->ring_n++) % s->ring_cap] = fp;
	s->set[k] = fp;
}

/* id onto `list`, right after node `at` (the list's sentinel: its head). */
static void put_after(struct kvd_policy *p, uint32_t id, uint8_t list, uint32_t at)
{
	struct s3 *s = s3_of(p);

	kvd_plist_after(p->ord, at, id);
	p->node[id].list = list;
	if (list == SMALL)
		s->n_small++;
	else
		s->n_main++;
}

static void put(struct kvd_policy *p, uint32_t id, uint8_t list, bool cold)
{
	uint32_t sn = p->n + list;

	put_after(p, id, list, cold ? kvd_plist_tail(p->ord, sn) : sn);
}

static void s3_add(struct kvd_policy *p, uint32_t id, bool used, bool cold)
{
	struct kvd_pnode *nd = &p->node[id];

	if (cold)	/* a parent whose children left: where it was */
		put(p, id, nd->from == SMALL ? SMALL : MAIN, true);
	else if (used)	/* pinned or used while parked: in use, keep it */
		put(p, id, MAIN, false);
	else
		put(p, id, ghost_has(s3_of(p), nd->fp) ? MAIN : SMALL, false);
}

static void s3_add_behind(struct kvd_policy *p, uint32_t id, uint32_t behind)
{
	uint8_t list = ghost_has(s3_of(p), p->node[id].fp) ? MAIN : SMALL;

	put_after(p, id, list, p->node[behind].list == list ? behind : p->n + list);
}

static void s3_touch(struct kvd_policy *p, uint32_t id)
{
	if (p->node[id].freq < FREQ_MAX)
		p->node[id].freq++;
}

static void s3_del(struct kvd_policy *p, uint32_t id)
{
	struct s3 *s = s3_of(p);

	if (p->node[id].list == SMALL)
		s->n_small--;
	else
		s->n_main--;
	kvd_plist_unlink(p->ord, id);
}

static uint32_t s3_next(struct kvd_policy *p, uint32_t *steps)
{
	struct s3 *s = s3_of(p);
	uint32_t t;

	for (;;) {
		uint32_t target = (s->n_small + s->n_main) / 10;

		if (s->n_small && (s->n_small > target || !s->n_main)) {
			t = kvd_plist_tail(p->ord, p->n + SMALL);
			if (!p->node[t].freq || ++*steps > KVD_POLICY_STEPS)
				return t;
			/* Used while in small: it earns main. */
			s3_del(p, t);
			p->node[t].freq = 0;
			put(p, t, MAIN, false);
			continue;
		}
		if (!s->n_main)
			return KVD_POLICY_NONE;
		t = kvd_plist_tail(p->ord, p->n + MAIN);
		if (!p->node[t].freq || ++*steps > KVD_POLICY_STEPS)
			return t;
		p->node[t].freq--;
		kvd_plist_unlink(p->ord, t);
		kvd_plist_after(p->ord, p->n + MAIN, t);
	}
}

static void s3_gone(struct kvd_policy *p, uint32_t id, uint8_t from)
{
	if (from == SMALL)
		ghost_add(s3_of(p), p->node[id].fp);
}

const struct kvd_policy_ops kvd_policy_s3fifo = {
	.name = "s3fifo",
	.prefix = true,
	.init = s3_init,
	.fini = s3_fini,
	.add = s3_add,
	.add_behind = s3_add_behind,
	.touch = s3_touch,
	.del = s3_del,
	.next = s3_next,
	.gone = s3_gone,
};
