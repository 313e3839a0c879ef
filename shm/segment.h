/* SPDX-License-Identifier: MIT */
/*
 * segment.h - the layout of the shared segment every kvcached process maps.
 *
 * One memfd holds, in order: the header, the stats, the namespace table, the
 * client rows, the hash index buckets, the page table, the block tokens of
 * every page and the free-page stack. The daemon creates it, fills the
 * header, maps it read-write and then seals it (F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_FUTURE_WRITE) before handing it to anyone, so clients and kvstat can
 * only ever map it read-only. Nothing here is a pointer: every reference is
 * an offset from the segment base or an index into a table, and a reader
 * bounds-checks an index before it follows it.
 *
 * Writers and orderings, field by field, are stated next to each struct.
 * The one rule behind all of them: the daemon's main thread is the only
 * writer of this segment. Clients write only their own ledger (ledger.h).
 *
 * Must never: contain pointers, change a struct without bumping
 * KVSHM_VERSION, or be written by a client.
 */
#ifndef KVSHM_SEGMENT_H
#define KVSHM_SEGMENT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KVSHM_MAGIC   0x4448434143564b31ull	/* "1KVCACHD" little-endian */
#define KVSHM_VERSION 17u	/* 8: remote tier counters; 9: single flight (page
				 * flight, row flight, wait stats); 10: page
				 * entries of one cache line; 11: tick timing;
				 * 12: ledger access ring of 1024, a hit run
				 * written deepest first; 13: page `unlisted`
				 * (lookups find pages without the index);
				 * 14: pool and segment backing stats; 15:
				 * ledger counters in rows, one per thread; 16:
				 * keys carry their root, tenants, pinned
				 * prefixes, the settings a reload changes;
				 * namespace rows without the tensor-parallel
				 * rank (one namespace for every TP size), with
				 * the KV layout; page `slices` and `writers`
				 * (pages written by several ranks); 17: header
				 * flags (KVSHM_F_MEMBARRIER: pins without a
				 * fence), access ring runs (KVSHM_RING_RUN) */

#define KVSHM_CACHELINE 64
#define KVSHM_MAX_BLOCK_TOKENS 1024u
#define KVSHM_MODEL_NAME 64

/* A 128-bit XXH3 key. */
struct kvshm_key {
	uint64_t lo;
	uint64_t hi;
};

/* ---------------------------------------------------------------- header */

/* Geometry fixed at creation. Written once by the daemon before sealing. */
struct kvshm_geometry {
	uint64_t page_bytes;	/* bytes of one pool page (slot) */
	uint64_t pool_bytes;	/* n_pages * page_bytes */
	uint32_t n_pages;	/* pages in the pool (tier 0) */
	uint32_t block_tokens;	/* tokens per block, same for every namespace */
	uint32_t n_buckets;	/* index buckets, a power of two */
	uint32_t max_clients;	/* rows in the client table */
	uint32_t max_ns;	/* rows in the namespace table */
	uint32_t ledger_slots;	/* pin slots in each client's ledger */
	uint32_t n_slots;	/* spill slots (tier 1); 0: no spill tier */
	uint32_t pad;
};

/*
 * Written once by the daemon before the segment is sealed and handed out;
 * read-only for everyone afterwards, except the fields marked otherwise.
 * struct sizes let a reader refuse a segment built by another layout even
 * when the version number was not bumped.
 */
struct kvshm_header {
	uint64_t magic;
	uint32_t version;
	uint32_t header_bytes;		/* sizeof(struct kvshm_header) */
	uint32_t page_entry_bytes;	/* sizeof(struct kvshm_page) */
	uint32_t bucket_bytes;		/* sizeof(struct kvshm_bucket) */
	uint32_t stats_bytes;		/* sizeof(struct kvshm_stats) */
	uint32_t ns_bytes;		/* sizeof(struct kvshm_ns) */
	uint32_t client_row_bytes;	/* sizeof(struct kvshm_client_row) */
	uint32_t ledger_header_bytes;	/* sizeof(struct kvshm_ledger) */
	uint32_t top_bytes;		/* sizeof(struct kvshm_top) */
	uint32_t slot_entry_bytes;	/* sizeof(struct kvshm_slot) */
	struct kvshm_geometry geo;
	uint64_t segment_bytes;
	/* Offsets from the segment base; each is KVSHM_CACHELINE aligned. */
	uint64_t off_stats;
	uint64_t off_ns;
	uint64_t off_clients;
	uint64_t off_buckets;
	uint64_t off_pages;
	uint64_t off_tokens;
	uint64_t off_free;
	uint64_t off_top;
	uint64_t off_slots;
	int32_t daemon_pid;
	uint32_t pool_kind;		/* enum kvshm_pool_kind */
	uint64_t start_time_ns;		/* CLOCK_REALTIME at creation */
	/* Daemon, relaxed store: bumped every tick so readers see it is alive. */
	_Atomic uint64_t heartbeat;
	/* Since layout 6 (after heartbeat, whose offset readers rely on). */
	uint32_t ns_stats_bytes;	/* sizeof(struct kvshm_ns_stats) */
	uint32_t flags;			/* KVSHM_F_*, set before the seal (layout 17) */
	uint64_t off_ns_stats;		/* max_ns entries */
	/* Since layout 16: tenants and pinned prefixes (KVSHM_TENANTS and
	 * KVSHM_PINNED rows). */
	uint32_t tenant_bytes;		/* sizeof(struct kvshm_tenant) */
	uint32_t pinned_bytes;		/* sizeof(struct kvshm_pinned) */
	uint64_t off_tenants;
	uint64_t off_pinned;
};

