/* SPDX-License-Identifier: MIT */
/*
 * proto.h - the Unix-socket protocol between libkvclient and kvcached.
 *
 * SOCK_STREAM, little-endian host order (both ends are on one host).
 * Every message is a 16-byte header followed by `len` payload bytes, and
 * every request gets exactly one reply carrying the same `seq`. File
 * descriptors travel (SCM_RIGHTS) only with the replies whose row's note
 * says so (HELLO_R, STAT_R, POOL_R).
 *
 * Every frame is a row of KVPROTO_FRAMES below: its number, its size
 * rule and payload, when the daemon takes it, its handler; a note above a
 * row says what the row cannot (descriptors that travel with it, a reply
 * after which the daemon closes, statuses). The structs say what their
 * fields mean.
 *
 * kvproto_decode() checks every length against the declared counts before
 * anything reads a record; it is the one function that ever parses bytes
 * that came from the socket.
 */
#ifndef KVSHM_PROTO_H
#define KVSHM_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "segment.h"

#define KVPROTO_MAGIC	0x4b564331u	/* "1CVK" */
/* 2: HELLO carries the shard; 3: a PUBLISH record carries the request's
 * extra-keys digest (56 bytes), which the daemon needs to recompute keys;
 * 4: HELLO carries the salt (the daemon recomputes keys in the client's
 * own key space, shm/key.h, and knows its tenant), the no-insert flag and
 * a share of the pool the client asks to be held to; HELLO's kv_heads are
 * the model's (every tensor-parallel rank's together) and the shard says
 * which a rank holds; KVPROTO_HELLO_LATENT; PUBLISH_R status
 * KVPROTO_PUB_SLICE. */
#define KVPROTO_VERSION 4u
#define KVPROTO_MAX_LEN (16u << 20)	/* largest payload either side sends */
#define KVPROTO_MAX_COUNT 65536u	/* records per message */

/*
 * Every frame, one row each, in numeric order: the wire contract's one
 * table. kvproto_decode (proto.c) checks a frame by its row, the daemon's
 * dispatch (daemon/server/server.c) runs its row's handler, and the enum
 * below is made from it. Adding a frame is adding a row (and its
 * handler, and the library call that sends it). Columns:
 *
 *   name     the frame is KVPROTO_<name>
 *   type     its number on the wire (ranges apart: 32 cuda pool, 40
 *            single flight, 50 drop, reset, operator and pins, 60 remote
 *            tier)
 *   desc     its name in decode's messages ("<desc> has the wrong size")
 *   size     the size rule, on top of magic and KVPROTO_MAX_LEN:
 *              NONE        no payload
 *              EXACT       exactly `bytes`
 *              MIN         at least `bytes` (a header; check does the rest)
 *              COUNTED     a kvproto_count, then n records of `bytes`
 *              CUSTOM      check does it all
 *            and _BT: needs the connection's block tokens (a namespace
 *            declared): COUNTED_BT records are `bytes` + 4 per token
 *   bytes    the size the rule uses (0 where none)
 *   check    proto.c's check of what the rule does not cover, or NULL
 *   hello    when the daemon takes it: BEFORE (before HELLO only: after
 *            it, it is no request), AFTER (after HELLO only; every reply
 *            is AFTER: a client never sends one), ANY (HELLO: its handler
 *            refuses a second one)
 *   handler  the daemon's handler of a request (core), NULL for a reply;
 *            only the daemon expands this column
 */
