/* SPDX-License-Identifier: MIT */
/*
 * client_int.h - libkvclient internals shared by its .c files (private).
 */
#ifndef KVC_CLIENT_INT_H
#define KVC_CLIENT_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "kvclient.h"
#include "../shm/ledger.h"
#include "../shm/proto.h"
#include "../shm/segment.h"

struct kvc {
	int fd;				/* socket; -1 once the daemon is gone */
	/* Set (release) when the connection ends for any reason; lookups
	 * check it (acquire) so a dead handle returns -ENOTCONN, not hits. */
	atomic_bool dead;
	unsigned fork_gen;		/* kvc_fork_gen when opened */
	pthread_mutex_t io_lock;	/* one round trip at a time */
	uint32_t seq;

	const struct kvshm_header *seg;	/* read-only mapping */
	uint64_t seg_bytes;
	/* The segment's geometry as a walk reads it (kvshm_view), made once
	 * when it is mapped: fixed for the segment's life. */
	struct kvshm_view view;
	uint8_t *pool;			/* read-write mapping of the pool */
	uint64_t pool_bytes;
	struct kvshm_ledger *ledger;	/* our own, read-write */
	uint64_t ledger_bytes;

	uint32_t client_id;
	uint32_t ns_id;
	uint32_t n_pages;
	uint32_t bt;			/* block tokens */
	bool engine_keys;		/* KVC_MODEL_ENGINE_KEYS: kvc_req_new_keys only */
	bool no_insert;			/* KVC_OPEN_NO_INSERT: kvc_alloc says -EROFS */
	bool pin_fence;			/* lookups fence each run of pins: the
					 * daemon's membarrier does not cover
					 * this process (ledger.h) */
	uint64_t slot_bytes;		/* pool page (slot) bytes */
	uint64_t page_bytes;		/* this namespace's page bytes */
	struct kvshm_key root;		/* H(namespace, salt) */

	pthread_mutex_t slot_lock;	/* guards the free-slot stack, rows_used */
	uint32_t *free_slots;
	uint32_t n_free_slots;
	uint32_t nslots;
	/* Threads' shares (slots.c): the serial that names this handle in
	 * threads' kvci_tls (never 0 once open, never reused), the threads'
	 * records and the next live handle (kvci_thr_lock), the counter rows
	 * held by threads (bit k: row k; slot_lock) and how many slots a
	 * thread may cache. */
	uint64_t serial;
	struct kvci_thr *thr;
	struct kvc *live_next;
	uint32_t rows_used;
	uint32_t tcache;

	/* Page kernels (gpu.c): the model's layers, whether its page is one
	 * latent (MLA) per token and layer, the bytes of one block of one
	 * layer's K or V (or latent) in a page (every head) and of one head's
	 * vector; this rank's heads (kvproto_part: which it moves, whether it
	 * writes them, its slice); the pool's kind and, for a cuda pool, its
	 * import (pool above is then a device address). */
	uint32_t layers;
	bool latent;
	uint32_t kv_heads;		/* the model's */
	struct kvproto_part part;
	uint32_t pool_kind;		/* enum kvshm_pool_kind */
	uint64_t half;
	uint64_t head_bytes;
	struct kvc_gpu *gpu;
	/* Host pool, GPU engines (hostmap.c): made once, by the first
	 * kvc_gpu_prepare, and published (release) for the copies that read
	 * it without a lock (acquire); freed by kvc_close. */
	struct kvc_hostmap *_Atomic hostmap;

	/* Alloc-ahead (KVC_OPEN_ALLOC_AHEAD; ahead_cap 0 when off): after a
	 * publish an ALLOC is sent and not waited for (ahead_seq); its reply
	 * is read by the next round trip, and its pages wait in ahead[]
	 * (held in ahead_slot[] of our ledger) for the next kvc_alloc. All
	 * under io_lock. */
	uint32_t ahead_cap, n_ahead, ahead_seq;
	struct kvproto_pg *ahead;
	uint32_t *ahead_slot;
};

enum kvc_block_state {
	KVC_B_NONE = 0,		/* no page */
	KVC_B_PINNED = 1,	/* READY page, pinned through slot */
	KVC_B_WRITING = 2,	/* granted by the daemon, not yet published */
};

