// SPDX-License-Identifier: MIT
/*
 * lookup.c - the hot path: key chain and longest verified prefix, pinned.
 *
 * No system call and no lock shared with another process: the index and
 * page table are read from the read-only segment mapping, pins go to our
 * own ledger. No lock either, nor a locked instruction: pin slots come
 * from the thread's own cache and counts go to its own ledger row
 * (slots.c); where the daemon orders pins with membarrier (shm/prefix.h)
 * there is no barrier at all, else one fence per run of pins.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "../shm/index.h"
#include "../shm/key.h"
#include "../shm/page.h"
#include "../shm/prefix.h"

/* Restore bandwidth assumed before the daemon has measured one (B/s): a
 * modest NVMe drive. */
#define KVC_RESTORE_BPS_GUESS 1e9
/* Remote fetch bandwidth assumed before the daemon has measured one: a
 * 10 GbE link. */
#define KVC_REMOTE_BPS_GUESS 1.1e9

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

	if (!c || c->engine_keys || (!keys && max_keys))
		return -EINVAL;
	if ((rc = check_tokens(tokens, n_tokens, extra, extra_len)))
		return rc;
	n = kvshm_blocks(n_tokens, c->bt);
	ex = kvshm_key_extra(extra, extra_len);
	parent = c->root;
	for (i = 0; i < n && i < max_keys; i++) {
		parent = kvshm_key_block(c->root, parent, tokens + i * c->bt, c->bt, ex);
		keys[i].lo = parent.lo;
		keys[i].hi = parent.hi;
	}
	return (int)n;
}

/*
 * A request of n blocks with its per-block arrays, in one allocation (a
 * 1-block lookup spent more on six malloc/free pairs than on the lookup):
 * keys first (8-byte aligned), the small arrays the lookup writes, the
 * tokens last. n <= KVC_MAX_TOKENS: the sum cannot overflow.
 */
static struct kvc_req *req_alloc(kvc_t *c, size_t n, size_t n_tokens)
{
	struct kvc_req *r;
	size_t head, small, i;

	head = (sizeof(*r) + 15) & ~(size_t)15;
	small = (n * (sizeof(*r->keys) + 3 * sizeof(uint32_t) + 1) + 3) & ~(size_t)3;
	r = malloc(head + small + n * c->bt * sizeof(uint32_t));
	if (!r)
		return NULL;
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
		for (i = 0; i < n; i++)
			r->slot[i] = UINT32_MAX;
	}
	return r;
}

int kvc_req_new(kvc_t *c, const uint32_t *tokens, size_t n_tokens,
		const void *extra, size_t extra_len, struct kvc_req **out)
{
	struct kvc_req *r;
	size_t n;
	int rc;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!c || c->engine_keys)
		return -EINVAL;
	if ((rc = check_tokens(tokens, n_tokens, extra, extra_len)))
		return rc;
	n = kvshm_blocks(n_tokens, c->bt);
	r = req_alloc(c, n, n_tokens);
	if (!r)
		return -ENOMEM;
	if (n) {
		/* The chain, with the first lines the walk reads on their way
		 * while it is hashed (prefix.h). No extra keys: a zero digest,
		 * with no call (r is zeroed). */
		if (extra_len)
			r->extra = kvshm_key_extra(extra, extra_len);
		kvshm_view_walk_keys(&c->view, c->root, r->extra, tokens, r->tokens, c->bt, n,
				     r->keys);
		r->ahead = n > 1;	/* block 0's run is on its way */
	}
	*out = r;
	return 0;
}

int kvc_req_new_keys(kvc_t *c, const void *keys, const uint32_t *key_lens, size_t n,
		     struct kvc_req **out)
{
	const uint8_t *k = keys;
	struct kvc_req *r;
	size_t i;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!c || !c->engine_keys || (n && (!keys || !key_lens)))
		return -EINVAL;
	if (n > KVC_MAX_TOKENS / c->bt)
		return -E2BIG;
	for (i = 0; i < n; i++) {
		if (!key_lens[i])
			return -EINVAL;
		if (key_lens[i] > KVC_MAX_ENGINE_KEY)
			return -E2BIG;
	}
	r = req_alloc(c, n, n * c->bt);
	if (!r)
		return -ENOMEM;
	r->flat = true;
	for (i = 0; i < n; i++) {
		r->keys[i] = kvshm_key_engine(c->root, k, key_lens[i], r->tokens + i * c->bt, c->bt);
		k += key_lens[i];
	}
	kvshm_walk_prefetch(c->seg, r->keys, n);
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

