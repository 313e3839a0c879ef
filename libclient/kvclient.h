/* SPDX-License-Identifier: MIT */
/*
 * kvclient.h - the one public header of libkvclient, the client side of
 * kvcached, the host-local KV-cache service for LLM inference.
 *
 * A serving process attaches once (kvc_open), declaring its model geometry.
 * For each prompt it makes a request (kvc_req_new), finds the longest cached
 * prefix (kvc_lookup: a pure read of shared memory, no system call), reads
 * the hit pages, asks for pages for the missed blocks (kvc_alloc: one socket
 * round trip), writes their KV, publishes them (kvc_publish: one round trip)
 * and finally releases the request (kvc_req_free: no system call unless
 * pages were left unpublished).
 *
 *	struct kvc_req *r;
 *	kvc_req_new(c, tokens, n, NULL, 0, &r);
 *	int hits = kvc_lookup(r);            // blocks 0..hits-1 are pinned
 *	// ... read kvc_block(r, i) for i < hits, prefill the rest ...
 *	int got = kvc_alloc(r);              // blocks hits..hits+got-1
 *	// ... write each new block's KV into kvc_block(r, i) ...
 *	kvc_publish(r);
 *	kvc_req_free(r);
 *
 * Conventions: every function that can fail returns 0 or a non-negative
 * count on success and a negative errno value on failure; kvc_strerror()
 * turns it into text. Every pointer argument is checked for NULL, every
 * size for zero and overflow; a failed call changes nothing in the cache.
 * A kvc_t may be shared by threads; one kvc_req is used by one thread at a
 * time. kvc_close(NULL) and kvc_req_free(NULL) are harmless no-ops.
 *
 * Page layout inside a block's page: [layer][k|v][token][kv_head][head_dim]
 * in the declared dtype, page bytes = block_tokens x layers x 2 x kv_heads x
 * head_dim x dtype_bytes (kvc_page_bytes()), every KV head of the model
 * whatever its tensor-parallel size; for an MLA model (KVC_MODEL_MLA)
 * [layer][token][head_dim], one latent vector per token and layer.
 */
#ifndef KVCLIENT_H
#define KVCLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The version of kvcached: the daemon, the tools, this library (its file
 * name libkvclient.so.MAJOR.MINOR.PATCH), kvclient.pc and the manual pages
 * all take it from the three numbers below (the Makefile reads them here);
 * the rest is derived.
 */
#define KVC_VERSION_MAJOR 0
#define KVC_VERSION_MINOR 2
#define KVC_VERSION_PATCH 0
/* major * 1000000 + minor * 1000 + patch, as kvc_version() returns */
#define KVC_VERSION_NUMBER \
	(KVC_VERSION_MAJOR * 1000000 + KVC_VERSION_MINOR * 1000 + KVC_VERSION_PATCH)
#define KVC_STRINGIFY_(x) #x
#define KVC_STRINGIFY(x) KVC_STRINGIFY_(x)
/* "MAJOR.MINOR.PATCH", as kvc_version_string() returns */
#define KVC_VERSION_STRING                                                   \
	KVC_STRINGIFY(KVC_VERSION_MAJOR) "." KVC_STRINGIFY(KVC_VERSION_MINOR) "." \
	KVC_STRINGIFY(KVC_VERSION_PATCH)

/* Largest prompt a request takes, in tokens. */
#define KVC_MAX_TOKENS (1u << 22)
/* Longest salt, in bytes. */
#define KVC_MAX_SALT 256
/* Longest extra-key blob (LoRA id, multimodal hashes), in bytes. */
#define KVC_MAX_EXTRA 4096

typedef struct kvc kvc_t;
struct kvc_req;

/* How positions are encoded; part of the namespace identity. */
enum kvc_pos_kind {
	KVC_POS_NONE = 0,
	KVC_POS_ROPE = 1,
	KVC_POS_ALIBI = 2,
	KVC_POS_LEARNED = 3,
};

/*
 * Which part of a model parallelised across processes this client holds:
 * tensor-parallel rank of tp_size ranks, pipeline stage pp_rank of
 * pp_size stages. All zero (the default) means not sharded, the same as
 * tp 0 of 1 and pp 0 of 1.
 *
 * Tensor-parallel ranks share the namespace and its pages, at every TP
 * size: a page holds every KV head of the model (kvc_model.kv_heads is the
 * model's), and each rank moves only its own heads (kvc_heads; kvc_gather
 * and kvc_scatter copy those). With tp_size <= kv_heads (tp_size dividing
 * them) rank r holds heads [r x kv_heads / tp_size, (r + 1) x kv_heads /
 * tp_size) and the ranks of an engine write each page together, each its
 * slice (kvc_publish); with tp_size > kv_heads (kv_heads dividing it) the
 * heads are replicated, rank r holds head r / (tp_size / kv_heads), and
 * only the first rank of each head writes it, so each head is stored once.
 * An MLA model's ranks all hold the whole latent: rank 0 writes, all read.
 * So a prompt an engine at TP 2 published is a hit for one at TP 1, 4 or
 * 8. A pipeline stage holds other layers: the stage is part of the
 * namespace, and each stage has its own pages.
 */
struct kvc_shard {
	uint16_t tp_rank;	/* < tp_size */
	uint16_t tp_size;	/* 0 or 1: no tensor parallelism */
	uint16_t pp_rank;	/* < pp_size */
	uint16_t pp_size;	/* 0 or 1: no pipeline parallelism */
};

/*
 * kvc_model.flags: KVC_MODEL_ENGINE_KEYS declares a namespace whose blocks
 * the engine names by keys of its own (SGLang HiCache's page hashes)
 * instead of by tokens: requests are made with kvc_req_new_keys, each block
 * keyed on its own from its engine key (no chain: a page's key already
 * says which prefix it ends, or the engine does not care). Such a
 * namespace is never the same as a token-keyed one of the same model (the
 * kind is part of its identity), and a hit there is only as exact as the
 * engine's key: kvcached cannot check the tokens it never sees.
 * kvc_req_new and kvc_keys refuse a handle of this kind (-EINVAL), and
 * kvc_req_new_keys a handle of the other. Its requests find spilled and
 * remote blocks as a token-keyed request does (kvc_req_spilled,
 * kvc_req_remote, kvc_restore), so its blocks outlive a daemon restart
 * on the spill and remote tiers.
 */