/*
 * struct kvshm_header.flags. KVSHM_F_MEMBARRIER: the daemon orders the
 * clients' pins against its evictor with membarrier(2) (one
 * MEMBARRIER_CMD_GLOBAL_EXPEDITED before every ledger scan), so a client
 * registered for it may pin with no fence of its own (ledger.h).
 */
#define KVSHM_F_MEMBARRIER 1u

enum kvshm_pool_kind {
	KVSHM_POOL_HOST = 1,
	KVSHM_POOL_CUDA = 2,
};

/* ----------------------------------------------------------------- stats */

/*
 * Daemon-wide counters. Written by the daemon's main thread only, relaxed
 * atomic stores (single writer; readers want a fresh-ish value, not a
 * consistent snapshot). Lookup counters are the sum of what the clients
 * count in their own ledgers, folded in by the daemon on every tick and when
 * a client leaves.
 */
/* Buckets of the tick-duration histogram (struct kvshm_stats). */
#define KVSHM_TICK_BUCKETS 40u

struct kvshm_stats {
	_Atomic uint64_t pages_free;
	_Atomic uint64_t pages_writing;
	_Atomic uint64_t pages_ready;
	_Atomic uint64_t index_entries;
	_Atomic uint64_t clients_attached;
	_Atomic uint64_t clients_total;		/* ever accepted */
	_Atomic uint64_t clients_refused;	/* geometry, peer, protocol */
	_Atomic uint64_t clients_dropped;	/* disconnected for bad messages */
	_Atomic uint64_t allocs;		/* pages handed out WRITING */
	_Atomic uint64_t alloc_short;		/* requests served only in part */
	_Atomic uint64_t publishes;		/* pages that became READY */
	_Atomic uint64_t publish_dups;		/* lost a race to an equal block */
	_Atomic uint64_t publish_refused;	/* same key, other block (collision) */
	_Atomic uint64_t frees;			/* WRITING pages given back */
	_Atomic uint64_t evictions;
	_Atomic uint64_t evict_backoffs;	/* candidates found pinned */
	_Atomic uint64_t reclaimed;		/* WRITING pages of dead clients */
	_Atomic uint64_t lookups;		/* folded in from ledgers */
	_Atomic uint64_t hit_blocks;
	_Atomic uint64_t miss_blocks;
	_Atomic uint64_t pin_failures;
	_Atomic uint64_t lookup_tokens;		/* prompt tokens looked up */
	_Atomic uint64_t hit_tokens;		/* of those, served from cache */
	/* Census, a pass every few ticks (16,384 ledger slots a tick at
	 * most; daemon/core/top.c): distinct READY pages some ledger pins,
	 * and pin slots in use over all clients. */
	_Atomic uint64_t pages_pinned;
	_Atomic uint64_t pins;
	/* Spill tier (tier 1); zero while no spill directory is configured. */
	_Atomic uint64_t spill_enabled;		/* 1 while spill writes go on */
	_Atomic uint64_t pages_spilled;		/* slots holding a block */
	_Atomic uint64_t spills;		/* pages written to a slot */
	_Atomic uint64_t restores;		/* slots read back into pages */
	/* Disconnected clients whose process lives on: their pins still
	 * count until it exits (see registry.c). */
	_Atomic uint64_t clients_lingering;
	/* Spill tier, continued (see daemon/tier/spill.c). */
	_Atomic uint64_t spill_path;		/* enum kvshm_spill_path */
	_Atomic uint64_t spill_slots;		/* slots in the spill area */
	_Atomic uint64_t spill_write_bytes;
	_Atomic uint64_t spill_read_bytes;
	_Atomic uint64_t spill_dropped;		/* bad header or checksum */
	_Atomic uint64_t spill_recycled;	/* coldest slots given up for room */
	_Atomic uint64_t spill_clean;		/* evictions that needed no write */
	_Atomic uint64_t spill_errors;		/* failed writes and reads */
	_Atomic uint64_t restore_misses;	/* asked for, not restored */
	_Atomic uint64_t spill_read_bps;	/* measured restore bandwidth, B/s */
	_Atomic uint64_t spill_warm;		/* slots found at start (warm) */
	/* Trust and limits (see docs/RELIABILITY.md). */
	_Atomic uint64_t clients_timed_out;	/* no HELLO within hello-timeout-ms */
	_Atomic uint64_t fds_passed;		/* descriptors clients sent (closed) */
	_Atomic uint64_t pool_holes;		/* pool pages found punched out */
	_Atomic uint64_t share_refused;		/* ALLOCs over a process's max-share */
	/* CLOCK_REALTIME ns of the last reset of the counters (kvstat
	 * --reset); 0: never reset, they count from start_time_ns. */
	_Atomic uint64_t reset_time_ns;
	/* KV events for cluster routers (daemon/obs/events.c); zero while
	 * --kv-events is not set. */
	_Atomic uint64_t kv_events_enabled;	/* 1 while publishing */
	_Atomic uint64_t kv_events;		/* events in batches sent */
	_Atomic uint64_t kv_event_batches;	/* batches sent */
	_Atomic uint64_t kv_event_drops;	/* batches dropped: queue full */
	_Atomic uint64_t kv_event_replays;	/* replay requests served */
	_Atomic uint64_t kv_event_replay_errors;	/* malformed or refused */
	_Atomic uint64_t kv_events_lossy;	/* 1 while a stalled subscriber
						 * loses batches alone, uncounted */
	/* Remote tier (tier 2, see daemon/tier/remote.c); zero without one.
	 * Clients read remote_servers_up in their lookups: while it is 0 no
	 * lookup offers tier 2. Counters of blocks and bytes: */
	_Atomic uint64_t remote_servers;	/* memcached servers configured */
	_Atomic uint64_t remote_servers_up;	/* of those, answering now */
	_Atomic uint64_t remote_write_mode;	/* enum kvshm_remote_write */
	_Atomic uint64_t remote_puts;		/* blocks written */
	_Atomic uint64_t remote_put_bytes;	/* item bytes written */
	_Atomic uint64_t remote_put_skipped;	/* not written: queue full or server down */
	_Atomic uint64_t remote_put_errors;	/* refused (too large) or failed */
	_Atomic uint64_t remote_fetches;	/* blocks asked for */
	_Atomic uint64_t remote_hits;		/* fetched, verified, placed */
	_Atomic uint64_t remote_misses;		/* not there, server down, or late */
	_Atomic uint64_t remote_dropped;	/* failed verification: never served */
	_Atomic uint64_t remote_stale;		/* items of another format version: misses */
	_Atomic uint64_t remote_timeouts;	/* operations past remote-timeout-ms */
	_Atomic uint64_t remote_fetch_bytes;	/* item bytes fetched */
	_Atomic uint64_t remote_fetch_bps;	/* measured fetch bandwidth, B/s */
	/* Single-flight prefill (daemon/core/flight.c, libclient/flight.c). The
	 * wait counters are folded in from the ledgers like the lookup ones. */
	_Atomic uint64_t flights;		/* pages announced in flight */
	_Atomic uint64_t pages_in_flight;	/* of them, still being written */
	_Atomic uint64_t waits;			/* kvc_wait calls that waited */
	_Atomic uint64_t wait_served;		/* ... the writer published */
	_Atomic uint64_t wait_timeouts;		/* ... the caller's timeout ran out */
	_Atomic uint64_t wait_lost;		/* ... the writer released or died */
	_Atomic uint64_t wait_tokens;		/* prefill tokens saved by waiting */
	/* The daemon's tick (daemon/server.c): ticks run, those that took
	 * longer than tick-ms (the loop fell behind), and how long each
	 * took, as a histogram (kvshm_tick_bucket). Layout 11. */
	_Atomic uint64_t ticks;
	_Atomic uint64_t ticks_slow;
	_Atomic uint64_t tick_hist[KVSHM_TICK_BUCKETS];
	/* The memory under the pool and the segment (daemon/pool/pool_host.c,
	 * daemon/main.c) as the kernel reported it to the daemon once both
	 * were faulted in: written once by its main thread, relaxed stores,
	 * before the socket listens (a client's punch may split a 2 MiB page
	 * later; these do not follow). Layout 14. */
	_Atomic uint64_t pool_backing;		/* enum kvshm_pool_backing */
	_Atomic uint64_t pool_memory_page_bytes;/* 2 MiB (hugetlb, THP), 4 KiB; 0: cuda */
	_Atomic uint64_t pool_huge_bytes;	/* of the pool, in 2 MiB pages */
	_Atomic uint64_t pool_prefault_ns;	/* faulting the pool in took */
	_Atomic uint64_t segment_huge_bytes;	/* of the segment, in 2 MiB pages */
	/* Layout 16. The settings a reload (SIGHUP) may change, as in force
	 * now (daemon/reload.c), and how often that happened. */
	_Atomic uint64_t cfg_low_watermark;	/* percent */
	_Atomic uint64_t cfg_high_watermark;	/* percent */
	_Atomic uint64_t cfg_eviction;		/* enum kvd_eviction: 0 lru, 1 s3fifo, 2 clock */
	_Atomic uint64_t cfg_max_share;		/* percent */
	_Atomic uint64_t cfg_tenant_share;	/* percent */
	_Atomic uint64_t cfg_namespace_share;	/* percent */
	_Atomic uint64_t cfg_log_level;		/* syslog priority: 3 error .. 7 debug */
	_Atomic uint64_t reloads;		/* reloads applied */
	_Atomic uint64_t reload_errors;		/* reloads refused (bad config) */
	_Atomic uint64_t reload_time_ns;	/* CLOCK_REALTIME of the last one */
	/* Tenants and operators (daemon/core/quota.c, daemon/core/pin.c). */
	_Atomic uint64_t tenant_refused;	/* ALLOCs over a tenant's share */
	_Atomic uint64_t namespace_refused;	/* ALLOCs over a namespace's share */
	_Atomic uint64_t no_insert_refused;	/* ALLOCs of no-insert clients */
	_Atomic uint64_t pinned_prefixes;	/* prefixes pinned with a TTL now */
	_Atomic uint64_t pinned_pages;		/* pages they hold resident */
	_Atomic uint64_t pins_expired;		/* TTL pins that ran out */
	_Atomic uint64_t operator_drops;	/* drops of a namespace or tenant */
	/* Pages several tensor-parallel ranks write (daemon/core/slice.c),
	 * layout 16: grants of a slice of a page another rank began, and
	 * pages given up unwhole (a rank released its slice, died, or never
	 * came within slice-timeout-ms). */
	_Atomic uint64_t slice_joins;
	_Atomic uint64_t slice_dropped;
	/* Layout 17: membarrier(2) calls the evictor made before its ledger
	 * scans (KVSHM_F_MEMBARRIER), each an interrupt to every CPU that
	 * runs a client then. */
	_Atomic uint64_t pin_barriers;
};

