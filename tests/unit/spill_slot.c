// SPDX-License-Identifier: MIT
/*
 * spill_slot.c - the spill area's on-disk headers: a filled slot header
 * checks back, every kind of damage is refused with its reason, an empty
 * slot reads as empty, and a file header names the geometry it was made
 * for. (The fuzz target tests/fuzz/spill_hdr.c searches the same code.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../fmt/spill_slot.h"
#include "../../shm/proto.h"

#define BT 16
#define PAGE (64u << 10)

static uint8_t hdr[8192];

static struct kvshm_ns model_ns(void)
{
	struct kvproto_hello hi = { 0 };
	struct kvshm_ns ns;

	hi.dtype_bytes = 2;
	hi.layers = 4;
	hi.kv_heads = 2;
	hi.head_dim = 64;
	hi.block_tokens = BT;
	hi.pos_kind = KVSHM_POS_ROPE;
	strcpy(hi.model, "unit-model");
	assert_int_equal(kvproto_hello_ns(&hi, &ns), 0);
	return ns;
}

static void fill(void)
{
	struct kvshm_ns ns = model_ns();
	struct kvshm_key key = { 1, 2 }, parent = { 3, 4 };
	uint32_t tokens[BT];
	int i;

	for (i = 0; i < BT; i++)
		tokens[i] = 1000u + (uint32_t)i;
	kvd_slot_hdr_fill(hdr, kvd_slot_hdr_bytes(BT), 42, &ns, key, parent, tokens, BT,
			  ns.page_bytes, 0x1234);
}

static void expect_bad(const char *why_part)
{
	const char *why = NULL;

	assert_int_equal(kvd_slot_hdr_check(hdr, kvd_slot_hdr_bytes(BT), BT, PAGE, &why),
			 -EBADMSG);
	assert_non_null(why);
	if (!strstr(why, why_part))
		fail_msg("reason '%s' does not mention '%s'", why, why_part);
}

static void test_roundtrip(void **state)
{
	struct kvd_slot_hdr h;

	(void)state;
	assert_int_equal(kvd_slot_hdr_bytes(BT), 4096);
	assert_int_equal(kvd_slot_hdr_bytes(1024), 8192);
	fill();
	assert_int_equal(kvd_slot_hdr_check(hdr, 4096, BT, PAGE, NULL), 0);
	memcpy(&h, hdr, sizeof(h));
	assert_int_equal(h.seq, 42);
	assert_int_equal(h.key.lo, 1);
	assert_int_equal(h.parent.hi, 4);
	assert_int_equal(h.payload_bytes, model_ns().page_bytes);
	assert_int_equal(h.payload_check, 0x1234);
	assert_int_equal(((uint32_t *)(hdr + sizeof(h)))[BT - 1], 1000 + BT - 1);
	/* Padding after the tokens is not part of the header. */
	hdr[4000] ^= 1;
	assert_int_equal(kvd_slot_hdr_check(hdr, 4096, BT, PAGE, NULL), 0);
}

static void test_damage(void **state)
{
	size_t off;

	(void)state;
	memset(hdr, 0, sizeof(hdr));
	assert_int_equal(kvd_slot_hdr_check(hdr, 4096, BT, PAGE, NULL), 1);	/* empty */
	fill();
	hdr[0] ^= 1;
	expect_bad("magic");
	fill();
	assert_int_equal(kvd_slot_hdr_check(hdr, 4096, BT + 1, PAGE, NULL), -EBADMSG);
	/* Every byte of the fields and tokens is covered by the checksum. */
	for (off = 8 + 4 + 4; off < sizeof(struct kvd_slot_hdr) + BT * 4; off++) {
		fill();
		hdr[off] ^= 0x80;
		assert_int_equal(kvd_slot_hdr_check(hdr, 4096, BT, PAGE, NULL), -EBADMSG);
	}
	fill();
	/* The payload must fit the pool's page. */
	assert_int_equal(kvd_slot_hdr_check(hdr, 4096, BT, 4096, NULL), -EBADMSG);
	hdr[sizeof(struct kvd_slot_hdr) + 3] ^= 1;	/* a token */
	expect_bad("checksum");
}

static void test_short(void **state)
{
	const char *why = NULL;

	(void)state;
	fill();
	assert_int_equal(kvd_slot_hdr_check(hdr, sizeof(struct kvd_slot_hdr), BT, PAGE, &why),
			 -EBADMSG);
	assert_non_null(strstr(why, "shorter"));
}

static void test_area(void **state)
{
	struct kvd_area_hdr a;
	const char *why = NULL;

	(void)state;
	kvd_area_hdr_fill(&a, BT, 4096, PAGE, 100, false);
	assert_int_equal(kvd_area_hdr_check(&a, sizeof(a), BT, 4096, PAGE, 100, NULL), 0);
	assert_int_equal(kvd_area_hdr_check(&a, sizeof(a), BT, 4096, 2 * PAGE, 100, &why),
			 -EBADMSG);
	assert_non_null(strstr(why, "page-size"));
	assert_int_equal(kvd_area_hdr_check(&a, sizeof(a), BT, 4096, PAGE, 99, &why), -EBADMSG);
	assert_non_null(strstr(why, "spill-size"));
	a.slots = 99;	/* edited without its checksum */
	assert_int_equal(kvd_area_hdr_check(&a, sizeof(a), BT, 4096, PAGE, 99, &why), -EBADMSG);
	assert_non_null(strstr(why, "checksum"));
	assert_int_equal(kvd_area_hdr_check(&a, 8, BT, 4096, PAGE, 99, &why), -EBADMSG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_damage),
		cmocka_unit_test(test_short),
		cmocka_unit_test(test_area),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