#define KVC_MODEL_ENGINE_KEYS 0x1u

/*
 * kvc_model.flags: KVC_MODEL_MLA declares multi-head latent attention
 * (DeepSeek-V2/V3/R1, Kimi K2 and their kin): one latent vector of
 * head_dim elements per token per layer (kv_lora_rank plus the rope
 * dimensions: vLLM's MLA cache, one [num_blocks, block_tokens, head_dim]
 * tensor per layer; SGLang's MLA host pool) and no K/V split; kv_heads
 * must be 1. The page is [layer][token][head_dim]. Every tensor-parallel
 * rank holds all of it: rank 0 publishes, every rank reads the same
 * pages (kvc_heads says 0 for the others), so the pool holds one copy,
 * not one per rank. An MLA namespace is never the same as a K/V one.
 */
#define KVC_MODEL_MLA 0x2u

/* Longest engine key, in bytes. */
#define KVC_MAX_ENGINE_KEY 1024

/*
 * The model geometry and identity a client declares: its namespace. KV
 * never crosses namespaces. Every field must be set (shard may be all
 * zero); resv must be zero. `shard` took the place of the first reserved
 * word, so a caller built before it (resv zeroed) declares no shard.
 */
struct kvc_model {
	uint32_t size;		/* sizeof(struct kvc_model) */
	uint32_t flags;		/* KVC_MODEL_ENGINE_KEYS, KVC_MODEL_MLA or 0 */
	const char *name;	/* model name and revision, 1..63 bytes */
	uint32_t dtype_bytes;	/* 1 (fp8), 2 (fp16/bf16), 4 (fp32) or 8 */
	uint32_t layers;	/* 1..4096 (of this pipeline stage) */
	uint32_t kv_heads;	/* 1..4096: the model's, all TP ranks' (1: MLA) */
	uint32_t head_dim;	/* 1..65536 */
	uint32_t block_tokens;	/* must equal the daemon's block-tokens */
	uint32_t pos_kind;	/* enum kvc_pos_kind */
	struct kvc_shard shard;	/* tensor / pipeline parallel part */
	uint64_t resv[3];
};

/*
 * kvc_options.flags: KVC_OPEN_ALLOC_AHEAD. After each kvc_publish the
 * library asks the daemon for as many pages again (at most 1/16 of the
 * pool and a quarter of the handle's pin slots) and does not wait for the
 * answer; the next kvc_alloc takes its pages from there, so a steady
 * stream of prefills pays one round trip per request instead of two. The
 * pages are this handle's, unusable by others, until it uses them or
 * closes: meant for an engine that publishes continuously. Ignored by a
 * tensor-parallel rank that writes a slice of pages its engine's ranks
 * write together (their pages are granted block by block, to every rank).
 */
#define KVC_OPEN_ALLOC_AHEAD 0x1u

/*
 * kvc_options.flags: KVC_OPEN_NO_INSERT. The handle looks up, restores,
 * waits and reads hit pages like any other, and never publishes: its
 * kvc_alloc returns -EROFS (no round trip; kvc_req_message says why), so
 * none of its process's KV is left in the shared cache. For a tenant that
 * may read shared prefixes but must not leave its own KV on the host. (A
 * tenant that must neither read nor write the shared cache opens with a
 * salt of its own: its key space meets nobody's.) The daemon can also
 * make every client of a tenant no-insert (kvcached.conf `tenant`); their
 * kvc_alloc then returns -EROFS with the daemon's reason. Not with
 * KVC_OPEN_ALLOC_AHEAD (-EINVAL).
 */
#define KVC_OPEN_NO_INSERT 0x2u

/* Connection options; pass NULL for all defaults. */
struct kvc_options {
	uint32_t size;		/* sizeof(struct kvc_options) */
	uint32_t flags;		/* KVC_OPEN_ALLOC_AHEAD, KVC_OPEN_NO_INSERT or 0 */
	/* Socket path; NULL: $KVCACHED_SOCKET, else the default path
	 * (/run/kvcached/kvcached.sock for root, $XDG_RUNTIME_DIR/
	 * kvcached.sock otherwise, falling back to the system service's
	 * /run/kvcached/kvcached.sock when no per-user socket exists). */
	const char *socket_path;
	/* Tenant secret mixed into the root of every key chain: only
	 * clients with the same salt hit each other's blocks, and a client
	 * publishes blocks of its own salt's key space only. The daemon is
	 * told it (never kvstat or the metrics): it names the client's
	 * tenant, whose quota and counters kvcached.conf may set. */
	const void *salt;
	size_t salt_len;	/* 0..KVC_MAX_SALT */
	uint32_t max_pins;	/* pin slots wanted; 0: daemon default */
	uint32_t pad;
	/* Where the daemon's reason for refusing a connection is copied
	 * (NUL-terminated), if not NULL. After a kvc_open that succeeded it
	 * is empty, or holds a warning: the model's page fills at most half
	 * of the pool's page, so most of every page it takes stays unused
	 * (the daemon logs the same; kvstat shows the waste). */
	char *errbuf;
	size_t errbuf_len;
	/* Percent of the pool (1..100) this process asks to be held to:
	 * pages it pins or writes, over all its handles, as the daemon's
	 * max-share, which it can lower and never raise; 0: the daemon's.
	 * Took the place of the first reserved word. */
	uint32_t max_share;
	uint32_t pad2;		/* must be zero */
	uint64_t resv[3];
};