/* What the pool's memory is made of (kvshm_stats.pool_backing). */
enum kvshm_pool_backing {
	KVSHM_BACKING_NONE = 0,		/* a cuda pool: GPU memory */
	KVSHM_BACKING_SMALL = 1,	/* normal 4 KiB pages */
	KVSHM_BACKING_THP = 2,		/* shmem transparent huge pages: 2 MiB,
					 * pool_huge_bytes of it */
	KVSHM_BACKING_HUGETLB = 3,	/* hugetlb pages, 2 MiB */
};

/*
 * Histogram bucket of a tick that took `ns`: 0 for under 1 us, then two
 * buckets per doubling, bucket b >= 1 holding [2^((b-1)/2), 2^(b/2)) us;
 * the last one holds everything longer (about 0.7 s and up).
 */
static inline uint32_t kvshm_tick_bucket(uint64_t ns)
{
	uint64_t us = ns / 1000;
	uint32_t k, b;

	if (!us)
		return 0;
	if (us >= (1ull << 30))
		return KVSHM_TICK_BUCKETS - 1;
	k = 63u - (uint32_t)__builtin_clzll(us);	/* 2^k <= us < 2^(k+1) */
	/* us >= 2^(k + 1/2) <=> us^2 >= 2^(2k+1) */
	b = 2 * k + 1 + (us * us >= (1ull << (2 * k + 1)));
	return b < KVSHM_TICK_BUCKETS ? b : KVSHM_TICK_BUCKETS - 1;
}

