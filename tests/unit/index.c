// SPDX-License-Identifier: MIT
/*
 * index.c - unit tests for shm/index.c: the shared hash index.
 *
 * Round trips over many keys, duplicate and absent keys, the probe window
 * (a full window gives -ENOSPC, spilled entries stay reachable and the
 * spill hints go back to zero when they leave), removal that must name the
 * right page, and the bucket seqcounts being even after every operation.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/index.h"
#include "../../shm/segment.h"

struct seg {
	struct kvshm_header *h;
	void *base;
};

static void seg_new(struct seg *s, uint32_t n_pages, uint32_t n_buckets)
{
	struct kvshm_geometry geo = {
		.page_bytes = 4096,
		.n_pages = n_pages,
		.block_tokens = 16,
		.n_buckets = n_buckets ? n_buckets : kvshm_buckets_for(n_pages),
		.max_clients = 4,
		.max_ns = 4,
		.ledger_slots = 64,
	};
	struct kvshm_header h;

	assert_int_equal(kvshm_layout(&h, &geo), 0);
	s->base = aligned_alloc(4096, h.segment_bytes);
	assert_non_null(s->base);
	memset(s->base, 0, h.segment_bytes);
	kvshm_init(s->base, &h);
	s->h = s->base;
}

static void seg_free(struct seg *s)
{
	free(s->base);
}

static uint64_t rng_state;

static uint64_t rng(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static struct kvshm_key rand_key(void)
{
	struct kvshm_key k = { rng(), rng() };

	return k;
}

/* A random key whose home bucket is `home`. */
static struct kvshm_key key_home(const struct kvshm_header *h, uint32_t home)
{
	struct kvshm_key k = rand_key();

	k.hi = (k.hi & ~((uint64_t)(h->geo.n_buckets - 1) << 32)) | ((uint64_t)home << 32);
	assert_int_equal(kvshm_index_home(h, k), home);
	return k;
}

static void assert_seqs_even(const struct kvshm_header *h)
{
	const struct kvshm_bucket *b = kvshm_buckets(h);
	uint32_t i;

	for (i = 0; i < h->geo.n_buckets; i++)
		assert_int_equal(atomic_load(&b[i].seq) & 1, 0);
}

static uint32_t spill_of(const struct kvshm_header *h, uint32_t i)
{
	return kvshm_buckets(h)[i].spill;
}

static uint32_t used_entries(const struct kvshm_header *h)
{
	const struct kvshm_bucket *b = kvshm_buckets(h);
	uint32_t i, j, n = 0;

	for (i = 0; i < h->geo.n_buckets; i++)
		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++)
			n += b[i].e[j].ref != 0;
	return n;
}

/* The home bucket is the top half of key.hi masked to the table. */
static void test_home(void **state)
{
	struct seg s;
	struct kvshm_key k = { 0, 0x0000000512345678ull };

	(void)state;
	seg_new(&s, 64, 8);
	assert_int_equal(kvshm_index_home(s.h, k), 5);
	k.hi = 0xfffffffd00000000ull;
	assert_int_equal(kvshm_index_home(s.h, k), 5);
	k.hi = 0x00000000ffffffffull;
	assert_int_equal(kvshm_index_home(s.h, k), 0);
	seg_free(&s);
}

static void test_empty_find(void **state)
{
	struct seg s;
	int i;

	(void)state;
	seg_new(&s, 64, 0);
	rng_state = 1;
	for (i = 0; i < 100; i++)
		assert_int_equal(kvshm_index_find(s.h, rand_key()), UINT32_MAX);
	/* The all-zero key is not "an empty slot" either. */
	assert_int_equal(kvshm_index_find(s.h, (struct kvshm_key){ 0, 0 }), UINT32_MAX);
	seg_free(&s);
}