/*
 * Attach to kvcached. On success *out is a handle for kvc_close().
 * Errors: -EINVAL (bad model or options, unknown flags, resv not zero),
 * -ENAMETOOLONG (socket path), -ENOENT / -ECONNREFUSED (no daemon),
 * -EACCES (the daemon does not trust this user), -EPROTO (protocol or
 * segment version differs), -EMEDIUMTYPE (geometry does not fit the pool;
 * errbuf says why), -EUSERS (too many clients), -ETOOMANYREFS (64 models
 * with clients attached already), -ENOMEM, or the errno of a failed
 * socket, connect or mmap. A daemon with a cuda pool adds: -ENOTSUP (this
 * library was built without CUDA, or there is no usable CUDA driver or
 * VMM support here), -ENODEV (the pool's GPU is not visible to this
 * process, e.g. CUDA_VISIBLE_DEVICES), -EIO (importing or mapping the
 * pool failed); errbuf says which. -EINVAL also for a shard kv_heads do
 * not split into (tp_size and kv_heads neither dividing the other, an MLA
 * model with kv_heads other than 1, more than 32 ranks writing one page);
 * errbuf says which.
 *
 * A handle belongs to the process that opened it: after fork() the child
 * gets -ECHILD from every call on an inherited handle (and its kvc_close
 * and kvc_req_free leave the parent's pins alone); it opens its own.
 */
int kvc_open(const struct kvc_model *model, const struct kvc_options *opts,
	     kvc_t **out);

/* Detach: releases every pin and unpublished page of the handle. Free the
 * handle's requests first: a kvc_req must not outlive its kvc_t. */
void kvc_close(kvc_t *c);

/* A block's 128-bit key. */
struct kvc_key {
	uint64_t lo;
	uint64_t hi;
};

/*
 * Compute the key chain of the full blocks of tokens[0..n_tokens) under
 * this handle's namespace and salt, mixing `extra` (may be NULL) into every
 * block. Writes min(blocks, max_keys) keys, returns the number of full
 * blocks. Errors: -EINVAL, -E2BIG (over KVC_MAX_TOKENS or KVC_MAX_EXTRA).
 */
int kvc_keys(kvc_t *c, const uint32_t *tokens, size_t n_tokens,
	     const void *extra, size_t extra_len, struct kvc_key *keys,
	     size_t max_keys);

/*
 * Start a request for one prompt: copies the full blocks' tokens and
 * computes their keys. A trailing partial block is not cached.
 * Errors: -EINVAL, -E2BIG, -ENOMEM.
 */
int kvc_req_new(kvc_t *c, const uint32_t *tokens, size_t n_tokens,
		const void *extra, size_t extra_len, struct kvc_req **out);

/*
 * Start a request of an engine-keyed handle (KVC_MODEL_ENGINE_KEYS) for n
 * blocks named by the engine: block i's key is the key_lens[i] bytes at
 * keys + key_lens[0] + ... + key_lens[i-1] (the keys one after another in
 * one buffer). Everything after is as for kvc_req_new: kvc_lookup finds
 * the leading blocks cached (the first key not cached ends the run),
 * kvc_alloc, kvc_block, kvc_gather / kvc_scatter, kvc_publish. Blocks are
 * keyed independently: the same engine key is the same block in every
 * request. Errors: -EINVAL (NULL arguments with n > 0, a key of 0 bytes, a
 * token-keyed handle), -E2BIG (a key over KVC_MAX_ENGINE_KEY bytes, n over
 * KVC_MAX_TOKENS / block tokens), -ENOMEM.
 */
int kvc_req_new_keys(kvc_t *c, const void *keys, const uint32_t *key_lens, size_t n,
		     struct kvc_req **out);

/* Longest label kvc_req_label takes, NUL excluded. */
#define KVC_MAX_LABEL 23

/*
 * Name what this prompt's prefix is ("system-v3", "doc:tables") for the
 * operator: kvstat and /metrics show it next to the hottest prefixes.
 * NULL clears it. Call before kvc_lookup. Errors: -EINVAL (NULL request,
 * or after kvc_lookup), -E2BIG (over KVC_MAX_LABEL bytes).
 */
int kvc_req_label(struct kvc_req *r, const char *label);

/* Full blocks in the request (0 for NULL). */
size_t kvc_req_blocks(const struct kvc_req *r);

/*
 * The request's key chain, as kvc_keys computed it for its tokens and
 * extra keys: writes min(blocks, max_keys) keys, returns the number of
 * full blocks. Errors: -EINVAL (NULL request, NULL keys with max_keys > 0).
 */
int kvc_req_keys(const struct kvc_req *r, struct kvc_key *keys, size_t max_keys);

/*
 * Find and pin the longest cached prefix: no system call, no lock shared
 * with other processes. Returns the number of leading blocks hit (each
 * verified against its parent key and tokens, then pinned), 0..blocks.
 * Call once per request, before kvc_alloc. Errors: -EINVAL (NULL, or
 * called twice or after kvc_alloc), -ENOTCONN (the connection to the
 * daemon has ended: a round trip failed or the daemon refused a message),
 * -ECHILD (handle inherited across fork).
 */
int kvc_lookup(struct kvc_req *r);

/*
 * The spill tier (tier 1). When the daemon spills evicted pages to NVMe
 * (kvcached --spill-dir), a lookup also finds the run of blocks right
 * after the hit prefix that wait on disk. They are neither pinned nor
 * readable yet. The caller chooses: kvc_restore() brings them back in one
 * round trip and pins them as hits; or kvc_alloc() goes on without them
 * and the engine prefills them. kvc_restore_pays() says which is faster.
 */

/* Blocks of the spilled run after the hit prefix (0 for NULL, none, or
 * outside the looked-up stage). */
size_t kvc_req_spilled(const struct kvc_req *r);

