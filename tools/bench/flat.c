// SPDX-License-Identifier: MIT
/*
 * flat.c - kvbench's flat mode: is a verified lookup as fast with millions
 * of blocks cached as with a few thousand?
 *
 * It times the walk every kvc_lookup runs (shm/prefix.h: index probe,
 * parent-key and token verification, pin through the ledger, with no
 * fence, as a client registered for the daemon's membarrier pins; with
 * KVBENCH_FLAT_FENCE=1 one fence per run of pins, as a client that fences)
 * on segments built here in shared anonymous memory, laid out by
 * kvshm_layout like the daemon's, holding N cached blocks (4k, 64k, 1M,
 * 4M; --quick: 4k and 256k): N / 256 prompts of 256 blocks of 16 tokens,
 * READY pages with their keys, parents and tokens, indexed. No daemon: a
 * daemon cannot be given 4M pages of 4 KiB on a machine of this size, and
 * the lookup reads only the segment, never the pool.
 *
 * A request is the first B blocks (B = 16 or 256) of a prompt drawn at
 * random, its key chain computed and its first buckets prefetched just
 * before its walk, untimed (what kvc_req_new does before kvc_lookup, as
 * in the lookup mode's `lookup` rows); the walk must pin all B, and the
 * pins are released untimed. Rows: the rate at N cached against the rate at 4k
 * cached, alternating slices of the two in the same run (op
 * "lookup_cached"), and the same for the walk libkvclient had before this
 * mode (one bucket prefetched 8 blocks ahead, no page prefetch, one
 * seq_cst pin per block; op "lookup_cached_old"), to show what the
 * pipeline buys; and the in-process table the lookup mode races
 * (table.h) holding the same blocks against it holding 4k (op
 * "table_cached"): what the same numbers of cached blocks cost a lookup
 * that is one probe per block on this machine, with no index between the
 * key and the block's identity.
 *
 * Knobs for experiments (environment): KVBENCH_FLAT_BLOCKS=N measures N
 * cached blocks only (against 4k); KVBENCH_FLAT_HUGE=1 puts the segments
 * on private anonymous memory advised for transparent huge pages (2 MiB
 * pages where the kernel grants them), to show what the TLB costs: the
 * daemon's segment is a memfd, on 4 KiB pages unless the host's shmem
 * THP setting gives it huge ones. KVBENCH_FLAT_LAYOUT=up (the default:
 * each prompt on a run of pages, as a fresh pool hands them out), down (a
 * run downwards) or scatter (no block next to its parent's, as after much
 * churn in a daemon's free list: the walk cannot guess and finds every
 * block through the index). KVBENCH_FLAT_VS=4k compares page sizes
 * instead (issue #40): each row is N blocks on a memfd in 2 MiB shmem
 * pages, made as the daemon makes its segment (mapped at a 2 MiB
 * boundary, one fault and MADV_COLLAPSE per 2 MiB), against the same N
 * blocks on 4 KiB pages, alternating slices (op "lookup_cached_2m").
 * KVBENCH_FLAT_KEYS=1 times the key chain with
 * the walk (kvshm_walk_keys, which prefetches block 0's bucket and run
 * while it hashes, as kvc_req_new does): what a lookup costs a caller
 * from its tokens, where those prefetches can hide the first misses.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../shm/index.h"
#include "../../shm/key.h"
#include "../../shm/ledger.h"
#include "../../shm/mapping.h"
#include "../../shm/page.h"
#include "../../shm/prefix.h"
#include "../../shm/segment.h"
#include "bench.h"
#include "table.h"

#define FLAT_PROMPT 256		/* blocks per cached prompt */
#define FLAT_BATCH 64		/* requests prepared per timed batch */
#define FLAT_NS 1		/* the namespace id of every page */

struct flat_seg {
	struct kvshm_header *h;
	void *base;
	size_t bytes;
	size_t blocks;		/* cached */
	struct kvshm_ledger *l;
	size_t lbytes;
	struct peer table;	/* the same blocks in the in-process table
				 * (kind FLAT_TABLE), when seg_build was asked */
};