struct kvc_req {
	kvc_t *c;
	size_t n;		/* full blocks */
	size_t n_tokens;	/* the whole prompt, partial block included */
	char label[KVSHM_LABEL];	/* for the top-prefix list; may be empty */
	int stage;		/* 0 new, 1 looked up, 2 allocated, 3 published */
	uint32_t hits;
	size_t t1;		/* spilled run after the hits, not yet counted */
	size_t t2;		/* then blocks that may be remote, not yet counted */
	size_t t3;		/* or the run in flight after the hits, not yet counted */
	bool single;		/* kvc_wait asked for single flight (flight_wait.c) */
	/* Set by the request's first kvc_wait: no wait of this request
	 * sleeps past wait_until (CLOCK_MONOTONIC), so whatever loop the
	 * caller writes around kvc_wait and kvc_alloc, its waiting ends. */
	bool wait_armed;
	struct timespec wait_until;
	bool flat;		/* engine keys: every block's parent is the root */
	bool ahead;		/* kvc_req_new prefetched block 0's run (prefix.h) */
	int short_err;		/* why kvc_alloc granted fewer than asked, or 0 */
	char *why;		/* the last refusal's text (kvc_req_message), or NULL */
	/* What the ledger counters hold for this request so far: hit
	 * blocks and missed blocks (kvci_count brings them up to date). */
	uint32_t counted_hits;
	size_t counted_misses;
	struct kvshm_key *keys;
	struct kvshm_key extra;	/* digest of the extra keys (zero: none) */
	uint32_t *tokens;	/* n * bt */
	uint32_t *page;
	uint32_t *gen;
	uint32_t *slot;		/* ledger slot, UINT32_MAX when none */
	uint8_t *state;
};

/*
 * ThreadSanitizer cannot see that a page written by one thread and
 * published reaches a reader thread of the same process through another
 * process (the daemon makes it READY in shared memory). In TSan builds the
 * publisher releases and the pinning reader acquires on the page's
 * address, which is the happens-before the daemon provides; elsewhere
 * these are nothing.
 */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define KVC_TSAN_RELEASE(p) __tsan_release(p)
#define KVC_TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define KVC_TSAN_RELEASE(p) ((void)0)
#define KVC_TSAN_ACQUIRE(p) ((void)0)
#endif

/* Bumped in every child after fork(): a handle opened before the fork is
 * the parent's (its ledger slots, its socket) and refuses to work. */
extern atomic_uint kvc_fork_gen;

/* 0, -ECHILD (handle inherited across fork) or -ENOTCONN (dead). */
static inline int kvc_usable(const kvc_t *c)
{
	if (c->fork_gen != atomic_load_explicit(&kvc_fork_gen, memory_order_relaxed))
		return -ECHILD;
	if (atomic_load_explicit(&c->dead, memory_order_acquire))
		return -ENOTCONN;
	return 0;
}

/* The connection is over (io_lock held): close the socket, mark the
 * handle dead; later calls return -ENOTCONN. */
void kvci_mark_dead(kvc_t *c);
/* kvc_wait sleeps at most this long before it checks that the daemon
 * lives (flight_wait.c). */
#define KVCI_WAIT_SLICE_MS 25

/* Round trip: send (type, payload), receive the reply into a malloc'd
 * buffer. Returns 0, or -errno; an ERROR reply returns its err. */
int kvc_rpc(kvc_t *c, uint16_t type, const void *payload, uint32_t len,
	    uint16_t want, void **reply, uint32_t *reply_len);
/* The same, with the text of an ERROR reply copied to why (NUL-terminated,
 * cut to why_len; empty when there was none). */
int kvc_rpc_why(kvc_t *c, uint16_t type, const void *payload, uint32_t len,
		uint16_t want, void **reply, uint32_t *reply_len, char *why, size_t why_len);
/* Keep `msg` as the request's message (kvc_req_message); rc is returned. */
int kvci_req_why(struct kvc_req *r, int rc, const char *msg);
/* Longest message a request keeps, NUL included. */
#define KVCI_WHY 400

/* ---------------------------------------------------------- slots.c */

#define KVCI_TCACHE 64	/* free slots one thread keeps at most */
#define KVCI_TLS 4	/* handles a thread keeps a record for at once */

/* One thread's share of one handle (slots.c). Written by that thread
 * alone, but for kvc_close, which frees it. */
struct kvci_thr {
	struct kvci_thr *next;	/* in the handle's list */
	uint32_t row;		/* ledger counter row of this thread alone; 0: shared */
	uint32_t n;		/* slots cached */
	uint32_t slot[KVCI_TCACHE];
};

struct kvci_tls {
	uint64_t serial;	/* the handle's; 0: empty */
	struct kvci_thr *t;
};
/* Initial-exec: one load off the thread pointer, no __tls_get_addr call
 * on every lookup. 64 bytes of the static TLS that glibc keeps for
 * libraries loaded with dlopen (Python's ctypes). */
extern __thread struct kvci_tls kvci_tls[KVCI_TLS] __attribute__((tls_model("initial-exec")));

/* kvc_open: a serial, the thread cache's size, the live list. kvc_close:
 * off the live list, every thread's record freed. */
void kvci_slots_init(kvc_t *c);
void kvci_slots_close(kvc_t *c);

/* The calling thread's record for c, made on first use; NULL when none
 * could be had (out of memory): callers then use the stack and row 0. */
struct kvci_thr *kvci_thr_find(kvc_t *c);
static inline struct kvci_thr *kvci_thr(kvc_t *c)
{
	if (__builtin_expect(kvci_tls[0].serial == c->serial, 1))
		return kvci_tls[0].t;
	return kvci_thr_find(c);
}

/* Take up to n free slots into out[] (returns how many): t's cache first
 * (no lock), then the stack; give n back: into t's cache while it has
 * room, the rest to the stack. t may be NULL. */