/*
 * The remote tier (tier 2). When the daemon shares blocks with other
 * hosts through a remote store (kvcached --remote) and some server of it
 * answers, every block after the hits and the spilled run may be there:
 * the lookup cannot tell without the network, which only the daemon
 * talks to. kvc_req_remote() is that run's length (0 for NULL, no remote
 * tier, no server up, nothing missed, or outside the looked-up stage).
 * kvc_restore() asks for it too, in the same single round trip: the
 * daemon fetches what the store holds (each block checked against its
 * key, parent, tokens and the cluster's MAC; anything that fails is
 * dropped, never served), and the prefix ends at the first block it does
 * not have. That round trip waits for the network, at most about twice
 * the daemon's remote timeout.
 */
size_t kvc_req_remote(const struct kvc_req *r);

/*
 * Restore the spilled run, and the remote run after it (see
 * kvc_req_remote): the daemon reads every block of them into free
 * pages (checking each slot's header and checksum, each remote block's
 * MAC and identity: a bad one is dropped, never served) and publishes
 * them; then they are pinned like hits.
 * Returns the new number of leading hit blocks (at least what kvc_lookup
 * returned; a block that failed, or was evicted again at once, ends the
 * prefix there). Call after kvc_lookup and before kvc_alloc; the round
 * trip waits for the disk reads. Errors: -EINVAL (NULL, or called at
 * another stage), -ENOTCONN, -ECHILD, -ENOMEM, -EPROTO / -EBADMSG, or an
 * error the daemon sent; the spilled blocks are then misses.
 */
int kvc_restore(struct kvc_req *r);

/*
 * Whether restoring the spilled run is expected to take less time than
 * prefilling its tokens, at the caller's prefill speed for this model
 * (prompt tokens per second): restore time = one round trip + spilled
 * blocks x page bytes / restore bandwidth (as the daemon measured it on
 * recent restores; 1 GB/s before the first) + for a remote run, a round
 * trip to the servers and its blocks' bytes / the remote fetch bandwidth
 * the daemon measured (1.1 GB/s before the first), prefill time = blocks
 * x block tokens / prefill_tokens_per_sec. The remote run is counted as
 * if the store held all of it (a miss costs only the round trips).
 * Returns 1 (restore), 0 (prefill, or nothing spilled or remote), or
 * -EINVAL (NULL request, speed not positive).
 */
int kvc_restore_pays(const struct kvc_req *r, double prefill_tokens_per_sec);

/*
 * Single-flight prefill. When several processes get the same new prompt at
 * once, one of them should compute it and the others wait for its pages.
 * kvc_alloc tells the daemon which block each granted page is for, so the
 * daemon announces those blocks as *in flight*; a lookup also finds the
 * run of blocks right after the hit prefix that another client is writing
 * now. They are neither pinned nor readable yet. The caller chooses:
 * kvc_wait() sleeps until they are published (then pins them as hits), or
 * kvc_alloc() goes on and the engine prefills them itself.
 *
 *	hits = kvc_lookup(r);
 *	do {
 *		hits = kvc_wait(r, timeout_ms);	// at once if nothing in flight
 *		if (hits < 0)
 *			break;			// daemon gone: compute, no cache
 *		got = kvc_alloc(r);
 *	} while (got == -EINPROGRESS);		// lost a race: wait for it too
 *
 * The loop ends: the first kvc_wait of a request sets its deadline
 * (timeout_ms from then), no later wait of the request sleeps past it,
 * and once it has passed kvc_alloc no longer returns -EINPROGRESS. So a
 * request waits timeout_ms at most in all, however often a writer gives
 * its blocks up and announces them again.
 *
 * A wait holds no lock of the handle (other threads go on), and no pin or
 * page for the blocks it waits for. A writer that releases its pages
 * unpublished, loses its connection or dies wakes its waiters at once:
 * those blocks are misses, to be computed. Blocks this handle itself is
 * writing are never reported (no thread waits for its own handle).
 */

/* Blocks of the run in flight after the hit prefix (0 for NULL, none, or
 * outside the looked-up stage). */
size_t kvc_req_inflight(const struct kvc_req *r);

/*
 * Wait for the run in flight: sleep (a futex on a word of the read-only
 * segment; the daemon keeps no state per waiter) until the blocks are
 * published, their writer gives them up or dies, or timeout_ms pass; pin
 * what was published as hits and go on through any further blocks that
 * are cached or in flight then, within the same deadline. Returns the new
 * number of leading hit blocks (at least what it was). With nothing in
 * flight it returns at once. Call after kvc_lookup (or a kvc_alloc that
 * returned -EINPROGRESS) and before kvc_alloc.
 *
 * After a kvc_wait with timeout_ms > 0 that did not time out, the
 * request is single-flight: its kvc_alloc returns -EINPROGRESS, granting
 * nothing, if another client began writing the first missed block since
 * (a race no lookup can see; the daemon decides who writes). Call
 * kvc_wait again, then kvc_alloc. A timeout of 0, or a wait that timed
 * out, lets kvc_alloc go ahead whatever others write, which bounds that
 * loop by the caller's deadline.
 *
 * The request's first kvc_wait sets its deadline; a later call waits
 * until the earlier of its own timeout and that deadline (see the loop
 * above).
 *
 * A daemon that dies while the caller sleeps is noticed within about a
 * daemon tick (the sleep is cut in slices after which the socket is
 * checked): -ENOTCONN, the handle is dead, the blocks are to be computed.
 *
 * Errors: -EINVAL (NULL request, negative timeout, called at another
 * stage), -ENOTCONN (the daemon is gone, before or during the wait),
 * -ECHILD.
 */
int kvc_wait(struct kvc_req *r, int timeout_ms);

