// SPDX-License-Identifier: MIT
/*
 * segment.c - computing, initialising and validating the segment layout.
 * Pure arithmetic over a geometry; no I/O. Overflow is checked everywhere
 * because the geometry can come from a config file.
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ledger.h"
#include "segment.h"

static int add_region(uint64_t *off, uint64_t bytes, uint64_t *at)
{
	uint64_t a = (*off + KVSHM_CACHELINE - 1) & ~(uint64_t)(KVSHM_CACHELINE - 1);

	if (a < *off || a + bytes < a)
		return -EINVAL;
	*at = a;
	*off = a + bytes;
	return 0;
}

uint32_t kvshm_buckets_for(uint64_t entries)
{
	/*
	 * At most a quarter of the entry slots in use. An insert fails only
	 * when all KVSHM_PROBE_MAX buckets (24 slots) of its window are full;
	 * at half load (~12 entries expected per window) that is a percent-
	 * level event per pool fill, at a quarter (~6) about 1e-8 per window.
	 * The price is 64 bytes of index per 1.33 pages.
	 */
	uint64_t need = (entries * 4 + KVSHM_BUCKET_ENTRIES - 1) / KVSHM_BUCKET_ENTRIES;
	uint64_t n = 8;

	while (n < need && n < (1ull << 31))
		n <<= 1;
	return (uint32_t)n;
}

int kvshm_layout(struct kvshm_header *h, const struct kvshm_geometry *geo)
{
	uint64_t off = 0, tmp;
	int rc = 0;

	if (!geo->page_bytes || !geo->n_pages || !geo->block_tokens ||
	    geo->block_tokens > KVSHM_MAX_BLOCK_TOKENS || !geo->max_clients ||
	    !geo->max_ns || !geo->ledger_slots || !geo->n_buckets ||
	    (geo->n_buckets & (geo->n_buckets - 1)) ||
	    geo->n_pages >= KVSHM_LOC_SLOT - 1 || geo->n_slots >= KVSHM_LOC_SLOT - 1)
		return -EINVAL;
	if (geo->page_bytes > UINT64_MAX / geo->n_pages)
		return -EINVAL;

	memset(h, 0, sizeof(*h));
	h->magic = KVSHM_MAGIC;
	h->version = KVSHM_VERSION;
	h->header_bytes = sizeof(struct kvshm_header);
	h->page_entry_bytes = sizeof(struct kvshm_page);
	h->bucket_bytes = sizeof(struct kvshm_bucket);
	h->stats_bytes = sizeof(struct kvshm_stats);
	h->ns_bytes = sizeof(struct kvshm_ns);
	h->client_row_bytes = sizeof(struct kvshm_client_row);
	h->ledger_header_bytes = sizeof(struct kvshm_ledger);
	h->top_bytes = sizeof(struct kvshm_top);
	h->slot_entry_bytes = sizeof(struct kvshm_slot);
	h->ns_stats_bytes = sizeof(struct kvshm_ns_stats);
	h->tenant_bytes = sizeof(struct kvshm_tenant);
	h->pinned_bytes = sizeof(struct kvshm_pinned);
	h->geo = *geo;
	h->geo.pool_bytes = geo->page_bytes * geo->n_pages;

	off = sizeof(*h);
	rc |= add_region(&off, sizeof(struct kvshm_stats), &h->off_stats);
	rc |= add_region(&off, (uint64_t)geo->max_ns * sizeof(struct kvshm_ns), &h->off_ns);
	rc |= add_region(&off, (uint64_t)geo->max_clients * sizeof(struct kvshm_client_row),
			 &h->off_clients);
	rc |= add_region(&off, (uint64_t)geo->n_buckets * sizeof(struct kvshm_bucket),
			 &h->off_buckets);
	rc |= add_region(&off, (uint64_t)geo->n_pages * sizeof(struct kvshm_page), &h->off_pages);
	rc |= add_region(&off, (uint64_t)geo->n_pages * geo->block_tokens * sizeof(uint32_t),
			 &h->off_tokens);
	rc |= add_region(&off, sizeof(struct kvshm_free) + (uint64_t)geo->n_pages * 4,
			 &h->off_free);
	rc |= add_region(&off, sizeof(struct kvshm_top), &h->off_top);
	rc |= add_region(&off, (uint64_t)geo->n_slots * sizeof(struct kvshm_slot), &h->off_slots);
	rc |= add_region(&off, (uint64_t)geo->max_ns * sizeof(struct kvshm_ns_stats),
			 &h->off_ns_stats);
	rc |= add_region(&off, KVSHM_TENANTS * sizeof(struct kvshm_tenant), &h->off_tenants);
	rc |= add_region(&off, KVSHM_PINNED * sizeof(struct kvshm_pinned), &h->off_pinned);
	if (rc)
		return -EINVAL;
	tmp = (off + 4095) & ~4095ull;
	if (tmp < off)
		return -EINVAL;
	h->segment_bytes = tmp;
	return 0;
}

