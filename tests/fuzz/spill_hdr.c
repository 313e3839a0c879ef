// SPDX-License-Identifier: MIT
/*
 * spill_hdr.c - fuzz target for the spill area's on-disk headers: the slot
 * header (kvd_slot_hdr_check, which the daemon runs on every slot at a
 * warm restart and on every restore) and the file header
 * (kvd_area_hdr_check).
 *
 * Input: byte 0 picks the mode, byte 1 the block tokens (1..256).
 *   mode even: the rest is a slot header as read from disk (then a file
 *     header from the same bytes);
 *   mode odd: the rest describes a valid block (namespace geometry, model
 *     name, key, tokens), which kvd_slot_hdr_fill writes; then pairs of
 *     (offset, xor) bytes damage it.
 *
 * Oracle: no crash, no leak. A header the checker accepts describes a
 * namespace a HELLO could declare, a payload that fits the pool page, and
 * fills back to exactly the same bytes. A filled header is accepted as it
 * is; damaged anywhere inside its fields or tokens it is never accepted
 * (XXH3-64 over the header); damage in the padding after the tokens is
 * ignored. An area header is accepted only with the geometry asked for.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../fmt/spill_slot.h"
#include "../../shm/key.h"
#include "../../shm/proto.h"

#include "check.h"

#define PAGE_BYTES (1ull << 20)

static void check_accepted(const uint8_t *h, uint64_t hb, uint32_t bt)
{
	struct kvd_slot_hdr s;
	struct kvproto_hello hi;
	struct kvshm_ns ns;
	uint8_t *again = malloc(hb);

	CHECK(again);
	memcpy(&s, h, sizeof(s));
	CHECK(s.magic == KVD_SLOT_MAGIC && s.version == KVD_SPILL_VERSION);
	CHECK(s.block_tokens == bt && s.ns.block_tokens == bt);
	CHECK(s.payload_bytes && s.payload_bytes <= PAGE_BYTES &&
	      s.payload_bytes == s.ns.page_bytes);
	memset(&hi, 0, sizeof(hi));
	hi.dtype_bytes = s.ns.dtype_bytes;
	hi.layers = s.ns.layers;
	hi.kv_heads = s.ns.kv_heads;
	hi.head_dim = s.ns.head_dim;
	hi.block_tokens = s.ns.block_tokens;
	hi.pos_kind = s.ns.pos_kind;
	memcpy(hi.model, s.ns.model, sizeof(hi.model));
	CHECK(kvproto_hello_ns(&hi, &ns) == 0);
	CHECK(kvshm_key_eq(ns.id, s.ns.id) && ns.page_bytes == s.ns.page_bytes);
	/* Written back from what was parsed: the same bytes. */
	kvd_slot_hdr_fill(again, hb, s.seq, &s.ns, s.key, s.parent,
			  (const uint32_t *)(h + sizeof(s)), bt, s.payload_bytes, s.payload_check);
	CHECK(!memcmp(again, h, sizeof(s) + (size_t)bt * 4));
	free(again);
}

static uint32_t u32_at(const uint8_t *d, size_t n, size_t *at)
{
	uint32_t v = 0;
	size_t i;

	for (i = 0; i < 4; i++, (*at)++)
		v |= (uint32_t)(*at < n ? d[*at] : 0) << (8 * i);
	return v;
}

/* A valid header from the input's bytes, then damage. */
static void built(const uint8_t *d, size_t n, uint32_t bt, uint8_t *h, uint64_t hb)
{
	static const uint32_t dt[4] = { 1, 2, 4, 8 };
	struct kvproto_hello hi;
	struct kvshm_ns ns;
	struct kvshm_key key, parent;
	uint32_t tokens[256];
	size_t at = 0, i, used = sizeof(struct kvd_slot_hdr) + (size_t)bt * 4;
	uint8_t *orig;
	bool damaged;
	int rc;

	memset(&hi, 0, sizeof(hi));
	hi.dtype_bytes = dt[u32_at(d, n, &at) & 3];
	hi.layers = 1 + u32_at(d, n, &at) % 8;
	hi.kv_heads = 1 + u32_at(d, n, &at) % 8;
	hi.head_dim = 1 + u32_at(d, n, &at) % 128;
	hi.block_tokens = bt;
	hi.pos_kind = u32_at(d, n, &at) % (KVSHM_POS_MAX + 1);
	memcpy(hi.model, "fuzz-model", 10);
	hi.model[10] = (char)('a' + u32_at(d, n, &at) % 26);
	if (kvproto_hello_ns(&hi, &ns) || ns.page_bytes > PAGE_BYTES)
		return;
	key.lo = u32_at(d, n, &at);
	key.hi = u32_at(d, n, &at);
	parent.lo = u32_at(d, n, &at);
	parent.hi = u32_at(d, n, &at);
	for (i = 0; i < bt; i++)
		tokens[i] = u32_at(d, n, &at);
	kvd_slot_hdr_fill(h, hb, u32_at(d, n, &at), &ns, key, parent, tokens, bt, ns.page_bytes,
			  u32_at(d, n, &at));
	CHECK(kvd_slot_hdr_check(h, hb, bt, PAGE_BYTES, NULL) == 0);
	check_accepted(h, hb, bt);
	orig = malloc(hb);
	CHECK(orig);
	memcpy(orig, h, hb);
	/* Damage: (offset low, offset high, xor) triples from what is left
	 * (two of them may cancel out: what counts is the net change). */
	for (; at + 3 <= n; at += 3) {
		size_t off = ((size_t)d[at] | (size_t)d[at + 1] << 8) % hb;

		h[off] ^= d[at + 2];
	}
	damaged = memcmp(orig, h, used) != 0;
	free(orig);
	rc = kvd_slot_hdr_check(h, hb, bt, PAGE_BYTES, NULL);
	if (damaged)
		CHECK(rc != 0);
	else
		CHECK(rc == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t bt;
	uint64_t hb;
	uint8_t *h;
	int rc;

	if (size < 2)
		return 0;
	bt = 1 + data[1] % 256;
	hb = kvd_slot_hdr_bytes(bt);
	h = calloc(1, hb);
	CHECK(h);
	if (data[0] & 1) {
		built(data + 2, size - 2, bt, h, hb);
	} else {
		memcpy(h, data + 2, size - 2 < hb ? size - 2 : hb);
		rc = kvd_slot_hdr_check(h, hb, bt, PAGE_BYTES, NULL);
		CHECK(rc == 0 || rc == 1 || rc == -EBADMSG);
		if (rc == 1)
			CHECK(((const struct kvd_slot_hdr *)h)->magic == 0);
		if (rc == 0)
			check_accepted(h, hb, bt);
		/* Too short to hold the tokens: refused, not read past. */
		CHECK(kvd_slot_hdr_check(h, sizeof(struct kvd_slot_hdr), bt, PAGE_BYTES, NULL) ==
		      -EBADMSG);
		rc = kvd_area_hdr_check(data + 2, size - 2, bt, hb, PAGE_BYTES, 7, NULL);
		if (rc == 0) {
			struct kvd_area_hdr a;

			memcpy(&a, data + 2, sizeof(a));
			CHECK(a.magic == KVD_AREA_MAGIC && a.block_tokens == bt &&
			      a.hdr_bytes == hb && a.page_bytes == PAGE_BYTES && a.slots == 7);
		}
	}
	free(h);
	return 0;
}
