// SPDX-License-Identifier: MIT
/*
 * spill_slot.c - building and checking spill-area headers (see spill_slot.h).
 * Pure functions over memory; the tier's I/O lives in spill.c.
 */
#include <errno.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../shm/proto.h"
#include "spill_slot.h"

static int bad(const char **why, const char *w)
{
	if (why)
		*why = w;
	return -EBADMSG;
}

uint64_t kvd_slot_hdr_bytes(uint32_t bt)
{
	uint64_t n = sizeof(struct kvd_slot_hdr) + (uint64_t)bt * sizeof(uint32_t);

	return (n + KVD_SPILL_ALIGN - 1) / KVD_SPILL_ALIGN * KVD_SPILL_ALIGN;
}

void kvd_area_hdr_fill(struct kvd_area_hdr *a, uint32_t bt, uint64_t hdr_bytes,
		       uint64_t page_bytes, uint64_t slots, bool clean)
{
	memset(a, 0, sizeof(*a));
	a->magic = KVD_AREA_MAGIC;
	a->version = KVD_SPILL_VERSION;
	a->block_tokens = bt;
	a->hdr_bytes = hdr_bytes;
	a->page_bytes = page_bytes;
	a->slots = slots;
	a->clean = clean;
	a->check = XXH3_64bits(a, offsetof(struct kvd_area_hdr, check));
}

int kvd_area_hdr_check(const void *buf, size_t len, uint32_t bt, uint64_t hdr_bytes,
		       uint64_t page_bytes, uint64_t slots, const char **why)
{
	struct kvd_area_hdr a;

	if (len < sizeof(a))
		return bad(why, "file shorter than its header");
	memcpy(&a, buf, sizeof(a));
	if (a.magic != KVD_AREA_MAGIC)
		return bad(why, "not a kvcached spill file (bad magic)");
	if (a.check != XXH3_64bits(&a, offsetof(struct kvd_area_hdr, check)))
		return bad(why, "file header checksum mismatch");
	if (a.version != KVD_SPILL_VERSION)
		return bad(why, "spill format version differs from this build");
	if (a.block_tokens != bt || a.hdr_bytes != hdr_bytes || a.page_bytes != page_bytes)
		return bad(why, "made for another block-tokens or page-size");
	if (a.slots != slots)
		return bad(why, "made for another spill-size");
	return 0;
}

uint64_t kvd_payload_check_avx2(const void *p, size_t len);	/* spill_avx2.c */

uint64_t kvd_payload_check(const void *p, size_t len)
{
#if defined(__x86_64__)
	static int avx2 = -1;

	if (avx2 < 0) {
		__builtin_cpu_init();
		avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
	}
	if (avx2)
		return kvd_payload_check_avx2(p, len);
#endif
	return XXH3_64bits(p, len);
}

/* XXH3-64 of the header and tokens with `check` read as zero. */
static uint64_t hdr_check_of(const void *buf, uint32_t bt)
{
	const size_t at = offsetof(struct kvd_slot_hdr, check);
	const uint64_t zero = 0;
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, buf, at);
	XXH3_64bits_update(&st, &zero, sizeof(zero));
	XXH3_64bits_update(&st, (const char *)buf + sizeof(struct kvd_slot_hdr),
			   (size_t)bt * sizeof(uint32_t));
	return XXH3_64bits_digest(&st);
}

void kvd_slot_hdr_fill(void *buf, uint64_t hdr_bytes, uint64_t seq,
		       const struct kvshm_ns *ns, struct kvshm_key key,
		       struct kvshm_key parent, const uint32_t *tokens,
		       uint32_t bt, uint64_t payload_bytes, uint64_t payload_check)
{
	struct kvd_slot_hdr h;

	memset(buf, 0, hdr_bytes);
	memset(&h, 0, sizeof(h));
	h.magic = KVD_SLOT_MAGIC;
	h.version = KVD_SPILL_VERSION;
	h.block_tokens = bt;
	h.seq = seq;
	h.key = key;
	h.parent = parent;
	h.payload_bytes = payload_bytes;
	h.payload_check = payload_check;
	memcpy((char *)&h.ns + offsetof(struct kvshm_ns, dtype_bytes),
	       (const char *)ns + offsetof(struct kvshm_ns, dtype_bytes),
	       sizeof(h.ns) - offsetof(struct kvshm_ns, dtype_bytes));
	memcpy(buf, &h, sizeof(h));
	memcpy((char *)buf + sizeof(h), tokens, (size_t)bt * sizeof(uint32_t));
	h.check = hdr_check_of(buf, bt);
	memcpy(buf, &h, sizeof(h));
}

int kvd_slot_hdr_check(const void *buf, size_t len, uint32_t bt, uint64_t page_bytes,
		       const char **why)
{
	struct kvd_slot_hdr h;
	struct kvshm_ns ns;

	if (len < sizeof(h) + (uint64_t)bt * sizeof(uint32_t))
		return bad(why, "slot header shorter than its tokens");
	memcpy(&h, buf, sizeof(h));
	if (h.magic == 0)
		return 1;
	if (h.magic != KVD_SLOT_MAGIC)
		return bad(why, "bad slot magic");
	if (h.block_tokens != bt)
		return bad(why, "slot written for another block-tokens");
	if (h.check != hdr_check_of(buf, bt))
		return bad(why, "slot header checksum mismatch");
	if (h.version != KVD_SPILL_VERSION)
		return bad(why, "slot format version differs from this build");
	/* The namespace, checked exactly as a HELLO declaring it would be. */
	if (kvproto_ns_declared(&h.ns, &ns) || ns.page_bytes != h.ns.page_bytes ||
	    !kvshm_key_eq(ns.id, h.ns.id) || h.ns.block_tokens != bt)
		return bad(why, "slot names an invalid namespace");
	if (!h.payload_bytes || h.payload_bytes != h.ns.page_bytes ||
	    h.payload_bytes > page_bytes)
		return bad(why, "slot payload length does not fit the pool page");
	return 0;
}
