// SPDX-License-Identifier: MIT
/*
 * events.c - unit tests for daemon/obs/events.c, with no ZMQ: batches go to a
 * sink (kvd_events_open_sink) and are decoded with the strict schema
 * decoder of tests/lib/kvevents.h. The tier hooks are driven by the real
 * page transitions (shm/page.c) and by the daemon's own evict.c.
 *
 * Covered: one BlockStored per chain with parent None at the chain start
 * and the previous block's hash after it, the prompt's tokens, block
 * size, medium and None LoRA fields; the three hash forms; eviction;
 * spill, slot loss and restore as a removal from one medium plus a store
 * in the other; a namespace dropped (per-block removals on its own topic
 * and on a shared one, never AllBlocksCleared); a muted shard rank; large
 * batches split; dropped batches counted with their sequence number spent and
 * kept for replay; replay from a sequence, its bounds, refusals and
 * resumption, and for a REQ peer one batch per request; topic templates;
 * a reused namespace row; both encodings (tagged arrays, maps), the
 * test decoder on every event kind of both and on what it must refuse;
 * the host pool's medium name.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../daemon/config.h"
#include "../../daemon/obs/events.h"
#include "../../daemon/core/kvd.h"
#include "../../daemon/core/evict.h"
#include "../../shm/index.h"
#include "../../shm/key.h"
#include "../../shm/page.h"
#include "../../shm/proto.h"
#include "../../shm/stats.h"
#include "../lib/kvevents.h"

#define BT 16
#define NPAGES 64
#define NSLOTS 16
#define MAXB 64

struct sent {
	char topic[512];
	uint64_t seq;
	uint8_t *p;
	size_t len;
};

static struct sent out[MAXB];
static int n_out;
static int sink_rc;		/* what the sink answers */

static int sink(void *arg, const char *topic, size_t tlen, uint64_t seq, const void *p,
		size_t len)
{
	(void)arg;
	assert_true(n_out < MAXB);
	assert_true(tlen < sizeof(out[0].topic));
	memcpy(out[n_out].topic, topic, tlen);
	out[n_out].topic[tlen] = 0;
	out[n_out].seq = seq;
	out[n_out].p = malloc(len);
	assert_non_null(out[n_out].p);
	memcpy(out[n_out].p, p, len);
	out[n_out].len = len;
	n_out++;
	return sink_rc;
}

static void out_clear(void)
{
	int i;

	for (i = 0; i < n_out; i++)
		free(out[i].p);
	n_out = 0;
}

static struct kve_batch decode(int i)
{
	struct kve_batch b;
	const char *why = "?";

	assert_true(i < n_out);
	if (kve_decode(out[i].p, out[i].len, &b, &why))
		fail_msg("batch %d does not decode: %s", i, why);
	assert_true(b.has_rank);
	assert_int_equal(b.rank, 0);
	assert_true(b.ts > 1e9);
	return b;
}

static struct kvd D;

/* A daemon state with a segment (pages, slots, 4 namespace rows) and
 * events going to the sink. */
static void setup_with(const char *topic, int hash, uint32_t buffer)
{
	struct kvshm_geometry geo = {
		.page_bytes = 4096, .n_pages = NPAGES, .block_tokens = BT,
		.n_buckets = kvshm_buckets_for(NPAGES + NSLOTS), .max_clients = 1, .max_ns = 4,
		.ledger_slots = 8, .n_slots = NSLOTS,
	};
	struct kvshm_header h;

	memset(&D, 0, sizeof(D));
	kvd_config_defaults(&D.cfg);
	D.cfg.max_clients = 1;
	if (topic)
		strcpy(D.cfg.kv_events_topic, topic);
	D.cfg.kv_events_hash = hash;
	D.cfg.kv_events_buffer = buffer;
	assert_int_equal(kvshm_layout(&h, &geo), 0);
	D.h = aligned_alloc(4096, (h.segment_bytes + 4095) / 4096 * 4096);
	assert_non_null(D.h);
	memset(D.h, 0, h.segment_bytes);
	kvshm_init(D.h, &h);
	D.h->pool_kind = KVSHM_POOL_HOST;
	D.clients = calloc(1, sizeof(*D.clients));
	D.mark = calloc(NPAGES, 1);
	assert_non_null(D.clients);
	assert_int_equal(kvd_policy_open(&D.pol, D.cfg.eviction, NPAGES), 0);
	kvd_ground_bind(&D);
	assert_int_equal(kvd_events_open_sink(&D.g, sink, NULL), 0);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_events_enabled), 1);
	sink_rc = 0;
	n_out = 0;
}

static int setup(void **state)
{
	(void)state;
	setup_with(NULL, KVD_EVENTS_HASH_UINT64, 100);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	kvd_events_close(&D.g);
	assert_null(D.g.events);
	kvd_policy_close(&D.pol);
	free(D.h);
	free(D.clients);
	free(D.mark);
	out_clear();
	return 0;
}

/* Namespace row `row` for model name, of a pipeline stage. */
static void ns_add(uint32_t row, const char *model, uint16_t pp_rank)
{
	assert_int_equal(kve_test_ns(&kvshm_ns(D.h)[row], model, pp_rank), 0);
}

