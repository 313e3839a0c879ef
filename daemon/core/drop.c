// SPDX-License-Identifier: MIT
/*
 * drop.c - DROP: a client gives up every cached block of its own
 * namespace (kvc_drop_namespace), e.g. a benchmark cleaning up after
 * itself on a daemon that serves real engines too; and an operator's drop
 * of a namespace's or a tenant's blocks (kvstat --drop-namespace,
 * --drop-tenant, through admin.c), which ends the prefixes pinned there
 * first.
 *
 * It is the eviction a reclaimed namespace row gets (kvd_evict_ns, which
 * first forgets the namespace's spill slots): READY pages nobody pins
 * leave the index and go back to the free list, pinned pages and pages
 * being written stay. It covers the whole namespace, every salt; a client
 * can only name its own (any trusted client can read and write every page
 * anyway, see ARCHITECTURE.md "Trust"). Its cost is two passes over the
 * page table and one over the ledgers, like an eviction batch, so a client
 * gets one DROP per tick; another within the same tick is answered
 * -EAGAIN and changes nothing.
 */
#include <errno.h>
#include <string.h>

#include "kvd.h"
#include "drop.h"
#include "evict.h"
#include "pin.h"
#include "reply.h"
#include "../util/log.h"

static bool match(uint32_t v, uint32_t want)
{
	return want == UINT32_MAX || v == want;
}

/* READY pool pages and spill slots (spilled or backing) of namespace
 * ns_id and tenant (UINT32_MAX: any). */
static void count_where(const struct kvd *d, uint32_t ns_id, uint32_t tenant, uint32_t *pages,
			uint32_t *slots)
{
	const struct kvshm_page *pg = kvshm_pages(d->h);
	const struct kvshm_slot *sl = kvshm_slots(d->h);
	uint32_t i;

	*pages = *slots = 0;
	for (i = 0; i < d->h->geo.n_pages; i++)
		*pages += match(pg[i].ns_id, ns_id) && match(pg[i].tenant, tenant) &&
			  atomic_load_explicit(&pg[i].state, memory_order_relaxed) == KVSHM_PAGE_READY;
	for (i = 0; i < d->h->geo.n_slots; i++) {
		uint32_t st = atomic_load_explicit(&sl[i].state, memory_order_relaxed);

		*slots += match(sl[i].ns_id, ns_id) && match(sl[i].tenant, tenant) &&
			  (st == KVSHM_SLOT_SPILLED || st == KVSHM_SLOT_BACKING);
	}
}

/* Drop, and count: one namespace, or every one of tenant t. */
static void drop_one(struct kvd *d, uint32_t ns_id, uint32_t tenant, struct kvproto_admin_r *r)
{
	uint32_t pages0, slots0, pages1, slots1;

	count_where(d, ns_id, tenant, &pages0, &slots0);
	r->left += kvd_evict_where(d, ns_id, tenant);
	count_where(d, ns_id, tenant, &pages1, &slots1);
	r->dropped += pages0 - pages1;
	r->slots += slots0 - slots1;
	if (ns_id < d->h->geo.max_ns && ns_id < KVD_MAX_NS)
		kvd_stat_add(&kvshm_ns_stats(d->h)[ns_id].dropped, pages0 - pages1);
	if (tenant < KVSHM_TENANTS)
		kvd_stat_add(&kvshm_tenants(d->h)[tenant].dropped, pages0 - pages1);
}

void kvd_drop_where(struct kvd *d, uint32_t ns_id, uint32_t tenant, struct kvproto_admin_r *r)
{
	/* The operator said drop: what a pinned prefix kept goes too. */
	kvd_pin_forget(d, ns_id, tenant);
	drop_one(d, ns_id, tenant, r);
	kvd_stat_add(&kvshm_stats(d->h)->operator_drops, 1);
}

int kvd_drop_ns(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		const void *p)
{
	const uint32_t seq = hdr->seq;
	struct kvproto_drop_r r = { 0 };
	struct kvproto_drop q;
	struct kvproto_admin_r ar = { 0 };

	memcpy(&q, p, sizeof(q));
	if (q.version != KVPROTO_VERSION) {
		kvd_reply_error(d, c, seq, -EPROTO, true, "DROP: protocol version %u, this kvcached speaks %u",
				q.version, KVPROTO_VERSION);
		return -1;
	}
	if (c->drop_tick == d->ticks + 1) {
		kvd_reply_error(d, c, seq, -EAGAIN, false,
				"DROP: one per tick (%u ms) and client; try again", d->cfg.tick_ms);
		return 0;
	}
	c->drop_tick = d->ticks + 1;
	/* Its namespace, every tenant; what a prefix pin holds stays. */
	drop_one(d, c->ns_id, UINT32_MAX, &ar);
	r.dropped = ar.dropped;
	r.left = ar.left;
	r.slots = ar.slots;
	kvd_info("client %u (pid %d, %s): dropped namespace %u (%s): %u pages, %u spill slots; %u pinned or being written stay",
		 c->id, (int)c->pid, c->comm, c->ns_id, kvshm_ns(d->h)[c->ns_id].model, r.dropped,
		 r.slots, r.left);
	return kvd_reply(d, c, KVPROTO_DROP_R, seq, &r, sizeof(r), NULL, 0);
}