#define KVPROTO_FRAMES(X)                                                                 \
	X(HELLO,      1,  "HELLO",        EXACT,      sizeof(struct kvproto_hello),          \
	  NULL,                  ANY,    kvd_registry_hello)                              \
	/* + fds [segment, pool, ledger]; a cuda pool's: [segment, ledger], then POOL */  \
	X(HELLO_R,    2,  "HELLO reply",  EXACT,      sizeof(struct kvproto_hello_r),        \
	  NULL,                  AFTER,  NULL)                                            \
	X(ALLOC,      3,  "ALLOC",        EXACT,      sizeof(struct kvproto_alloc),          \
	  kvproto_check_alloc,   AFTER,  kvd_alloc)                                       \
	/* count + n pg; fewer than asked: count.pad names the limit (KVPROTO_SHORT_*) */ \
	X(ALLOC_R,    4,  "ALLOC reply",  CUSTOM,     0,                                     \
	  kvproto_check_alloc_r, AFTER,  NULL)                                            \
	/* count + n x (pub + bt tokens) */                                               \
	X(PUBLISH,    5,  "PUBLISH",      COUNTED_BT, sizeof(struct kvproto_pub),            \
	  NULL,                  AFTER,  kvd_publish)                                     \
	X(PUBLISH_R,  6,  "PUBLISH reply", COUNTED,   sizeof(struct kvproto_pub_r),          \
	  NULL,                  AFTER,  NULL)                                            \
	X(FREE,       7,  "FREE",         COUNTED,    sizeof(struct kvproto_pg),             \
	  NULL,                  AFTER,  kvd_free)                                        \
	X(FREE_R,     8,  "FREE reply",   EXACT,      sizeof(struct kvproto_count),          \
	  NULL,                  AFTER,  NULL)                                            \
	/* + message text; fatal: the daemon then closes the connection */                \
	X(ERROR,      9,  "ERROR",        MIN,        sizeof(struct kvproto_error),          \
	  NULL,                  AFTER,  NULL)                                            \
	/* an observer (kvstat): STAT_R + fd [segment], then the daemon closes */         \
	X(STAT,       10, "STAT",         EXACT,      sizeof(struct kvproto_stat),           \
	  kvproto_check_stat,    BEFORE, kvd_registry_stat)                               \
	X(STAT_R,     11, "STAT reply",   EXACT,      sizeof(struct kvproto_stat_r),         \
	  NULL,                  AFTER,  NULL)                                            \
	/* no reply: all released; a live process that hangs up keeps its pins */         \
	X(BYE,        12, "BYE",          NONE,       0,                                     \
	  NULL,                  AFTER,  kvd_client_bye)                                  \
	/* spilled blocks of the namespace back into pool pages, one round trip */        \
	X(RESTORE,    13, "RESTORE",      COUNTED,    sizeof(struct kvshm_key),              \
	  NULL,                  AFTER,  kvd_restore)                                     \
	/* an int32 per key: 0 READY (look up again), -ENOENT, -EBADMSG, -EIO, -ENOSPC */ \
	X(RESTORE_R,  14, "RESTORE reply", COUNTED,   sizeof(int32_t),                       \
	  NULL,                  AFTER,  NULL)                                            \
	/* after a HELLO_R that says pool_kind cuda */                                    \
	X(POOL,       32, "POOL",         EXACT,      sizeof(struct kvproto_pool),           \
	  kvproto_check_pool,    AFTER,  kvd_registry_pool)                               \
	/* + n_chunks fds: the pool's CUDA VMM chunks, in pool order */                   \
	X(POOL_R,     33, "POOL reply",   EXACT,      sizeof(struct kvproto_pool_r),         \
	  kvproto_check_pool_r,  AFTER,  NULL)                                            \
	/* alloc + n claim: ALLOC_R; ALLOC_SINGLE: maybe a non-fatal ERROR -EINPROGRESS */ \
	X(ALLOC_KEYS, 40, "ALLOC_KEYS",   MIN,        sizeof(struct kvproto_alloc),          \
	  kvproto_check_alloc_keys, AFTER, kvd_alloc_keys)                                \
	/* every unpinned block of the namespace, pool and spill, every salt */           \
	X(DROP,       50, "DROP",         EXACT,      sizeof(struct kvproto_drop),           \
	  kvproto_check_drop,    AFTER,  kvd_drop_ns)                                     \
	X(DROP_R,     51, "DROP reply",   EXACT,      sizeof(struct kvproto_drop_r),         \
	  NULL,                  AFTER,  NULL)                                            \
	/* instead of HELLO, root or the daemon's user: zero the counters; reply, then close */ \
	X(RESET,      52, "RESET",        EXACT,      sizeof(struct kvproto_reset),          \
	  kvproto_check_reset,   BEFORE, kvd_nsstat_reset_req)                            \
	X(RESET_R,    53, "RESET reply",  EXACT,      sizeof(struct kvproto_reset_r),        \
	  NULL,                  AFTER,  NULL)                                            \
	/* instead of HELLO, as RESET (+ n_tokens tokens for a pin); reply, then close */ \
	X(ADMIN,      54, "ADMIN",        MIN,        sizeof(struct kvproto_admin),          \
	  kvproto_check_admin,   BEFORE, kvd_admin_req)                                   \
	X(ADMIN_R,    55, "ADMIN reply",  EXACT,      sizeof(struct kvproto_admin_r),        \
	  NULL,                  AFTER,  NULL)                                            \
	/* + n keys: the client's prefix kept resident ttl_s, on its tenant's share */    \
	X(PIN,        56, "PIN",          MIN,        sizeof(struct kvproto_pin),            \
	  kvproto_check_pin,     AFTER,  kvd_pin_req)                                     \
	X(PIN_R,      57, "PIN reply",    EXACT,      sizeof(struct kvproto_pin_r),          \
	  NULL,                  AFTER,  NULL)                                            \
	X(UNPIN,      58, "UNPIN",        EXACT,      sizeof(struct kvproto_unpin),          \
	  kvproto_check_unpin,   AFTER,  kvd_unpin_req)                                   \
	X(UNPIN_R,    59, "UNPIN reply",  EXACT,      sizeof(struct kvproto_unpin),          \
	  NULL,                  AFTER,  NULL)                                            \
	/* + n x (key + bt tokens): a chain brought in from any tier; may wait for the network */ \
	X(FETCH,      60, "FETCH",        MIN_BT,     sizeof(struct kvproto_fetch),          \
	  kvproto_check_fetch,   AFTER,  kvd_restore)                                     \
	/* as RESTORE_R; also -ETIMEDOUT (a remote server late) */                        \
	X(FETCH_R,    61, "FETCH reply",  COUNTED,    sizeof(int32_t),                       \
	  NULL,                  AFTER,  NULL)