void kvshm_init(void *base, const struct kvshm_header *h)
{
	struct kvshm_header *dst = base;
	struct kvshm_free *fr;
	struct timespec ts;
	uint32_t i;

	memcpy(dst, h, sizeof(*h));
	clock_gettime(CLOCK_REALTIME, &ts);
	dst->start_time_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	dst->daemon_pid = getpid();
	fr = kvshm_free(dst);
	/* Stack top is the end: hand out low page numbers first. */
	for (i = 0; i < h->geo.n_pages; i++)
		fr->page[i] = h->geo.n_pages - 1 - i;
	fr->count = h->geo.n_pages;
	atomic_store_explicit(&kvshm_stats(dst)->pages_free, h->geo.n_pages,
			      memory_order_relaxed);
}

int kvshm_validate(const void *base, uint64_t bytes, const char **why)
{
	const struct kvshm_header *h = base;
	struct kvshm_header want;
	const char *w = NULL;
	int rc = 0;

	if (bytes < sizeof(*h)) {
		w = "segment smaller than its header";
		rc = -EBADMSG;
	} else if (h->magic != KVSHM_MAGIC) {
		w = "bad segment magic (not a kvcached segment)";
		rc = -EPROTO;
	} else if (h->version != KVSHM_VERSION) {
		w = "segment layout version differs from this build";
		rc = -EPROTO;
	} else if (kvshm_layout(&want, &h->geo)) {
		w = "segment geometry is invalid";
		rc = -EBADMSG;
	} else if (want.header_bytes != h->header_bytes ||
		   want.page_entry_bytes != h->page_entry_bytes ||
		   want.bucket_bytes != h->bucket_bytes ||
		   want.stats_bytes != h->stats_bytes ||
		   want.ns_bytes != h->ns_bytes ||
		   want.client_row_bytes != h->client_row_bytes ||
		   want.ledger_header_bytes != h->ledger_header_bytes ||
		   want.top_bytes != h->top_bytes ||
		   want.slot_entry_bytes != h->slot_entry_bytes ||
		   want.ns_stats_bytes != h->ns_stats_bytes ||
		   want.tenant_bytes != h->tenant_bytes ||
		   want.pinned_bytes != h->pinned_bytes) {
		w = "segment struct sizes differ from this build";
		rc = -EPROTO;
	} else if (want.off_stats != h->off_stats || want.off_ns != h->off_ns ||
		   want.off_clients != h->off_clients ||
		   want.off_buckets != h->off_buckets ||
		   want.off_pages != h->off_pages ||
		   want.off_tokens != h->off_tokens ||
		   want.off_free != h->off_free || want.off_top != h->off_top ||
		   want.off_slots != h->off_slots ||
		   want.off_ns_stats != h->off_ns_stats ||
		   want.off_tenants != h->off_tenants ||
		   want.off_pinned != h->off_pinned ||
		   want.segment_bytes != h->segment_bytes ||
		   h->segment_bytes > bytes) {
		w = "segment offsets do not match its geometry";
		rc = -EBADMSG;
	}
	if (why)
		*why = w;
	return rc;
}