/* What a timed batch runs. */
enum flat_kind {
	FLAT_WALK,	/* kvshm_walk_pin: kvc_lookup's walk */
	FLAT_OLD,	/* walk_old: the walk before issue #27 */
	FLAT_TABLE,	/* peer_lookup on the in-process table (table.h) */
};

_Static_assert(sizeof(struct kvshm_key) == sizeof(struct kvc_key), "one key layout");

static const struct kvshm_key flat_root = { 0x6b76636163686564ull, 0x666c6174ull };

/* The first n tokens of a prompt: cheap (the request's preparation is
 * untimed, but it should not dwarf the walk) and distinct between
 * prompts. */
static void prompt_tokens(uint32_t *t, size_t prompt, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		t[i] = (uint32_t)(prompt << 12 | i);
}

static size_t flat_huge_bytes, flat_huge_asked;	/* KVBENCH_FLAT_VS: made, asked */

/* Shared memory of `bytes`; shmem2m: a memfd in 2 MiB pages where the
 * kernel collapses them (else its 4 KiB pages; the mode's text says how
 * much it collapsed). */
static void *shared_map(size_t bytes, bool shmem2m)
{
	bool huge = getenv("KVBENCH_FLAT_HUGE") != NULL;
	size_t off;
	void *p;
	int fd;

	if (shmem2m) {
		fd = memfd_create("kvbench-flat", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)bytes))
			die("flat: memfd of %zu MiB: %s", bytes >> 20, strerror(errno));
		p = kvshm_map(fd, bytes, PROT_READ | PROT_WRITE);
		close(fd);
		if (!p)
			die("flat: mmap of %zu MiB: %s", bytes >> 20, strerror(errno));
		flat_huge_asked += bytes;
		for (off = 0; off + KVSHM_HUGE_BYTES <= bytes; off += KVSHM_HUGE_BYTES) {
			((volatile char *)p)[off] = 0;
			if (madvise((char *)p + off, KVSHM_HUGE_BYTES, 25 /* MADV_COLLAPSE */))
				break;
			flat_huge_bytes += KVSHM_HUGE_BYTES;
		}
		return p;
	}
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		 (huge ? MAP_PRIVATE : MAP_SHARED) | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("flat: mmap of %zu MiB: %s", bytes >> 20, strerror(errno));
	if (huge)
		madvise(p, bytes, MADV_HUGEPAGE);
	return p;
}

/* A segment of `blocks` READY, indexed pages (blocks a multiple of 256),
 * on 2 MiB shmem pages when shmem2m; with `table`, the same blocks in an
 * in-process table too (at most half full, as a serving process would
 * size it). */