static void tokens_of(uint32_t *t, size_t n, uint32_t seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		t[i] = seed * 1000 + (uint32_t)i;
}

/* Publish the nb-block prompt of seed in namespace row ns, the way the
 * daemon does (alloc, publish, hook); keys out; returns the first page. */
static uint32_t publish(uint32_t ns, uint32_t seed, uint32_t nb, struct kvshm_key *keys,
			const uint32_t *skip_blocks)
{
	uint32_t t[8 * BT], i, page = 0, first = UINT32_MAX, gen, w, wg;
	struct kvshm_key root = kvshm_key_root(kvshm_ns(D.h)[ns].id, NULL, 0);
	int st;

	assert_true(nb <= 8);
	tokens_of(t, nb * BT, seed);
	kvshm_key_chain(root, root, (struct kvshm_key){ 0, 0 }, t, nb * BT, BT, keys);
	for (i = skip_blocks ? *skip_blocks : 0; i < nb; i++) {
		assert_int_equal(kvshm_page_alloc(D.h, 1, ns, &page, &gen), 0);
		st = kvshm_page_publish(D.h, page, gen, 1, keys[i], i ? keys[i - 1] : root,
					t + i * BT, &w, &wg);
		kvd_events_published(&D.g, page, st);
		if (st == KVSHM_PUBLISHED)
			kvd_evict_insert(&D, page);	/* into the eviction order */
		if (first == UINT32_MAX)
			first = page;
	}
	return first;
}

static bool hash_is(const struct kve_hash *h, struct kvshm_key k)
{
	return h->form == KVE_HASH_UINT && h->lo == k.lo;
}

/* Batch i is block k moving: removed from `from`, then stored in `to`
 * (with no parent: the tests' blocks here start their chains). */
static struct kve_batch check_move(int i, const char *from, const char *to, struct kvshm_key k)
{
	struct kve_batch b = decode(i);

	assert_int_equal(b.n, 2);
	assert_int_equal(b.ev[0].type, KVE_REMOVED);
	assert_string_equal(b.ev[0].medium, from);
	assert_true(hash_is(&b.ev[0].hash[0], k));
	assert_int_equal(b.ev[1].type, KVE_STORED);
	assert_string_equal(b.ev[1].medium, to);
	assert_true(hash_is(&b.ev[1].hash[0], k));
	assert_false(b.ev[1].has_parent);
	return b;
}

static void test_stored_chain(void **state)
{
	struct kvshm_key k[4], k2[4];
	uint32_t t[4 * BT], i, skip = 2;
	struct kve_batch b;
	char want[256], host[128] = "";

	(void)state;
	ns_add(0, "model-a", 0);
	publish(0, 7, 3, k, NULL);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 1);
	assert_int_equal(out[0].seq, 0);
	gethostname(host, sizeof(host) - 1);
	snprintf(want, sizeof(want), "kv@%s@model-a", host);
	assert_string_equal(out[0].topic, want);
	b = decode(0);
	assert_int_equal(b.n, 1);
	assert_int_equal(b.ev[0].type, KVE_STORED);
	assert_int_equal(b.ev[0].n, 3);
	for (i = 0; i < 3; i++)
		assert_true(hash_is(&b.ev[0].hash[i], k[i]));
	assert_false(b.ev[0].has_parent);	/* the chain starts here */
	tokens_of(t, 3 * BT, 7);
	assert_int_equal(b.ev[0].ntok, 3 * BT);
	assert_memory_equal(b.ev[0].tok, t, 3 * BT * 4);
	assert_int_equal(b.ev[0].block_size, BT);
	assert_true(b.ev[0].has_medium);
	assert_string_equal(b.ev[0].medium, "CPU");
	kve_free(&b);

	/* The same prompt, one block longer: only the new block, its parent
	 * the last block the index holds. */
	publish(0, 7, 4, k2, &skip);	/* blocks 2..3: block 2 is a duplicate */
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 2);
	assert_int_equal(out[1].seq, 1);
	b = decode(1);
	assert_int_equal(b.n, 1);
	assert_int_equal(b.ev[0].n, 1);
	assert_true(hash_is(&b.ev[0].hash[0], k2[3]));
	assert_true(b.ev[0].has_parent);
	assert_true(hash_is(&b.ev[0].parent, k[2]));
	kve_free(&b);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_events), 2);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_event_batches), 2);
	/* A tick with nothing to say sends nothing. */
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 2);
}

static void hash_form(int form)
{
	struct kvshm_key k[2];
	struct kve_batch b;

	setup_with(NULL, form, 10);
	ns_add(0, "m", 0);
	publish(0, 3, 2, k, NULL);
	kvd_events_tick(&D.g);
	b = decode(0);
	assert_int_equal(b.ev[0].n, 2);
	switch (form) {
	case KVD_EVENTS_HASH_INT64:
		/* The same 64 bits; negative when the top bit is set. */
		assert_int_equal(b.ev[0].hash[0].lo, k[0].lo);
		assert_int_equal(b.ev[0].hash[0].form,
				 (int64_t)k[0].lo < 0 ? KVE_HASH_INT : KVE_HASH_UINT);
		break;
	case KVD_EVENTS_HASH_BYTES:
		assert_int_equal(b.ev[0].hash[1].form, KVE_HASH_BYTES);
		assert_int_equal(b.ev[0].hash[1].lo, k[1].lo);
		assert_int_equal(b.ev[0].hash[1].hi, k[1].hi);
		break;
	}
	kve_free(&b);
	teardown(NULL);
}