/* Upper end of bucket b in nanoseconds (UINT64_MAX for the last one). */
static inline uint64_t kvshm_tick_bucket_ns(uint32_t b)
{
	if (b + 1 >= KVSHM_TICK_BUCKETS)
		return UINT64_MAX;
	/* 2^(b/2) us, the half powers rounded: 1000 * 2^(b/2). */
	return (b & 1 ? 1414ull : 1000ull) << (b / 2);
}

/* When the remote tier writes a block (remote_write_mode). */
enum kvshm_remote_write {
	KVSHM_REMOTE_OFF = 0,
	KVSHM_REMOTE_PUBLISH = 1,	/* when it is published */
	KVSHM_REMOTE_EVICT = 2,		/* when the pool evicts it */
};

/* How the spill tier does its I/O. */
enum kvshm_spill_path {
	KVSHM_SPILL_OFF = 0,
	KVSHM_SPILL_URING = 1,		/* io_uring, registered buffers */
	KVSHM_SPILL_THREADS = 2,	/* pread/pwrite on worker threads */
	KVSHM_SPILL_DEGRADED = 3,	/* writes stopped after an error */
};

/* ------------------------------------------------------------ namespaces */

/*
 * A namespace's statistics: entry i of this parallel array belongs to
 * namespace row i (the rows themselves are also the spill tier's on-disk
 * identity, so they stay as they are). Writer: the daemon's main thread
 * only, relaxed atomic stores on its tick (daemon/core/nsstat.c); readers load
 * them relaxed for a row whose `used` they saw set (acquire), so two of
 * them may be a tick apart. The daemon zeroes an entry before it writes
 * its row for a new namespace. The counters (not the gauges) go back to
 * zero when an operator resets the statistics (kvstat --reset).
 */
struct kvshm_ns_stats {
	/* Counters, from what the namespace's clients count in their
	 * ledgers (as the daemon-wide ones in struct kvshm_stats). */
	_Atomic uint64_t lookups;
	_Atomic uint64_t hit_blocks;
	_Atomic uint64_t miss_blocks;
	_Atomic uint64_t lookup_tokens;
	_Atomic uint64_t hit_tokens;
	_Atomic uint64_t published;	/* pages its clients published */
	_Atomic uint64_t dropped;	/* pages dropped at a client's request */
	/* Gauges. pages: pool pages holding a block of the namespace
	 * (READY, or EVICTING on its way out), kept at each page transition
	 * (shm/page.c). clients: attached with it now. */
	_Atomic uint64_t pages;
	_Atomic uint64_t clients;
	/* Layout 16. held: pages its clients pin or write, as its
	 * namespace-share counts them (daemon/core/quota.c), refreshed each
	 * tick; refused: ALLOCs refused for that share (a counter). */
	_Atomic uint64_t held;
	_Atomic uint64_t refused;
	uint64_t resv[5];
};

/* ---------------------------------------------------------------- tenants */

#define KVSHM_TENANTS 64	/* rows of the tenant table */
#define KVSHM_TENANT_NAME 32	/* name bytes, NUL included */
#define KVSHM_TENANT_NONE 0xffffu	/* a page of no known tenant */

/* struct kvshm_tenant.flags */
#define KVSHM_TENANT_CONFIGURED 0x1u	/* named in kvcached.conf */
#define KVSHM_TENANT_NO_INSERT 0x2u	/* its clients never publish */