static void seg_build(struct flat_seg *s, size_t blocks, bool shmem2m, bool table)
{
	struct kvshm_geometry geo = {
		.page_bytes = 4096, .n_pages = (uint32_t)blocks, .block_tokens = BT,
		.n_buckets = kvshm_buckets_for(blocks), .max_clients = 4, .max_ns = 4,
		.ledger_slots = FLAT_PROMPT,
	};
	struct kvshm_key keys[FLAT_PROMPT], none = { 0, 0 };
	uint32_t tokens[FLAT_PROMPT * BT];
	struct kvshm_header hd;
	const char *lay = getenv("KVBENCH_FLAT_LAYOUT") ? getenv("KVBENCH_FLAT_LAYOUT") : "up";
	char layout = !strcmp(lay, "scatter") ? 's' : !strcmp(lay, "down") ? 'd' : 'u';
	size_t p, b;

	memset(s, 0, sizeof(*s));
	if (strcmp(lay, "up") && strcmp(lay, "down") && strcmp(lay, "scatter"))
		die("flat: KVBENCH_FLAT_LAYOUT is up, down or scatter, not \"%s\"", lay);
	if (layout == 's' && (blocks & (blocks - 1)))
		die("flat: KVBENCH_FLAT_LAYOUT=scatter needs a power of two of blocks, not %zu", blocks);
	if (kvshm_layout(&hd, &geo))
		die("flat: no segment layout for %zu blocks", blocks);
	s->bytes = hd.segment_bytes;
	s->base = shared_map(s->bytes, shmem2m);
	kvshm_init(s->base, &hd);
	s->h = s->base;
	s->blocks = blocks;
	if (table) {
		uint32_t cap = 1;

		while (cap < 2 * blocks)
			cap <<= 1;
		peer_init(&s->table, cap);
	}
	for (p = 0; p < blocks / FLAT_PROMPT; p++) {
		prompt_tokens(tokens, p, FLAT_PROMPT * BT);
		kvshm_key_chain(flat_root, flat_root, none, tokens, FLAT_PROMPT * BT, BT, keys);
		for (b = 0; b < FLAT_PROMPT; b++) {
			/* Scattered: a bijection (odd multiplier, blocks a
			 * power of two) that puts no block next to its parent. */
			uint32_t page = layout == 's' ? (uint32_t)((p * FLAT_PROMPT + b) * 0x9E3779B1ull %
								   blocks) :
					layout == 'd' ? (uint32_t)(p * FLAT_PROMPT + FLAT_PROMPT - 1 - b) :
							(uint32_t)(p * FLAT_PROMPT + b);
			struct kvshm_page *pg = &kvshm_pages(s->h)[page];

			pg->ns_id = FLAT_NS;
			pg->key = keys[b];
			pg->parent = b ? keys[b - 1] : flat_root;
			memcpy(kvshm_tokens(s->h, page), tokens + b * BT, BT * sizeof(uint32_t));
			atomic_store(&pg->gen, 1);
			atomic_store(&pg->state, KVSHM_PAGE_READY);
			if (kvshm_index_insert(s->h, keys[b], page))
				die("flat: index insert failed at %zu blocks", (size_t)page);
			if (table)
				peer_insert(&s->table, (struct kvc_key){ keys[b].lo, keys[b].hi },
					    b ? (struct kvc_key){ keys[b - 1].lo, keys[b - 1].hi }
					      : (struct kvc_key){ 0, 0 },	/* peer_lookup's root */
					    tokens + b * BT, page);
		}
	}
	s->lbytes = kvshm_ledger_bytes(FLAT_PROMPT);
	s->l = shared_map(s->lbytes, false);
	kvshm_ledger_init(s->l, FLAT_PROMPT, 1, FLAT_NS);
}

static void seg_free(struct flat_seg *s)
{
	munmap(s->base, s->bytes);
	munmap(s->l, s->lbytes);
	if (s->table.e)
		peer_free(&s->table);
	memset(s, 0, sizeof(*s));
}

/* The walk libkvclient ran before shm/prefix.h, kept as the baseline. */
static size_t walk_old(const struct kvshm_header *h, struct kvshm_ledger *l,
		       const struct kvshm_walk *w)
{
	struct kvshm_key parent = w->parent;
	size_t i, k;

	for (k = 0; k < w->n && k < 8; k++)
		kvshm_index_prefetch(h, w->keys[k]);
	for (i = 0; i < w->n; i++) {
		uint32_t page, gen;

		if (i + 8 < w->n)
			kvshm_index_prefetch(h, w->keys[i + 8]);
		page = kvshm_index_find(h, w->keys[i]);
		if (page == UINT32_MAX ||
		    !kvshm_page_verify(h, page, w->ns_id, w->keys[i], parent,
				       w->tokens + i * h->geo.block_tokens, &gen) ||
		    !kvshm_ledger_pin(l, w->slot[i], h, page, gen))
			break;
		kvshm_ledger_touch(l, page);
		w->page[i] = page;
		w->gen[i] = gen;
		parent = w->keys[i];
	}
	return i;
}

struct flat_batch {
	struct kvshm_key keys[FLAT_BATCH][FLAT_PROMPT];
	uint32_t tokens[FLAT_BATCH][FLAT_PROMPT * BT];
	uint32_t page[FLAT_PROMPT], gen[FLAT_PROMPT], slot[FLAT_PROMPT];
	uint64_t rng;
};