static void test_hash_forms(void **state)
{
	(void)state;
	teardown(NULL);
	hash_form(KVD_EVENTS_HASH_INT64);
	hash_form(KVD_EVENTS_HASH_BYTES);
	setup(NULL);
}

static void test_evict(void **state)
{
	struct kvshm_key k[8];
	struct kve_batch b;
	uint32_t i, freed;

	(void)state;
	ns_add(0, "m", 0);
	publish(0, 1, 8, k, NULL);
	kvd_events_tick(&D.g);
	freed = kvd_evict(&D, 8, true);
	assert_int_equal(freed, 8);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 2);
	b = decode(1);
	assert_int_equal(b.n, 1);
	assert_int_equal(b.ev[0].type, KVE_REMOVED);
	assert_int_equal(b.ev[0].n, 8);
	assert_string_equal(b.ev[0].medium, "CPU");
	for (i = 0; i < 8; i++) {
		uint32_t j;
		bool found = false;

		for (j = 0; j < 8; j++)
			found |= hash_is(&b.ev[0].hash[j], k[i]);
		assert_true(found);
	}
	kve_free(&b);
}

static void test_spill_restore(void **state)
{
	struct kvshm_key k[2];
	struct kvshm_slot *sl = &kvshm_slots(D.h)[5];
	uint32_t page, gen, t[BT];
	struct kve_batch b;

	(void)state;
	ns_add(0, "m", 0);
	page = publish(0, 2, 1, k, NULL);
	kvd_events_tick(&D.g);
	/* Spilled: the evictor's mark, the slot, the entry moved. */
	assert_true(kvshm_page_evict_mark(D.h, page));
	sl->ns_id = 0;
	sl->key = k[0];
	sl->parent = kvshm_pages(D.h)[page].parent;
	atomic_store(&sl->state, KVSHM_SLOT_SPILLED);
	assert_int_equal(kvshm_page_evict_to_slot(D.h, page, 5), 0);
	kvd_events_spilled(&D.g, page, 5);
	kvd_events_tick(&D.g);
	b = check_move(1, "CPU", "DISK", k[0]);
	tokens_of(t, BT, 2);
	assert_memory_equal(b.ev[1].tok, t, sizeof(t));
	kve_free(&b);

	/* Restored into a fresh page: out of DISK, into CPU. */
	assert_int_equal(kvshm_page_alloc(D.h, 99, 0, &page, &gen), 0);
	assert_int_equal(kvshm_page_restore(D.h, page, gen, 99, 5, k[0], sl->parent, t), 0);
	kvd_events_restored(&D.g, page, 5);
	kvd_events_tick(&D.g);
	b = check_move(2, "DISK", "CPU", k[0]);
	kve_free(&b);

	/* Spilled again, then its slot recycled: removed from DISK, once. */
	assert_true(kvshm_page_evict_mark(D.h, page));
	assert_int_equal(kvshm_page_evict_to_slot(D.h, page, 5), 0);
	kvd_events_spilled(&D.g, page, 5);
	kvd_events_slot_gone(&D.g, 5);
	kvd_events_slot_gone(&D.g, 5);
	kvd_events_page_gone(&D.g, page);	/* already left the pool */
	kvd_events_tick(&D.g);
	b = decode(3);
	assert_int_equal(b.n, 3);
	assert_int_equal(b.ev[2].type, KVE_REMOVED);
	assert_string_equal(b.ev[2].medium, "DISK");
	assert_int_equal(b.ev[2].n, 1);
	kve_free(&b);
}

/* A dropped namespace: a BlockRemoved for each of its blocks on its own
 * topic, never AllBlocksCleared (a router that keys by pod, as llm-d
 * does, clears every model of the host on that), nothing on another's. */
static void test_ns_cleared(void **state)
{
	struct kvshm_key k[4], kb[2];
	struct kve_batch b;
	uint32_t i;

	(void)state;
	ns_add(0, "model-a", 0);
	ns_add(1, "model-b", 0);
	publish(0, 1, 4, k, NULL);
	publish(1, 2, 2, kb, NULL);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 2);
	assert_int_equal(kvd_evict_ns(&D, 0), 0);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 3);
	assert_non_null(strstr(out[2].topic, "model-a"));
	b = decode(2);
	assert_int_equal(b.n, 1);
	assert_int_equal(b.ev[0].type, KVE_REMOVED);
	assert_string_equal(b.ev[0].medium, "CPU");
	assert_int_equal(b.ev[0].n, 4);
	for (i = 0; i < 4; i++)
		assert_true(hash_is(&b.ev[0].hash[i], k[i]));
	kve_free(&b);
	/* Dropped again: nothing left to remove, nothing sent. */
	assert_int_equal(kvd_evict_ns(&D, 0), 0);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 3);
}

