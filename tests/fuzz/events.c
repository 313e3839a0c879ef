// SPDX-License-Identifier: MIT
/*
 * events.c - fuzz target for the KV events (daemon/obs/events.c): the replay
 * request parser (parsed input from the network), and the batches the
 * daemon encodes for any sequence of tier transitions.
 *
 * Input: byte 0 sets the hash form (bits 0-1), whether all namespaces
 * share one topic (bit 2), the replay buffer (bits 3-5: 0..7 batches)
 * and the encoding (bit 6: events as maps, else as arrays).
 * Then operations, one byte each with their arguments after it:
 *   0 publish  ns, blocks, seed, chained: a prompt's blocks published in
 *              namespace row ns (row 3 is rank 1 of a sharded model:
 *              muted), chained to the last prompt's last block or not
 *   1 evict    count: kvd_evict, the daemon's own evictor
 *   2 spill    which: a READY page to a free spill slot (spill.c's steps)
 *   3 restore  which: a spilled slot back into a page
 *   4 drop     which: a spilled slot recycled (it leaves the index)
 *   5 clear    ns: the namespace's blocks dropped (forget its slots with
 *              their hook, then kvd_evict_ns, as a reclaim or DROP does)
 *   6 tick     the batches go out
 *   7 replay   frames: count, then per frame a length and its bytes;
 *              then the reply verdict (0 sent, EAGAIN, EHOSTUNREACH)
 *              and whether the peer is a REQ socket (one reply)
 *
 * Oracle: no crash, no leak. Every batch decodes strictly in the vLLM
 * schema (tests/lib/kvevents.h), every event in the form configured:
 * BlockStored with n >= 1 hashes, n x 16 tokens, block size 16, medium
 * CPU or DISK, or BlockRemoved; never AllBlocksCleared (a router that
 * keys by pod would clear the other namespaces too). Sequence numbers
 * count up by one. A removal names a block the stream stored in that
 * medium and did not remove since. After a final tick, the blocks the
 * stream says a topic holds are exactly the blocks the index holds for
 * its namespaces (pool pages and spilled slots), muted rank excepted, so
 * a dropped namespace left nothing behind and took nothing of another's.
 * A replay request the parser accepts is 3 frames with an empty
 * delimiter and an 8-byte sequence; replayed batches come in increasing
 * sequence order and each decodes; the end marker has an empty payload;
 * a REQ peer gets one message per request.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../daemon/config.h"
#include "../../daemon/obs/events.h"
#include "../../daemon/core/kvd.h"
#include "../../daemon/core/evict.h"
#include "../../daemon/util/log.h"
#include "../../shm/index.h"
#include "../../shm/key.h"
#include "../../shm/page.h"
#include "../../shm/proto.h"
#include "../lib/kvevents.h"

#include "check.h"

#define BT 16
#define NPAGES 32
#define NSLOTS 8
#define NNS 4
#define MAXHELD 256

static struct kvd D;
static uint32_t slot_tok[NSLOTS][BT];	/* what a spilled slot holds on "disk" */
static struct kvshm_key last_key;
static bool have_last;
static uint64_t next_seq;
static bool map_form;

/* The state the stream describes, per topic: (topic, medium, hash). */
struct held {
	char topic[64];
	bool disk;
	uint64_t hash;
};
static struct held held[MAXHELD * 4];
static int n_held;

static int held_find(const char *topic, bool disk, uint64_t h)
{
	int i;

	for (i = 0; i < n_held; i++)
		if (held[i].disk == disk && held[i].hash == h && !strcmp(held[i].topic, topic))
			return i;
	return -1;
}