/*
 * A tenant: the clients of one salt (an unsalted client is the tenant of
 * the empty salt). The name is the operator's (kvcached.conf `tenant`), or
 * "unsalted", or "unnamed-ROW" for a salt the config does not name; never
 * the salt, which only the daemon's memory holds. Writer: the daemon's
 * main thread; a row is written while `used` is 0, then `used` is set
 * (release); readers load `used` (acquire) before the rest. Counters and
 * gauges are relaxed stores, refreshed each tick (as struct
 * kvshm_ns_stats); the counters go back to zero with kvstat --reset.
 */
struct kvshm_tenant {
	_Atomic uint32_t used;
	uint32_t flags;			/* KVSHM_TENANT_* */
	_Atomic uint64_t share;		/* percent of the pool it may hold */
	char name[KVSHM_TENANT_NAME];	/* NUL-terminated */
	/* Counters: from its clients' ledgers, as per namespace. */
	_Atomic uint64_t lookups;
	_Atomic uint64_t hit_blocks;
	_Atomic uint64_t miss_blocks;
	_Atomic uint64_t lookup_tokens;
	_Atomic uint64_t hit_tokens;
	_Atomic uint64_t published;
	_Atomic uint64_t refused;	/* ALLOCs refused for its share */
	_Atomic uint64_t no_insert_refused;	/* ALLOCs of its no-insert clients */
	_Atomic uint64_t dropped;	/* pages an operator dropped */
	/* Gauges. pages: pool pages holding its blocks (shm/page.c, at each
	 * transition); held: pages its clients pin or write and its pinned
	 * prefixes hold, as its share counts them; pinned: of those, held by
	 * pinned prefixes (TTL); clients: attached now. */
	_Atomic uint64_t pages;
	_Atomic uint64_t held;
	_Atomic uint64_t pinned;
	_Atomic uint64_t clients;
	uint64_t resv[5];
};

/* -------------------------------------------------------- pinned prefixes */

#define KVSHM_PINNED 64		/* rows: prefixes pinned with a TTL at once */

/*
 * A prefix kept resident until a time (kvstat --pin, kvc_pin): its blocks'
 * pages are held by the daemon, counted against its tenant's share, and
 * no eviction takes them until `expires_ns`. Writer: the daemon's main
 * thread; a row is written while `id` is 0, then `id` is set (release);
 * cleared by storing 0 to `id` first. Readers load `id` (acquire), copy the
 * row, and load `id` again: equal means the copy is whole.
 */
struct kvshm_pinned {
	_Atomic uint32_t id;		/* 0: free; else what unpin names */
	uint32_t ns_id;
	uint32_t tenant;		/* row in the tenant table */
	uint32_t blocks;		/* blocks of the prefix asked for */
	_Atomic uint32_t resident;	/* of them, held in the pool now */
	int32_t pid;			/* who pinned it (kvstat, or a client) */
	uint64_t expires_ns;		/* CLOCK_REALTIME */
	uint64_t since_ns;		/* CLOCK_REALTIME when pinned */
	struct kvshm_key first;		/* its first block's key */
	char label[24];			/* NUL-terminated, may be empty */
	uint32_t uid;
	uint32_t pad;
};

/* Position encoding kinds a namespace can declare. */
enum kvshm_pos_kind {
	KVSHM_POS_NONE = 0,
	KVSHM_POS_ROPE = 1,
	KVSHM_POS_ALIBI = 2,
	KVSHM_POS_LEARNED = 3,
	KVSHM_POS_MAX = 3,
};

/*
 * How a namespace names its blocks; part of its identity (kvshm_ns_id), so
 * namespaces of different kinds never share a block.
 *
 * TOKENS: a block's key is the chain over its parent and its tokens
 *   (shm/key.h); a hit is verified against parent and tokens.
 * ENGINE: the engine names each block by a key of its own (SGLang's page
 *   hashes) and never hands over the tokens. The library turns that key
 *   into the block's key and its stored "tokens" (a digest of the engine
 *   key, kvshm_key_engine), with the namespace root as every block's parent:
 *   blocks are not chained and a hit is only as exact as the engine's hash.
 *   A daemon check that recomputes keys from parent + tokens still holds,
 *   but one that reads the stored tokens as prompt tokens (KV events) must
 *   skip these namespaces.
 */
enum kvshm_ns_kind {
	KVSHM_NS_TOKENS = 0,
	KVSHM_NS_ENGINE = 1,
};

/*
 * How a namespace's page holds one block's KV; part of its identity.
 *
 * SPLIT: a K and a V vector per KV head per token per layer, the page
 *   [layer][k|v][token][kv_head][head_dim] (every attention with heads:
 *   MHA, GQA, MQA). Tensor-parallel ranks each hold some of the heads.
 * LATENT: one latent vector per token per layer and no K/V split (MLA:
 *   DeepSeek-V2/V3/R1, Kimi K2), the page [layer][token][head_dim] with
 *   head_dim the latent width (kv_lora_rank + rope dims); kv_heads is 1.
 *   Every tensor-parallel rank holds all of it.
 */
enum kvshm_kv_layout {
	KVSHM_KV_SPLIT = 0,
	KVSHM_KV_LATENT = 1,
};

/* Most ranks that write one page together (kvproto_part). */
#define KVSHM_MAX_WRITERS 32u