static void test_ns_cleared_shared_topic(void **state)
{
	struct kvshm_key k[4];
	struct kve_batch b;
	uint32_t i;

	(void)state;
	teardown(NULL);
	setup_with("kvcached@{host}", KVD_EVENTS_HASH_UINT64, 10);
	ns_add(0, "model-a", 0);
	ns_add(1, "model-b", 0);
	publish(0, 1, 4, k, NULL);
	publish(1, 2, 2, k + 2, NULL);
	kvd_events_tick(&D.g);
	/* One topic: both namespaces' events in one batch. */
	assert_int_equal(n_out, 1);
	b = decode(0);
	assert_int_equal(b.n, 2);
	kve_free(&b);
	publish(0, 1, 4, k, NULL);	/* all duplicates: nothing new */
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 1);
	assert_int_equal(kvd_evict_ns(&D, 0), 0);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 2);
	b = decode(1);
	/* Removals of model-a's blocks alone: model-b's stay. */
	for (i = 0; i < b.n; i++)
		assert_int_equal(b.ev[i].type, KVE_REMOVED);
	assert_int_equal(b.n, 1);
	assert_int_equal(b.ev[0].n, 4);
	kve_free(&b);
}

/* Both encodings: every event of a tick (a chain stored, a block removed)
 * as a tagged array or as a map with "type", nothing with a default
 * carried; the first key of a map is "type", as msgspec writes it. */
static void test_forms(void **state)
{
	static const uint8_t map_head[] = { 0x88, 0xa4, 't', 'y', 'p', 'e', 0xab, 'B', 'l',
					    'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd' };
	struct kvshm_key k[3];
	struct kve_batch b;
	int form;
	uint32_t i;

	(void)state;
	for (form = KVD_EVENTS_FORMAT_ARRAY; form <= KVD_EVENTS_FORMAT_MAP; form++) {
		teardown(NULL);
		setup_with(NULL, KVD_EVENTS_HASH_UINT64, 10);
		D.cfg.kv_events_format = form;
		ns_add(0, "m", 0);
		publish(0, 5, 3, k, NULL);
		assert_int_equal(kvd_evict(&D, 1, true), 1);
		kvd_events_tick(&D.g);
		assert_int_equal(n_out, 1);
		b = decode(0);
		assert_int_equal(b.n, 2);
		assert_int_equal(b.ev[0].type, KVE_STORED);
		assert_int_equal(b.ev[0].n, 3);
		assert_int_equal(b.ev[1].type, KVE_REMOVED);
		assert_int_equal(b.ev[1].n, 1);
		for (i = 0; i < b.n; i++) {
			assert_int_equal(b.ev[i].map, form == KVD_EVENTS_FORMAT_MAP);
			assert_int_equal(b.ev[i].optional, 0);
			assert_string_equal(b.ev[i].medium, "CPU");
		}
		kve_free(&b);
		/* [ts (float64), [event, ...], 0]: the event starts at 12. */
		assert_int_equal(out[0].p[0], 0x93);
		assert_int_equal(out[0].p[1], 0xcb);
		if (form == KVD_EVENTS_FORMAT_MAP)
			assert_memory_equal(out[0].p + 11, map_head, sizeof(map_head));
		else
			assert_memory_equal(out[0].p + 11, "\x98\xab" "BlockStored", 13);
	}
}

/* Token ids are written as msgpack-c's msgpack_pack_uint32 writes them
 * (fixint, uint8, uint16, uint32 at their bounds), byte for byte. */
static void test_token_bytes(void **state)
{
	static const uint32_t v[BT] = { 0, 1, 127, 128, 255, 256, 65535, 65536, 70000,
					UINT32_MAX, 4242, 16777216, 12, 200, 300, 2000000 };
	struct kvshm_key root = kvshm_key_root(kvshm_ns(D.h)[0].id, NULL, 0), k;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	uint32_t page, gen, w, wg, i;
	struct kve_batch b;

	(void)state;
	ns_add(0, "m", 0);
	root = kvshm_key_root(kvshm_ns(D.h)[0].id, NULL, 0);
	kvshm_key_chain(root, root, (struct kvshm_key){ 0, 0 }, v, BT, BT, &k);
	assert_int_equal(kvshm_page_alloc(D.h, 1, 0, &page, &gen), 0);
	kvd_events_published(&D.g, page, kvshm_page_publish(D.h, page, gen, 1, k, root, v, &w, &wg));
	kvd_events_tick(&D.g);
	b = decode(0);
	assert_int_equal(b.ev[0].ntok, BT);
	assert_memory_equal(b.ev[0].tok, v, sizeof(v));
	kve_free(&b);
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, BT);
	for (i = 0; i < BT; i++)
		msgpack_pack_uint32(&pk, v[i]);
	assert_non_null(memmem(out[0].p, out[0].len, sb.data, sb.size));
	msgpack_sbuffer_destroy(&sb);
}

/* Pack an event for the decoder tests: fields as msgpack-c packs them. */
static size_t pack_obj(uint8_t *buf, size_t cap, void (*fn)(msgpack_packer *pk))
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	size_t n;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 3);
	msgpack_pack_double(&pk, 1.5);
	fn(&pk);
	msgpack_pack_int(&pk, 0);
	assert_true(sb.size <= cap);
	memcpy(buf, sb.data, sb.size);
	n = sb.size;
	msgpack_sbuffer_destroy(&sb);
	return n;
}

