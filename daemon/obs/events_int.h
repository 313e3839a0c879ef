/* SPDX-License-Identifier: MIT */
/*
 * events_int.h - KV events' state, shared by their files (private):
 * events.c (open, close, the tick, the hooks), events_batch.c (per-topic
 * queues, msgpack batches, sending, the replay ring), events_replay.c
 * (the replay socket) and events_topic.c (topics and medium names).
 */
#ifndef KVD_EVENTS_INT_H
#define KVD_EVENTS_INT_H

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>	/* the packer: static inline, nothing to link */
#include <zmq.h>	/* types and constants; functions come from dlopen */

#include "../../shm/index.h"
#include "../../shm/key.h"
#include "../../shm/page.h"
#include "events.h"
#include "../util/clock.h"
#include "../util/log.h"

#define BATCH_BYTES (256u << 10)	/* a topic's batch is sent early past this */
#define RING_BYTES (64ull << 20)	/* replay ring: at most this many payload bytes */
#define REPLAYS 8			/* replays in progress at once */
#define REPLAY_BUDGET (1u << 20)	/* payload bytes one service sends */
/* Messages (frames) a replay peer may have queued and unread: the ROUTER's
 * high-water mark, so a peer that does not read stops receiving. Payloads
 * are the ring's own buffers, shared, not copies (zmq_msg_init_data). */
#define REPLAY_HWM 64
/* A replay whose peer has read nothing for this long is ended. */
#define REPLAY_STALL_MS 10000
#define PARTS_PER_SERVICE 4096		/* request frames one service reads */
#define TOPIC_MAX 512
#define ZMQ_LIB "libzmq.so.5"

enum { F_ANNOUNCED = 1, F_ROOT = 2 };
enum { EV_STORED, EV_REMOVED };

/* libzmq, as dlopen()ed: each pointer has the type zmq.h declares. */
#define ZMQ_FUNCS(X) X(zmq_ctx_new) X(zmq_ctx_term) X(zmq_socket) X(zmq_close) \
	X(zmq_setsockopt) X(zmq_getsockopt) X(zmq_bind) X(zmq_connect) X(zmq_send) \
	X(zmq_msg_init) X(zmq_msg_recv) X(zmq_msg_data) X(zmq_msg_size) X(zmq_msg_more) \
	X(zmq_msg_close) X(zmq_errno) X(zmq_strerror) X(zmq_version) X(zmq_msg_init_data) \
	X(zmq_msg_send) X(zmq_msg_gets)
struct zapi {
#define F(n) __typeof__(n) *n;
	ZMQ_FUNCS(F)
#undef F
};

/* One pending event; its keys (and tokens) are in its queue's arrays,
 * in order. */
struct pev {
	uint8_t type;
	uint8_t medium;
	bool root;		/* stored: the parent is a chain start: none */
	uint32_t first, n;	/* keys [first, first + n) */
	uint32_t tok;		/* stored: tokens from here, n x block_tokens */
	struct kvshm_key parent;
};

/* A namespace row's topic, made for the identity the row had then. */
struct row {
	bool known;
	bool muted;		/* a shard other than rank 0, stage 0 */
	struct kvshm_key id;
	uint32_t q;		/* the queue of its topic, last time */
	uint32_t topic_len;
	char topic[TOPIC_MAX];
};

/* One topic's events of this tick, in the order they happened. */
struct queue {
	uint32_t topic_len;
	char topic[TOPIC_MAX];
	struct pev *ev;
	uint32_t nev, cap_ev;
	struct kvshm_key *keys;
	uint32_t nkeys, cap_keys;
	uint32_t *tok;
	uint32_t ntok, cap_tok;
	size_t bytes;		/* about what it encodes to */
};

/* A batch's bytes, shared by the ring and the replay messages libzmq
 * still holds (its I/O thread drops their references): freed by the last. */
struct rbuf {
	atomic_uint refs;
	uint32_t len;
	uint8_t data[];
};

/* A sent (or dropped) batch, kept for replay. data is an rbuf's. */
struct rbatch {
	uint64_t seq;
	uint32_t len;
	uint8_t *data;
};

struct replay {
	bool on;
	uint32_t idlen;
	uint8_t id[256];	/* the peer's ROUTER identity */
	uint64_t next;		/* first sequence not sent yet */
	uint64_t stalled_ms;	/* its queue full since (0: it is not) */
};

struct kvd_events {
	void *lib;
	struct zapi z;
	void *ctx, *pub, *router;
	/* ipc:// endpoints we bound: their socket files are ours to remove
	 * when we stop (libzmq leaves them). */
	bool pub_bound, router_bound;
	int fd;			/* router's ZMQ_FD, or -1 */
	bool lossy;		/* NODROP off: a stalled subscriber loses alone */
	bool probing;		/* NODROP on again to see if it still stalls */
	uint64_t stall_since;	/* ms: sends failing since (0: they do not) */
	uint64_t lossy_since;
	bool discarding;	/* in the middle of an oversized request */
	kvd_events_sink sink;
	void *sink_arg;

	uint32_t max_ns, n_pages, n_slots, bt;
	char host[128];
	struct row *rows;	/* max_ns */
	struct queue *st;	/* max_ns queues, one per topic in use */
	uint8_t *flags;		/* n_pages + n_slots */
	uint64_t seq;
	msgpack_sbuffer sb;	/* the batch being encoded */
	bool sb_failed;		/* ... ran out of memory */

	struct rbatch *ring;	/* cfg.kv_events_buffer entries, circular */
	uint32_t ring_cap, ring_head, ring_n;
	uint64_t ring_bytes;
	struct replay rp[REPLAYS];
};

static inline struct kvshm_stats *st_of(struct kvd_ground *g)
{
	return kvshm_stats(g->h);
}

static inline void put_be64(uint8_t *b, uint64_t v)
{
	int i;

	for (i = 7; i >= 0; i--, v >>= 8)
		b[i] = (uint8_t)v;
}

static inline uint64_t get_be64(const uint8_t *b)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < 8; i++)
		v = v << 8 | b[i];
	return v;
}

/* events_batch.c */
struct rbuf *kvd_ev_rbuf_of(const void *data);
void kvd_ev_rbuf_put(struct rbuf *b);
void kvd_ev_rbuf_release(void *data, void *hint);
void kvd_ev_ring_pop(struct kvd_events *e);
struct rbatch *kvd_ev_ring_at(struct kvd_events *e, uint32_t i);
void kvd_ev_flush_all(struct kvd_ground *g);
struct queue *kvd_ev_queue_get(struct kvd_ground *g, uint32_t ns_id);
bool kvd_ev_room(struct kvd_ground *g, struct queue *s, uint32_t ntok);
void kvd_ev_add_stored(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key,
		       struct kvshm_key parent, bool root, const uint32_t *tokens);
void kvd_ev_add_removed(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key);

#endif