/*
 * Ask the daemon for pages for every block after the hit prefix, in one
 * round trip. Returns how many were granted, starting at the first missed
 * block; fewer than asked when the pool is full of pinned pages, this
 * handle's pin slots run out, or the blocks would not fit one PUBLISH
 * message (16 MiB of records). A tensor-parallel rank whose engine's
 * ranks write each page together (kvc_shard) is granted, per block, the
 * page another rank of its engine began (for its own slice) or a new one;
 * its grant stops at a block it can have neither of (cached meanwhile, or
 * being written by ranks of another TP size, or its slice taken). A rank
 * that writes nothing (replicated heads, an MLA rank other than 0) is
 * granted none: 0 at once, kvc_req_short_reason -EPERM. Errors: -EINVAL (NULL, state), -ENOTCONN
 * (daemon gone), -ECHILD, -ENOMEM, -EPROTO / -EBADMSG (a reply that does
 * not parse), or an error the daemon sent: -EDQUOT (this process, its
 * tenant or its namespace holds its share of the pool; nothing granted),
 * -EROFS (a no-insert handle, KVC_OPEN_NO_INSERT, or a client of a
 * tenant the daemon's config makes no-insert); kvc_req_message says
 * which. -EINPROGRESS only after
 * kvc_wait (single flight, above): nothing granted, the request is back
 * at the looked-up stage with kvc_req_inflight() blocks in flight.
 *
 * When any round trip fails with -ENOTCONN, -EPROTO or -EBADMSG the handle
 * is dead: later calls return -ENOTCONN. Pages pinned before that stay
 * pinned (the daemon honours the pins until this process exits or closes
 * the handle), so pointers from kvc_block remain readable until
 * kvc_req_free.
 */
int kvc_alloc(struct kvc_req *r);

/*
 * Why the last kvc_alloc of r granted pages for fewer blocks than follow
 * the hits (those blocks are computed and not cached): 0 when it granted
 * every one, or before any kvc_alloc; -EDQUOT this process, its tenant or
 * its namespace holds its share of the pool (max-share, a tenant's or a
 * namespace's share: kvc_req_message names it when nothing was granted),
 * -ENOSPC no free page (the pool is
 * full of pinned or half-written pages) or no free pin slot of this
 * handle, -EMSGSIZE more blocks than one PUBLISH message carries,
 * -EBUSY (a rank writing slices) the next block was cached meanwhile, or
 * is being written by ranks of another tensor-parallel size, or its slice
 * by another rank, -EPERM this rank writes nothing (replicated heads, an
 * MLA rank other than 0), -EIO a kvcached too old to say; or the error
 * kvc_alloc returned. -EINVAL for a NULL request. Pure memory work.
 */
int kvc_req_short_reason(const struct kvc_req *r);

/*
 * The reason of the request's last refused round trip, as the daemon (or
 * the library) worded it: why kvc_alloc returned -EROFS or -EDQUOT (the
 * quota it names: the process's max-share, its tenant's share or its
 * namespace's), why kvc_publish or kvc_pin was refused. "" when none (a
 * grant cut short by a limit gives no message: kvc_req_short_reason says
 * which). Valid until the next call on the request or kvc_req_free; never
 * NULL (also "" for a NULL request).
 */
const char *kvc_req_message(const struct kvc_req *r);

/*
 * Where block i's KV lives: a hit page, or a page granted by kvc_alloc
 * (write the block's KV there before kvc_publish). NULL for a block with
 * no page or i out of range. Valid until kvc_req_free(). The pointer is
 * writable because granted pages must be; a hit page is shared with every
 * other client and must only be read. On a cuda pool (kvc_pool_kind) it is
 * a device address on kvc_pool_device()'s GPU, not a host pointer.
 */
void *kvc_block(struct kvc_req *r, size_t i);

/* Pool page index of block i, or -ENOENT / -EINVAL. */
int64_t kvc_block_page(const struct kvc_req *r, size_t i);

/*
 * Publish every granted block, in one round trip. A block some other
 * client published first is replaced by that client's page (identical
 * KV); a block refused (index full, key collision) loses its page. A
 * tensor-parallel rank whose engine's ranks write each page together
 * publishes its slice (its heads): the page stays pinned for it and
 * becomes a hit for everyone when the last rank's slice is published
 * (within kvcached's slice-timeout-ms, else the page is given up and the
 * block is a miss). Returns the number of blocks of the request that are
 * now cached, or have this rank's slice in, and pinned (hits included). Errors: -EINVAL (NULL, nothing granted),
 * -ENOTCONN, -ECHILD, -ENOMEM, -EPROTO / -EBADMSG, or an error the daemon
 * sent.
 */
int kvc_publish(struct kvc_req *r);

/* Release the request: unpin its pages (no system call) and give back
 * granted pages that were never published (one round trip). */
void kvc_req_free(struct kvc_req *r);

/* ------------------------------------------------------------------
 * Moving KV between the pool and an engine's paged cache (issue #6), so
 * that an engine needs no kernel of its own.
 */

/* Where the pool lives. */
enum kvc_pool_kind {
	KVC_POOL_HOST = 1,	/* host memory: kvc_block gives host pointers */
	KVC_POOL_CUDA = 2,	/* GPU memory (CUDA VMM, mapped at attach) */
};

/* KVC_POOL_HOST or KVC_POOL_CUDA; -EINVAL for NULL. */
int kvc_pool_kind(const kvc_t *c);

/* The CUDA device ordinal, as this process numbers its devices, of the
 * GPU holding a cuda pool (its primary context is where kvc_gather and
 * kvc_scatter launch). -ENODEV for a host pool, -EINVAL for NULL. */
int kvc_pool_device(const kvc_t *c);

enum kvc_layout_kind {
	/* Per layer l, a K tensor k[l] and a V tensor v[l], each
	 * [num_blocks, block_tokens, kv_heads, head_dim] of the model's
	 * dtype. */
	KVC_LAYOUT_KV = 1,
	/* Per layer l, one tensor k[l] of [2, num_blocks, block_tokens,
	 * kv_heads, head_dim] (K then V: vLLM's FlashAttention layout);
	 * v is unused (NULL). */
	KVC_LAYOUT_FLASH = 2,
	/* An MLA model (KVC_MODEL_MLA): per layer l, one tensor k[l] of
	 * [num_blocks, block_tokens, head_dim], the latent (vLLM's MLA
	 * cache); v is unused (NULL). */
	KVC_LAYOUT_MLA = 3,
};