static void check_batch(const char *topic, const void *p, size_t len, bool apply)
{
	struct kve_batch b;
	const char *why = NULL;
	uint32_t i, k;

	CHECK(kve_decode(p, len, &b, &why) == 0);
	CHECK(b.has_rank && b.rank == 0);
	for (i = 0; i < b.n; i++) {
		const struct kve_ev *e = &b.ev[i];
		bool disk = !strcmp(e->medium, "DISK");

		CHECK(e->type != KVE_CLEARED);
		CHECK(e->map == map_form);
		CHECK(e->n >= 1);
		CHECK(disk || !strcmp(e->medium, "CPU"));
		if (e->type == KVE_STORED)
			CHECK(e->ntok == e->n * BT && e->block_size == BT);
		if (!apply)
			continue;
		for (k = 0; k < e->n; k++) {
			int at = held_find(topic, disk, e->hash[k].lo);

			if (e->type == KVE_STORED) {
				CHECK(at < 0);	/* not stored twice in a medium */
				CHECK(n_held < (int)(sizeof(held) / sizeof(held[0])));
				snprintf(held[n_held].topic, sizeof(held[0].topic), "%s", topic);
				held[n_held].disk = disk;
				held[n_held].hash = e->hash[k].lo;
				n_held++;
			} else {
				CHECK(at >= 0);	/* removed: was stored */
				held[at] = held[--n_held];
			}
		}
	}
	kve_free(&b);
}

static int sink(void *arg, const char *topic, size_t tlen, uint64_t seq, const void *p,
		size_t len)
{
	char t[64];

	(void)arg;
	CHECK(seq == next_seq);
	next_seq++;
	CHECK(tlen > 0 && tlen < sizeof(t));
	memcpy(t, topic, tlen);
	t[tlen] = 0;
	check_batch(t, p, len, true);
	return 0;
}

struct rstate {
	int verdict;
	bool any;
	uint64_t last;
	int replies;
};

static int reply(void *arg, const struct iovec *f, size_t n)
{
	struct rstate *r = arg;
	const uint8_t *s;
	uint64_t seq = 0;
	int i;

	CHECK(n == 4 && f[1].iov_len == 0 && f[2].iov_len == 8);
	CHECK(f[0].iov_len >= 1 && f[0].iov_len <= 255);
	r->replies++;
	s = f[2].iov_base;
	for (i = 0; i < 8; i++)
		seq = seq << 8 | s[i];
	if (seq == UINT64_MAX) {
		CHECK(f[3].iov_len == 0);
	} else {
		CHECK(!r->any || seq > r->last);
		r->any = true;
		r->last = seq;
		check_batch("", f[3].iov_base, f[3].iov_len, false);
	}
	return r->verdict;
}

static void setup(uint8_t mode)
{
	static const char *const models[NNS] = { "alpha", "beta", "gamma", "alpha" };
	struct kvshm_geometry geo = {
		.page_bytes = 4096, .n_pages = NPAGES, .block_tokens = BT,
		.n_buckets = kvshm_buckets_for(NPAGES + NSLOTS), .max_clients = 1,
		.max_ns = NNS, .ledger_slots = 8, .n_slots = NSLOTS,
	};
	struct kvshm_header h;
	uint32_t i;

	memset(&D, 0, sizeof(D));
	kvd_config_defaults(&D.cfg);
	D.cfg.max_clients = 1;
	D.cfg.kv_events_hash = mode & 3 ? (mode & 3) - 1 : 0;
	if (mode & 4)
		strcpy(D.cfg.kv_events_topic, "one");
	else
		strcpy(D.cfg.kv_events_topic, "t-{model}");
	D.cfg.kv_events_buffer = (mode >> 3) & 7;
	map_form = mode & 64;
	D.cfg.kv_events_format = map_form ? KVD_EVENTS_FORMAT_MAP : KVD_EVENTS_FORMAT_ARRAY;
	CHECK(!kvshm_layout(&h, &geo));
	D.h = calloc(1, h.segment_bytes);
	CHECK(D.h);
	kvshm_init(D.h, &h);
	D.h->pool_kind = KVSHM_POOL_HOST;
	D.clients = calloc(1, sizeof(*D.clients));
	D.mark = calloc(NPAGES, 1);
	CHECK(D.clients && D.mark);
	CHECK(!kvd_policy_open(&D.pol, D.cfg.eviction, NPAGES));
	for (i = 0; i < NNS; i++)	/* row 3: rank 1 of 2, muted */
		CHECK(!kve_test_ns(&kvshm_ns(D.h)[i], models[i], i == 3));
	kvd_ground_bind(&D);
	CHECK(!kvd_events_open_sink(&D.g, sink, NULL));
	n_held = 0;
	next_seq = 0;
	have_last = false;
}

