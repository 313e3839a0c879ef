/* SPDX-License-Identifier: MIT */
/*
 * pin.h - prefixes kept resident with a time to live (pin.c).
 */
#ifndef KVD_PIN_H
#define KVD_PIN_H

#include "kvd.h"

/* What to pin: a prefix's chain of keys in one namespace and key space. */
struct kvd_pin_want {
	uint32_t ns_id, tenant;
	struct kvshm_key root;		/* block 0's parent */
	const struct kvshm_key *keys;
	uint32_t n;
	bool flat;			/* every block's parent is the root */
	uint32_t ttl_s;
	const char *label;		/* shown in kvstat --pins; may be "" */
	int32_t pid;
	uint32_t uid;
};

/*
 * Pin w: hold the pages of its blocks that are cached now, from block 0
 * on (the rest as they are published, on later ticks), until ttl_s have
 * passed, counted against its tenant's share. The same prefix pinned
 * again keeps its id and lasts until the later end. Returns 0 with *id
 * and *resident, or -ENOSPC (64 pins), -EDQUOT (its tenant's share), -ENOMEM,
 * with msg naming the reason.
 */
int kvd_pin_add(struct kvd *d, const struct kvd_pin_want *w, uint32_t *id, uint32_t *resident,
		char *msg, size_t len);
/* End pin `id` (its pages evictable again). tenant and ns_id, unless
 * UINT32_MAX, must be its: 0 or -ENOENT. */
int kvd_pin_remove(struct kvd *d, uint32_t id, uint32_t tenant, uint32_t ns_id);
/* End every pin of namespace ns_id and tenant (UINT32_MAX: any): an
 * operator drops them. Returns how many. */
uint32_t kvd_pin_forget(struct kvd *d, uint32_t ns_id, uint32_t tenant);
/* Does a pin hold namespace ns_id's pages (its row must not be reused)? */
bool kvd_pin_ns_held(const struct kvd *d, uint32_t ns_id);
/* Pool page `page` lost its block (punched out): pins let go of it. */
void kvd_pin_page_gone(struct kvd *d, uint32_t page);
/* Per tick: end the pins whose time is up; extend the others over blocks
 * published since (a bounded number of index lookups). */
void kvd_pin_tick(struct kvd *d);

/* PIN and UNPIN from a client (the frame table's handlers). */
int kvd_pin_req(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		const void *p);
int kvd_unpin_req(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		  const void *p);

#endif
