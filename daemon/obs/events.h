/* SPDX-License-Identifier: MIT */
/*
 * events.h - KV events for cluster routers: which blocks this host holds,
 * in which medium, published the way vLLM publishes its KV cache events
 * (ZMQ PUB, msgpack batches of BlockStored / BlockRemoved;
 * docs/EVENTS.md has the format). A dropped namespace is a BlockRemoved
 * per block, never AllBlocksCleared: a router that keys by pod clears
 * every model of the host on that.
 *
 * The tiers call one-line hooks where a block enters or leaves a medium;
 * the hooks queue events, and the tick sends each topic's (by default each
 * namespace's) events of that tick as one batch. Every hook is an inline test of g->events and
 * nothing else when --kv-events is not set (and then libzmq is never
 * loaded). Nothing here blocks: sends are ZMQ_DONTWAIT into bounded
 * queues that libzmq's own I/O thread drains; a full queue drops the
 * batch and counts it, and the batch keeps its sequence number (the gap
 * subscribers see) and its place in the replay buffer.
 */
#ifndef KVD_EVENTS_H
#define KVD_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "../../shm/segment.h"
#include "../util/ground.h"

/*
 * Where a block lives, as the events name it (vLLM's `medium`). POOL is
 * the page pool: "GPU" for a cuda pool, "CPU" (or what
 * --kv-events-host-medium says) for a host pool. SPILL is the NVMe spill
 * tier ("DISK"), REMOTE a remote tier ("REMOTE").
 */
enum kvd_medium {
	KVD_MEDIUM_POOL = 0,
	KVD_MEDIUM_SPILL = 1,
	KVD_MEDIUM_REMOTE = 2,
};

/* The medium's name on the wire: "GPU", or a host pool's
 * (--kv-events-host-medium, "CPU" by default); "DISK"; "REMOTE". */
const char *kvd_medium_name(const struct kvd_ground *g, enum kvd_medium m);

/* Is name a medium name (1..15 letters, digits, '_' or '-')? 0, or
 * -EINVAL with *why. */
int kvd_events_medium_check(const char *name, const char **why);

/*
 * Start publishing: load libzmq (dlopen, only now), bind or connect the
 * PUB socket to cfg.kv_events and bind the replay ROUTER socket to
 * cfg.kv_events_replay if set. Needs the segment. Does nothing when
 * cfg.kv_events is empty. Returns 0, or -1 after a log line naming the
 * endpoint and the reason.
 */
int kvd_events_open(struct kvd_ground *g);

/* Send what is queued, close the sockets, unload nothing (libzmq stays
 * mapped until exit), free everything. g->events becomes NULL. */
void kvd_events_close(struct kvd_ground *g);

/* The replay socket's ZMQ_FD for the main loop (edge-triggered), or -1. */
int kvd_events_fd(const struct kvd_ground *g);

/* The main loop: the replay socket's fd was signalled. */
void kvd_events_service(struct kvd_ground *g);

/* End of a tick: send this tick's batches, go on with replays. */
void kvd_events_tick(struct kvd_ground *g);

/*
 * Tests and the fuzzer: publish with no ZMQ at all; every batch goes to
 * sink(arg, topic, topic_len, seq, payload, len), whose return value
 * stands for the send's (0 sent, -EAGAIN queue full: dropped). Settings
 * come from g->cfg as for kvd_events_open. Returns 0 or -1.
 */
typedef int (*kvd_events_sink)(void *arg, const char *topic, size_t topic_len,
			       uint64_t seq, const void *payload, size_t len);
int kvd_events_open_sink(struct kvd_ground *g, kvd_events_sink sink, void *arg);

/*
 * Tests and the fuzzer: the replay request sink(arg, ...) would answer
 * for a request of these frames, as kvd_events_service handles one from
 * the ROUTER socket. Replies go to reply(arg, frames, n) one message at a
 * time (the identity frame first); its return value stands for the send's
 * (-EAGAIN: that peer's queue is full, the replay goes on later). With
 * frames NULL it only goes on with the replays in progress. once: the
 * peer is a REQ socket, which takes one message per request: it gets the
 * first batch from the start sequence on (or the end marker), and asks
 * again from the next.
 */
typedef int (*kvd_events_reply)(void *arg, const struct iovec *frames, size_t n);
void kvd_events_replay_frames(struct kvd_ground *g, const struct iovec *frames, size_t n, bool once,
			      kvd_events_reply reply, void *arg);