#define KVPROTO_ENUM_ROW(name, type, ...) KVPROTO_##name = type,
enum kvproto_type { KVPROTO_FRAMES(KVPROTO_ENUM_ROW) };
#undef KVPROTO_ENUM_ROW
/* The largest type number: the size of a union of one char[type] per row. */
#define KVPROTO_SPAN_ROW(name, type, ...) char name[type];
union kvproto_type_span { KVPROTO_FRAMES(KVPROTO_SPAN_ROW) };
#undef KVPROTO_SPAN_ROW
#define KVPROTO_TYPE_MAX ((unsigned)sizeof(union kvproto_type_span))

/* The size rules (the table's size column). */
enum kvproto_size {
	KVPROTO_SIZE_NONE,
	KVPROTO_SIZE_EXACT,
	KVPROTO_SIZE_MIN,
	KVPROTO_SIZE_COUNTED,
	KVPROTO_SIZE_CUSTOM,
	KVPROTO_SIZE_MIN_BT,
	KVPROTO_SIZE_COUNTED_BT,
};

/* When the daemon takes a frame (the table's hello column). */
enum kvproto_take {
	KVPROTO_TAKE_ANY,
	KVPROTO_TAKE_BEFORE,
	KVPROTO_TAKE_AFTER,
};

struct kvproto_hdr {
	uint32_t magic;
	uint16_t type;
	uint16_t flags;
	uint32_t len;
	uint32_t seq;
};

/* HELLO flags: the namespace's blocks are named by the engine's keys
 * (enum kvshm_ns_kind KVSHM_NS_ENGINE), not by token chains; its page
 * holds one latent vector per token per layer (KVSHM_KV_LATENT: MLA). */
#define KVPROTO_HELLO_ENGINE_KEYS 0x1u
/* The client looks up and reads, and never publishes (KVC_OPEN_NO_INSERT):
 * the daemon refuses its ALLOCs. */