static void str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void ev_cleared_array(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_array(pk, 1);
	str(pk, "AllBlocksCleared");
}

static void ev_cleared_map(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 1);
	str(pk, "type");
	str(pk, "AllBlocksCleared");
}

/* vLLM 0.26's BlockStored of a full-attention group: extra_keys,
 * group_idx and kv_cache_spec_kind set, the type key last. */
static void ev_stored_map_full(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 11);
	str(pk, "block_hashes");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, 7);
	str(pk, "parent_block_hash");
	msgpack_pack_nil(pk);
	str(pk, "token_ids");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint32(pk, 3);
	str(pk, "block_size");
	msgpack_pack_uint32(pk, 1);
	str(pk, "lora_id");
	msgpack_pack_nil(pk);
	str(pk, "medium");
	str(pk, "GPU");
	str(pk, "lora_name");
	msgpack_pack_nil(pk);
	str(pk, "extra_keys");
	msgpack_pack_array(pk, 1);
	msgpack_pack_nil(pk);
	str(pk, "group_idx");
	msgpack_pack_uint32(pk, 0);
	str(pk, "kv_cache_spec_kind");
	str(pk, "full_attention");
	str(pk, "type");
	str(pk, "BlockStored");
}

/* A BlockRemoved map with a field no struct declares. */
static void ev_removed_map_extra(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 4);
	str(pk, "type");
	str(pk, "BlockRemoved");
	str(pk, "block_hashes");
	msgpack_pack_array(pk, 0);
	str(pk, "medium");
	msgpack_pack_nil(pk);
	str(pk, "pod");
	str(pk, "x");
}

/* A BlockRemoved map without medium (it has no default). */
static void ev_removed_map_short(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 2);
	str(pk, "type");
	str(pk, "BlockRemoved");
	str(pk, "block_hashes");
	msgpack_pack_array(pk, 0);
}

/* An array BlockRemoved of vLLM 0.23: group_idx after medium. */
static void ev_removed_array_group(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_array(pk, 4);
	str(pk, "BlockRemoved");
	msgpack_pack_array(pk, 1);
	msgpack_pack_int64(pk, -5);
	str(pk, "GPU");
	msgpack_pack_uint32(pk, 1);
}

/* ... and one field past what any version declares. */
static void ev_removed_array_long(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_array(pk, 5);
	str(pk, "BlockRemoved");
	msgpack_pack_array(pk, 0);
	str(pk, "GPU");
	msgpack_pack_uint32(pk, 1);
	msgpack_pack_uint32(pk, 1);
}

/* The test decoder, which follows vLLM's field lists, takes every event
 * kind in both forms (AllBlocksCleared too, which kvcached never sends),
 * the defaulted fields of newer vLLM, and refuses what msgspec would,
 * and a map field no struct declares. */
static void test_decoder(void **state)
{
	static void (*const good[])(msgpack_packer *) = {
		ev_cleared_array, ev_cleared_map, ev_stored_map_full, ev_removed_array_group,
	};
	static void (*const bad[])(msgpack_packer *) = {
		ev_removed_map_extra, ev_removed_map_short, ev_removed_array_long,
	};
	uint8_t buf[512];
	struct kve_batch b;
	const char *why;
	size_t i, n;

	(void)state;
	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		n = pack_obj(buf, sizeof(buf), good[i]);
		why = NULL;
		if (kve_decode(buf, n, &b, &why))
			fail_msg("good event %zu refused: %s", i, why);
		assert_int_equal(b.n, 1);
		assert_int_equal(b.ev[0].map, i == 1 || i == 2);
		assert_int_equal(b.ev[0].type,
				 i < 2 ? KVE_CLEARED : i == 2 ? KVE_STORED : KVE_REMOVED);
		assert_int_equal(b.ev[0].optional, i == 2 ? 3 : i == 3 ? 1 : 0);
		kve_free(&b);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		n = pack_obj(buf, sizeof(buf), bad[i]);
		why = NULL;
		assert_int_equal(kve_decode(buf, n, &b, &why), -1);
		assert_non_null(why);
	}
}

/* --kv-events-host-medium names a host pool's medium; a cuda pool's is
 * GPU whatever it says. */
static void test_host_medium(void **state)
{
	struct kvshm_key k[1];
	struct kve_batch b;
	const char *why = NULL;

	(void)state;
	strcpy(D.cfg.kv_events_host_medium, "CPU_PINNED");
	ns_add(0, "m", 0);
	publish(0, 1, 1, k, NULL);
	kvd_events_tick(&D.g);
	b = decode(0);
	assert_string_equal(b.ev[0].medium, "CPU_PINNED");
	kve_free(&b);
	D.h->pool_kind = KVSHM_POOL_CUDA;
	assert_string_equal(kvd_medium_name(&D.g, KVD_MEDIUM_POOL), "GPU");
	assert_string_equal(kvd_medium_name(&D.g, KVD_MEDIUM_SPILL), "DISK");
	assert_string_equal(kvd_medium_name(&D.g, KVD_MEDIUM_REMOTE), "REMOTE");
	D.h->pool_kind = KVSHM_POOL_HOST;
	assert_int_equal(kvd_events_medium_check("GPU", &why), 0);
	assert_int_equal(kvd_events_medium_check("", &why), -EINVAL);
	assert_int_equal(kvd_events_medium_check("CPU PINNED", &why), -EINVAL);
	assert_non_null(strstr(why, "letters"));
	assert_int_equal(kvd_events_medium_check("ABCDEFGHIJKLMNOP", &why), -EINVAL);
}