/*
 * A replay request as the ROUTER socket delivers it: [identity, empty,
 * 8-byte big-endian start sequence] (a REQ or DEALER peer's envelope).
 * Returns 0 with *start set, or -EBADMSG with *why naming the problem.
 * Pure; the replay fuzz target calls it directly.
 */
int kvd_events_replay_parse(const struct iovec *frames, size_t n, uint64_t *start,
			    const char **why);

/*
 * Expand a topic template for a namespace: {host} and {model} (made
 * printable: bytes outside ASCII 0x21..0x7e and '@' become '_'). Returns
 * the length, or -E2BIG when it does not fit `len` (NUL included).
 * kvd_events_topic_check: is a template valid (only those placeholders,
 * printable, fits)? 0 or -EINVAL with *why.
 */
int kvd_events_topic(const char *tmpl, const char *host, const char *model, char *out,
		     size_t len);
int kvd_events_topic_check(const char *tmpl, const char **why);

/* ------------------------------------------------------------ the hooks */

/* Generic (a tier with its own bookkeeping, e.g. a remote tier): a block
 * of namespace ns_id entered / left a medium. root: its parent is the
 * start of a chain (the namespace or salt root), sent as no parent;
 * tokens: its block_tokens token ids (NULL: nothing is sent). */
void kvd_events_stored_(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m,
			struct kvshm_key key, struct kvshm_key parent, bool root,
			const uint32_t *tokens);
void kvd_events_removed_(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m,
			 struct kvshm_key key);
/* Page and slot hooks: the identity is read from the page table or slot
 * table (and the slot's tokens from `tokens`, where given). */
void kvd_events_published_(struct kvd_ground *g, uint32_t page, int status);
void kvd_events_page_gone_(struct kvd_ground *g, uint32_t page);
void kvd_events_spilled_(struct kvd_ground *g, uint32_t page, uint32_t slot);
void kvd_events_restored_(struct kvd_ground *g, uint32_t page, uint32_t slot);
void kvd_events_slot_gone_(struct kvd_ground *g, uint32_t slot);
void kvd_events_slot_found_(struct kvd_ground *g, uint32_t slot, const uint32_t *tokens);

/* A block of namespace ns_id entered / left medium m (generic). */
static inline void kvd_events_stored(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m,
				     struct kvshm_key key, struct kvshm_key parent, bool root,
				     const uint32_t *tokens)
{
	if (g->events)
		kvd_events_stored_(g, ns_id, m, key, parent, root, tokens);
}

static inline void kvd_events_removed(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m,
				      struct kvshm_key key)
{
	if (g->events)
		kvd_events_removed_(g, ns_id, m, key);
}

/* kvshm_page_publish(page) returned status: when that is KVSHM_PUBLISHED
 * the block is in the pool now (a duplicate or a refusal changes nothing). */
static inline void kvd_events_published(struct kvd_ground *g, uint32_t page, int status)
{
	if (g->events)
		kvd_events_published_(g, page, status);
}

/* The index is about to stop naming page (evicted, its namespace
 * dropped, or its entry given to a newer copy): it leaves the pool, if it
 * was announced there. */
static inline void kvd_events_page_gone(struct kvd_ground *g, uint32_t page)
{
	if (g->events)
		kvd_events_page_gone_(g, page);
}

/* Page's block moved to spill slot `slot` (its entry names the slot now). */
static inline void kvd_events_spilled(struct kvd_ground *g, uint32_t page, uint32_t slot)
{
	if (g->events)
		kvd_events_spilled_(g, page, slot);
}

/* Slot's block was restored into page (READY, indexed as the page). */
static inline void kvd_events_restored(struct kvd_ground *g, uint32_t page, uint32_t slot)
{
	if (g->events)
		kvd_events_restored_(g, page, slot);
}

/* The index is about to stop naming spill slot `slot` (recycled, dropped,
 * its namespace dropped, or given to a newer copy). */
static inline void kvd_events_slot_gone(struct kvd_ground *g, uint32_t slot)
{
	if (g->events)
		kvd_events_slot_gone_(g, slot);
}

/* A spilled block found on disk at start (warm restart); tokens from its
 * slot header. */
static inline void kvd_events_slot_found(struct kvd_ground *g, uint32_t slot, const uint32_t *tokens)
{
	if (g->events)
		kvd_events_slot_found_(g, slot, tokens);
}

#endif
