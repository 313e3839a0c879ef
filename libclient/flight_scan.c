// SPDX-License-Identifier: MIT
/*
 * flight_scan.c - which blocks other clients are writing right now (single
 * flight): the run a lookup defers (lookup.c, publish.c) and the block a
 * waiter sleeps on (flight_wait.c). Below both, so that neither calls the
 * other back.
 */
#include <stdbool.h>
#include <stdint.h>

#include "client_int.h"
#include "../shm/index.h"
#include "../shm/page.h"

/* Is block i in flight (announced by another client)? *owner: whose. */
bool kvci_block_inflight(const struct kvc_req *r, size_t i, uint32_t *owner)
{
	const kvc_t *c = r->c;
	struct kvshm_key parent = kvci_parent(r, i);

	/* A page of this rank's engine waiting for this rank's own slice
	 * is not in flight for it: its kvc_alloc joins it. */
	return kvshm_page_inflight(c->seg, kvshm_index_find(c->seg, r->keys[i]), c->ns_id,
				   r->keys[i], parent, c->client_id + 1,
				   c->part.writes ? c->part.writers : 0, c->part.slice, owner);
}

size_t kvci_inflight_run(const struct kvc_req *r, size_t from)
{
	uint32_t owner;
	size_t j;

	for (j = from; j < r->n && kvci_block_inflight(r, j, &owner); j++)
		;
	return j - from;
}
