/* SPDX-License-Identifier: MIT */
/*
 * ledger.h - a client's pin ledger: hazard slots, counters, access ring.
 *
 * Each attached client gets its own memfd ledger, created and sized by the
 * daemon and sealed against growing and shrinking (so a client cannot make
 * the daemon's mapping fault), but writable by the client. The daemon maps
 * it too and only reads what the client writes; nothing the daemon does
 * depends on a ledger value being sane beyond the bounds it checks.
 *
 * Pinning (client)                      Evicting (daemon)
 *   slot = (page, gen)   [seq_cst]        state = EVICTING     [seq_cst]
 *   s = state, g = gen   [seq_cst]        scan every ledger's slots
 *   s == READY && g == gen ? pinned       a slot names the page ? back off
 *                        : clear, miss                         : free it
 * Both sides store then load with seq_cst, so at least one sees the other:
 * either the client sees EVICTING and gives up, or the evictor sees the
 * slot and leaves the page alone (or both, and the page merely survives).
 * The evictor matches slots on the page alone, whatever gen they carry, and
 * gen changes only when a page is freed or handed out, never on a back-off.
 *
 * The full barrier between the client's store and load is the lookup's
 * one costly instruction (a locked one on x86, which waits for every
 * store before it). When the header has KVSHM_F_MEMBARRIER, the daemon
 * instead runs membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) between its
 * EVICTING stores and its slot loads (kvshm_barrier_global): every thread
 * of every process registered for it (kvshm_barrier_register) is then
 * interrupted to run a full barrier, or is not running (a context switch
 * is one). A registered client's slot store and state load need only stay
 * in program order, which the compiler keeps: if its load came before the
 * daemon's barrier it read READY and its slot is visible to the scan that
 * follows; if after, it sees EVICTING. Asymmetric: the rare side (an
 * eviction batch, one system call of a few microseconds) pays for the
 * common one (every lookup). A client that could not register fences as
 * above; either kind may attach to the same daemon.
 *
 * Must never: be trusted by the daemon for more than "which pages are
 * pinned" and counters shown to operators.
 */
#ifndef KVSHM_LEDGER_H
#define KVSHM_LEDGER_H

#include <stdbool.h>
#include <stddef.h>

#include "segment.h"

#define KVSHM_LEDGER_MAGIC 0x5245474445444c4bull	/* "KLDEDGER" */
#define KVSHM_RING 1024			/* access ring entries, power of 2 */
#define KVSHM_HIT_RING 64		/* hit ring entries, power of 2 */
#define KVSHM_RING_RUN 0x80000000u	/* access ring: a run entry */
#define KVSHM_RING_UP 0x40000000u	/* the run goes up */
#define KVSHM_RING_COUNT 0x0000ffffu	/* the run's count of pages */
#define KVSHM_RING_RUN_MAX 256u		/* pages one run entry may name */
#define KVSHM_RING_DRAIN (4u * KVSHM_RING)	/* pages one drain takes at most */

#define KVSHM_LEDGER_ROWS 16		/* counter rows (kvshm_ledger_sum adds them) */

/*
 * One row of a client's counters, one cache line. Written by the client
 * only, relaxed (monotonic but for pins_held and miss_blocks, read for
 * statistics). Row 0 is shared by the client's threads, which add to it
 * with atomic read-modify-writes; every other row is written by one
 * thread at a time (the library hands rows out: libclient/slots.c), with
 * a relaxed load and a relaxed store and no locked instruction. A value
 * is the sum over the rows, modulo 2^64: a gauge such as pins_held may
 * go up in one thread's row and down in another's.
 */
struct kvshm_ctr {
	_Atomic uint64_t lookups;
	_Atomic uint64_t hit_blocks;
	_Atomic uint64_t miss_blocks;
	_Atomic uint64_t pin_failures;
	_Atomic uint64_t pins_held;	/* slots in use right now */
	_Atomic uint64_t published;
	_Atomic uint64_t lookup_tokens;	/* prompt tokens looked up */
	_Atomic uint64_t hit_tokens;	/* of those, served from cache */
};
_Static_assert(sizeof(struct kvshm_ctr) == KVSHM_CACHELINE, "counter row: one line");