static void test_muted_stage(void **state)
{
	struct kvshm_key k[2];

	(void)state;
	ns_add(0, "big", 1);		/* pipeline stage 1 of 2 */
	publish(0, 1, 2, k, NULL);
	kvd_evict(&D, 2, true);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 0);
	ns_add(1, "big", 0);		/* stage 0 speaks for the model */
	publish(1, 1, 2, k, NULL);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 1);
}

static void test_big_batches(void **state)
{
	struct kvshm_key k;
	uint32_t t[BT], i, page, gen, w, wg, blocks = 0, j;
	int st;

	(void)state;
	ns_add(0, "m", 0);
	/* 4000 blocks of 16 tokens (about 350 KiB of events) in one tick:
	 * more than one batch, every block in exactly one. */
	for (i = 0; i < 4000; i++) {
		tokens_of(t, BT, i);
		k.lo = 0x1000 + i;
		k.hi = i;
		assert_int_equal(kvshm_page_alloc(D.h, 1, 0, &page, &gen), 0);
		st = kvshm_page_publish(D.h, page, gen, 1, k, (struct kvshm_key){ 1, 1 }, t, &w,
					&wg);
		assert_int_equal(st, KVSHM_PUBLISHED);
		kvd_events_published(&D.g, page, st);
		/* free the page again so the pool never runs out */
		assert_true(kvshm_page_evict_mark(D.h, page));
		kvd_events_page_gone(&D.g, page);
		kvshm_page_evict_finish(D.h, page);
	}
	kvd_events_tick(&D.g);
	assert_true(n_out > 1);
	for (i = 0; i < (uint32_t)n_out; i++) {
		struct kve_batch b = decode((int)i);

		assert_int_equal(out[i].seq, i);
		for (j = 0; j < b.n; j++)
			if (b.ev[j].type == KVE_STORED)
				blocks += b.ev[j].n;
		kve_free(&b);
	}
	assert_int_equal(blocks, 4000);
}

struct rcap {
	int n;
	uint64_t seq[64];
	int eagain_after;	/* answer -EAGAIN from the nth reply on */
	uint8_t id[8];
};

static int rcap_fn(void *arg, const struct iovec *f, size_t n)
{
	struct rcap *r = arg;

	assert_int_equal(n, 4);
	assert_int_equal(f[0].iov_len, 3);
	assert_memory_equal(f[0].iov_base, "ab\x01", 3);
	assert_int_equal(f[1].iov_len, 0);
	assert_int_equal(f[2].iov_len, 8);
	if (r->eagain_after && r->n >= r->eagain_after)
		return -EAGAIN;
	assert_true(r->n < 64);
	{
		const uint8_t *s = f[2].iov_base;
		uint64_t v = 0;
		int i;

		for (i = 0; i < 8; i++)
			v = v << 8 | s[i];
		r->seq[r->n++] = v;
	}
	if (r->seq[r->n - 1] == UINT64_MAX)
		assert_int_equal(f[3].iov_len, 0);	/* the end marker */
	else
		assert_true(f[3].iov_len > 0);
	return 0;
}

static void replay_req(struct rcap *r, uint64_t start, size_t seqlen, size_t delim)
{
	uint8_t s[9] = { 0 }, dl = 'x';
	struct iovec f[3] = { { "ab\x01", 3 }, { &dl, delim }, { s, seqlen } };
	int i;

	for (i = 7; i >= 0; i--, start >>= 8)
		s[i] = (uint8_t)start;
	kvd_events_replay_frames(&D.g, f, 3, false, rcap_fn, r);
}

static void replay_once(struct rcap *r, uint64_t start)
{
	uint8_t s[8];
	struct iovec f[3] = { { "ab\x01", 3 }, { NULL, 0 }, { s, 8 } };
	int i;

	for (i = 7; i >= 0; i--, start >>= 8)
		s[i] = (uint8_t)start;
	kvd_events_replay_frames(&D.g, f, 3, true, rcap_fn, r);
}