/* struct kvc_layout flags. */
enum kvc_layout_flag {
	/*
	 * The tensors are in the memory of CUDA device `device` (its
	 * ordinal in this process). On a host pool this is the GPU engine's
	 * path: the copies run on that GPU as one kernel launch reading or
	 * writing the pool's pages over the bus, once kvc_gpu_prepare has
	 * registered them with CUDA (see there). On a cuda pool the tensors
	 * are device memory anyway; with the flag, `device` must be
	 * kvc_pool_device's.
	 */
	KVC_LAYOUT_DEVICE = 1u << 0,
};

/*
 * An engine's paged KV cache. The tensors are host pointers for a host
 * pool (device pointers with KVC_LAYOUT_DEVICE) and device pointers (on
 * kvc_pool_device's GPU) for a cuda pool. Within one block the engine's
 * layout must be dense, [block_tokens, kv_heads, head_dim] with kv_heads
 * this rank's (kvc_heads: the count), or [block_tokens, head_dim] for MLA;
 * between blocks it may be padded (block_stride). KV and FLASH are for K/V
 * models, MLA for MLA models.
 */
struct kvc_layout {
	uint32_t size;		/* sizeof(struct kvc_layout) */
	uint32_t kind;		/* enum kvc_layout_kind */
	uint32_t flags;		/* enum kvc_layout_flag, or 0 */
	uint32_t layers;	/* must equal the model's layers */
	uint64_t num_blocks;	/* blocks in each engine tensor, >= 1 */
	/* Bytes from one block to the next in a tensor; 0 means dense
	 * (block_tokens x this rank's kv_heads x head_dim x dtype_bytes). */
	uint64_t block_stride;
	void *const *k;		/* [layers]: K (or the FLASH tensor) per layer */
	void *const *v;		/* [layers]: V per layer (KVC_LAYOUT_KV) */
	int32_t device;		/* KVC_LAYOUT_DEVICE: CUDA device ordinal; else 0 */
	uint32_t resv32;	/* must be zero */
	uint64_t resv[3];	/* must be zero */
};

/*
 * Gather: copy the KV of request blocks [first_block, first_block +
 * n_blocks) from their pool pages into the engine's cache, block
 * first_block + j into engine block engine_block_ids[j] (any order, need
 * not be contiguous; for a gather they must be distinct), all layers, K
 * and V (or the latent), in one pass: for hits after kvc_lookup (or any
 * block with a page). Only this rank's heads move (kvc_heads): the engine
 * tensors hold those, the page all of the model's.
 *
 * Host pool and host tensors: runs on the calling thread and is done on
 * return; `stream` is ignored. Cuda pool: queued as one kernel launch on
 * `stream` (a CUstream or cudaStream_t of the primary context of
 * kvc_pool_device's GPU; NULL is the legacy default stream) and returns
 * without waiting. Host pool and a KVC_LAYOUT_DEVICE layout: the same on
 * the layout's GPU, the kernel reading or writing the pool over the bus
 * (pages kvc_gpu_prepare has not registered yet go as driver copies per
 * layer, K and V, which may wait for the stream).
 * engine_block_ids and the layout's arrays are read before the call
 * returns and may be reused at once; the pages must stay pinned until the
 * copy is done, so synchronize the stream before kvc_req_free.
 *
 * Returns 0. Errors: -EINVAL (NULL request or layout while n_blocks > 0,
 * NULL ids, a layout with a wrong size, unknown kind, flags or resv not
 * zero, a K/V kind for an MLA model or MLA for a K/V one, layers other
 * than the model's, num_blocks 0, block_stride smaller
 * than a block, a NULL tensor; the run past the request's blocks; an
 * engine block id outside 0..num_blocks-1), -ENOENT (a block of the run
 * has no page), -ECHILD (handle inherited across fork), -ENOMEM,
 * -EFAULT (GPU copies: a tensor, at its start or at the end of the span
 * num_blocks and block_stride give it, is not memory CUDA knows, e.g. a
 * plain host pointer), -EXDEV (GPU copies: a tensor in another GPU's
 * memory than the GPU copying: kvc_pool_device's, or the layout's device
 * on a host pool; both checked, once per layout, so that the kernel never
 * faults the context), -ENOTSUP (a GPU copy in a library without CUDA or
 * a process without a driver: kvc_gpu_status says which), -ENODEV (a
 * KVC_LAYOUT_DEVICE device this process does not have), -ENOEXEC (the
 * kernels do not load on that GPU), -EIO (the CUDA launch failed). On a
 * host pool without KVC_LAYOUT_DEVICE the tensors must be host memory of
 * that size; that is not checked.
 */
int kvc_gather(struct kvc_req *r, size_t first_block, size_t n_blocks,
	       const struct kvc_layout *l, const int64_t *engine_block_ids,
	       void *stream);

/*
 * Scatter: the other way, engine blocks into the pool pages kvc_alloc
 * granted, before kvc_publish. On a cuda pool, synchronize the stream
 * before kvc_publish (the page is visible to every client once published)
 * and before kvc_req_free of a request whose granted pages it wrote (they
 * go back to the daemon, which hands them out again).
 * Errors: those of kvc_gather, and -EPERM for a block that is a hit or
 * already published (its page is shared and read-only), and for every
 * block of a rank that writes nothing (kvc_heads returned 0).
 */
int kvc_scatter(struct kvc_req *r, size_t first_block, size_t n_blocks,
		const struct kvc_layout *l, const int64_t *engine_block_ids,
		void *stream);

/*
 * Where, and how, kvc_gather_v2 and kvc_scatter_v2 run. Zero-filled with
 * `size` set, it is kvc_gather's and kvc_scatter's behaviour.
 */