uint32_t kvci_slots_take_slow(kvc_t *c, struct kvci_thr *t, uint32_t *out, uint32_t n);
void kvci_slots_give_slow(kvc_t *c, struct kvci_thr *t, const uint32_t *s, uint32_t n);
static inline uint32_t kvci_slots_take(kvc_t *c, struct kvci_thr *t, uint32_t *out, uint32_t n)
{
	uint32_t k;

	if (!t || t->n < n)
		return kvci_slots_take_slow(c, t, out, n);
	for (k = 0; k < n; k++)
		out[k] = t->slot[--t->n];
	return n;
}
static inline void kvci_slots_give(kvc_t *c, struct kvci_thr *t, const uint32_t *s, uint32_t n)
{
	uint32_t k;

	if (!t || c->tcache - t->n < n) {
		kvci_slots_give_slow(c, t, s, n);
		return;
	}
	for (k = 0; k < n; k++)
		t->slot[t->n++] = s[k];
}
/* Free slots this thread could take now: the stack's and t's. */
uint32_t kvci_slots_free(kvc_t *c, const struct kvci_thr *t);

/* Where a thread's counts go: its own ledger row (plain relaxed load and
 * store) or, without one, the shared row 0 (atomic adds). */
struct kvci_row {
	struct kvshm_ctr *p;
	bool own;
};

static inline struct kvci_row kvci_row(kvc_t *c, const struct kvci_thr *t)
{
	struct kvci_row w = { &c->ledger->ctr[t ? t->row : 0], t && t->row };

	return w;
}

/* Add v to a counter of a row the thread owns: no other writer. */
static inline void kvci_own_add(_Atomic uint64_t *p, uint64_t v)
{
	atomic_store_explicit(p, atomic_load_explicit(p, memory_order_relaxed) + v,
			      memory_order_relaxed);
}

static inline void kvci_row_add(struct kvci_row w, size_t off, uint64_t v)
{
	_Atomic uint64_t *p = (_Atomic uint64_t *)((char *)w.p + off);

	if (w.own)
		kvci_own_add(p, v);
	else
		atomic_fetch_add_explicit(p, v, memory_order_relaxed);
}
#define KVCI_ROW_ADD(w, field, v) \
	kvci_row_add((w), offsetof(struct kvshm_ctr, field), (uint64_t)(v))

/* Add v to counter `field` of thread t's row (t may be NULL). */
#define KVCI_COUNT(c, t, field, v) KVCI_ROW_ADD(kvci_row((c), (t)), field, v)

/* Alloc-ahead: take up to `want` pages granted ahead into pg[] and their
 * ledger slots into slot[]; returns how many, or -errno (handle died). */
int kvci_ahead_take(kvc_t *c, uint32_t want, struct kvproto_pg *pg, uint32_t *slot);
/* Alloc-ahead: after a publish of n pages, ask for n more, not waiting. */
void kvci_ahead_ask(kvc_t *c, uint32_t n);

/* Count a spilled run the caller did not restore, and a run in flight it
 * did not wait for, as misses. */
void kvci_settle(struct kvc_req *r);
/* Bring the ledger's hit and miss counters up to date with the request:
 * hits, and every block after them that is not a deferred run (t1, t2, t3). */
void kvci_count(struct kvc_req *r);
/* Pin blocks from `from` on while they are READY pages that verify
 * (lookup.c); returns where it stopped, *missed: on a miss, not on the
 * pin quota. */
size_t kvci_pin_run(struct kvc_req *r, size_t from, bool *missed);
/* flight_scan.c: blocks from `from` on that other clients are writing now
 * (flight_wait.c waits for them). */
size_t kvci_inflight_run(const struct kvc_req *r, size_t from);
/* Is block i in flight (announced by another client)? *owner: whose. */
bool kvci_block_inflight(const struct kvc_req *r, size_t i, uint32_t *owner);
/* Most fds one reply carries (a cuda pool's chunks). */
#define KVC_MAX_FDS ((int)KVPROTO_MAX_CHUNKS)

/*
 * gpu.c: import and map a cuda pool's chunk fds (ownership stays with the
 * caller) and load the kernels; on failure a message goes to errbuf.
 * Returns 0, -ENOTSUP, -ENODEV, -EIO or -ENOMEM. kvc_gpu_detach undoes it
 * (nothing but free in a child after fork).
 */
int kvc_gpu_attach(kvc_t *c, const struct kvproto_pool_r *pr, const int *fds,
		   char *errbuf, size_t errlen);
void kvc_gpu_detach(kvc_t *c);
/* Wait for every kernel of this process's pool context (before BYE). */
void kvc_gpu_quiesce(kvc_t *c);

/* The parent of block i: the block before it, or the root (first block,
 * or any block of an engine-keyed request, whose blocks are not chained). */
static inline struct kvshm_key kvci_parent(const struct kvc_req *r, size_t i)
{
	return i && !r->flat ? r->keys[i - 1] : r->c->root;
}

/* Drop block i's page reference (unpin or forget). */
void kvc_block_release(struct kvc_req *r, size_t i);

#endif