static bool keys_timed;	/* KVBENCH_FLAT_KEYS */
static bool walk_fence;	/* KVBENCH_FLAT_FENCE */

/* Request r's key chain: for the walks with the prefetches kvc_req_new
 * makes meanwhile, for the table as a serving process computes it. */
static void request_keys(struct flat_batch *fb, size_t r, const struct flat_seg *s,
			 size_t blocks, enum flat_kind kind)
{
	struct kvshm_key none = { 0, 0 };

	if (kind == FLAT_TABLE)
		kvshm_key_chain(flat_root, flat_root, none, fb->tokens[r], blocks * BT, BT,
				fb->keys[r]);
	else
		kvshm_walk_keys(s->h, flat_root, none, fb->tokens[r], NULL, BT, blocks,
				fb->keys[r]);
}

/* Prepare request r of the batch: a random prompt of s and, unless the
 * key chain is timed with the lookup, its key chain (untimed). */
static void request_fill(struct flat_batch *fb, size_t r, const struct flat_seg *s,
			 size_t blocks, enum flat_kind kind)
{
	size_t p = mix64(++fb->rng) % (s->blocks / FLAT_PROMPT);

	prompt_tokens(fb->tokens[r], p, blocks * BT);
	if (!keys_timed)
		request_keys(fb, r, s, blocks, kind);
}

/* One timed batch on s; returns its ns. */
static uint64_t batch_run(struct flat_batch *fb, struct flat_seg *s, size_t blocks,
			  enum flat_kind kind)
{
	bool missed;
	uint64_t t0, ns = 0;
	size_t r, got, k;

	for (r = 0; r < FLAT_BATCH; r++) {
		struct kvshm_walk w = {
			.keys = fb->keys[r], .tokens = fb->tokens[r], .slot = fb->slot,
			.page = fb->page, .gen = fb->gen, .n = blocks, .ns_id = FLAT_NS,
			.parent = flat_root, .fence = walk_fence, .ahead = blocks > 1,
		};

		request_fill(fb, r, s, blocks, kind);
		t0 = now_ns();
		if (keys_timed)
			request_keys(fb, r, s, blocks, kind);
		got = kind == FLAT_TABLE ? peer_lookup(&s->table, (const struct kvc_key *)fb->keys[r],
						       fb->tokens[r], blocks, fb->page)
		      : kind == FLAT_OLD ? walk_old(s->h, s->l, &w)
					 : kvshm_walk_pin(s->h, s->l, &w, &missed);
		ns += now_ns() - t0;
		if (got != blocks)
			die("flat: a lookup of %zu cached blocks found %zu", blocks, got);
		for (k = 0; kind != FLAT_TABLE && k < blocks; k++)	/* kvc_req_free's unpin, untimed */
			kvshm_ledger_unpin(s->l, fb->slot[k]);
	}
	return ns;
}

/* Blocks per second over about ns of batches. */
static double slice_rate(struct flat_batch *fb, struct flat_seg *s, size_t blocks,
			 enum flat_kind kind, uint64_t ns)
{
	uint64_t t = 0, n = 0;

	do {
		t += batch_run(fb, s, blocks, kind);
		n += FLAT_BATCH * blocks;
	} while (t < ns);
	return (double)n * 1e9 / (double)t;
}

/* The median rates of walks on x and on y, in ROUNDS alternating slices
 * after a warm-up of each. */
static void alternate(struct flat_batch *fb, struct flat_seg *x, struct flat_seg *y,
		      size_t blocks, enum flat_kind kind, uint64_t slice, double *rx, double *ry)
{
	double a[ROUNDS], b[ROUNDS];
	int r;

	slice_rate(fb, x, blocks, kind, slice / 4);	/* warm */
	slice_rate(fb, y, blocks, kind, slice / 4);
	for (r = 0; r < ROUNDS; r++) {
		a[r] = slice_rate(fb, x, blocks, kind, slice);
		b[r] = slice_rate(fb, y, blocks, kind, slice);
	}
	*rx = median(a, ROUNDS);
	*ry = median(b, ROUNDS);
}