struct kvc_copy_opts {
	uint32_t size;		/* sizeof(struct kvc_copy_opts) */
	uint32_t flags;		/* none defined: 0 */
	/* Copy only layers first_layer .. first_layer + layers - 1 (layers 0:
	 * through the last), so that an engine can load and save layer by
	 * layer while it computes. */
	uint32_t first_layer;
	uint32_t layers;
	/* GPU copies: the CUstream / cudaStream_t to queue on (NULL: the
	 * legacy default stream), of the primary context of the GPU they run
	 * on (kvc_pool_device's, or the layout's device). */
	void *stream;
	/* GPU copies: a CUevent / cudaEvent_t of that context, recorded on
	 * `stream` after the copy, or NULL. */
	void *event;
	/* GPU copies: NULL, or one CUevent per layer copied, events[i]
	 * recorded once layer first_layer + i is copied: the copy is then
	 * queued as one launch per layer, in layer order, so that a waiter
	 * on events[i] waits for that layer only. */
	void *const *layer_events;
	uint64_t resv[4];	/* must be zero */
};

/*
 * kvc_gather and kvc_scatter with options (o may be NULL: the defaults).
 * CPU copies (a host pool and host tensors) are done on return and ignore
 * stream and events. Errors: those of kvc_gather / kvc_scatter, and
 * -EINVAL for opts with a wrong size, flags or resv not zero, or layers
 * past the model's.
 */
int kvc_gather_v2(struct kvc_req *r, size_t first_block, size_t n_blocks,
		  const struct kvc_layout *l, const int64_t *engine_block_ids,
		  const struct kvc_copy_opts *o);
int kvc_scatter_v2(struct kvc_req *r, size_t first_block, size_t n_blocks,
		   const struct kvc_layout *l, const int64_t *engine_block_ids,
		   const struct kvc_copy_opts *o);

/* kvc_gpu_prepare flags. */
enum kvc_gpu_flag {
	KVC_GPU_WAIT = 1u << 0,	/* return once the host pool is registered */
};

/*
 * Prepare GPU copies between the pool and tensors on CUDA device `device`,
 * off the request path (an engine calls it when it has allocated its KV
 * cache): the driver loaded, the kernels loaded and warmed up in that
 * GPU's primary context.
 *
 * Host pool: also registers the pool's pages with CUDA
 * (cuMemHostRegister, portable and mapped: page-locked, and readable and
 * writable by kernels over the bus), in chunks of KVC_GPU_CHUNK bytes, by
 * a thread of its own, so that the call returns at once (KVC_GPU_WAIT:
 * once it is done). Registering costs about 0.1 s per GiB of pool (0.37 s
 * for 4 GiB on an H200 host), once per process: a 512 GiB pool takes
 * most of a minute, during which copies are correct but slower: a page
 * in a chunk not yet registered is copied as separate driver copies
 * per layer, K and V (as fast as an engine's own copies from unregistered
 * memory), and the rest by the kernel. If registering fails (the driver
 * refuses, the memory lock limit), the chunks registered so far stay in
 * use, the others are copied that way, and kvc_gpu_status says why.
 * Registered pages stay registered until kvc_close, which unregisters
 * them. The memory is the daemon's pool, already resident; registering
 * pins it for this process too.
 *
 * Cuda pool: device must be kvc_pool_device's; nothing to register.
 *
 * A kvc_gather / kvc_scatter of a KVC_LAYOUT_DEVICE layout on a host pool
 * calls this itself if it was not called (for its device), and then
 * copies per piece until registration has caught up.
 *
 * Returns 0 (registering, or done). Errors: -EINVAL (NULL, unknown flags,
 * a negative device), -ECHILD (handle inherited across fork), -ENOTSUP
 * (no CUDA here: a library built without it, no driver, a driver that
 * does not start; kvc_gpu_status says which), -ENODEV (no such device),
 * -EXDEV (cuda pool: another device than the pool's), -ENOEXEC (the
 * kernels do not load on that GPU), -EIO, -ENOMEM. A second call for
 * another device prepares that device too; the registration, portable,
 * serves every GPU.
 */
int kvc_gpu_prepare(kvc_t *c, int device, uint32_t flags);

#define KVC_GPU_CHUNK (256ull << 20)

/* What kvc_gpu_prepare did. */
struct kvc_gpu_status {
	uint32_t size;		/* set by the caller: sizeof(struct kvc_gpu_status) */
	int32_t state;		/* enum kvc_gpu_state, or the -errno it failed with */
	int32_t device;		/* the device prepared, or -1 */
	uint32_t chunks;	/* host pool: chunks of the pool */
	uint32_t chunks_registered;	/* of those, registered */
	uint32_t resv32;
	uint64_t bytes_registered;
	uint64_t register_ns;	/* time spent registering so far */
	char why[256];		/* a failed state: why, for a log line */
	uint64_t resv[4];
};

enum kvc_gpu_state {
	KVC_GPU_NONE = 0,	/* not prepared */
	KVC_GPU_REGISTERING = 1,	/* host pool: the thread is at work */
	KVC_GPU_READY = 2,	/* every copy runs as kernels */
};

/*
 * Fill *st (st->size set by the caller). Pure memory work. Errors:
 * -EINVAL (NULL, wrong size).
 */
int kvc_gpu_status(const kvc_t *c, struct kvc_gpu_status *st);

/*
 * Order a batch of n prompts (prompts[i], lens[i] tokens) so that prompts
 * sharing a prefix run after the one that publishes it. Only full blocks
 * of block_tokens count. Prompts whose first full block is equal form a
 * group; a prompt with no full block is a group of its own. Groups are
 * numbered 0.. by their earliest prompt. Fills order[0..n) with a
 * permutation of 0..n-1: first the leader of each group (the member
 * sharing the most blocks with another; earliest on ties), group 0 first,
 * then the other members group by group, neighbours sharing the longest
 * prefixes next to each other. Run order[0..groups) first (they share no
 * block) and start each group's others after its leader has published.
 * group_of (may be NULL) gets each prompt's group. Pure computation: no
 * handle, no system call; the same keys (namespace, salt, extra) are the
 * caller's assumption. Returns the number of groups (0 for n = 0).
 * Errors: -EINVAL (NULL prompts, lens or order with n > 0, a NULL prompt
 * with tokens, block_tokens 0), -E2BIG (a prompt over KVC_MAX_TOKENS, n
 * over 2^24), -ENOMEM.
 */
