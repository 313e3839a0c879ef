// SPDX-License-Identifier: MIT
/*
 * ledger.c - pin ledger operations: the client's hazard-slot pin and the
 * daemon's scan. See ledger.h for the Dekker handshake with the evictor.
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ledger.h"

uint64_t kvshm_ledger_bytes(uint32_t nslots)
{
	uint64_t b = sizeof(struct kvshm_ledger) + (uint64_t)nslots * sizeof(uint64_t);

	return (b + 4095) & ~4095ull;
}

void kvshm_ledger_init(struct kvshm_ledger *l, uint32_t nslots,
		       uint32_t client_id, uint32_t ns_id)
{
	l->magic = KVSHM_LEDGER_MAGIC;
	l->version = KVSHM_VERSION;
	l->nslots = nslots;
	l->client_id = client_id;
	l->ns_id = ns_id;
	l->bytes = kvshm_ledger_bytes(nslots);
}

int kvshm_ledger_validate(const struct kvshm_ledger *l, uint64_t bytes)
{
	if (bytes < sizeof(*l) || l->magic != KVSHM_LEDGER_MAGIC ||
	    l->version != KVSHM_VERSION)
		return -EPROTO;
	if (kvshm_ledger_bytes(l->nslots) > bytes)
		return -EBADMSG;
	return 0;
}

static int membarrier(int cmd)
{
	long rc = syscall(__NR_membarrier, cmd, 0, 0);

	return rc < 0 ? -errno : (int)rc;
}

int kvshm_barrier_query(void)
{
	const int need = MEMBARRIER_CMD_GLOBAL_EXPEDITED |
			 MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
	int q = membarrier(MEMBARRIER_CMD_QUERY);

	if (q < 0)
		return q;
	return (q & need) == need ? 0 : -ENOSYS;
}

int kvshm_barrier_register(void)
{
	int rc = membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED);

	return rc < 0 ? rc : 0;
}

int kvshm_barrier_global(void)
{
	int rc = membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED);

	return rc < 0 ? rc : 0;
}

void kvshm_ledger_sum(const struct kvshm_ledger *l, struct kvshm_ledger_counts *out)
{
	const struct kvshm_ctr *r;
	uint32_t i;

	memset(out, 0, sizeof(*out));
	for (i = 0; i < KVSHM_LEDGER_ROWS; i++) {
		r = &l->ctr[i];
		out->lookups += atomic_load_explicit(&r->lookups, memory_order_relaxed);
		out->hit_blocks += atomic_load_explicit(&r->hit_blocks, memory_order_relaxed);
		out->miss_blocks += atomic_load_explicit(&r->miss_blocks, memory_order_relaxed);
		out->pin_failures += atomic_load_explicit(&r->pin_failures, memory_order_relaxed);
		out->pins_held += atomic_load_explicit(&r->pins_held, memory_order_relaxed);
		out->published += atomic_load_explicit(&r->published, memory_order_relaxed);
		out->lookup_tokens += atomic_load_explicit(&r->lookup_tokens, memory_order_relaxed);
		out->hit_tokens += atomic_load_explicit(&r->hit_tokens, memory_order_relaxed);
	}
}

void kvshm_ledger_scan(const struct kvshm_ledger *l, uint32_t nslots,
		       const struct kvshm_header *h,
		       void (*back_off)(uint32_t page, void *arg), void *arg)
{
	const struct kvshm_page *pages = kvshm_pages(h);
	uint32_t i, pg;

	for (i = 0; i < nslots; i++) {
		uint64_t v = atomic_load_explicit(&((struct kvshm_ledger *)l)->slot[i],
						  memory_order_seq_cst);

		if (!v)
			continue;
		pg = kvshm_slot_page(v);
		if (pg < h->geo.n_pages &&
		    atomic_load_explicit(&pages[pg].state, memory_order_relaxed) ==
			    KVSHM_PAGE_EVICTING)
			back_off(pg, arg);
	}
}

uint64_t kvshm_ledger_count(const struct kvshm_ledger *l, uint32_t nslots,
			    const struct kvshm_header *h)
{
	uint64_t n = 0;
	uint32_t i;

	for (i = 0; i < nslots; i++) {
		uint64_t v = atomic_load_explicit(&((struct kvshm_ledger *)l)->slot[i],
						  memory_order_relaxed);

		if (v && kvshm_slot_page(v) < h->geo.n_pages)
			n++;
	}
	return n;
}