/* Insert, find, remove and re-insert 4096 random keys. */
static void test_round_trip_many(void **state)
{
	enum { N = 4096 };
	static struct kvshm_key keys[N];
	struct seg s;
	uint32_t i;

	(void)state;
	seg_new(&s, N, 0);
	rng_state = 42;
	for (i = 0; i < N; i++)
		keys[i] = rand_key();
	for (i = 0; i < N; i++) {
		assert_int_equal(kvshm_index_insert(s.h, keys[i], i), 0);
		assert_int_equal(kvshm_index_find(s.h, keys[i]), i);
	}
	assert_int_equal(used_entries(s.h), N);
	assert_seqs_even(s.h);
	for (i = 0; i < N; i++)
		assert_int_equal(kvshm_index_find(s.h, keys[i]), i);

	/* Remove the odd ones; the even ones stay exactly as they were. */
	for (i = 1; i < N; i += 2)
		assert_int_equal(kvshm_index_remove(s.h, keys[i], i), 0);
	assert_int_equal(used_entries(s.h), N / 2);
	for (i = 0; i < N; i++)
		assert_int_equal(kvshm_index_find(s.h, keys[i]), i & 1 ? UINT32_MAX : i);
	assert_seqs_even(s.h);

	/* Re-insert them under other pages. */
	for (i = 1; i < N; i += 2)
		assert_int_equal(kvshm_index_insert(s.h, keys[i], N - i), 0);
	for (i = 0; i < N; i++)
		assert_int_equal(kvshm_index_find(s.h, keys[i]), i & 1 ? N - i : i);

	/* Remove everything: empty table, no spill hint left anywhere. */
	for (i = 0; i < N; i++)
		assert_int_equal(kvshm_index_remove(s.h, keys[i], i & 1 ? N - i : i), 0);
	assert_int_equal(used_entries(s.h), 0);
	for (i = 0; i < s.h->geo.n_buckets; i++)
		assert_int_equal(spill_of(s.h, i), 0);
	assert_seqs_even(s.h);
	seg_free(&s);
}

static void test_duplicate_insert(void **state)
{
	struct seg s;
	struct kvshm_key k;

	(void)state;
	seg_new(&s, 64, 0);
	rng_state = 7;
	k = rand_key();
	assert_int_equal(kvshm_index_insert(s.h, k, 3), 0);
	assert_int_equal(kvshm_index_insert(s.h, k, 3), -EEXIST);
	assert_int_equal(kvshm_index_insert(s.h, k, 9), -EEXIST);
	assert_int_equal(kvshm_index_find(s.h, k), 3);
	assert_int_equal(used_entries(s.h), 1);
	assert_seqs_even(s.h);
	seg_free(&s);
}

/* Keys that differ only in lo, or only in the low half of hi, are distinct. */
static void test_near_keys_distinct(void **state)
{
	struct seg s;
	struct kvshm_key a = { 0x1000, 0x0000000300000001ull };
	struct kvshm_key b = { 0x1001, 0x0000000300000001ull };
	struct kvshm_key c = { 0x1000, 0x0000000300000002ull };

	(void)state;
	seg_new(&s, 64, 8);
	assert_int_equal(kvshm_index_insert(s.h, a, 1), 0);
	assert_int_equal(kvshm_index_find(s.h, b), UINT32_MAX);
	assert_int_equal(kvshm_index_find(s.h, c), UINT32_MAX);
	assert_int_equal(kvshm_index_insert(s.h, b, 2), 0);
	assert_int_equal(kvshm_index_insert(s.h, c, 3), 0);
	assert_int_equal(kvshm_index_find(s.h, a), 1);
	assert_int_equal(kvshm_index_find(s.h, b), 2);
	assert_int_equal(kvshm_index_find(s.h, c), 3);
	assert_int_equal(kvshm_index_remove(s.h, b, 2), 0);
	assert_int_equal(kvshm_index_find(s.h, a), 1);
	assert_int_equal(kvshm_index_find(s.h, b), UINT32_MAX);
	assert_int_equal(kvshm_index_find(s.h, c), 3);
	seg_free(&s);
}

