// SPDX-License-Identifier: MIT
/*
 * nsstat.c - statistics per namespace (model), and the operator's reset of
 * every counter.
 *
 * Per namespace, in the segment's struct kvshm_ns_stats array (row i for
 * namespace row i), and per tenant, in its struct kvshm_tenant row (the
 * same ledger counters, from its clients), written on the main thread
 * only:
 *   - what its clients count in their ledgers (lookups, hit and missed
 *     blocks, looked-up and hit tokens, published pages), folded in as
 *     deltas: each client remembers what was already added (ns_seen), so
 *     a client that leaves adds only what it counted since the last tick,
 *     and one that rewinds its (client-written) counters adds nothing;
 *   - the clients attached with it now;
 *   - its pool pages holding a block (READY or being evicted), kept by
 *     shm/page.c at each page's transitions, so nothing here reads the
 *     page table.
 *
 * The reset (kvstat --reset, a RESET frame from root or the daemon's own
 * user) zeroes every counter the metrics table calls one, the per-namespace
 * counters and the top-prefix sketch; gauges (pages, clients, pins) are
 * states, not counts, and stay. Daemon-wide lookup counters are sums over
 * the ledgers (registry.c's fold); they restart from zero because the sum
 * of the clients that left is set to minus what the attached ones have
 * counted so far (modulo 2^64), so the next fold gives what was counted
 * since. Per-client rows are the clients' own counts since they attached
 * and are not reset (a client's kvc_stats shows the same numbers).
 *
 * Must never: block, or trust a ledger value beyond adding it to a count.
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../shm/stats.h"
#include "kvd.h"
#include "admin.h"
#include "nsstat.h"
#include "reply.h"
#include "top.h"
#include "../util/log.h"

#define RELAXED memory_order_relaxed

static uint32_t ns_rows(const struct kvd *d)
{
	return d->h->geo.max_ns < KVD_MAX_NS ? d->h->geo.max_ns : KVD_MAX_NS;
}

/* The ledger counters, in the order of ns_seen[] and of add_to_ns(). */
static void ledger_counts(const struct kvshm_ledger *l, uint64_t v[KVD_NS_FOLD])
{
	struct kvshm_ledger_counts n;

	kvshm_ledger_sum(l, &n);
	v[0] = n.lookups;
	v[1] = n.hit_blocks;
	v[2] = n.miss_blocks;
	v[3] = n.lookup_tokens;
	v[4] = n.hit_tokens;
	v[5] = n.published;
}

/* The counters of a namespace entry or a tenant row, in ns_seen[] order. */
#define FOLD_TO(st) { &(st)->lookups, &(st)->hit_blocks, &(st)->miss_blocks, \
		      &(st)->lookup_tokens, &(st)->hit_tokens, &(st)->published }

/* c's new ledger counts, to its namespace's entry and its tenant's row. */
static void fold(struct kvd *d, struct kvd_client *c)
{
	struct kvshm_ns_stats *ns = c->ns_id < ns_rows(d) ? &kvshm_ns_stats(d->h)[c->ns_id] : NULL;
	struct kvshm_tenant *tr = c->tenant < KVSHM_TENANTS ? &kvshm_tenants(d->h)[c->tenant] : NULL;
	uint64_t v[KVD_NS_FOLD];
	int k;

	ledger_counts(c->l, v);
	for (k = 0; k < KVD_NS_FOLD; k++) {
		/* A counter that went back was rewound by its client: start
		 * again from there, adding nothing. */
		if (v[k] > c->ns_seen[k]) {
			if (ns) {
				_Atomic uint64_t *to[KVD_NS_FOLD] = FOLD_TO(ns);

				kvd_stat_add(to[k], (int64_t)(v[k] - c->ns_seen[k]));
			}
			if (tr) {
				_Atomic uint64_t *to[KVD_NS_FOLD] = FOLD_TO(tr);

				kvd_stat_add(to[k], (int64_t)(v[k] - c->ns_seen[k]));
			}
		}
		c->ns_seen[k] = v[k];
	}
}

void kvd_nsstat_tick(struct kvd *d)
{
	struct kvshm_ns_stats *st = kvshm_ns_stats(d->h);
	uint64_t clients[KVD_MAX_NS] = { 0 };
	uint32_t i, rows = ns_rows(d);

	for (i = 0; i < d->cfg.max_clients; i++) {
		struct kvd_client *c = &d->clients[i];

		if (!kvd_live(c))
			continue;
		fold(d, c);
		if (c->ns_id < rows)
			clients[c->ns_id]++;
	}
	for (i = 0; i < rows; i++)
		atomic_store_explicit(&st[i].clients, clients[i], RELAXED);
}

void kvd_nsstat_retire(struct kvd *d, struct kvd_client *c)
{
	if (c->hello && c->l)
		fold(d, c);
}