static void test_drops_and_replay(void **state)
{
	struct kvshm_key k[1];
	struct rcap r;
	uint32_t i;

	(void)state;
	teardown(NULL);
	setup_with(NULL, KVD_EVENTS_HASH_UINT64, 4);	/* keeps 4 batches */
	ns_add(0, "m", 0);
	for (i = 0; i < 6; i++) {
		sink_rc = i == 2 ? -EAGAIN : 0;	/* batch 2: the queue is full */
		publish(0, 10 + i, 1, k, NULL);
		kvd_events_tick(&D.g);
	}
	assert_int_equal(n_out, 6);
	for (i = 0; i < 6; i++)
		assert_int_equal(out[i].seq, i);	/* the drop spent its number */
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_event_drops), 1);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_event_batches), 5);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_events), 5);

	/* From 0: what the ring holds (2..5: the dropped one too), then END. */
	memset(&r, 0, sizeof(r));
	replay_req(&r, 0, 8, 0);
	assert_int_equal(r.n, 5);
	for (i = 0; i < 4; i++)
		assert_int_equal(r.seq[i], 2 + i);
	assert_int_equal(r.seq[4], UINT64_MAX);
	/* From 4. */
	memset(&r, 0, sizeof(r));
	replay_req(&r, 4, 8, 0);
	assert_int_equal(r.n, 3);
	assert_int_equal(r.seq[0], 4);
	assert_int_equal(r.seq[2], UINT64_MAX);
	/* Past the end: END only. */
	memset(&r, 0, sizeof(r));
	replay_req(&r, 1000, 8, 0);
	assert_int_equal(r.n, 1);
	assert_int_equal(r.seq[0], UINT64_MAX);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_event_replays), 3);

	/* The peer's queue fills after 2: the rest goes on later. */
	memset(&r, 0, sizeof(r));
	r.eagain_after = 2;
	replay_req(&r, 0, 8, 0);
	assert_int_equal(r.n, 2);
	r.eagain_after = 0;
	kvd_events_replay_frames(&D.g, NULL, 0, false, rcap_fn, &r);
	assert_int_equal(r.n, 5);
	assert_int_equal(r.seq[2], 4);
	assert_int_equal(r.seq[4], UINT64_MAX);
	kvd_events_replay_frames(&D.g, NULL, 0, false, rcap_fn, &r);	/* done: nothing */
	assert_int_equal(r.n, 5);

	/* A REQ peer takes one message per request: the first batch from
	 * its start on, then it asks from the next; END past the last. It
	 * holds no replay slot. */
	memset(&r, 0, sizeof(r));
	for (i = 0; i < 5; i++)
		replay_once(&r, i ? r.seq[i - 1] + 1 : 0);
	assert_int_equal(r.n, 5);
	for (i = 0; i < 4; i++)
		assert_int_equal(r.seq[i], 2 + i);
	assert_int_equal(r.seq[4], UINT64_MAX);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_event_replays), 9);
	kvd_events_replay_frames(&D.g, NULL, 0, false, rcap_fn, &r);
	assert_int_equal(r.n, 5);

	/* Malformed: refused, counted, and a REQ peer still gets END. */
	memset(&r, 0, sizeof(r));
	replay_req(&r, 0, 7, 0);
	replay_req(&r, 0, 8, 1);
	assert_int_equal(r.n, 2);
	assert_int_equal(r.seq[0], UINT64_MAX);
	assert_int_equal(atomic_load(&kvshm_stats(D.h)->kv_event_replay_errors), 2);
}

static void test_replay_parse(void **state)
{
	uint8_t s[8] = { 0, 0, 0, 0, 0, 0, 1, 2 }, big[300];
	struct iovec f[4] = { { "id", 2 }, { NULL, 0 }, { s, 8 }, { s, 8 } };
	const char *why = NULL;
	uint64_t start = 0;

	(void)state;
	assert_int_equal(kvd_events_replay_parse(f, 3, &start, &why), 0);
	assert_int_equal(start, 0x102);
	assert_int_equal(kvd_events_replay_parse(f, 4, &start, &why), -EBADMSG);
	assert_non_null(strstr(why, "3 frames"));
	assert_int_equal(kvd_events_replay_parse(f, 2, &start, &why), -EBADMSG);
	f[0].iov_len = 0;
	assert_int_equal(kvd_events_replay_parse(f, 3, &start, &why), -EBADMSG);
	f[0].iov_base = big;
	f[0].iov_len = sizeof(big);
	assert_int_equal(kvd_events_replay_parse(f, 3, &start, &why), -EBADMSG);
	assert_non_null(strstr(why, "identity"));
	f[0].iov_len = 5;
	f[1].iov_base = s;
	f[1].iov_len = 1;
	assert_int_equal(kvd_events_replay_parse(f, 3, &start, &why), -EBADMSG);
	assert_non_null(strstr(why, "delimiter"));
	f[1].iov_len = 0;
	f[2].iov_len = 4;
	assert_int_equal(kvd_events_replay_parse(f, 3, &start, &why), -EBADMSG);
	assert_non_null(strstr(why, "8 bytes"));
}

