// SPDX-License-Identifier: MIT
/*
 * drop.c - DROP: a client gives up every cached block of its own
 * namespace (kvc_drop_namespace), e.g. a benchmark cleaning up after
 * itself on a daemon that serves real engines too.
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
#include "reply.h"
#include "../util/log.h"

/* READY pool pages and spill slots (spilled or backing) of ns_id. */
static void count_ns(const struct kvd *d, uint32_t ns_id, uint32_t *pages, uint32_t *slots)
{
	const struct kvshm_page *pg = kvshm_pages(d->h);
	const struct kvshm_slot *sl = kvshm_slots(d->h);
	uint32_t i;

	*pages = *slots = 0;
	for (i = 0; i < d->h->geo.n_pages; i++)
		*pages += pg[i].ns_id == ns_id &&
			  atomic_load_explicit(&pg[i].state, memory_order_relaxed) == KVSHM_PAGE_READY;
	for (i = 0; i < d->h->geo.n_slots; i++) {
		uint32_t st = atomic_load_explicit(&sl[i].state, memory_order_relaxed);

		*slots += sl[i].ns_id == ns_id &&
			  (st == KVSHM_SLOT_SPILLED || st == KVSHM_SLOT_BACKING);
	}
}

int kvd_drop_ns(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		const void *p)
{
	const uint32_t seq = hdr->seq;
	struct kvproto_drop_r r = { 0 };
	struct kvproto_drop q;
	uint32_t pages0, slots0, pages1, slots1;

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
	count_ns(d, c->ns_id, &pages0, &slots0);
	r.left = kvd_evict_ns(d, c->ns_id);
	count_ns(d, c->ns_id, &pages1, &slots1);
	r.dropped = pages0 - pages1;
	r.slots = slots0 - slots1;
	if (c->ns_id < d->h->geo.max_ns && c->ns_id < KVD_MAX_NS)
		kvd_stat_add(&kvshm_ns_stats(d->h)[c->ns_id].dropped, r.dropped);
	kvd_info("client %u (pid %d, %s): dropped namespace %u (%s): %u pages, %u spill slots; %u pinned or being written stay",
		 c->id, (int)c->pid, c->comm, c->ns_id, kvshm_ns(d->h)[c->ns_id].model, r.dropped,
		 r.slots, r.left);
	return kvd_reply(d, c, KVPROTO_DROP_R, seq, &r, sizeof(r), NULL, 0);
}