/* Remove must name both the key and its page; nothing changes otherwise. */
static void test_remove_wrong(void **state)
{
	struct seg s;
	struct kvshm_key k, other;
	uint32_t seq;

	(void)state;
	seg_new(&s, 64, 8);
	rng_state = 99;
	k = key_home(s.h, 4);
	other = key_home(s.h, 4);
	assert_int_equal(kvshm_index_insert(s.h, k, 10), 0);
	seq = atomic_load(&kvshm_buckets(s.h)[4].seq);
	assert_int_equal(kvshm_index_remove(s.h, k, 11), -ENOENT);
	assert_int_equal(kvshm_index_remove(s.h, k, UINT32_MAX), -ENOENT);
	assert_int_equal(kvshm_index_remove(s.h, other, 10), -ENOENT);
	assert_int_equal(atomic_load(&kvshm_buckets(s.h)[4].seq), seq);
	assert_int_equal(kvshm_index_find(s.h, k), 10);
	assert_int_equal(kvshm_index_remove(s.h, k, 10), 0);
	assert_int_equal(kvshm_index_remove(s.h, k, 10), -ENOENT);
	assert_int_equal(kvshm_index_find(s.h, k), UINT32_MAX);
	seg_free(&s);
}

/*
 * n_buckets = 8 with PROBE_MAX = 8: one home bucket's window is the whole
 * table. Fill it, overflow, then empty the spilled part and refill.
 */
static void test_full_table(void **state)
{
	enum { CAP = KVSHM_BUCKET_ENTRIES * KVSHM_PROBE_MAX };
	struct kvshm_key keys[CAP + 1], extra;
	struct seg s;
	uint32_t i, home = 2;

	(void)state;
	seg_new(&s, 64, 8);
	rng_state = 1234;
	for (i = 0; i <= CAP; i++)
		keys[i] = key_home(s.h, home);
	for (i = 0; i < CAP; i++) {
		assert_int_equal(kvshm_index_insert(s.h, keys[i], i), 0);
		assert_seqs_even(s.h);
		/* The first BUCKET_ENTRIES stay home; the others spill. */
		assert_int_equal(spill_of(s.h, home),
				 i < KVSHM_BUCKET_ENTRIES ? 0 : i + 1 - KVSHM_BUCKET_ENTRIES);
	}
	assert_int_equal(used_entries(s.h), CAP);
	assert_int_equal(kvshm_index_insert(s.h, keys[CAP], CAP), -ENOSPC);
	assert_int_equal(kvshm_index_find(s.h, keys[CAP]), UINT32_MAX);
	/* A key of any other home finds no room either: the table is full. */
	extra = key_home(s.h, 6);
	assert_int_equal(kvshm_index_insert(s.h, extra, 99), -ENOSPC);
	assert_seqs_even(s.h);

	/* Every entry, spilled or not, is still found. */
	for (i = 0; i < CAP; i++)
		assert_int_equal(kvshm_index_find(s.h, keys[i]), i);

	/* Remove the spilled ones: the hint goes back to 0. */
	for (i = KVSHM_BUCKET_ENTRIES; i < CAP; i++) {
		assert_int_equal(kvshm_index_remove(s.h, keys[i], i), 0);
		assert_int_equal(spill_of(s.h, home), CAP - 1 - i);
		assert_int_equal(kvshm_index_find(s.h, keys[i]), UINT32_MAX);
		assert_seqs_even(s.h);
	}
	for (i = 0; i < s.h->geo.n_buckets; i++)
		assert_int_equal(spill_of(s.h, i), 0);
	for (i = 0; i < KVSHM_BUCKET_ENTRIES; i++)
		assert_int_equal(kvshm_index_find(s.h, keys[i]), i);

	/* Room again: the refused key and the other home now go in. */
	assert_int_equal(kvshm_index_insert(s.h, keys[CAP], CAP), 0);
	assert_int_equal(kvshm_index_find(s.h, keys[CAP]), CAP);
	assert_int_equal(spill_of(s.h, home), 1);
	assert_int_equal(kvshm_index_insert(s.h, extra, 99), 0);
	assert_int_equal(kvshm_index_find(s.h, extra), 99);
	assert_int_equal(spill_of(s.h, 6), 0);

	/* Free a home slot: the next key of that home lands at home. */
	assert_int_equal(kvshm_index_remove(s.h, keys[0], 0), 0);
	assert_int_equal(kvshm_index_insert(s.h, keys[1 + KVSHM_BUCKET_ENTRIES], 50), 0);
	assert_int_equal(spill_of(s.h, home), 1);
	assert_int_equal(kvshm_index_find(s.h, keys[1 + KVSHM_BUCKET_ENTRIES]), 50);
	assert_seqs_even(s.h);
	seg_free(&s);
}