static void test_topic(void **state)
{
	char t[64];
	const char *why = NULL;

	(void)state;
	assert_int_equal(kvd_events_topic("kv@{host}@{model}", "h1", "meta/llama 3@x", t,
					  sizeof(t)), (int)strlen("kv@h1@meta/llama_3_x"));
	assert_string_equal(t, "kv@h1@meta/llama_3_x");	/* space and '@' made safe */
	assert_int_equal(kvd_events_topic("", "h", "m", t, sizeof(t)), 0);
	assert_string_equal(t, "");
	kvd_events_topic("{model}{model}{model}", "h", "abcdefghijklmnopqrstuvwxyz", t, 20);
	assert_int_equal(strlen(t), 19);	/* cut to fit, NUL kept */
	kvd_events_topic("x{host}", "\xff\x01h", "m", t, sizeof(t));
	assert_string_equal(t, "x__h");
	assert_int_equal(kvd_events_topic_check("kv@{host}@{model}", &why), 0);
	assert_int_equal(kvd_events_topic_check("", &why), 0);
	assert_int_equal(kvd_events_topic_check("kv@{pod}", &why), -EINVAL);
	assert_non_null(strstr(why, "{host}"));
	assert_int_equal(kvd_events_topic_check("kv {model}", &why), -EINVAL);
	assert_int_equal(kvd_events_topic_check("kv}", &why), -EINVAL);
	assert_int_equal(kvd_events_topic_check("{host", &why), -EINVAL);
	memset(t, 'a', sizeof(t));
	t[sizeof(t) - 1] = 0;
	assert_int_equal(kvd_events_topic_check(t, &why), 0);
	{
		char longer[200];

		memset(longer, 'a', sizeof(longer));
		longer[sizeof(longer) - 1] = 0;
		assert_int_equal(kvd_events_topic_check(longer, &why), -EINVAL);
	}
	assert_string_equal(kvd_medium_name(&D.g, KVD_MEDIUM_POOL), "CPU");
	D.h->pool_kind = KVSHM_POOL_CUDA;
	assert_string_equal(kvd_medium_name(&D.g, KVD_MEDIUM_POOL), "GPU");
	D.h->pool_kind = KVSHM_POOL_HOST;
	assert_string_equal(kvd_medium_name(&D.g, KVD_MEDIUM_SPILL), "DISK");
	assert_string_equal(kvd_medium_name(&D.g, KVD_MEDIUM_REMOTE), "REMOTE");
}

static void test_row_reused(void **state)
{
	struct kvshm_key k[2];

	(void)state;
	ns_add(0, "old-model", 0);
	publish(0, 1, 2, k, NULL);
	/* The row names another model before the tick: what the old one
	 * queued stays under its own topic, the new one gets its own. */
	ns_add(0, "new-model", 0);
	publish(0, 2, 2, k, NULL);
	assert_int_equal(n_out, 0);
	kvd_events_tick(&D.g);
	assert_int_equal(n_out, 2);
	assert_non_null(strstr(out[0].topic, "old-model"));
	assert_non_null(strstr(out[1].topic, "new-model"));
}

static void test_slot_found(void **state)
{
	struct kvshm_slot *sl = &kvshm_slots(D.h)[3];
	uint32_t t[BT];
	struct kve_batch b;

	(void)state;
	ns_add(0, "m", 0);
	tokens_of(t, BT, 4);
	sl->ns_id = 0;
	sl->key = (struct kvshm_key){ 77, 78 };
	sl->parent = kvshm_key_root(kvshm_ns(D.h)[0].id, NULL, 0);
	kvd_events_slot_found(&D.g, 3, t);
	sl = &kvshm_slots(D.h)[4];
	sl->ns_id = 0;
	sl->key = (struct kvshm_key){ 79, 80 };
	sl->parent = (struct kvshm_key){ 77, 78 };
	kvd_events_slot_found(&D.g, 4, t);
	kvd_events_tick(&D.g);
	b = decode(0);
	/* One chain: the unsalted root is recognised as its start. */
	assert_int_equal(b.n, 1);
	assert_int_equal(b.ev[0].n, 2);
	assert_false(b.ev[0].has_parent);
	assert_string_equal(b.ev[0].medium, "DISK");
	kve_free(&b);
}

/* The stats table: every JSON name once, a Prometheus family's rows
 * together (split, /metrics would name the family twice), and the KV
 * event counters in it. */
static void test_metric_rows(void **state)
{
	static const char *const ours[] = {
		"kv_events_enabled", "kv_events", "kv_event_batches", "kv_event_drops",
		"kv_events_lossy", "kv_event_replays", "kv_event_replay_errors",
	};
	size_t i, j, found = 0;

	(void)state;
	for (i = 0; i < kvshm_n_metrics; i++) {
		for (j = i + 1; j < kvshm_n_metrics; j++) {
			assert_string_not_equal(kvshm_metrics[i].json, kvshm_metrics[j].json);
			if (j > i + 1 && !strcmp(kvshm_metrics[i].name, kvshm_metrics[j].name))
				assert_string_equal(kvshm_metrics[j - 1].name, kvshm_metrics[j].name);
		}
		for (j = 0; j < sizeof(ours) / sizeof(ours[0]); j++)
			found += !strcmp(kvshm_metrics[i].json, ours[j]);
	}
	assert_int_equal(found, sizeof(ours) / sizeof(ours[0]));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_stored_chain, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hash_forms, setup, teardown),
		cmocka_unit_test_setup_teardown(test_evict, setup, teardown),
		cmocka_unit_test_setup_teardown(test_spill_restore, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ns_cleared, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ns_cleared_shared_topic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_forms, setup, teardown),
		cmocka_unit_test(test_decoder),
		cmocka_unit_test_setup_teardown(test_token_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_host_medium, setup, teardown),
		cmocka_unit_test_setup_teardown(test_muted_stage, setup, teardown),
		cmocka_unit_test_setup_teardown(test_big_batches, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drops_and_replay, setup, teardown),
		cmocka_unit_test_setup_teardown(test_replay_parse, setup, teardown),
		cmocka_unit_test_setup_teardown(test_topic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_row_reused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_slot_found, setup, teardown),
		cmocka_unit_test(test_metric_rows),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