/*
 * Pin blocks from..n while they are READY pages that verify; stops at the
 * first miss or when pin slots run out. Returns the block it stopped at;
 * *missed says whether it stopped on a miss (not on the pin quota or a pin
 * lost to the evictor). The walk itself (guesses, prefetch pipeline, pins
 * as it verifies) is shm/prefix.h's; the slots come from the thread's cache
 * (slots.c) and the counts go to its own ledger row.
 */
static inline __attribute__((always_inline)) size_t
pin_run(struct kvc_req *r, struct kvci_thr *t, struct kvci_row row, size_t from, bool *missed)
{
	kvc_t *c = r->c;
	size_t i, k, got;
	struct kvshm_walk w;

	*missed = false;
	if (from >= r->n)
		return from;
	/* All the pin slots this walk can use, at once. */
	got = kvci_slots_take(c, t, r->slot + from, (uint32_t)(r->n - from));
	w = (struct kvshm_walk){
		.keys = r->keys + from, .tokens = r->tokens + from * c->bt,
		.slot = r->slot + from, .page = r->page + from, .gen = r->gen + from,
		.n = got, .ns_id = c->ns_id, .parent = kvci_parent(r, from), .flat = r->flat,
		.fence = c->pin_fence, .ahead = !from && r->ahead,
	};
	r->ahead = false;	/* its prefetches are spent */
	i = from + kvshm_view_walk_pin(&c->view, c->ledger, &w, missed);
	if (__builtin_expect(i < from + got, 0)) {
		if (!*missed)
			KVCI_ROW_ADD(row, pin_failures, 1);
		/* Slots past the hit prefix go back (when got < n, the pin
		 * quota ended the prefix and the rest is a miss). */
		kvci_slots_give(c, t, r->slot + i, (uint32_t)(from + got - i));
		for (k = i; k < from + got; k++)
			r->slot[k] = UINT32_MAX;
	}
	/* One memset (a loop of byte stores reloads r->state after each: a
	 * char store may alias anything), or one store. */
	if (i - from == 1)
		r->state[from] = KVC_B_PINNED;
	else
		memset(r->state + from, KVC_B_PINNED, i - from);
#if defined(__SANITIZE_THREAD__)
	for (k = from; k < i; k++)
		KVC_TSAN_ACQUIRE(c->pool + (uint64_t)r->page[k] * c->slot_bytes);
#endif
	KVCI_ROW_ADD(row, pins_held, i - from);
	return i;
}

size_t kvci_pin_run(struct kvc_req *r, size_t from, bool *missed)
{
	struct kvci_thr *t = kvci_thr(r->c);

	return pin_run(r, t, kvci_row(r->c, t), from, missed);
}

/*
 * The tier-1 run at block `from`: blocks the index names as spill slots
 * (or as pages, between them) with the right key and parent. Returns its
 * length, 0 when block `from` is not spilled.
 */
static size_t spilled_run(const struct kvc_req *r, size_t from)
{
	const kvc_t *c = r->c;
	const struct kvshm_header *h = c->seg;
	size_t j;

	if (!h->geo.n_slots)
		return 0;
	for (j = from; j < r->n; j++) {
		uint32_t loc = kvshm_index_find(h, r->keys[j]), gen;
		struct kvshm_key parent = kvci_parent(r, j);

		if (!kvshm_slot_verify(h, loc, c->ns_id, r->keys[j], parent) &&
		    (j == from || loc >= h->geo.n_pages ||
		     !kvshm_page_verify(h, loc, c->ns_id, r->keys[j], parent,
					r->tokens + j * c->bt, &gen)))
			break;
	}
	return j - from;
}

/* May tier 2 hold blocks? While the daemon's remote tier has a server
 * that answers (one relaxed load of a shared counter). */
static bool remote_up(const kvc_t *c)
{
	return atomic_load_explicit(&kvshm_stats(c->seg)->remote_servers_up,
				    memory_order_relaxed) != 0;
}