static void teardown(void)
{
	kvd_events_close(&D.g);
	kvd_policy_close(&D.pol);
	free(D.h);
	free(D.clients);
	free(D.mark);
}

static uint8_t take(const uint8_t **p, const uint8_t *end)
{
	return *p < end ? *(*p)++ : 0;
}

static void op_publish(uint8_t nsb, uint8_t blocks, uint8_t seed, uint8_t chained)
{
	uint32_t ns = nsb % NNS, nb = blocks % 6 + 1, t[6 * BT], i, page, gen, w, wg;
	struct kvshm_key keys[6], root = kvshm_key_root(kvshm_ns(D.h)[ns].id, NULL, 0);
	struct kvshm_key parent = root;

	for (i = 0; i < nb * BT; i++)
		t[i] = (uint32_t)seed * 7919u + i;
	if ((chained & 1) && have_last)
		parent = last_key;
	kvshm_key_chain(root, parent, (struct kvshm_key){ 0, 0 }, t, nb * BT, BT, keys);
	for (i = 0; i < nb; i++) {
		int st;

		if (kvshm_page_alloc(D.h, 1, ns, &page, &gen))
			break;
		st = kvshm_page_publish(D.h, page, gen, 1, keys[i], i ? keys[i - 1] : parent,
					t + i * BT, &w, &wg);
		kvd_events_published(&D.g, page, st);
		if (st == KVSHM_PUBLISHED)
			kvd_evict_insert(&D, page);	/* into the eviction order */
	}
	last_key = keys[nb - 1];
	have_last = true;
}

static bool page_held(uint32_t p)
{
	const struct kvshm_page *pg = &kvshm_pages(D.h)[p];

	return atomic_load(&pg->state) == KVSHM_PAGE_READY &&
	       kvshm_index_find(D.h, pg->key) == p;
}

static bool slot_held(uint32_t s)
{
	const struct kvshm_slot *sl = &kvshm_slots(D.h)[s];

	return atomic_load(&sl->state) == KVSHM_SLOT_SPILLED &&
	       kvshm_index_find(D.h, sl->key) == (KVSHM_LOC_SLOT | s);
}

static void op_spill(uint8_t which)
{
	uint32_t p = which % NPAGES, s;
	struct kvshm_slot *sl;

	if (!page_held(p))
		return;
	for (s = 0; s < NSLOTS; s++)
		if (atomic_load(&kvshm_slots(D.h)[s].state) == KVSHM_SLOT_FREE)
			break;
	if (s == NSLOTS || !kvshm_page_evict_mark(D.h, p))
		return;
	sl = &kvshm_slots(D.h)[s];
	sl->ns_id = kvshm_pages(D.h)[p].ns_id;
	sl->key = kvshm_pages(D.h)[p].key;
	sl->parent = kvshm_pages(D.h)[p].parent;
	memcpy(slot_tok[s], kvshm_tokens(D.h, p), sizeof(slot_tok[s]));
	atomic_store(&sl->state, KVSHM_SLOT_SPILLED);
	CHECK(!kvshm_page_evict_to_slot(D.h, p, s));
	kvd_events_spilled(&D.g, p, s);
}

static void op_restore(uint8_t which)
{
	uint32_t s = which % NSLOTS, page, gen;
	struct kvshm_slot *sl = &kvshm_slots(D.h)[s];

	if (!slot_held(s) || kvshm_page_alloc(D.h, 77, sl->ns_id, &page, &gen))
		return;
	CHECK(!kvshm_page_restore(D.h, page, gen, 77, s, sl->key, sl->parent, slot_tok[s]));
	atomic_store(&sl->state, KVSHM_SLOT_BACKING);
	kvd_events_restored(&D.g, page, s);
	atomic_store(&sl->state, KVSHM_SLOT_FREE);	/* the copy is not tracked here */
}

static void slot_forget(uint32_t s)
{
	struct kvshm_slot *sl = &kvshm_slots(D.h)[s];

	CHECK(!kvshm_index_remove(D.h, sl->key, KVSHM_LOC_SLOT | s));
	atomic_store(&sl->state, KVSHM_SLOT_FREE);
}

static void op_drop(uint8_t which)
{
	uint32_t s = which % NSLOTS;

	if (!slot_held(s))
		return;
	kvd_events_slot_gone(&D.g, s);
	slot_forget(s);
}

