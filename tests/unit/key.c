// SPDX-License-Identifier: MIT
/*
 * key.c - unit tests for shm/key.c: the XXH3-128 block key chain.
 *
 * Expected keys are computed here straight from xxHash over the byte
 * layout that key.h documents (parent lo|hi, tokens as uint32, extra
 * digest), not through the code under test; a few literal constants pin
 * the format so that any change of it is noticed. Also the properties the
 * cache relies on: prefix property, partial blocks ignored, salt, extra and
 * namespace all change the keys, and the collision test hook.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../../shm/key.h"
#include "../../shm/segment.h"

#define MAXB 1024

static uint64_t rng_state;

static uint64_t rng(void)
{
	/* splitmix64: deterministic token streams. */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fill_tokens(uint32_t *t, size_t n, uint64_t seed)
{
	size_t i;

	rng_state = seed;
	for (i = 0; i < n; i++)
		t[i] = (uint32_t)rng() % 128256;	/* a Llama-3 vocabulary */
}

static void put64(uint8_t *p, uint64_t v)
{
	int i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put32(uint8_t *p, uint32_t v)
{
	int i;

	for (i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* The documented key of one block, built byte by byte (little-endian),
 * then XORed with its key space's root. */
static struct kvshm_key ref_block(struct kvshm_key root, struct kvshm_key parent,
				  const uint32_t *tok, uint32_t bt, struct kvshm_key extra)
{
	static uint8_t buf[32 + 4 * MAXB];
	XXH128_hash_t x;
	uint32_t i;
	struct kvshm_key k;

	put64(buf, parent.lo);
	put64(buf + 8, parent.hi);
	for (i = 0; i < bt; i++)
		put32(buf + 16 + 4 * i, tok[i]);
	put64(buf + 16 + 4 * bt, extra.lo);
	put64(buf + 24 + 4 * bt, extra.hi);
	x = XXH3_128bits(buf, 32 + 4 * (size_t)bt);
	k.lo = x.low64 ^ root.lo;
	k.hi = x.high64 ^ root.hi;
	return k;
}

/* The documented root: XXH3_128(ns id lo | hi | salt), one shot. */
static struct kvshm_key ref_root(struct kvshm_key ns, const void *salt, size_t n)
{
	uint8_t buf[16 + 256];
	XXH128_hash_t x;
	struct kvshm_key k;

	assert_true(n <= 256);
	put64(buf, ns.lo);
	put64(buf + 8, ns.hi);
	if (n)
		memcpy(buf + 16, salt, n);
	x = XXH3_128bits(buf, 16 + n);
	k.lo = x.low64;
	k.hi = x.high64;
	return k;
}

static struct kvshm_key ref_extra(const void *p, size_t n)
{
	XXH128_hash_t x = XXH3_128bits(p, n);
	struct kvshm_key k = { x.low64, x.high64 };

	return k;
}

static void test_ns(struct kvshm_ns *ns)
{
	memset(ns, 0, sizeof(*ns));
	ns->dtype_bytes = 2;
	ns->layers = 32;
	ns->kv_heads = 8;
	ns->head_dim = 128;
	ns->block_tokens = 16;
	ns->pos_kind = KVSHM_POS_ROPE;
	ns->page_bytes = 2ull << 20;
	strcpy(ns->model, "meta-llama/Meta-Llama-3-8B@main");
}

static void assert_key_eq(struct kvshm_key a, struct kvshm_key b)
{
	assert_int_equal(a.lo, b.lo);
	assert_int_equal(a.hi, b.hi);
}

static void assert_key_ne(struct kvshm_key a, struct kvshm_key b)
{
	assert_false(a.lo == b.lo && a.hi == b.hi);
}

/* kvshm_key_block matches the documented byte layout for several sizes. */
static void test_block_vectors(void **state)
{
	static const uint32_t sizes[] = { 1, 2, 16, 17, 64, 1024 };
	static uint32_t tok[MAXB];
	struct kvshm_key parent = { 0x0123456789abcdefull, 0xfedcba9876543210ull };
	struct kvshm_key root = { 0x5555aaaa5555aaaaull, 0x1234123412341234ull };
	struct kvshm_key zero = { 0, 0 };
	struct kvshm_key extra = ref_extra("lora:adapter-7", 14);
	size_t s;

	(void)state;
	for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint32_t bt = sizes[s];

		fill_tokens(tok, bt, 1000 + bt);
		assert_key_eq(kvshm_key_block(root, parent, tok, bt, zero),
			      ref_block(root, parent, tok, bt, zero));
		assert_key_eq(kvshm_key_block(root, parent, tok, bt, extra),
			      ref_block(root, parent, tok, bt, extra));
		assert_key_eq(kvshm_key_block(zero, zero, tok, bt, zero),
			      ref_block(zero, zero, tok, bt, zero));
	}
}

/* kvshm_key_chain: each key is the block key of the previous one. */
static void test_chain_vectors(void **state)
{
	static const uint32_t sizes[] = { 1, 16, 1024 };
	static uint32_t tok[4 * MAXB];
	static struct kvshm_key keys[4 * MAXB];
	struct kvshm_key root = { 0x1111111111111111ull, 0x2222222222222222ull };
	struct kvshm_key zero = { 0, 0 };
	struct kvshm_key extra = ref_extra("img:sha256:abcd", 15);
	size_t s;

	(void)state;
	for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint32_t bt = sizes[s];
		size_t nblk = bt == 1 ? 40 : 3, n, i;
		struct kvshm_key parent;
		int e;

		fill_tokens(tok, nblk * bt, 77 + bt);
		for (e = 0; e < 2; e++) {
			struct kvshm_key x = e ? extra : zero;

			n = kvshm_key_chain(root, root, x, tok, nblk * bt, bt, keys);
			assert_int_equal(n, nblk);
			parent = root;
			for (i = 0; i < n; i++) {
				struct kvshm_key want = ref_block(root, parent, tok + i * bt, bt, x);

				assert_key_eq(keys[i], want);
				parent = want;
			}
		}
	}
}

/* Root: ns id (lo, hi) then the salt; no salt hashes the id alone. */
static void test_root_vectors(void **state)
{
	struct kvshm_key ns = { 0xa5a5a5a5a5a5a5a5ull, 0x5a5a5a5a5a5a5a5aull };
	static const char salt[] = "tenant-42-secret";
	char big[200];

	(void)state;
	assert_key_eq(kvshm_key_root(ns, NULL, 0), ref_root(ns, NULL, 0));
	/* A salt of length 0 is no salt, whatever the pointer. */
	assert_key_eq(kvshm_key_root(ns, salt, 0), ref_root(ns, NULL, 0));
	assert_key_eq(kvshm_key_root(ns, salt, strlen(salt)),
		      ref_root(ns, salt, strlen(salt)));
	memset(big, 'x', sizeof(big));
	assert_key_eq(kvshm_key_root(ns, big, sizeof(big)),
		      ref_root(ns, big, sizeof(big)));
	/* The root is a hash, not the ns id itself. */
	assert_key_ne(kvshm_key_root(ns, NULL, 0), ns);
}

static void test_extra_digest(void **state)
{
	struct kvshm_key zero = { 0, 0 };
	static const uint8_t lora[] = { 7, 0, 0, 0 };

	(void)state;
	assert_key_eq(kvshm_key_extra(NULL, 0), zero);
	assert_key_eq(kvshm_key_extra(lora, 0), zero);
	assert_key_eq(kvshm_key_extra(lora, sizeof(lora)), ref_extra(lora, sizeof(lora)));
	assert_key_ne(kvshm_key_extra(lora, sizeof(lora)), zero);
}

/*
 * Format-stability vector: these literals were computed once from the
 * documented layout. If this test fails, the key format changed: every
 * spilled page and every mixed-version client would miss (or worse). Bump
 * KVSHM_VERSION and update the literals only on purpose.
 */
static void test_format_stability(void **state)
{
	struct kvshm_ns ns;
	struct kvshm_key id, root, keys[2];
	uint32_t tok[32];
	uint32_t i;

	(void)state;
	test_ns(&ns);
	for (i = 0; i < 32; i++)
		tok[i] = 1000 + 37 * i;
	id = kvshm_ns_id(&ns);
	root = kvshm_key_root(id, "salt", 4);
	assert_int_equal(kvshm_key_chain(root, root, kvshm_key_extra(NULL, 0), tok, 32, 16, keys), 2);
	assert_int_equal(id.lo, 0x703bde8c42884d32ull);
	assert_int_equal(id.hi, 0x891715a0342739d1ull);
	assert_int_equal(root.lo, 0x2cd11711e515a756ull);
	assert_int_equal(root.hi, 0x2f143eaafe5e4b2eull);
	assert_int_equal(keys[0].lo, 0xd3aa772f6695188eull);
	assert_int_equal(keys[0].hi, 0xa8794aff457f214cull);
	assert_int_equal(keys[1].lo, 0xc1e1ee10393a704full);
	assert_int_equal(keys[1].hi, 0x288f41c8238d2e05ull);
	/* ...and the literals agree with the documented layout. */
	assert_key_eq(root, ref_root(id, "salt", 4));
	assert_key_eq(keys[1], ref_block(root, keys[0], tok + 16, 16, (struct kvshm_key){ 0, 0 }));
}

/* Engine keys: the block's words and key come from the engine key alone
 * (same key, same block; another key, another block), exactly bt words are
 * written, the key is the block key of those words under the root, and the
 * namespace kind changes the namespace id. */
static void test_engine_keys(void **state)
{
	struct kvshm_key root = { 7, 8 }, zero = { 0, 0 }, a, a2, b;
	uint32_t ta[21], ta2[21], tb[21];
	struct kvshm_ns ns, ns2;
	uint32_t bt;

	(void)state;
	for (bt = 1; bt <= 20; bt++) {
		memset(ta, 0xab, sizeof(ta));
		memset(ta2, 0, sizeof(ta2));
		a = kvshm_key_engine(root, "3f2a", 4, ta, bt);
		a2 = kvshm_key_engine(root, "3f2a", 4, ta2, bt);
		b = kvshm_key_engine(root, "3f2b", 4, tb, bt);
		assert_key_eq(a, a2);
		assert_memory_equal(ta, ta2, bt * 4);
		assert_key_ne(a, b);
		assert_memory_not_equal(ta, tb, bt * 4);
		assert_int_equal(ta[bt], 0xabababab);	/* nothing past bt words */
		assert_key_eq(a, kvshm_key_block(root, root, ta, bt, zero));
	}
	assert_key_ne(kvshm_key_engine(root, "k", 1, ta, 16),
		      kvshm_key_engine((struct kvshm_key){ 7, 9 }, "k", 1, tb, 16));
	test_ns(&ns);
	ns2 = ns;
	ns2.kind = KVSHM_NS_ENGINE;
	assert_key_ne(kvshm_ns_id(&ns), kvshm_ns_id(&ns2));
}

/* The chain of the first k blocks is the first k keys of a longer chain. */
static void test_prefix_property(void **state)
{
	static uint32_t tok[16 * 20];
	struct kvshm_key full[20], part[20];
	struct kvshm_key root = { 42, 43 }, zero = { 0, 0 };
	size_t k, i;

	(void)state;
	fill_tokens(tok, 16 * 20, 5);
	assert_int_equal(kvshm_key_chain(root, root, zero, tok, 16 * 20, 16, full), 20);
	for (k = 1; k <= 20; k++) {
		memset(part, 0, sizeof(part));
		assert_int_equal(kvshm_key_chain(root, root, zero, tok, 16 * k, 16, part), k);
		for (i = 0; i < k; i++)
			assert_key_eq(part[i], full[i]);
	}
	/* All keys of one chain differ from each other. */
	for (k = 0; k < 20; k++)
		for (i = k + 1; i < 20; i++)
			assert_key_ne(full[k], full[i]);
}

/* A trailing partial block is neither hashed nor written. */
static void test_partial_block_ignored(void **state)
{
	static uint32_t tok[16 * 4];
	struct kvshm_key a[5], b[5];
	struct kvshm_key root = { 1, 2 }, zero = { 0, 0 }, canary = { 0xdead, 0xbeef };
	size_t p;

	(void)state;
	fill_tokens(tok, 16 * 4, 9);
	assert_int_equal(kvshm_key_chain(root, root, zero, tok, 48, 16, a), 3);
	for (p = 1; p < 16; p++) {
		b[3] = canary;
		tok[48 + p - 1] ^= 0x5555;	/* the partial tail changes */
		assert_int_equal(kvshm_key_chain(root, root, zero, tok, 48 + p, 16, b), 3);
		assert_key_eq(b[0], a[0]);
		assert_key_eq(b[1], a[1]);
		assert_key_eq(b[2], a[2]);
		assert_key_eq(b[3], canary);
	}
	/* Fewer tokens than one block: no keys at all. */
	b[0] = canary;
	assert_int_equal(kvshm_key_chain(root, root, zero, tok, 15, 16, b), 0);
	assert_int_equal(kvshm_key_chain(root, root, zero, tok, 0, 16, b), 0);
	assert_key_eq(b[0], canary);
}

/* Salt and extra each change every key of the chain. */
static void test_salt_and_extra_change_keys(void **state)
{
	static uint32_t tok[16 * 8];
	struct kvshm_key base[8], salted[8], salted2[8], extra[8], extra2[8];
	struct kvshm_key ns = { 0x77, 0x88 }, zero = { 0, 0 };
	struct kvshm_key r0, r1, r2;
	size_t i, j;

	(void)state;
	fill_tokens(tok, 16 * 8, 11);
	r0 = kvshm_key_root(ns, NULL, 0);
	r1 = kvshm_key_root(ns, "tenant-a", 8);
	r2 = kvshm_key_root(ns, "tenant-b", 8);
	assert_key_ne(r0, r1);
	assert_key_ne(r1, r2);
	kvshm_key_chain(r0, r0, zero, tok, 16 * 8, 16, base);
	kvshm_key_chain(r1, r1, zero, tok, 16 * 8, 16, salted);
	kvshm_key_chain(r2, r2, zero, tok, 16 * 8, 16, salted2);
	kvshm_key_chain(r0, r0, kvshm_key_extra("lora-1", 6), tok, 16 * 8, 16, extra);
	kvshm_key_chain(r0, r0, kvshm_key_extra("lora-2", 6), tok, 16 * 8, 16, extra2);
	for (i = 0; i < 8; i++) {
		for (j = 0; j < 8; j++) {
			/* No key of one chain appears anywhere in another. */
			assert_key_ne(base[i], salted[j]);
			assert_key_ne(salted[i], salted2[j]);
			assert_key_ne(base[i], extra[j]);
			assert_key_ne(extra[i], extra2[j]);
		}
	}
	/* Same inputs, same keys: deterministic. */
	kvshm_key_chain(r1, r1, zero, tok, 16 * 8, 16, extra2);
	for (i = 0; i < 8; i++)
		assert_key_eq(extra2[i], salted[i]);
}

/*
 * Key spaces (issue #35): a chain computed under one root but starting at
 * another root's parent (what a client of namespace B does when it
 * publishes namespace A's block 0 with A's root and tokens) shares no key
 * with A's own chain; under A's root it is A's chain exactly.
 */
static void test_key_spaces_apart(void **state)
{
	static uint32_t tok[16 * 6];
	struct kvshm_key a[6], b[6], same[6], zero = { 0, 0 };
	struct kvshm_key ra = kvshm_key_root((struct kvshm_key){ 1, 2 }, NULL, 0);
	struct kvshm_key rb = kvshm_key_root((struct kvshm_key){ 3, 4 }, NULL, 0);
	size_t i, j;

	(void)state;
	fill_tokens(tok, 16 * 6, 21);
	kvshm_key_chain(ra, ra, zero, tok, 16 * 6, 16, a);
	kvshm_key_chain(rb, ra, zero, tok, 16 * 6, 16, b);	/* B's space, A's parent */
	kvshm_key_chain(ra, ra, zero, tok, 16 * 6, 16, same);
	for (i = 0; i < 6; i++) {
		assert_key_eq(a[i], same[i]);
		for (j = 0; j < 6; j++)
			assert_key_ne(a[i], b[j]);
	}
	/* Block by block: the same parent, tokens and extra, another root. */
	assert_key_ne(kvshm_key_block(ra, a[0], tok + 16, 16, zero),
		      kvshm_key_block(rb, a[0], tok + 16, 16, zero));
	assert_key_eq(kvshm_key_block(ra, a[0], tok + 16, 16, zero), a[1]);
}

/* A changed token anywhere in block i changes key i and every later one. */
static void test_token_change_propagates(void **state)
{
	static uint32_t tok[16 * 6];
	struct kvshm_key a[6], b[6], root = { 5, 6 }, zero = { 0, 0 };
	size_t i;

	(void)state;
	fill_tokens(tok, 16 * 6, 13);
	kvshm_key_chain(root, root, zero, tok, 16 * 6, 16, a);
	tok[2 * 16 + 15] += 1;
	kvshm_key_chain(root, root, zero, tok, 16 * 6, 16, b);
	assert_key_eq(a[0], b[0]);
	assert_key_eq(a[1], b[1]);
	for (i = 2; i < 6; i++)
		assert_key_ne(a[i], b[i]);
}

/* Every field of the namespace, the model name included, changes its id. */
static void test_ns_id(void **state)
{
	struct kvshm_ns ns, o;
	struct kvshm_key base;

	(void)state;
	test_ns(&ns);
	base = kvshm_ns_id(&ns);
	o = ns;
	assert_key_eq(kvshm_ns_id(&o), base);

#define CHANGED(stmt) do { o = ns; stmt; assert_key_ne(kvshm_ns_id(&o), base); } while (0)
	CHANGED(o.dtype_bytes = 4);
	CHANGED(o.layers = 33);
	CHANGED(o.kv_heads = 4);
	CHANGED(o.head_dim = 64);
	CHANGED(o.block_tokens = 32);
	CHANGED(o.pos_kind = KVSHM_POS_ALIBI);
	CHANGED(o.page_bytes = 4ull << 20);
	CHANGED(strcpy(o.model, "meta-llama/Meta-Llama-3-8B@rev2"));
	CHANGED(strcpy(o.model, "meta-llama/Meta-Llama-3-8B@mai"));
	CHANGED(o.model[0] = 0);
	CHANGED(o.layout = KVSHM_KV_LATENT);
	CHANGED(o.pp_size = 2);
	CHANGED(o.pp_size = 2; o.pp_rank = 1);
	CHANGED(o.kind = KVSHM_NS_ENGINE);
#undef CHANGED

	/* Only identity counts: `used`, the stored id and bytes after the
	 * model's NUL are not part of it. */
	o = ns;
	atomic_store(&o.used, 1);
	o.id.lo = 99;
	o.model[sizeof(o.model) - 1] = 'z';
	assert_key_eq(kvshm_ns_id(&o), base);

	/* A model name filling the whole field is still hashed in full. */
	o = ns;
	memset(o.model, 'm', sizeof(o.model));
	base = kvshm_ns_id(&o);
	o.model[sizeof(o.model) - 1] = 'n';
	assert_key_ne(kvshm_ns_id(&o), base);
}

/* The test hook masks both halves so that different blocks collide. */
static void test_mask_forces_collisions(void **state)
{
	struct kvshm_key root = { 3, 4 }, zero = { 0, 0 }, k[5];
	uint32_t tok[5][16];
	int i, j, found = 0;

	(void)state;
	assert_int_equal(kvshm_key_test_mask, 0);
	for (i = 0; i < 5; i++)
		fill_tokens(tok[i], 16, 500 + i);

	/* One bit per half leaves 4 possible keys: 5 blocks must collide. */
	kvshm_key_test_mask = 1ull << 40;
	for (i = 0; i < 5; i++) {
		k[i] = kvshm_key_block(root, root, tok[i], 16, zero);
		assert_int_equal(k[i].lo & ~kvshm_key_test_mask, 0);
		assert_int_equal(k[i].hi & ~kvshm_key_test_mask, 0);
	}
	for (i = 0; i < 5; i++)
		for (j = i + 1; j < 5; j++)
			if (kvshm_key_eq(k[i], k[j]) && memcmp(tok[i], tok[j], sizeof(tok[i])))
				found = 1;
	assert_true(found);

	/* The mask is the only thing that made them collide. */
	kvshm_key_test_mask = 0;
	for (i = 0; i < 5; i++)
		k[i] = kvshm_key_block(root, root, tok[i], 16, zero);
	for (i = 0; i < 5; i++)
		for (j = i + 1; j < 5; j++)
			assert_key_ne(k[i], k[j]);
}

static int reset_mask(void **state)
{
	(void)state;
	kvshm_key_test_mask = 0;
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_vectors),
		cmocka_unit_test(test_chain_vectors),
		cmocka_unit_test(test_root_vectors),
		cmocka_unit_test(test_extra_digest),
		cmocka_unit_test(test_format_stability),
		cmocka_unit_test(test_prefix_property),
		cmocka_unit_test(test_engine_keys),
		cmocka_unit_test(test_partial_block_ignored),
		cmocka_unit_test(test_salt_and_extra_change_keys),
		cmocka_unit_test(test_token_change_propagates),
		cmocka_unit_test(test_key_spaces_apart),
		cmocka_unit_test(test_ns_id),
		cmocka_unit_test_teardown(test_mask_forces_collisions, reset_mask),
	};

	return cmocka_run_group_tests_name("key", tests, NULL, reset_mask);
}