/* A model's tensor- / pipeline-parallel part (kvc_shard, normalised). */
struct kvshm_shard {
	uint16_t tp_rank;
	uint16_t tp_size;
	uint16_t pp_rank;
	uint16_t pp_size;
};

/*
 * One model geometry plus identity. A row is written by the daemon while
 * `used` is 0, then `used` is set with a release store; readers load `used`
 * with acquire before trusting the rest. Rows are never reused while the
 * daemon lives (namespaces are few; their pages outlive their clients).
 *
 * The tensor-parallel rank is no part of it (since layout 16): kv_heads is
 * the model's, all ranks together, and a page holds every head, so the
 * ranks of an engine at any TP size share the namespace and its pages
 * (each rank moves only its heads: kvproto_part). A pipeline stage holds
 * other layers, so pp_rank / pp_size stay.
 */
struct kvshm_ns {
	_Atomic uint32_t used;
	uint32_t dtype_bytes;
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t block_tokens;
	uint32_t pos_kind;
	uint32_t kind;			/* enum kvshm_ns_kind (was padding, 0) */
	uint64_t page_bytes;		/* the namespace's own page size */
	struct kvshm_key id;		/* hash of the fields above + model
					 * (+ pipeline stage when staged, + kind
					 * when not TOKENS, + layout when not
					 * SPLIT): kvshm_ns_id */
	char model[KVSHM_MODEL_NAME];	/* NUL-terminated */
	uint16_t pp_rank;		/* pipeline stage, < pp_size */
	uint16_t pp_size;		/* >= 1; 1: not staged */
	uint16_t layout;		/* enum kvshm_kv_layout */
	uint16_t resv;			/* 0 */
};

/* ----------------------------------------------------------- client rows */

/*
 * One row per attached client, for kvstat. The daemon writes a row while
 * `pid` is 0, then publishes it by storing `pid` with release; it clears the
 * row by storing 0 to `pid` first. Counters are relaxed copies of what the
 * client counts in its ledger, refreshed every tick.
 *
 * flight: the futex word of single-flight waiters (daemon/core/flight.c). The
 *   daemon bumps it (release store, then FUTEX_WAKE on its own mapping)
 *   after any page this client announced in flight stopped being in flight
 *   (published, freed, taken over, reclaimed). Never reset, whatever
 *   happens to the rest of the row: a waiter that read it, then saw the
 *   page still in flight, sleeps with FUTEX_WAIT on that value and is sure
 *   to be woken by the change.
 */
struct kvshm_client_row {
	_Atomic int32_t pid;
	uint32_t uid;
	uint32_t ns_id;
	_Atomic uint32_t flight;
	char comm[16];
	_Atomic uint64_t lookups;
	_Atomic uint64_t hit_blocks;
	_Atomic uint64_t miss_blocks;
	_Atomic uint64_t pins_held;
	_Atomic uint64_t published;
	_Atomic uint64_t writing;
};

/* ------------------------------------------------------------ top prefixes */

#define KVSHM_TOP 32		/* entries in the space-saving sketch */
#define KVSHM_LABEL 24		/* label bytes, NUL included */

/*
 * The prefix roots (a chain's first block key) with the most hit tokens,
 * kept by the daemon as a space-saving sketch (Metwally et al.): a root
 * not in the sketch replaces the entry with the fewest tokens and inherits
 * its count as `err`, so hit_tokens - err <= true count <= hit_tokens.
 * Writer: the daemon, under the seqcount like an index bucket; readers
 * copy the whole struct with relaxed loads and retry on a seq change.
 */
struct kvshm_top_entry {
	struct kvshm_key key;
	uint64_t hit_tokens;
	uint64_t err;
	uint32_t ns_id;
	uint32_t pad;
	char label[KVSHM_LABEL];	/* NUL-terminated, may be empty */
};

struct kvshm_top {
	_Atomic uint32_t seq;
	uint32_t n;			/* entries in use */
	uint8_t pad[56];
	struct kvshm_top_entry e[KVSHM_TOP];
};

/* ---------------------------------------------------------------- index */

#define KVSHM_BUCKET_ENTRIES 3
#define KVSHM_PROBE_MAX 8	/* buckets scanned from the home bucket */

/*
 * Index entry: `ref` is the page index + 1 (0 = empty slot); `tag` is
 * key.lo and `check` the low 32 bits of key.hi, so that most foreign
 * entries are rejected without touching the page table. The full key is
 * verified against the page entry.
 */
struct kvshm_entry {
	uint64_t tag;
	uint32_t ref;
	uint32_t check;
};

/*
 * A bucket is one cache line, read under its own sequence count (Linux
 * seqcount). Writer (daemon only): seq += 1 (relaxed) then a release fence,
 * write entries (relaxed atomic stores), seq += 1 (release store). Reader:
 * s = seq (acquire); odd -> retry; read entries (relaxed atomic loads);
 * acquire fence; seq == s or retry.
 *
 * `spill` counts entries whose home is this bucket but which live in one of
 * the next KVSHM_PROBE_MAX - 1 buckets; a reader goes on probing only while
 * it is non-zero, so a miss usually costs one cache line.
 */
struct kvshm_bucket {
	_Atomic uint32_t seq;
	uint32_t spill;
	struct kvshm_entry e[KVSHM_BUCKET_ENTRIES];
	uint64_t pad;
};