static inline void count(struct kvc_req *r, struct kvci_row row)
{
	size_t deferred = r->hits + r->t1 + r->t2 + r->t3, miss = deferred < r->n ? r->n - deferred : 0;

	/* Hits only grow (lookup, restore, wait); misses move both ways as
	 * runs are deferred (in flight) and settled. */
	if (r->hits > r->counted_hits) {
		uint64_t k = r->hits - r->counted_hits;

		KVCI_ROW_ADD(row, hit_blocks, k);
		KVCI_ROW_ADD(row, hit_tokens, k * r->c->bt);
		r->counted_hits = r->hits;
	}
	if (miss != r->counted_misses)
		KVCI_ROW_ADD(row, miss_blocks, miss - r->counted_misses);	/* mod 2^64 */
	r->counted_misses = miss;
}

void kvci_count(struct kvc_req *r)
{
	count(r, kvci_row(r->c, kvci_thr(r->c)));
}

void kvci_settle(struct kvc_req *r)
{
	r->t1 = 0;
	r->t2 = 0;
	r->t3 = 0;
	kvci_count(r);
}

/* After a lookup's first miss at block i: the spilled run, then the run
 * in flight or the blocks that may be remote, deferred (kvc_restore or
 * kvc_wait settles them). */
static __attribute__((noinline)) void lookup_missed(struct kvc_req *r, size_t i)
{
	/* Blocks on NVMe right after the hits, or being written by another
	 * client: counted once the caller has restored (waited for) them or
	 * gone on without them. */
	r->t1 = spilled_run(r, i);
	/* Then (after a spilled run, or from the first miss when nothing is
	 * in flight there) every block may be in the remote tier: only the
	 * daemon can ask, in the FETCH kvc_restore sends. */
	r->t3 = !r->t1 ? kvci_inflight_run(r, i) : 0;
	r->t2 = !r->t3 && remote_up(r->c) ? r->n - i - r->t1 : 0;
}

int kvc_lookup(struct kvc_req *r)
{
	struct kvci_thr *t;
	struct kvci_row row;
	kvc_t *c;
	bool missed;
	size_t i;
	int rc;

	if (!r || r->stage != 0)
		return -EINVAL;
	c = r->c;
	if ((rc = kvc_usable(c)))
		return rc;	/* dead or forked: no hits from a stale view */
	t = kvci_thr(c);
	row = kvci_row(c, t);
	r->stage = 1;
	i = pin_run(r, t, row, 0, &missed);
	r->hits = (uint32_t)i;
	if (i)
		kvshm_ledger_hit(c->ledger, r->keys[0], (uint64_t)i * c->bt, r->label);
	if (__builtin_expect(i == r->n && row.own, 1)) {
		/* All of it a hit, counted in the thread's own row: plain
		 * adds, none of count()'s cases (no miss, nothing deferred). */
		struct kvshm_ctr *p = row.p;

		kvci_own_add(&p->lookups, 1);
		kvci_own_add(&p->lookup_tokens, r->n_tokens);
		kvci_own_add(&p->hit_blocks, i);
		kvci_own_add(&p->hit_tokens, (uint64_t)i * c->bt);
		r->counted_hits = (uint32_t)i;
		return (int)i;
	}
	if (missed)
		lookup_missed(r, i);
	KVCI_ROW_ADD(row, lookup_tokens, r->n_tokens);
	KVCI_ROW_ADD(row, lookups, 1);
	count(r, row);
	return (int)i;
}

size_t kvc_req_spilled(const struct kvc_req *r)
{
	return r && r->stage == 1 ? r->t1 : 0;
}

size_t kvc_req_remote(const struct kvc_req *r)
{
	return r && r->stage == 1 ? r->t2 : 0;
}

/* FETCH: parent, then each block's key and tokens. */
static uint8_t *fetch_msg(const struct kvc_req *r, size_t from, uint32_t n, uint32_t *len)
{
	const kvc_t *c = r->c;
	struct kvproto_fetch fh = { n, 0, kvci_parent(r, from) };
	size_t rec = sizeof(struct kvshm_key) + (size_t)c->bt * 4, i;
	uint8_t *msg;

	*len = (uint32_t)kvproto_fetch_bytes(n, c->bt);
	msg = malloc(*len);
	if (!msg)
		return NULL;
	memcpy(msg, &fh, sizeof(fh));
	for (i = 0; i < n; i++) {
		uint8_t *p = msg + sizeof(fh) + i * rec;

		memcpy(p, &r->keys[from + i], sizeof(struct kvshm_key));
		memcpy(p + sizeof(struct kvshm_key), r->tokens + (from + i) * c->bt,
		       (size_t)c->bt * 4);
	}
	return msg;
}