#define KVPROTO_HELLO_NO_INSERT 0x2u
#define KVPROTO_HELLO_LATENT 0x4u
/* Longest salt a HELLO carries (KVC_MAX_SALT). */
#define KVPROTO_MAX_SALT 256u

struct kvproto_hello {
	uint32_t version;
	uint32_t flags;		/* KVPROTO_HELLO_* or 0 */
	uint32_t dtype_bytes;
	uint32_t layers;
	uint32_t kv_heads;	/* the model's, all tensor-parallel ranks' */
	uint32_t head_dim;
	uint32_t block_tokens;
	uint32_t pos_kind;
	uint32_t max_pins;	/* 0 = daemon default */
	uint32_t pad;
	char model[KVSHM_MODEL_NAME];
	char name[16];		/* process name for kvstat */
	struct kvshm_shard shard;	/* all zero: not sharded */
	/* Percent of the pool this process asks to be held to, below the
	 * daemon's max-share (0: the daemon's). */
	uint32_t max_share;
	uint32_t salt_len;	/* 0..KVPROTO_MAX_SALT */
	/* The client's salt: the daemon computes the client's root (its key
	 * space, shm/key.h) from it and finds its tenant by it. Kept in the
	 * daemon's memory, never written to the segment. */
	uint8_t salt[KVPROTO_MAX_SALT];
};

struct kvproto_hello_r {
	uint32_t version;
	uint32_t client_id;
	uint32_t ns_id;
	uint32_t n_pages;
	uint64_t page_bytes;	/* pool slot bytes */
	uint64_t ns_page_bytes;	/* this namespace's page bytes (<= slot) */
	uint64_t segment_bytes;
	uint64_t pool_bytes;
	uint64_t ledger_bytes;
	uint32_t block_tokens;
	uint32_t pool_kind;
	uint32_t nslots;
	uint32_t pad;
};

struct kvproto_count {
	uint32_t n;
	uint32_t pad;
};

/* ALLOC_R's count.pad: the limit that granted fewer pages than asked. */
#define KVPROTO_SHORT_SHARE 1u	/* the process's max-share of the pool */
#define KVPROTO_SHORT_SLOTS 2u	/* the client's pin slots */
#define KVPROTO_SHORT_POOL 3u	/* no free page (all pinned or being written) */
#define KVPROTO_SHORT_TAKEN 4u	/* a rank writing slices: the next block is
				 * cached, or written by ranks of another
				 * layout, or its slice is taken (slice.h) */

struct kvproto_alloc {
	uint32_t n;		/* pages wanted, 1..KVPROTO_MAX_COUNT */
	uint32_t flags;		/* ALLOC: must be 0; ALLOC_KEYS: below */
};

/* ALLOC_KEYS flags: refuse (-EINPROGRESS) rather than grant pages when
 * the first claimed block is in flight by another client, or cached. */
#define KVPROTO_ALLOC_SINGLE 0x1u

/* ALLOC_KEYS record: the block the page in the same place of the reply
 * will be published as. */
struct kvproto_claim {
	struct kvshm_key key;
	struct kvshm_key parent;
};

/* A page as handed out: index and generation. */
struct kvproto_pg {
	uint32_t page;
	uint32_t gen;
};

/* One publish record; followed by block_tokens uint32 tokens. */
struct kvproto_pub {
	uint32_t page;
	uint32_t gen;
	struct kvshm_key key;
	struct kvshm_key parent;
	/* The request's extra-keys digest (kvshm_key_extra; zero without):
	 * with it the daemon recomputes key from parent and tokens. */
	struct kvshm_key extra;
};

/* PUBLISH_R status of a rank's slice of a page several ranks write: the
 * slice is in, the page becomes READY when the last slice is (it stays
 * the caller's, pinned; kvproto_part). */
#define KVPROTO_PUB_SLICE 2

struct kvproto_pub_r {
	int32_t status;		/* 0 published, 1 dup (page = winner),
				 * KVPROTO_PUB_SLICE, -errno */
	uint32_t page;
	uint32_t gen;
	uint32_t pad;
};