/* ----------------------------------------------------------- page table */

enum kvshm_page_state {
	KVSHM_PAGE_FREE = 0,
	KVSHM_PAGE_WRITING = 1,	/* handed to one client, invisible */
	KVSHM_PAGE_READY = 2,	/* in the index, pinnable */
	KVSHM_PAGE_EVICTING = 3,/* chosen by the evictor, pins being checked */
};

/*
 * Where an index entry points: a pool page (tier 0), or with
 * KVSHM_LOC_SLOT set, a spill slot (tier 1). The index stores loc + 1.
 */
#define KVSHM_LOC_SLOT 0x80000000u

static inline int kvshm_loc_is_slot(uint32_t loc)
{
	return loc != UINT32_MAX && (loc & KVSHM_LOC_SLOT);
}

/*
 * One entry per pool page, written by the daemon only.
 *
 * state: seq_cst stores. The evictor's READY -> EVICTING store and a
 *   client's pin-slot store are the two sides of a Dekker handshake
 *   (ledger.h): with both seq_cst, at least one side sees the other.
 * gen: bumped (release) on FREE -> WRITING and on EVICTING -> FREE, so a
 *   (page, gen) pair names one life of a page. Readers load it with acquire
 *   before reading the identity fields and re-check it afterwards.
 * ns_id, tenant, key, parent, tokens (in the tokens region): written with relaxed
 *   atomic stores only while the page is WRITING (not visible to lookups);
 *   the READY store publishes them.
 * owner: the client id holding a WRITING page; the daemon's own bookkeeping,
 *   shown to kvstat.
 * slices, writers: a page that several tensor-parallel ranks write
 *   together (each its slice of the heads, kvproto_part) while it is
 *   WRITING: writers is how many slices make it whole (0 for a page with
 *   one writer, always so outside WRITING) and bit s of slices is set once
 *   some rank was granted slice s. Relaxed stores by the daemon while the
 *   page is WRITING (set before an announcement's flight store, cleared
 *   when the page leaves WRITING); a lookup reads them (relaxed) to tell a
 *   page in flight that waits for its own slice, which it must write, not
 *   wait for (libclient/flight_scan.c).
 * flight: 1 while the page is WRITING and *announced*: its owner said which
 *   block it will publish there (ALLOC_KEYS), key and parent hold that
 *   block's identity and the index names the page under that key, so that
 *   other clients find the block being written and may wait for it
 *   (single flight, page.h). 0 otherwise. Release store after key and
 *   parent and before the index entry; cleared (release) after the page
 *   left WRITING or its entry left the index. owner is then read (relaxed)
 *   by clients to find the row whose flight word to wait on.
 * unlisted: 1 while a READY page is out of the index without being freed
 *   (its pool memory was punched out and a reader still pins it: it waits
 *   for the evictor), else 0. Lookups may reach a page without the index
 *   (the walk guesses a block's page as the one after its parent's,
 *   shm/prefix.h), so a READY page that must not be found says so here.
 *   Relaxed store by the daemon; read by kvshm_page_verify between its
 *   two reads of gen, cleared when the page is freed.
 */
struct kvshm_page {
	_Atomic uint32_t state;
	_Atomic uint32_t gen;
	uint32_t ns_id;
	uint32_t owner;
	struct kvshm_key key;
	struct kvshm_key parent;
	_Atomic uint32_t slices;	/* was `ref` (unused) until layout 16 */
	_Atomic uint32_t flight;
	uint16_t unlisted;
	/* The tenant row (struct kvshm_tenant) whose key space the block is
	 * in, KVSHM_TENANT_NONE when not known (a spilled block found at a
	 * start). Written like ns_id, while the page is WRITING; layout 16
	 * (`unlisted` and `tenant` share what was one 4-byte field). */
	uint16_t tenant;
	_Atomic uint32_t writers;	/* was padding: one line per entry */
};

/* ------------------------------------------------------------ spill slots */

/*
 * One entry per spill slot (tier 1), written by the daemon only, read by
 * clients to tell a tier-1 hit. A block lives in one tier at a time as far
 * as the index is concerned: its entry names a page or a slot.
 *
 * state: KVSHM_SLOT_SPILLED while the index names this slot and its
 *   contents on disk are whole; anything else (free, being written or read,
 *   backing a page that is in the pool) is not a tier-1 hit. Release store
 *   after the identity fields; readers load it with acquire.
 * gen: bumped (release) whenever the slot changes identity, so a reader
 *   re-checks it after reading the identity, as for pages.
 * ns_id, key, parent: relaxed atomic stores before the SPILLED store.
 */
enum kvshm_slot_state {
	KVSHM_SLOT_FREE = 0,
	KVSHM_SLOT_SPILLED = 1,
	KVSHM_SLOT_BUSY = 2,	/* being written or restored */
	KVSHM_SLOT_BACKING = 3,	/* a clean copy of a pool page */
};

struct kvshm_slot {
	_Atomic uint32_t state;
	_Atomic uint32_t gen;
	uint32_t ns_id;
	uint32_t tenant;	/* as the page's (layout 16; KVSHM_TENANT_NONE after a start) */
	struct kvshm_key key;
	struct kvshm_key parent;
};

/* ------------------------------------------------------------- accessors */

static inline void *kvshm_at(const void *base, uint64_t off)
{
	return (char *)base + off;
}

