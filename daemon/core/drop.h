/* SPDX-License-Identifier: MIT */
/*
 * drop.h - DROP: a client gives up its namespace's blocks (drop.c).
 */
#ifndef KVD_DROP_H
#define KVD_DROP_H

#include "reply.h"

/* DROP from c: evict every unpinned block of c's namespace (pool
 * pages and spill slots). Returns 0, or -1 if c was dropped. */
kvd_frame_fn kvd_drop_ns;

/*
 * An operator's drop (admin.c): every block of namespace ns_id (UINT32_MAX:
 * every namespace) and tenant row `tenant` (UINT32_MAX: every tenant) that
 * no client pins or writes, the prefixes pinned there first. Adds what
 * went and what stayed to *r, and counts it for the namespace and tenant.
 */
void kvd_drop_where(struct kvd *d, uint32_t ns_id, uint32_t tenant,
		    struct kvproto_admin_r *r);

#endif