static void op_clear(uint8_t nsb)
{
	uint32_t ns = nsb % NNS, s;

	/* kvd_spill_forget_ns, which kvd_evict_ns calls first (no spill
	 * tier here): each of the namespace's slots leaves with its hook. */
	for (s = 0; s < NSLOTS; s++)
		if (slot_held(s) && kvshm_slots(D.h)[s].ns_id == ns) {
			kvd_events_slot_gone(&D.g, s);
			slot_forget(s);
		}
	CHECK(kvd_evict_ns(&D, ns) == 0);
}

static void op_replay(const uint8_t **p, const uint8_t *end)
{
	struct iovec f[6];
	uint8_t buf[6][300];
	size_t n = take(p, end) % 7, i;
	struct rstate r = { 0 };
	uint64_t start;
	const char *why;
	bool once, ok;
	static const int verdicts[3] = { 0, -EAGAIN, -EHOSTUNREACH };

	for (i = 0; i < n; i++) {
		size_t len = take(p, end);

		if (len > 8 && (take(p, end) & 1))
			len += 40;	/* some identities over 255 bytes */
		len = len > sizeof(buf[i]) ? sizeof(buf[i]) : len;
		memset(buf[i], 0, len);
		for (size_t k = 0; k < len && *p < end; k++)
			buf[i][k] = take(p, end);
		f[i].iov_base = buf[i];
		f[i].iov_len = len;
	}
	r.verdict = verdicts[take(p, end) % 3];
	once = take(p, end) & 1;
	ok = !kvd_events_replay_parse(f, n, &start, &why);
	if (ok) {
		CHECK(n == 3 && f[1].iov_len == 0 && f[2].iov_len == 8);
		CHECK(f[0].iov_len >= 1 && f[0].iov_len <= 255);
	} else {
		CHECK(why && *why);
	}
	kvd_events_replay_frames(&D.g, f, n, once, reply, &r);
	if (ok && once)
		CHECK(r.replies == 1);	/* a batch, or the end marker */
	r.any = false;
	r.verdict = 0;
	kvd_events_replay_frames(&D.g, NULL, 0, false, reply, &r);	/* go on */
}

/* After the last tick: the stream's blocks are the index's blocks. */
static void check_state(void)
{
	uint32_t i;
	int want = 0;

	for (i = 0; i < NPAGES + NSLOTS; i++) {
		bool slot = i >= NPAGES;
		uint32_t k = slot ? i - NPAGES : i;
		uint32_t ns;
		uint64_t lo;
		char topic[64];
		int at;

		if (slot ? !slot_held(k) : !page_held(k))
			continue;
		ns = slot ? kvshm_slots(D.h)[k].ns_id : kvshm_pages(D.h)[k].ns_id;
		if (ns == 3)
			continue;	/* muted */
		lo = slot ? kvshm_slots(D.h)[k].key.lo : kvshm_pages(D.h)[k].key.lo;
		kvd_events_topic(D.cfg.kv_events_topic, "", kvshm_ns(D.h)[ns].model, topic,
				 sizeof(topic));
		at = held_find(topic, slot, lo);	/* every form keeps the low 64 bits */
		CHECK(at >= 0);
		want++;
	}
	CHECK(want == n_held);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *end = data + size;

	kvd_log_level = 0;
	if (!size)
		return 0;
	setup(take(&p, end));
	while (p < end) {
		uint8_t op = take(&p, end) % 8;

		switch (op) {
		case 0: {
			uint8_t a = take(&p, end), b = take(&p, end), c = take(&p, end);

			op_publish(a, b, c, take(&p, end));
			break;
		}
		case 1:
			kvd_evict(&D, take(&p, end) % 8 + 1, true);
			break;
		case 2:
			op_spill(take(&p, end));
			break;
		case 3:
			op_restore(take(&p, end));
			break;
		case 4:
			op_drop(take(&p, end));
			break;
		case 5:
			op_clear(take(&p, end));
			break;
		case 6:
			kvd_events_tick(&D.g);
			break;
		default:
			op_replay(&p, end);
		}
	}
	kvd_events_tick(&D.g);
	check_state();
	teardown();
	return 0;
}