/* KVBENCH_FLAT_VS=4k: N blocks on 2 MiB pages against the same on 4 KiB. */
static void flat_vs_4k(struct flat_batch *fb, const size_t *sizes, size_t nsizes, uint64_t slice)
{
	static const size_t lens[] = { 16, 256 };
	struct flat_seg small, huge;
	size_t i, b;

	for (i = 1; i < nsizes; i++) {
		seg_build(&small, sizes[i], false, false);
		seg_build(&huge, sizes[i], true, false);
		for (b = 0; b < NELEM(lens); b++) {
			double rh, rs;

			alternate(fb, &huge, &small, lens[b], FLAT_WALK, slice, &rh, &rs);
			add_row(&(struct row){ "flat", "lookup_cached_2m", 1, sizes[i], 4096, NULL,
					       "blocks/s",
					       lens[b] == 16 ? "4 KiB pages, 16 blk" : "4 KiB pages, 256 blk",
					       rh, rs, NULL });
		}
		seg_free(&huge);
		seg_free(&small);
	}
}

void mode_flat(void)
{
	static const size_t full[] = { 4096, 65536, 1 << 20, 4 << 20 };
	static const size_t quick[] = { 4096, 256 << 10 };
	static const size_t lens[] = { 16, 256 };
	const size_t *sizes = opt.quick ? quick : full;
	size_t nsizes = opt.quick ? NELEM(quick) : NELEM(full), i, b, k;
	static size_t one[2] = { 4096, 0 };

	keys_timed = getenv("KVBENCH_FLAT_KEYS") != NULL;
	walk_fence = getenv("KVBENCH_FLAT_FENCE") != NULL;
	if (getenv("KVBENCH_FLAT_BLOCKS")) {
		one[1] = strtoull(getenv("KVBENCH_FLAT_BLOCKS"), NULL, 0);
		sizes = one;
		nsizes = 2;
	}
	struct flat_batch *fb = xmalloc(sizeof(*fb));
	struct flat_seg small, big;
	uint64_t slice = (uint64_t)(opt.seconds * 1e9 / (4.0 * ROUNDS));

	for (k = 0; k < FLAT_PROMPT; k++)
		fb->slot[k] = (uint32_t)k;
	if (getenv("KVBENCH_FLAT_VS")) {
		if (strcmp(getenv("KVBENCH_FLAT_VS"), "4k"))
			die("flat: KVBENCH_FLAT_VS is 4k, not \"%s\"", getenv("KVBENCH_FLAT_VS"));
		flat_vs_4k(fb, sizes, nsizes, slice);
		free(fb);
		snprintf(mode_text, sizeof(mode_text),
			 "flat: rows are blocks cached (the size column) on 2 MiB shmem pages (%zu of %zu MiB collapsed), each against the same on 4 KiB pages\n",
			 flat_huge_bytes >> 20, flat_huge_asked >> 20);
		return;
	}
	seg_build(&small, sizes[0], false, true);
	for (i = 1; i < nsizes; i++) {
		seg_build(&big, sizes[i], false, true);
		for (b = 0; b < NELEM(lens); b++) {
			for (k = FLAT_WALK; k <= FLAT_TABLE; k++) {
				static const char *const op[] = {
					[FLAT_WALK] = "lookup_cached", [FLAT_OLD] = "lookup_cached_old",
					[FLAT_TABLE] = "table_cached",
				};
				double rb, rs;

				alternate(fb, &big, &small, lens[b], (enum flat_kind)k, slice, &rb, &rs);
				add_row(&(struct row){ "flat", op[k],
						       1, sizes[i], 4096, NULL, "blocks/s",
						       lens[b] == 16 ? "4k cached, 16 blk"
								     : "4k cached, 256 blk",
						       rb, rs, NULL });
			}
		}
		seg_free(&big);
	}
	seg_free(&small);
	free(fb);
	snprintf(mode_text, sizeof(mode_text),
		 "flat: rows are blocks cached (the size column); each against the same walk with 4096 cached\n");
}