struct kvproto_stat {
	uint32_t version;
	uint32_t flags;		/* none defined: must be 0 */
};

struct kvproto_stat_r {
	uint32_t version;
	uint32_t shm_version;	/* KVSHM_VERSION of the segment */
	uint64_t segment_bytes;
};

/* Most chunks a cuda pool has (fds in one POOL_R, under SCM_MAX_FD). */
#define KVPROTO_MAX_CHUNKS 64u

struct kvproto_pool {
	uint32_t version;
	uint32_t flags;		/* none defined: must be 0 */
};

struct kvproto_pool_r {
	uint32_t version;
	uint32_t n_chunks;	/* fds that come with it: 1..KVPROTO_MAX_CHUNKS */
	uint64_t chunk_bytes;	/* each chunk; a multiple of granularity */
	uint64_t granularity;	/* cuMemGetAllocationGranularity (recommended) */
	uint64_t pool_bytes;	/* n_pages x page_bytes <= n_chunks x chunk_bytes */
	uint8_t uuid[16];	/* the GPU's CUuuid: ordinals differ per process */
	int32_t ordinal;	/* the daemon's ordinal of it, for messages */
	uint32_t pad;
};

struct kvproto_drop {
	uint32_t version;
	uint32_t flags;		/* none defined: must be 0 */
};

struct kvproto_drop_r {
	uint32_t dropped;	/* pool pages of the namespace freed */
	uint32_t left;		/* its pages still pinned or being written */
	uint32_t slots;		/* spill slots of the namespace given up */
	uint32_t pad;
};

struct kvproto_reset {
	uint32_t version;
	uint32_t flags;		/* none defined: must be 0 */
};

struct kvproto_reset_r {
	uint32_t version;
	uint32_t pad;
};

/* ADMIN ops (kvstat --drop-namespace, --drop-tenant, --pin, --unpin). */
enum kvproto_admin_op {
	KVPROTO_ADMIN_DROP_NS = 1,	/* a namespace's pages, every tenant */
	KVPROTO_ADMIN_DROP_TENANT = 2,	/* a tenant's pages, in one or every namespace */
	KVPROTO_ADMIN_PIN = 3,		/* keep a prompt's prefix resident */
	KVPROTO_ADMIN_UNPIN = 4,	/* end a pin */
};
#define KVPROTO_ADMIN_ANY 0xffffffffu	/* ns_row: by model name, or every one */
#define KVPROTO_PIN_TTL_MAX (30u * 86400u)	/* seconds a pin may last at most */
#define KVPROTO_PIN_BLOCKS 16384u	/* blocks one pin may hold at most */

struct kvproto_admin {
	uint32_t version;
	uint32_t op;		/* enum kvproto_admin_op */
	/* The namespace: a row, or KVPROTO_ADMIN_ANY to name it by model
	 * (DROP_NS: every namespace of that model; PIN: the one, which must
	 * be alone of its name; DROP_TENANT with model "": every one). */
	uint32_t ns_row;
	uint32_t ttl_s;		/* PIN: 1..KVPROTO_PIN_TTL_MAX */
	uint32_t pin_id;	/* UNPIN */
	uint32_t n_tokens;	/* PIN: the prompt's tokens, which follow */
	char model[KVSHM_MODEL_NAME];	/* NUL-terminated */
	char tenant[KVSHM_TENANT_NAME];	/* DROP_TENANT, PIN ("": unsalted) */
	char label[24];		/* PIN: shown in kvstat --pins */
};

struct kvproto_admin_r {
	uint32_t version;
	uint32_t op;
	uint32_t dropped;	/* pool pages dropped */
	uint32_t left;		/* pages of it still pinned or being written */
	uint32_t slots;		/* spill slots given up */
	uint32_t pin_id;	/* PIN: its id (for --unpin) */
	uint32_t blocks;	/* PIN: full blocks of the prompt */
	uint32_t resident;	/* PIN: of them, held resident now */
};

/* PIN flags: the request's blocks are not chained (engine keys): every
 * block's parent is the root. */