int kvc_restore(struct kvc_req *r)
{
	struct kvproto_count cnt;
	uint32_t rlen, n, mlen;
	size_t from, i, fcap;
	void *reply = NULL;
	uint8_t *msg;
	bool missed;
	int rc;

	if (!r || r->stage != 1)
		return -EINVAL;
	if ((rc = kvc_usable(r->c)))
		return rc;
	if (!r->t1 && !r->t2)
		return (int)r->hits;
	from = r->hits;
	/* No more than one frame carries, nor than we could pin: the rest
	 * of the run stays where it is (counted as missed). A run that may
	 * reach tier 2 goes as a FETCH, with its tokens. */
	fcap = r->t2 ? (KVPROTO_MAX_LEN - sizeof(struct kvproto_fetch)) /
			       (sizeof(struct kvshm_key) + (size_t)r->c->bt * 4)
		     : KVPROTO_MAX_COUNT;
	if (fcap > KVPROTO_MAX_COUNT)
		fcap = KVPROTO_MAX_COUNT;
	n = (uint32_t)(r->t1 + r->t2 < fcap ? r->t1 + r->t2 : fcap);
	if (n > kvci_slots_free(r->c, kvci_thr(r->c)))
		n = kvci_slots_free(r->c, kvci_thr(r->c));
	if (!n) {
		kvci_settle(r);
		return (int)r->hits;
	}
	if (r->t2) {
		msg = fetch_msg(r, from, n, &mlen);
	} else {
		mlen = (uint32_t)(sizeof(cnt) + (size_t)n * sizeof(struct kvshm_key));
		msg = malloc(mlen);
		if (msg) {
			cnt.n = n;
			cnt.pad = 0;
			memcpy(msg, &cnt, sizeof(cnt));
			memcpy(msg + sizeof(cnt), r->keys + from,
			       (size_t)n * sizeof(struct kvshm_key));
		}
	}
	if (!msg)
		return -ENOMEM;
	rc = kvc_rpc(r->c, r->t2 ? KVPROTO_FETCH : KVPROTO_RESTORE, msg, mlen,
		     r->t2 ? KVPROTO_FETCH_R : KVPROTO_RESTORE_R, &reply, &rlen);
	free(msg);
	if (!rc) {
		memcpy(&cnt, reply, sizeof(cnt));
		if (cnt.n != n)
			rc = -EBADMSG;
	}
	free(reply);
	if (rc) {
		kvci_settle(r);
		return rc;
	}
	/* Restored blocks are READY pages now: pin them as hits. The
	 * statuses need no reading: a block that failed is simply a miss. */
	i = kvci_pin_run(r, from, &missed);
	if (i > from)
		kvshm_ledger_hit(r->c->ledger, r->keys[0], (uint64_t)(i - from) * r->c->bt,
				 r->label);
	r->hits = (uint32_t)i;
	r->t1 = 0;
	r->t2 = 0;
	kvci_count(r);
	return (int)i;
}

int kvc_restore_pays(const struct kvc_req *r, double prefill_tokens_per_sec)
{
	const kvc_t *c;
	double bps, rbps, t_restore, t_prefill;

	if (!r || !(prefill_tokens_per_sec > 0))
		return -EINVAL;
	if (r->stage != 1 || (!r->t1 && !r->t2))
		return 0;
	c = r->c;
	bps = (double)atomic_load_explicit(&kvshm_stats(c->seg)->spill_read_bps,
					   memory_order_relaxed);
	if (bps <= 0)
		bps = KVC_RESTORE_BPS_GUESS;
	rbps = (double)atomic_load_explicit(&kvshm_stats(c->seg)->remote_fetch_bps,
					    memory_order_relaxed);
	if (rbps <= 0)
		rbps = KVC_REMOTE_BPS_GUESS;
	/* One round trip (and one to the servers for tier 2) plus the bytes
	 * (a remote item carries its header and tokens too), against
	 * prefilling the tokens. */
	t_restore = 100e-6 + (double)r->t1 * (double)(c->page_bytes + 4096) / bps;
	if (r->t2)
		t_restore += 200e-6 + (double)r->t2 * (double)(c->page_bytes + 256 + c->bt * 4) / rbps;
	t_prefill = (double)(r->t1 + r->t2) * c->bt / prefill_tokens_per_sec;
	return t_restore < t_prefill;
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