int kvc_group(const uint32_t *const *prompts, const size_t *lens, size_t n,
	      size_t block_tokens, size_t *order, size_t *group_of);

/*
 * Drop every cached block of this handle's namespace (its model geometry
 * and name, every salt): the pool pages nobody pins and its spill slots,
 * in one round trip; pages pinned or being written (by this or another
 * client) stay. For tools that fill a shared daemon with data nobody will
 * look up again (kvbench does this when it is done). Free this handle's
 * requests first, or their pinned pages stay. Returns the number of pool
 * pages dropped. Errors: -EINVAL (NULL), -ENOTCONN, -ECHILD, -EAGAIN (a
 * DROP from this handle in the same daemon tick already), -EPROTO /
 * -EBADMSG, -ENOMEM, or an error the daemon sent.
 */
int kvc_drop_namespace(kvc_t *c);

/*
 * Keep the request's prefix resident for ttl_seconds (1..30 days): the
 * daemon holds the pages of its blocks that are cached now, from block 0
 * on, and each further block as it is published, so that no eviction
 * takes them until the time is up (then they are evictable like any
 * other). For an engine's system prompt: pin the request that published
 * it. The pages count against this handle's tenant's share of the pool,
 * and a pin stops growing at that share. Pinning the same prefix again
 * keeps its id and lasts until the later end. Call at any stage after
 * kvc_req_new; the request may be freed afterwards. At most 64 prefixes
 * are pinned at once, at most 16384 blocks each. Returns the pin's id (>
 * 0; kvstat --pins lists it). Errors: -EINVAL (NULL, no full block, a TTL
 * out of range), -EDQUOT (the tenant holds its share), -ENOSPC (64 pins
 * already), -ENOTCONN, -ECHILD, -ENOMEM, -EPROTO; kvc_req_message says
 * why.
 */
int kvc_pin(struct kvc_req *r, uint32_t ttl_seconds);

/* End a pin of this handle's tenant and namespace before its time: 0, or
 * -EINVAL, -ENOENT (no such pin: ended, expired, another tenant's),
 * -ENOTCONN, -ECHILD. */
int kvc_unpin(kvc_t *c, int id);

/*
 * Is the daemon still there? One poll() of the handle's socket, no round
 * trip: 0 while the connection is up, -ENOTCONN once the daemon has closed
 * it (exited, killed) or the handle died, which it then is (later calls
 * return -ENOTCONN). Lookups read shared memory and need no daemon: pages
 * pinned before it died stay readable, but a caller that must not count on
 * a daemon that is gone (an engine about to promise blocks) asks here
 * first. -EINVAL for NULL, -ECHILD after fork.
 */
int kvc_connected(kvc_t *c);

/* Bytes of one page of this handle's namespace, and of a pool slot. */
size_t kvc_page_bytes(const kvc_t *c);

/*
 * This handle's KV heads in a page: heads [*first, *first + *count) of
 * the model's kv_heads (all of them when not tensor-parallel; 0 and 1 for
 * MLA), the ones kvc_gather and kvc_scatter move. Returns 1 when this
 * rank writes them (it publishes), 0 when another rank of its engine
 * does and it only reads (replicated heads, an MLA rank other than 0),
 * -EINVAL for NULL arguments.
 */
int kvc_heads(const kvc_t *c, uint32_t *first, uint32_t *count);
/* Tokens per block. */
size_t kvc_block_tokens(const kvc_t *c);

/* This handle's own counters. */
struct kvc_stats {
	uint64_t lookups;
	uint64_t hit_blocks;
	uint64_t miss_blocks;
	uint64_t lookup_tokens;	/* prompt tokens looked up */
	uint64_t hit_tokens;	/* of those, served from the cache */
	uint64_t pin_failures;	/* hits lost to a concurrent eviction */
	uint64_t pins_held;
	uint64_t published;
	uint64_t pages_total;	/* pool pages */
	uint64_t pages_free;	/* pool-wide, as the daemon counts them */
	uint64_t pages_ready;	/* pool-wide: indexed, pinnable */
	uint64_t pages_writing;	/* pool-wide: granted, not yet published */
};

/* Errors: -EINVAL. */
int kvc_stats(const kvc_t *c, struct kvc_stats *out);

/*
 * The daemon's own statistics, as kvstat shows them (bindings use these to
 * offer what `kvstat --json` and /metrics show). Both read the handle's
 * read-only mapping of shared memory: no round trip, no lock; counters may
 * be a daemon tick apart from each other, never torn. A handle whose
 * connection ended still reads them.
 */

/* One daemon-wide counter or gauge. */
struct kvc_stat {
	const char *name;	/* as in kvstat --json "counters"; static */
	uint64_t value;
};

/*
 * Fill out[0..min(n, max)) with every counter and gauge, in kvstat's
 * order, and return n, how many this library knows (call with max 0 to
 * size the array). Errors: -EINVAL (NULL handle, NULL out with max > 0),
 * -ECHILD (handle inherited across fork).
 */
int kvc_daemon_stats(const kvc_t *c, struct kvc_stat *out, size_t max);

/*
 * The same snapshot with the per-client rows and the hottest prefixes, in
 * the Prometheus text format the daemon's /metrics serves (what `kvstat
 * --prometheus` prints). Writes at most len bytes, NUL-terminated when len
 * > 0, and returns the length of the whole text, like snprintf (call
 * again with a larger buffer when it is >= len). Errors: -EINVAL (NULL
 * handle, NULL buf with len > 0), -ECHILD, -ENOMEM.
 */
int64_t kvc_daemon_metrics(const kvc_t *c, char *buf, size_t len);

/* Text for a negative return value of any kvc_ function. */
const char *kvc_strerror(int err);

/* KVC_VERSION_NUMBER of the library actually linked. */
int kvc_version(void);
const char *kvc_version_string(void);

#ifdef __cplusplus
}
#endif

#endif