#define KVPROTO_PIN_FLAT 0x1u

struct kvproto_pin {
	uint32_t n;		/* keys that follow, 1..KVPROTO_PIN_BLOCKS */
	uint32_t ttl_s;		/* 1..KVPROTO_PIN_TTL_MAX */
	uint32_t flags;		/* KVPROTO_PIN_FLAT or 0 */
	uint32_t pad;
	char label[24];		/* NUL-terminated, may be empty */
};

struct kvproto_pin_r {
	uint32_t id;		/* names it to UNPIN and in kvstat --pins */
	uint32_t resident;	/* blocks of it held now (more follow as they
				 * are published) */
	uint32_t blocks;
	uint32_t pad;
};

struct kvproto_unpin {
	uint32_t id;
	uint32_t flags;		/* none defined: 0 */
};

struct kvproto_fetch {
	uint32_t n;		/* blocks, 1..KVPROTO_MAX_COUNT */
	uint32_t flags;		/* none defined: must be 0 */
	struct kvshm_key parent;	/* the first block's parent key */
};

/* Payload bytes of a FETCH with n blocks of bt tokens. */
static inline uint64_t kvproto_fetch_bytes(uint32_t n, uint32_t bt)
{
	return sizeof(struct kvproto_fetch) +
	       (uint64_t)n * (sizeof(struct kvshm_key) + (uint64_t)bt * 4);
}

struct kvproto_error {
	int32_t err;		/* negative errno */
	uint32_t fatal;		/* 1: the daemon closes the connection */
};

/*
 * Check a received message: header magic, type in range, length within
 * KVPROTO_MAX_LEN, payload exactly the size its counts imply (bt = tokens
 * per block of this connection, for PUBLISH). Returns 0 or -EBADMSG, with
 * *why naming the problem.
 */
int kvproto_decode(const struct kvproto_hdr *h, const void *payload,
		   uint32_t bt, const char **why);

/* Payload bytes of a PUBLISH with n records of bt tokens. */
static inline uint64_t kvproto_pub_bytes(uint32_t n, uint32_t bt)
{
	return sizeof(struct kvproto_count) +
	       (uint64_t)n * (sizeof(struct kvproto_pub) + (uint64_t)bt * 4);
}

_Static_assert(sizeof(struct kvproto_hdr) == 16, "hdr");
_Static_assert(sizeof(struct kvproto_hello) == 392, "hello");
_Static_assert(sizeof(struct kvproto_pub) == 56, "pub");
_Static_assert(sizeof(struct kvproto_claim) == 32, "claim");
_Static_assert(sizeof(struct kvproto_pool_r) == 56, "pool_r");
_Static_assert(sizeof(struct kvproto_fetch) == 24, "fetch");
_Static_assert(sizeof(struct kvproto_admin) == 144, "admin");
_Static_assert(sizeof(struct kvproto_admin_r) == 32, "admin_r");
_Static_assert(sizeof(struct kvproto_pin) == 40, "pin");


/*
 * The namespace a HELLO declares, checked the same way on both ends: dtype
 * 1, 2, 4 or 8 bytes, layers and kv heads 1..4096, head dim 1..65536,
 * block tokens 1..KVSHM_MAX_BLOCK_TOKENS, a known position kind, no flag
 * but KVPROTO_HELLO_ENGINE_KEYS (which makes the namespace's kind ENGINE)
 * and KVPROTO_HELLO_NO_INSERT, and KVPROTO_HELLO_LATENT (layout LATENT:
 * kv heads 1, no K/V split), max_share 0..100, salt_len at most
 * KVPROTO_MAX_SALT, a shard kvproto_part takes, a non-empty NUL-terminated
 * model name; page bytes computed with overflow checked. Fills the
 * identity fields (the pipeline stage, never the tensor-parallel rank),
 * page_bytes and id of *ns (`used` is left 0). Returns 0 or -EINVAL.
 */
int kvproto_hello_ns(const struct kvproto_hello *hi, struct kvshm_ns *ns);

