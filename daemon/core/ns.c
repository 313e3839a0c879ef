// SPDX-License-Identifier: MIT
/*
 * ns.c - the namespace table: one row per model (geometry and name, its
 * id an XXH3 of both), found or added at HELLO and by the spill tier's
 * warm restart, a row of a namespace without clients reclaimed when the
 * table is full.
 */
#include <stddef.h>
#include <string.h>

#include "../../shm/key.h"
#include "../util/log.h"
#include "evict.h"
#include "ns.h"
#include "nsstat.h"
#include "pin.h"

/* Everything after `used`, then `used` (release): readers go by `used`. */
static void ns_write(struct kvshm_ns *t, const struct kvshm_ns *want)
{
	const size_t from = offsetof(struct kvshm_ns, dtype_bytes);

	memcpy((char *)t + from, (const char *)want + from, sizeof(*t) - from);
	atomic_store_explicit(&t->used, 1, memory_order_release);
}

/* A namespace row no client (live or lingering) uses and no pinned
 * prefix holds, or -1. */
static int ns_idle(const struct kvd *d)
{
	uint32_t i, k;

	for (i = 0; i < d->h->geo.max_ns; i++) {
		if (kvd_pin_ns_held(d, i))
			continue;
		for (k = 0; k < d->cfg.max_clients; k++)
			if (kvd_pins_count(&d->clients[k]) && d->clients[k].ns_id == i)
				break;
		if (k == d->cfg.max_clients)
			return (int)i;
	}
	return -1;
}

/*
 * Find or add the namespace; returns its row or -1 (table full of
 * namespaces that have clients). When the table is full, the row of a
 * namespace without clients is reclaimed: its cached pages are evicted
 * (nobody can hold them pinned) and the row rewritten.
 */
int kvd_ns_get(struct kvd *d, const struct kvshm_ns *want, bool may_reclaim)
{
	struct kvshm_ns *t = kvshm_ns(d->h);
	uint32_t i;
	int idle;

	for (i = 0; i < d->h->geo.max_ns; i++) {
		if (!atomic_load_explicit(&t[i].used, memory_order_acquire))
			break;
		if (kvshm_key_eq(t[i].id, want->id))
			return (int)i;
	}
	if (i < d->h->geo.max_ns) {
		kvd_nsstat_clear(d, i);
		ns_write(&t[i], want);
		kvd_info("namespace %u: %s, %u layers x %u kv heads x %u head dim, %u-byte dtype, %llu-byte pages",
			 i, want->model, want->layers, want->kv_heads, want->head_dim,
			 want->dtype_bytes, (unsigned long long)want->page_bytes);
		return (int)i;
	}
	idle = may_reclaim ? ns_idle(d) : -1;
	if (idle < 0 || kvd_evict_ns(d, (uint32_t)idle))
		return -1;
	kvd_info("namespace %d: %s replaces %s, which had no clients (its pages evicted)",
		 idle, want->model, t[idle].model);
	atomic_store_explicit(&t[idle].used, 0, memory_order_release);
	kvd_nsstat_clear(d, (uint32_t)idle);
	ns_write(&t[idle], want);
	return idle;
}