void kvd_nsstat_clear(struct kvd *d, uint32_t ns_id)
{
	struct kvshm_ns_stats *st;
	_Atomic uint64_t *w;
	size_t k;

	if (ns_id >= ns_rows(d))
		return;
	st = &kvshm_ns_stats(d->h)[ns_id];
	w = (_Atomic uint64_t *)st;
	/* All but the page gauge: shm/page.c keeps it at every transition,
	 * and pages of the row's last namespace that stayed (pinned) still
	 * carry its number until they are freed. */
	for (k = 0; k < sizeof(*st) / sizeof(uint64_t); k++)
		if (&w[k] != &st->pages)
			atomic_store_explicit(&w[k], 0, RELAXED);
}

void kvd_stats_reset(struct kvd *d)
{
	_Atomic uint64_t *v = (_Atomic uint64_t *)kvshm_stats(d->h);
	struct kvshm_ns_stats *st = kvshm_ns_stats(d->h);
	uint64_t lk = 0, hit = 0, miss = 0, pf = 0, lt = 0, ht = 0;
	struct timespec ts;
	uint32_t i;
	size_t k;

	for (k = 0; k < kvshm_n_metrics; k++)
		if (!strcmp(kvshm_metrics[k].type, "counter"))
			atomic_store_explicit(&v[kvshm_metrics[k].stat], 0, RELAXED);
	/* registry.c's fold sums gone_* and the attached clients' ledgers:
	 * make that sum zero now (unsigned arithmetic wraps). */
	for (i = 0; i < d->cfg.max_clients; i++) {
		const struct kvd_client *c = &d->clients[i];
		struct kvshm_ledger_counts n;

		if (!kvd_live(c))
			continue;
		kvshm_ledger_sum(c->l, &n);
		lk += n.lookups;
		hit += n.hit_blocks;
		miss += n.miss_blocks;
		pf += n.pin_failures;
		lt += n.lookup_tokens;
		ht += n.hit_tokens;
	}
	d->gone_lookups = -lk;
	d->gone_hits = -hit;
	d->gone_misses = -miss;
	d->gone_pinfail = -pf;
	d->gone_lookup_tokens = -lt;
	d->gone_hit_tokens = -ht;
	/* Per namespace: the counters, not the gauges (pages, clients), and
	 * every attached client's fold starts again from what it has now. */
	for (i = 0; i < ns_rows(d); i++) {
		atomic_store_explicit(&st[i].lookups, 0, RELAXED);
		atomic_store_explicit(&st[i].hit_blocks, 0, RELAXED);
		atomic_store_explicit(&st[i].miss_blocks, 0, RELAXED);
		atomic_store_explicit(&st[i].lookup_tokens, 0, RELAXED);
		atomic_store_explicit(&st[i].hit_tokens, 0, RELAXED);
		atomic_store_explicit(&st[i].published, 0, RELAXED);
		atomic_store_explicit(&st[i].dropped, 0, RELAXED);
		atomic_store_explicit(&st[i].refused, 0, RELAXED);
	}
	/* Per tenant: the counters (from lookups to dropped), not the gauges. */
	for (i = 0; i < KVSHM_TENANTS; i++) {
		struct kvshm_tenant *tr = &kvshm_tenants(d->h)[i];
		_Atomic uint64_t *c0 = &tr->lookups;

		for (k = 0; &c0[k] <= &tr->dropped; k++)
			atomic_store_explicit(&c0[k], 0, RELAXED);
	}
	/* Hit records the clients wrote before now belong to the counts
	 * being zeroed: take them in, then empty the sketch. */
	for (i = 0; i < d->cfg.max_clients; i++) {
		if (!kvd_live(&d->clients[i]))
			continue;
		ledger_counts(d->clients[i].l, d->clients[i].ns_seen);
		kvd_top_drain(d, &d->clients[i]);
	}
	kvd_top_reset(d);
	clock_gettime(CLOCK_REALTIME, &ts);
	atomic_store_explicit(&kvshm_stats(d->h)->reset_time_ns,
			      (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec, RELAXED);
}

int kvd_nsstat_reset_req(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
			 const void *p)
{
	const uint32_t seq = hdr->seq;
	struct kvproto_reset_r r = { KVPROTO_VERSION, 0 };
	struct kvproto_reset q;
	memcpy(&q, p, sizeof(q));
	c->refused = true;	/* an observer: never counted as dropped */
	if (q.version != KVPROTO_VERSION) {
		kvd_reply_error(d, c, seq, -EPROTO, true, "RESET: protocol version %u, this kvcached speaks %u",
				q.version, KVPROTO_VERSION);
		return -1;
	}
	/* The uid is the peer's SO_PEERCRED, taken at accept. */
	if (!kvd_admin_allowed(d, c, seq, "resetting the statistics"))
		return -1;
	kvd_stats_reset(d);
	kvd_info("statistics reset by pid %d (uid %u)", (int)c->pid, (unsigned)c->uid);
	if (!kvd_reply(d, c, KVPROTO_RESET_R, seq, &r, sizeof(r), NULL, 0))
		kvd_client_close(d, c, "reset served", false);
	return -1;
}