/* The rows of a ledger added up (kvshm_ledger_sum). */
struct kvshm_ledger_counts {
	uint64_t lookups, hit_blocks, miss_blocks, pin_failures, pins_held, published,
		lookup_tokens, hit_tokens;
};

/*
 * Header fields up to `client_id` are written by the daemon before the fd
 * is handed to the client and never change. Everything after them is
 * written by the client only.
 */
struct kvshm_ledger {
	uint64_t magic;
	uint32_t version;
	uint32_t nslots;
	uint32_t client_id;
	uint32_t ns_id;
	uint64_t bytes;
	uint8_t pad0[KVSHM_CACHELINE - 32];

	/* Client-written counters: row 0 shared, the others a thread's own
	 * (struct kvshm_ctr). */
	struct kvshm_ctr ctr[KVSHM_LEDGER_ROWS];

	/*
	 * Access ring: the client stores entries at ring[head % KVSHM_RING]
	 * (relaxed) and then bumps head (release), a hit run deepest block
	 * first; the daemon reads head (acquire) and the last KVSHM_RING
	 * entries, in order, into its eviction policy, every tick and
	 * before each ALLOC or PUBLISH of the client. An entry is a page
	 * (bit 31 clear: page numbers are below KVSHM_LOC_SLOT), or, after
	 * one, a run (KVSHM_RING_RUN | count, and KVSHM_RING_UP or not):
	 * count more pages, each one above (UP) or below the one before,
	 * so that a request's run of neighbouring pages costs two entries,
	 * not one per block. Overwritten entries (a full ring between two
	 * drains) are lost, which only makes the policy's order less
	 * precise; a run whose page was overwritten is skipped, and a drain
	 * takes at most KVSHM_RING_DRAIN pages, the newest. The threads of a
	 * handle write it with no locked instruction: two lookups at once
	 * may overwrite each other's entries (a run then perhaps after the
	 * other's page), which also only blurs the order. Any value is
	 * untrusted: the daemon ignores pages out of range or not cached,
	 * and runs longer than KVSHM_RING_RUN_MAX.
	 */
	_Atomic uint64_t ring_head;
	uint8_t pad2[KVSHM_CACHELINE - 8];
	_Atomic uint32_t ring[KVSHM_RING];

	/*
	 * Hit ring, for the daemon's top-prefix sketch: one record per lookup
	 * that hit, naming the chain's root block key. The client fills
	 * hits[head % KVSHM_HIT_RING] with relaxed stores, then bumps
	 * hit_head (release). The daemon copies what it has not seen and
	 * re-reads hit_head: records the client may have overwritten during
	 * the copy are dropped. Lossy by design, like the access ring.
	 */
	_Atomic uint64_t hit_head;
	uint8_t pad3[KVSHM_CACHELINE - 8];
	struct kvshm_hit {
		uint64_t key_lo;
		uint64_t key_hi;
		uint64_t tokens;
		char label[KVSHM_LABEL];
	} hits[KVSHM_HIT_RING];

	/*
	 * Single-flight waits (kvc_wait), client-written with relaxed atomic
	 * adds (a wait is no hot path: one row); the daemon folds them into
	 * the segment's stats.
	 * Each wait that slept ends as served, timed out or lost.
	 */
	_Atomic uint64_t waits;
	_Atomic uint64_t wait_served;	/* the writer published */
	_Atomic uint64_t wait_timeouts;	/* the caller's timeout ran out */
	_Atomic uint64_t wait_lost;	/* the writer released or died */
	_Atomic uint64_t wait_tokens;	/* tokens pinned thanks to waiting */
	uint8_t pad4[KVSHM_CACHELINE - 40];

	/*
	 * Hazard slots: 0 = empty, else ((page + 1) << 32) | gen. Written by
	 * the client with seq_cst, read by the daemon with seq_cst.
	 */
	_Atomic uint64_t slot[];
};

_Static_assert(offsetof(struct kvshm_ledger, ctr) == KVSHM_CACHELINE, "ledger");
_Static_assert(offsetof(struct kvshm_ledger, ring_head) == (1 + KVSHM_LEDGER_ROWS) * KVSHM_CACHELINE,
	       "ledger");