/*
 * A window that wraps past the end of a larger table: home 14 of 16 uses
 * buckets 14, 15, 0..5; it fills while other windows still have room.
 */
static void test_window_wraps(void **state)
{
	enum { CAP = KVSHM_BUCKET_ENTRIES * KVSHM_PROBE_MAX };
	struct kvshm_key keys[CAP + 1], k6, k13;
	struct seg s;
	uint32_t i;

	(void)state;
	seg_new(&s, 64, 16);
	rng_state = 555;
	for (i = 0; i <= CAP; i++)
		keys[i] = key_home(s.h, 14);
	for (i = 0; i < CAP; i++)
		assert_int_equal(kvshm_index_insert(s.h, keys[i], i), 0);
	assert_int_equal(kvshm_index_insert(s.h, keys[CAP], CAP), -ENOSPC);
	for (i = 0; i < CAP; i++)
		assert_int_equal(kvshm_index_find(s.h, keys[i]), i);
	/* Buckets 6..13 are untouched. */
	for (i = 6; i < 14; i++)
		assert_int_equal(kvshm_buckets(s.h)[i].e[0].ref, 0);
	k6 = key_home(s.h, 6);
	assert_int_equal(kvshm_index_insert(s.h, k6, 60), 0);
	assert_int_equal(kvshm_buckets(s.h)[6].e[0].ref, 61);
	/* Home 13's window (13..4) is full but for bucket 13 itself. */
	k13 = key_home(s.h, 13);
	for (i = 0; i < KVSHM_BUCKET_ENTRIES; i++) {
		struct kvshm_key k = key_home(s.h, 13);

		assert_int_equal(kvshm_index_insert(s.h, k, 100 + i), 0);
	}
	assert_int_equal(kvshm_index_insert(s.h, k13, 200), -ENOSPC);
	assert_int_equal(spill_of(s.h, 13), 0);
	assert_seqs_even(s.h);
	seg_free(&s);
}

/* A spilled entry's key also in another home bucket's window: no confusion. */
static void test_spill_shared_bucket(void **state)
{
	struct seg s;
	struct kvshm_key a[KVSHM_BUCKET_ENTRIES + 1], b;
	uint32_t i;

	(void)state;
	seg_new(&s, 64, 8);
	rng_state = 31;
	for (i = 0; i <= KVSHM_BUCKET_ENTRIES; i++)
		a[i] = key_home(s.h, 0);
	for (i = 0; i <= KVSHM_BUCKET_ENTRIES; i++)
		assert_int_equal(kvshm_index_insert(s.h, a[i], i), 0);
	/* a[3] spilled into bucket 1; bucket 1's own key goes beside it. */
	assert_int_equal(spill_of(s.h, 0), 1);
	b = key_home(s.h, 1);
	assert_int_equal(kvshm_index_insert(s.h, b, 77), 0);
	assert_int_equal(spill_of(s.h, 1), 0);
	assert_int_equal(kvshm_index_find(s.h, b), 77);
	assert_int_equal(kvshm_index_find(s.h, a[KVSHM_BUCKET_ENTRIES]), KVSHM_BUCKET_ENTRIES);
	/* Removing b leaves the spilled entry; removing it clears the hint. */
	assert_int_equal(kvshm_index_remove(s.h, b, 77), 0);
	assert_int_equal(kvshm_index_find(s.h, a[KVSHM_BUCKET_ENTRIES]), KVSHM_BUCKET_ENTRIES);
	assert_int_equal(spill_of(s.h, 0), 1);
	assert_int_equal(kvshm_index_remove(s.h, a[KVSHM_BUCKET_ENTRIES], KVSHM_BUCKET_ENTRIES), 0);
	assert_int_equal(spill_of(s.h, 0), 0);
	for (i = 0; i < KVSHM_BUCKET_ENTRIES; i++)
		assert_int_equal(kvshm_index_find(s.h, a[i]), i);
	seg_free(&s);
}