static inline struct kvshm_stats *kvshm_stats(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_stats);
}

static inline struct kvshm_ns *kvshm_ns(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_ns);
}

static inline struct kvshm_ns_stats *kvshm_ns_stats(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_ns_stats);
}

static inline struct kvshm_client_row *kvshm_clients(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_clients);
}

static inline struct kvshm_bucket *kvshm_buckets(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_buckets);
}

static inline struct kvshm_page *kvshm_pages(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_pages);
}

static inline uint32_t *kvshm_tokens(const struct kvshm_header *h, uint32_t page)
{
	return (uint32_t *)kvshm_at(h, h->off_tokens) +
	       (uint64_t)page * h->geo.block_tokens;
}

/*
 * What a reader of the index and page table needs from the header, in
 * locals: the header never changes once laid out, but a compiler must
 * load it again after every acquire load of the walk. A lookup takes
 * one view at its start (shm/prefix.h).
 */
struct kvshm_view {
	const struct kvshm_bucket *buckets;
	const struct kvshm_page *pages;
	const uint32_t *tokens;		/* page p's at tokens + p * bt */
	uint32_t bucket_mask;		/* n_buckets - 1 */
	uint32_t n_pages;
	uint32_t bt;			/* block tokens */
};

static inline struct kvshm_view kvshm_view(const struct kvshm_header *h)
{
	struct kvshm_view v = {
		kvshm_buckets(h), kvshm_pages(h), kvshm_at(h, h->off_tokens),
		h->geo.n_buckets - 1, h->geo.n_pages, h->geo.block_tokens,
	};
	return v;
}

static inline struct kvshm_top *kvshm_top(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_top);
}

static inline struct kvshm_slot *kvshm_slots(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_slots);
}

static inline struct kvshm_tenant *kvshm_tenants(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_tenants);
}

static inline struct kvshm_pinned *kvshm_pinned(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_pinned);
}

/* The free-page stack: a count followed by page indices. Daemon-only. */
struct kvshm_free {
	uint32_t count;
	uint32_t pad[15];
	uint32_t page[];
};

static inline struct kvshm_free *kvshm_free(const struct kvshm_header *h)
{
	return kvshm_at(h, h->off_free);
}

/*
 * Writer side of a seqcount (index buckets, the top sketch): seq += 1
 * (odd: write in progress), release fence, the writes (relaxed atomic
 * stores), seq += 1 with release. Single writer: the daemon's main thread.
 */
static inline void kvshm_seq_write_begin(_Atomic uint32_t *seq)
{
	uint32_t s = atomic_load_explicit(seq, memory_order_relaxed);

	atomic_store_explicit(seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
}

static inline void kvshm_seq_write_end(_Atomic uint32_t *seq)
{
	uint32_t s = atomic_load_explicit(seq, memory_order_relaxed);

	atomic_store_explicit(seq, s + 1, memory_order_release);
}

static inline int kvshm_key_eq(struct kvshm_key a, struct kvshm_key b)
{
	return !((a.lo ^ b.lo) | (a.hi ^ b.hi));
}

/*
 * Compute the layout for a geometry: fills every size and offset field of
 * *h (magic, version, sizes, offsets, segment_bytes). Returns 0 or -EINVAL
 * (zero sizes, block_tokens over KVSHM_MAX_BLOCK_TOKENS, overflow).
 */
int kvshm_layout(struct kvshm_header *h, const struct kvshm_geometry *geo);

/*
 * Initialise a freshly zeroed segment of h->segment_bytes at base: copies
 * the header, puts every page on the free stack, FREE, gen 0.
 */
void kvshm_init(void *base, const struct kvshm_header *h);

/*
 * Check that a mapped segment of `bytes` is one this build understands:
 * magic, version, struct sizes, offsets and geometry all inside `bytes`.
 * Returns 0, -EPROTO (magic or version) or -EBADMSG (sizes, offsets). On
 * error, *why (if not NULL) points to a static description.
 */
int kvshm_validate(const void *base, uint64_t bytes, const char **why);

/* Buckets for an index that must hold `entries` at a load of 1/4. */
uint32_t kvshm_buckets_for(uint64_t entries);

_Static_assert(sizeof(struct kvshm_key) == 16, "key");
_Static_assert(sizeof(struct kvshm_entry) == 16, "entry");
_Static_assert(sizeof(struct kvshm_bucket) == KVSHM_CACHELINE, "bucket");
_Static_assert(sizeof(struct kvshm_page) == KVSHM_CACHELINE, "page entry: one line");
_Static_assert(offsetof(struct kvshm_page, key) == 16, "page.key");
_Static_assert(sizeof(struct kvshm_ns) == 128, "ns row");
_Static_assert(sizeof(struct kvshm_client_row) == 80, "client row");
_Static_assert(sizeof(struct kvshm_top_entry) == 64, "top entry");
_Static_assert(sizeof(struct kvshm_slot) == 48, "slot entry");
_Static_assert(offsetof(struct kvshm_header, heartbeat) == 192, "hdr");
_Static_assert(sizeof(struct kvshm_ns_stats) == 128, "ns stats");
_Static_assert(sizeof(struct kvshm_header) == 240, "hdr size");
_Static_assert(sizeof(struct kvshm_tenant) == 192, "tenant row");
_Static_assert(sizeof(struct kvshm_pinned) == 88, "pinned row");

#endif