_Static_assert(sizeof(struct kvshm_hit) == 48, "hit record");
_Static_assert(offsetof(struct kvshm_ledger, waits) % KVSHM_CACHELINE == 0, "ledger");
_Static_assert(sizeof(struct kvshm_ledger) % KVSHM_CACHELINE == 0, "ledger");

static inline uint64_t kvshm_slot_pack(uint32_t page, uint32_t gen)
{
	return ((uint64_t)page + 1) << 32 | gen;
}

/* Page named by a non-empty slot value; UINT32_MAX for an empty one. */
static inline uint32_t kvshm_slot_page(uint64_t v)
{
	return v ? (uint32_t)(v >> 32) - 1 : UINT32_MAX;
}

/* The counters of ledger l: its rows added up (relaxed loads). */
void kvshm_ledger_sum(const struct kvshm_ledger *l, struct kvshm_ledger_counts *out);

/* Bytes of a ledger with nslots slots, rounded up to a 4 KiB page. */
uint64_t kvshm_ledger_bytes(uint32_t nslots);

/* Daemon: fill the header of a fresh zeroed ledger. */
void kvshm_ledger_init(struct kvshm_ledger *l, uint32_t nslots,
		       uint32_t client_id, uint32_t ns_id);

/* Check a mapped ledger of `bytes` (magic, version, nslots fit). */
int kvshm_ledger_validate(const struct kvshm_ledger *l, uint64_t bytes);

/*
 * Client: pin `page` expected at generation `gen` through slot `i`.
 * Returns true when the page is READY at `gen` after the slot is visible;
 * false (slot cleared) otherwise. The caller owns slot i and has checked
 * page < n_pages. Inline: the client's hot path.
 */
static inline bool kvshm_ledger_pin(struct kvshm_ledger *l, uint32_t i,
				    const struct kvshm_header *h, uint32_t page,
				    uint32_t gen)
{
	const struct kvshm_page *p = &kvshm_pages(h)[page];

	atomic_store_explicit(&l->slot[i], kvshm_slot_pack(page, gen), memory_order_seq_cst);
	if (atomic_load_explicit(&p->state, memory_order_seq_cst) == KVSHM_PAGE_READY &&
	    atomic_load_explicit(&p->gen, memory_order_seq_cst) == gen)
		return true;
	atomic_store_explicit(&l->slot[i], 0, memory_order_release);
	return false;
}

/* Client: record a slot for a page that is WRITING and owned by us. */
static inline void kvshm_ledger_hold(struct kvshm_ledger *l, uint32_t i,
				     uint32_t page, uint32_t gen)
{
	atomic_store_explicit(&l->slot[i], kvshm_slot_pack(page, gen), memory_order_seq_cst);
}

/* Client: clear slot i (release). */
static inline void kvshm_ledger_unpin(struct kvshm_ledger *l, uint32_t i)
{
	atomic_store_explicit(&l->slot[i], 0, memory_order_release);
}

/* Client: record a lookup that hit `tokens` tokens under root `key`. */
static inline void kvshm_ledger_hit(struct kvshm_ledger *l, struct kvshm_key key,
				    uint64_t tokens, const char *label)
{
	uint64_t hd = atomic_load_explicit(&l->hit_head, memory_order_relaxed);
	struct kvshm_hit *r = &l->hits[hd & (KVSHM_HIT_RING - 1)];
	size_t i;

	__atomic_store_n(&r->key_lo, key.lo, __ATOMIC_RELAXED);
	__atomic_store_n(&r->key_hi, key.hi, __ATOMIC_RELAXED);
	__atomic_store_n(&r->tokens, tokens, __ATOMIC_RELAXED);
	/* Up to and with the NUL: readers stop there (daemon/core/top.c),
	 * so a label-less hit is one store, not KVSHM_LABEL. */
	for (i = 0; i < KVSHM_LABEL; i++) {
		char ch = label ? label[i] : 0;

		__atomic_store_n(&r->label[i], ch, __ATOMIC_RELAXED);
		if (!ch)
			break;
	}
	atomic_store_explicit(&l->hit_head, hd + 1, memory_order_release);
}