/* Each write moves the written buckets' seq by exactly 2 (begin + end). */
static void test_seq_counts(void **state)
{
	struct seg s;
	struct kvshm_key k[KVSHM_BUCKET_ENTRIES + 1];
	const struct kvshm_bucket *b;
	uint32_t i, s0, s1, s2;

	(void)state;
	seg_new(&s, 64, 8);
	b = kvshm_buckets(s.h);
	rng_state = 8;
	for (i = 0; i <= KVSHM_BUCKET_ENTRIES; i++)
		k[i] = key_home(s.h, 3);
	s0 = atomic_load(&b[3].seq);
	assert_int_equal(kvshm_index_insert(s.h, k[0], 0), 0);
	assert_int_equal(atomic_load(&b[3].seq), s0 + 2);
	for (i = 1; i < KVSHM_BUCKET_ENTRIES; i++)
		assert_int_equal(kvshm_index_insert(s.h, k[i], i), 0);
	s0 = atomic_load(&b[3].seq);
	s1 = atomic_load(&b[4].seq);
	s2 = atomic_load(&b[5].seq);
	/* Spilling writes the entry's bucket and the home's hint. */
	assert_int_equal(kvshm_index_insert(s.h, k[KVSHM_BUCKET_ENTRIES], 9), 0);
	assert_int_equal(atomic_load(&b[3].seq), s0 + 2);
	assert_int_equal(atomic_load(&b[4].seq), s1 + 2);
	assert_int_equal(atomic_load(&b[5].seq), s2);
	/* A failed insert or remove writes nothing. */
	assert_int_equal(kvshm_index_insert(s.h, k[0], 0), -EEXIST);
	assert_int_equal(kvshm_index_remove(s.h, k[0], 5), -ENOENT);
	assert_int_equal(atomic_load(&b[3].seq), s0 + 2);
	assert_int_equal(atomic_load(&b[4].seq), s1 + 2);
	assert_int_equal(kvshm_index_remove(s.h, k[KVSHM_BUCKET_ENTRIES], 9), 0);
	assert_int_equal(atomic_load(&b[3].seq), s0 + 4);
	assert_int_equal(atomic_load(&b[4].seq), s1 + 4);
	assert_seqs_even(s.h);
	seg_free(&s);
}

/*
 * Regression (review finding): a daemon killed in the middle of a bucket
 * write leaves its seqcount odd for ever; a lookup used to spin on it.
 * It must give up and miss.
 */
static void test_odd_seq_is_a_miss_not_a_hang(void **state)
{
	struct kvshm_key k = { 0x1234, 0x5678 };
	struct kvshm_bucket *b;
	struct kvshm_header *h;
	struct seg sg;

	(void)state;
	seg_new(&sg, 64, 8);
	h = sg.h;
	assert_int_equal(kvshm_index_insert(h, k, 7), 0);
	assert_int_equal(kvshm_index_find(h, k), 7);
	b = &kvshm_buckets(h)[kvshm_index_home(h, k)];
	atomic_fetch_add(&b->seq, 1);	/* a writer that never finished */
	assert_int_equal(kvshm_index_find(h, k), UINT32_MAX);
	atomic_fetch_add(&b->seq, 1);
	assert_int_equal(kvshm_index_find(h, k), 7);
	seg_free(&sg);
}


int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_odd_seq_is_a_miss_not_a_hang),
		cmocka_unit_test(test_home),
		cmocka_unit_test(test_empty_find),
		cmocka_unit_test(test_round_trip_many),
		cmocka_unit_test(test_duplicate_insert),
		cmocka_unit_test(test_near_keys_distinct),
		cmocka_unit_test(test_remove_wrong),
		cmocka_unit_test(test_full_table),
		cmocka_unit_test(test_window_wraps),
		cmocka_unit_test(test_spill_shared_bucket),
		cmocka_unit_test(test_seq_counts),
	};

	return cmocka_run_group_tests_name("index", tests, NULL, NULL);
}