/*
 * Does a namespace whose pages are ns_page bytes waste a pool of slot-byte
 * pages? True when its page, rounded up to the 4 KiB steps of page-size,
 * is at most half a pool page: at least half of every page it takes stays
 * unused, and a daemon with pages that fit would at least halve the
 * memory it needs. Then the sentence the daemon logs and
 * the library puts in the caller's errbuf (NUL-terminated, cut to len) is
 * written to buf: the model, both sizes, the share used and the
 * --page-size that would fit it. False (buf untouched) otherwise.
 */
bool kvproto_page_waste(char *buf, size_t len, const char *model, uint64_t ns_page,
			uint64_t slot);

/*
 * A tensor-parallel rank's part of a namespace's pages (the same
 * arithmetic on both ends of the socket). A page holds every KV head of
 * the model; a rank holds heads [head0, head0 + heads) of them:
 *
 *   SPLIT, tp <= kv_heads: kv_heads / tp heads each (tp divides kv_heads),
 *     every rank writes its own: slice = tp_rank, writers = tp.
 *   SPLIT, tp > kv_heads: heads replicated, one each (kv_heads divides
 *     tp), ranks tp_rank / (tp / kv_heads) hold head that; the first rank
 *     of each such group writes it (one copy per head): writers = kv_heads.
 *   LATENT (MLA, kv_heads 1): every rank holds the whole latent; rank 0
 *     writes it, the others only read: writers = 1.
 *
 * A page with writers > 1 is written by that many ranks, each granted its
 * slice of the same page (daemon/core/slice.c), and becomes READY when the
 * last slice is published. writers is at most KVSHM_MAX_WRITERS.
 */
struct kvproto_part {
	uint32_t head0;		/* first KV head this rank holds */
	uint32_t heads;		/* how many (all of them: 1 for LATENT) */
	uint32_t slice;		/* its slice of a page, < writers (if writes) */
	uint32_t writers;	/* slices that make a page whole, >= 1 */
	bool writes;		/* false: a replica; it reads, never publishes */
};

/*
 * The part of a rank declaring `kv_heads` (the model's), `latent`
 * (KVPROTO_HELLO_LATENT) and shard (sizes 0 or 1: not sharded). Returns 0,
 * or -EINVAL with *why (if not NULL) naming the problem: tp_rank not below
 * tp_size, kv_heads and tp_size that do not divide one another, a latent
 * model with kv_heads other than 1, more than KVSHM_MAX_WRITERS writers.
 */
int kvproto_part(uint32_t kv_heads, bool latent, const struct kvshm_shard *shard,
		 struct kvproto_part *out, const char **why);

/*
 * A namespace identity read from outside (a spill slot, a remote item):
 * into *out, the namespace a HELLO declaring ns's geometry, model, layout
 * and pipeline stage gives (page bytes and id recomputed, the rest zeroed as in a row).
 * Returns 0, or -EINVAL when no HELLO could declare it.
 */
int kvproto_ns_declared(const struct kvshm_ns *ns, struct kvshm_ns *out);

/*
 * The socket path both ends use when none is given: $KVCACHED_SOCKET, else
 * /run/kvcached/kvcached.sock for root, else $XDG_RUNTIME_DIR/kvcached.sock,
 * else /tmp/kvcached-UID/kvcached.sock. Returns 0 or -ENAMETOOLONG.
 */
int kvproto_socket_path(char *buf, size_t len);

/*
 * The path a client (or kvstat) tries: as kvproto_socket_path, except that
 * a non-root process with no $KVCACHED_SOCKET whose per-user socket does
 * not exist uses the system service's /run/kvcached/kvcached.sock when that
 * exists. The daemon itself never falls back (it would collide with the
 * system service).
 */
int kvproto_client_socket_path(char *buf, size_t len);
/* The same with the system socket path given (for tests). */
int kvproto_client_socket_path_in(char *buf, size_t len, const char *sys);

/* Does something accept connections on the Unix socket at path? (The
 * tools and tests that start a daemon wait on it.) */
bool kvproto_can_connect(const char *path);

#endif