/* Client: note an access to `page` in the ring. */
static inline void kvshm_ledger_touch(struct kvshm_ledger *l, uint32_t page)
{
	uint64_t hd = atomic_load_explicit(&l->ring_head, memory_order_relaxed);

	atomic_store_explicit(&l->ring[hd & (KVSHM_RING - 1)], page, memory_order_relaxed);
	atomic_store_explicit(&l->ring_head, hd + 1, memory_order_release);
}

/*
 * Client: note accesses to a hit run pages[0..n) in the ring, one head
 * store, the deepest block first: the daemon's eviction policy then holds
 * the run's tail as older than its head and evicts it first (a block is
 * only reachable through its parents). Neighbouring pages go as runs: a
 * page, then one entry for up to KVSHM_RING_RUN_MAX more.
 */
static inline void kvshm_ledger_touch_run(struct kvshm_ledger *l, const uint32_t *pages,
					  size_t n)
{
	uint64_t hd = atomic_load_explicit(&l->ring_head, memory_order_relaxed);
	size_t i = n;

	if (!n)
		return;
	while (i) {
		uint32_t p = pages[--i], run = 0;
		int32_t d = i ? (int32_t)(pages[i - 1] - p) : 0;

		atomic_store_explicit(&l->ring[hd++ & (KVSHM_RING - 1)], p, memory_order_relaxed);
		if (d != 1 && d != -1)
			continue;
		while (i && run < KVSHM_RING_RUN_MAX && pages[i - 1] == p + (uint32_t)d) {
			p = pages[--i];
			run++;
		}
		atomic_store_explicit(&l->ring[hd++ & (KVSHM_RING - 1)],
				      KVSHM_RING_RUN | (d > 0 ? KVSHM_RING_UP : 0) | run,
				      memory_order_relaxed);
	}
	atomic_store_explicit(&l->ring_head, hd, memory_order_release);
}

/*
 * Client: kvshm_ledger_touch_run for a run known to be the pages first,
 * first + stride, ..., first + (n - 1) * stride (stride +1 or -1), the
 * same entries without reading the pages back.
 */
static inline void kvshm_ledger_touch_seq(struct kvshm_ledger *l, uint32_t first, size_t n,
					  int32_t stride)
{
	uint64_t hd = atomic_load_explicit(&l->ring_head, memory_order_relaxed);
	uint32_t p = first + (uint32_t)(int32_t)(n - 1) * (uint32_t)stride, run;

	while (n) {
		atomic_store_explicit(&l->ring[hd++ & (KVSHM_RING - 1)], p, memory_order_relaxed);
		n--;
		run = n < KVSHM_RING_RUN_MAX ? (uint32_t)n : KVSHM_RING_RUN_MAX;
		if (!run)
			break;
		atomic_store_explicit(&l->ring[hd++ & (KVSHM_RING - 1)],
				      KVSHM_RING_RUN | (stride < 0 ? KVSHM_RING_UP : 0) | run,
				      memory_order_relaxed);
		n -= run;
		p -= (run + 1) * (uint32_t)stride;
	}
	atomic_store_explicit(&l->ring_head, hd, memory_order_release);
}

/*
 * Daemon: for every one of the first `nslots` slots naming a page in state
 * EVICTING, call back_off(page, arg). Page numbers out of range are
 * ignored. `nslots` is the daemon's own record of the ledger's size, never
 * l->nslots: the header lives in memory the client can write.
 */
void kvshm_ledger_scan(const struct kvshm_ledger *l, uint32_t nslots,
		       const struct kvshm_header *h,
		       void (*back_off)(uint32_t page, void *arg), void *arg);

/*
 * The heavy side of the pin handshake (membarrier(2)), each 0 or -errno.
 * kvshm_barrier_query: 0 when this kernel has MEMBARRIER_CMD_GLOBAL_-
 * EXPEDITED and its registration (the daemon then sets KVSHM_F_MEMBARRIER).
 * kvshm_barrier_register: the calling process's threads take part from now
 * on (a client, at kvc_open). kvshm_barrier_global: a full barrier on every
 * running thread of every registered process (the daemon, before a scan).
 */
int kvshm_barrier_query(void);
int kvshm_barrier_register(void);
int kvshm_barrier_global(void);

/* Daemon: pins among the first `nslots` slots on pages in range. */
uint64_t kvshm_ledger_count(const struct kvshm_ledger *l, uint32_t nslots,
			    const struct kvshm_header *h);

#endif
