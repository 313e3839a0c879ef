// SPDX-License-Identifier: MIT
/*
 * events.c - KV events for cluster routers: every block that enters or
 * leaves a medium (the pool, the spill tier, a remote tier) becomes a
 * vLLM KV cache event, and every tick each namespace's events go out as
 * one KVEventBatch on a ZMQ PUB socket, so that a router that follows
 * vLLM's events (NVIDIA Dynamo's KV router, llm-d's KV cache manager)
 * learns which prefixes this host holds. Each event is written as vLLM
 * 0.24 on writes it (a map, "type" first) or as vLLM up to 0.23 did (a
 * tagged array), --kv-events-format. A dropped namespace is a BlockRemoved
 * per block, never AllBlocksCleared (routers that key by pod clear the
 * whole host on that). docs/EVENTS.md has the format.
 *
 * What it owns: the PUB and replay ROUTER sockets, one queue of pending
 * events per topic (this tick's events in the order they happened,
 * consecutive stores of one chain merged into one BlockStored as vLLM
 * does; namespaces whose topics are equal share a queue), the replay ring
 * of sent batches, and one byte of flags per page and per spill slot (was
 * the block announced in that medium; is its parent the start of a
 * chain).
 *
 * What it must never do: block the main loop, or make the daemon load
 * libzmq when --kv-events is not set. So libzmq is dlopen()ed here only
 * (nothing links it; zmq.h is included for its types and constants), and
 * msgpack-c is used for its packer alone, which is header-only (static
 * inline), so no msgpack library is ever loaded. Every send is
 * ZMQ_DONTWAIT into queues bounded by ZMQ_SNDHWM; libzmq's own I/O
 * thread does the network. The PUB socket runs with ZMQ_XPUB_NODROP, so a
 * full queue is an EAGAIN we count (kv_event_drops) instead of a silent
 * per-subscriber loss; the dropped batch keeps its sequence number (the
 * gap subscribers see) and its place in the replay ring; a subscriber
 * that stops reading for good is then left to lose batches alone
 * (pub_send). Replays are sent a bounded number of bytes at a time and
 * resume on the next tick where a peer's queue is full; a REQ peer gets
 * one batch per request, all a REQ socket can take.
 *
 * The main thread is the only caller; libzmq's threads never call back.
 */
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

static struct kvshm_stats *st_of(struct kvd_ground *g)
{
	return kvshm_stats(g->h);
}

static void put_be64(uint8_t *b, uint64_t v)
{
	int i;

	for (i = 7; i >= 0; i--, v >>= 8)
		b[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *b)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < 8; i++)
		v = v << 8 | b[i];
	return v;
}

const char *kvd_medium_name(const struct kvd_ground *g, enum kvd_medium m)
{
	switch (m) {
	case KVD_MEDIUM_POOL:
		return g->h->pool_kind == KVSHM_POOL_CUDA ? "GPU" : g->cfg->kv_events_host_medium;
	case KVD_MEDIUM_SPILL:
		return "DISK";
	case KVD_MEDIUM_REMOTE:
		return "REMOTE";
	}
	return "UNKNOWN";
}

/* ------------------------------------------------------------- topics */

static bool topic_char(unsigned char c)
{
	return c >= 0x21 && c <= 0x7e;
}

int kvd_events_topic_check(const char *tmpl, const char **why)
{
	const char *p;

	if (strlen(tmpl) >= KVD_TOPIC) {
		*why = "longer than 127 bytes";
		return -EINVAL;
	}
	for (p = tmpl; *p; p++) {
		if (*p == '{') {
			if (strncmp(p, "{host}", 6) && strncmp(p, "{model}", 7)) {
				*why = "'{' must start {host} or {model}";
				return -EINVAL;
			}
			p = strchr(p, '}');
		} else if (*p == '}') {
			*why = "'}' without {host} or {model}";
			return -EINVAL;
		} else if (!topic_char((unsigned char)*p)) {
			*why = "only printable ASCII without spaces";
			return -EINVAL;
		}
	}
	return 0;
}

/* Append s to out (at *n, room len - 1), made topic-safe. */
static void topic_put(char *out, size_t len, size_t *n, const char *s, bool clean)
{
	for (; *s && *n + 1 < len; s++)
		out[(*n)++] = !clean || (topic_char((unsigned char)*s) && *s != '@') ? *s : '_';
}

int kvd_events_topic(const char *tmpl, const char *host, const char *model, char *out,
		     size_t len)
{
	size_t n = 0;
	char one[2] = { 0, 0 };

	if (!len)
		return 0;
	while (*tmpl) {
		if (!strncmp(tmpl, "{host}", 6)) {
			topic_put(out, len, &n, host, true);
			tmpl += 6;
		} else if (!strncmp(tmpl, "{model}", 7)) {
			topic_put(out, len, &n, model, true);
			tmpl += 7;
		} else {
			one[0] = *tmpl++;
			topic_put(out, len, &n, one, false);
		}
	}
	out[n] = 0;
	return (int)n;
}

int kvd_events_medium_check(const char *name, const char **why)
{
	const char *p;

	if (!*name || strlen(name) >= KVD_MEDIUM) {
		*why = "must be 1..15 characters";
		return -EINVAL;
	}
	for (p = name; *p; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
		      (*p >= '0' && *p <= '9') || *p == '_' || *p == '-')) {
			*why = "only letters, digits, '_' and '-'";
			return -EINVAL;
		}
	return 0;
}

/* ------------------------------------------------------------- batches */

static void queue_reset(struct queue *s)
{
	s->nev = s->nkeys = s->ntok = 0;
	s->bytes = 0;
}

static struct rbuf *rbuf_of(const void *data)
{
	return (struct rbuf *)((uint8_t *)data - offsetof(struct rbuf, data));
}

static void rbuf_put(struct rbuf *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		free(b);
}

/* libzmq's free function of a replay payload (any thread). */
static void rbuf_release(void *data, void *hint)
{
	(void)hint;
	rbuf_put(rbuf_of(data));
}

static void ring_pop(struct kvd_events *e)
{
	struct rbatch *b = &e->ring[e->ring_head];

	e->ring_bytes -= b->len;
	rbuf_put(rbuf_of(b->data));
	b->data = NULL;
	e->ring_head = (e->ring_head + 1) % e->ring_cap;
	e->ring_n--;
}

static struct rbatch *ring_at(struct kvd_events *e, uint32_t i)
{
	return &e->ring[(e->ring_head + i) % e->ring_cap];
}

static void ring_push(struct kvd_events *e, uint64_t seq, const void *p, size_t len)
{
	struct rbatch *b;
	struct rbuf *copy;

	if (!e->ring_cap || len > RING_BYTES)
		return;
	while (e->ring_n && (e->ring_n == e->ring_cap || e->ring_bytes + len > RING_BYTES))
		ring_pop(e);
	copy = malloc(sizeof(*copy) + (len ? len : 1));
	if (!copy)
		return;	/* not replayable: a replay skips it, as a gap */
	atomic_init(&copy->refs, 1);
	copy->len = (uint32_t)len;
	memcpy(copy->data, p, len);
	b = ring_at(e, e->ring_n++);
	b->seq = seq;
	b->len = (uint32_t)len;
	b->data = copy->data;
	e->ring_bytes += len;
}

static int zsend(struct kvd_events *e, const char *topic, size_t tlen, uint64_t seq,
		 const void *p, size_t len)
{
	uint8_t sb[8];

	put_be64(sb, seq);
	/* NODROP: a subscriber's full queue is EAGAIN at the first part, and
	 * then nothing of the message was queued anywhere. */
	if (e->z.zmq_send(e->pub, topic, tlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return -e->z.zmq_errno();
	if (e->z.zmq_send(e->pub, sb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    e->z.zmq_send(e->pub, p, len, ZMQ_DONTWAIT) < 0)
		return -e->z.zmq_errno();
	return 0;
}

/* Never 0 (0: not stalled). */
static uint64_t now_ms(void)
{
	return kvd_now_ms() + 1;
}

static void set_lossy(struct kvd_ground *g, bool lossy)
{
	struct kvd_events *e = g->events;
	int v = !lossy;

	if (e->z.zmq_setsockopt(e->pub, ZMQ_XPUB_NODROP, &v, sizeof(v)))
		return;
	e->lossy = lossy;
	e->lossy_since = now_ms();
	atomic_store_explicit(&st_of(g)->kv_events_lossy, lossy, memory_order_relaxed);
}

/*
 * Send one batch on the PUB socket. With NODROP, one subscriber whose
 * queue is full makes every batch fail (counted; every subscriber sees
 * the gap and can replay it). So that one subscriber that stopped reading
 * cannot starve the others for ever, a queue full for longer than
 * kv-events-stall-ms turns NODROP off: from then on only that subscriber
 * loses batches (ZMQ's PUB drops for it alone, and nobody can count
 * them). Every 10 x kv-events-stall-ms NODROP goes on again for one
 * batch: if it still fails, back off at once; if not, every loss is
 * counted again.
 */
static int pub_send(struct kvd_ground *g, const char *topic, size_t tlen, uint64_t seq,
		    const void *p, size_t len)
{
	struct kvd_events *e = g->events;
	uint32_t grace = g->cfg->kv_events_stall_ms;
	uint64_t now = now_ms();
	int rc;

	if (e->lossy && now - e->lossy_since >= 10ull * grace) {
		set_lossy(g, false);
		e->probing = true;
	}
	rc = zsend(e, topic, tlen, seq, p, len);
	if (rc != -EAGAIN || e->lossy) {
		if (!rc && e->probing)
			kvd_info("kv events: every subscriber reads again; dropped batches are counted again");
		e->stall_since = 0;
		e->probing = false;
		return rc;
	}
	if (e->probing) {
		e->probing = false;
		set_lossy(g, true);
	} else if (!e->stall_since) {
		e->stall_since = now;
	} else if (grace && now - e->stall_since >= grace) {
		kvd_warn("kv events: a subscriber has not read for %llu ms (its queue of %u batches is full): from now on it alone loses batches, uncounted; the others get them",
			 (unsigned long long)(now - e->stall_since), g->cfg->kv_events_hwm);
		set_lossy(g, true);
	}
	return rc;
}

static void pack_hash(struct kvd_ground *g, msgpack_packer *pk, struct kvshm_key k)
{
	uint8_t b[16];

	switch (g->cfg->kv_events_hash) {
	case KVD_EVENTS_HASH_INT64:
		msgpack_pack_int64(pk, (int64_t)k.lo);
		break;
	case KVD_EVENTS_HASH_BYTES:
		/* XXH128's canonical form: high half first. The low 8 bytes,
		 * read big-endian, are the uint64 form (vLLM's rule). */
		put_be64(b, k.hi);
		put_be64(b + 8, k.lo);
		msgpack_pack_bin_with_body(pk, b, 16);
		break;
	default:
		msgpack_pack_uint64(pk, k.lo);
	}
}

static void pack_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str_with_body(pk, s, strlen(s));
}

/*
 * An event as msgspec encodes vLLM's tagged structs (omit_defaults: the
 * fields with a default, extra_keys, group_idx and the rest, are left
 * out, as msgspec leaves out a default): with array_like (vLLM up to
 * 0.23) an array of the tag and then every field in declaration order;
 * without it (0.24 on) a map of "type" to the tag and then each field's
 * name to its value, in the same order. ev_open starts an event of
 * `fields` fields with its first, block_hashes (both kinds start with
 * it); ev_key names the next field in the map form.
 */
static void ev_key(msgpack_packer *pk, bool map, const char *name)
{
	char b[32];
	size_t n = strlen(name);

	if (!map)
		return;
	b[0] = (char)(0xa0 | n);	/* fixstr: every name here is under 32 */
	memcpy(b + 1, name, n);
	pk->callback(pk->data, b, n + 1);	/* one write, not two */
}

/*
 * Token ids as msgpack unsigned ints, encoded as msgpack-c's
 * msgpack_pack_uint32 encodes them (fixint below 128, then uint8, uint16,
 * uint32), but written in runs of up to 512 bytes through one callback
 * instead of one per token: tokens are most of a batch's bytes.
 */
static void pack_tokens(msgpack_packer *pk, const uint32_t *t, uint32_t n)
{
	uint8_t b[512];
	size_t len = 0;
	uint32_t i;

	msgpack_pack_array(pk, n);
	for (i = 0; i < n; i++) {
		uint32_t v = t[i];

		if (len > sizeof(b) - 5) {
			pk->callback(pk->data, (const char *)b, len);
			len = 0;
		}
		if (v < 0x80) {
			b[len++] = (uint8_t)v;
		} else if (v < 0x100) {
			b[len++] = 0xcc;
			b[len++] = (uint8_t)v;
		} else if (v < 0x10000) {
			b[len++] = 0xcd;
			b[len++] = (uint8_t)(v >> 8);
			b[len++] = (uint8_t)v;
		} else {
			b[len++] = 0xce;
			b[len++] = (uint8_t)(v >> 24);
			b[len++] = (uint8_t)(v >> 16);
			b[len++] = (uint8_t)(v >> 8);
			b[len++] = (uint8_t)v;
		}
	}
	if (len)
		pk->callback(pk->data, (const char *)b, len);
}

static void ev_open(struct kvd_ground *g, msgpack_packer *pk, bool map, const char *tag,
		    uint32_t fields, const struct queue *s, const struct pev *v)
{
	uint32_t i;

	if (map) {
		msgpack_pack_map(pk, fields + 1);
		pack_str(pk, "type");
	} else {
		msgpack_pack_array(pk, fields + 1);
	}
	pack_str(pk, tag);
	ev_key(pk, map, "block_hashes");
	msgpack_pack_array(pk, v->n);
	for (i = 0; i < v->n; i++)
		pack_hash(g, pk, s->keys[v->first + i]);
}

/* One event: BlockStored or BlockRemoved, in the configured form. */
static void pack_event(struct kvd_ground *g, msgpack_packer *pk, const struct queue *s,
		       const struct pev *v)
{
	const char *medium = kvd_medium_name(g, v->medium);
	bool map = g->cfg->kv_events_format == KVD_EVENTS_FORMAT_MAP;
	uint32_t ntok = v->n * g->events->bt;

	if (v->type == EV_REMOVED) {
		ev_open(g, pk, map, "BlockRemoved", 2, s, v);
		ev_key(pk, map, "medium");
		pack_str(pk, medium);
		return;
	}
	ev_open(g, pk, map, "BlockStored", 7, s, v);
	ev_key(pk, map, "parent_block_hash");
	if (v->root)
		msgpack_pack_nil(pk);
	else
		pack_hash(g, pk, v->parent);
	ev_key(pk, map, "token_ids");
	pack_tokens(pk, s->tok + v->tok, ntok);
	ev_key(pk, map, "block_size");
	msgpack_pack_uint32(pk, g->events->bt);
	ev_key(pk, map, "lora_id");
	msgpack_pack_nil(pk);
	ev_key(pk, map, "medium");
	pack_str(pk, medium);
	ev_key(pk, map, "lora_name");
	msgpack_pack_nil(pk);
}

/* msgpack_sbuffer_write, remembering a failed allocation. */
static int sb_write(void *data, const char *buf, size_t len)
{
	struct kvd_events *e = data;

	if (msgpack_sbuffer_write(&e->sb, buf, len)) {
		e->sb_failed = true;
		return -1;
	}
	return 0;
}

/* Encode queue s's events as one KVEventBatch, send it with the next
 * sequence number, keep it for replay, and empty the queue. A batch that
 * could not be encoded (out of memory) is dropped like one that could not
 * be sent: counted, its sequence number spent. */
static void send_queue(struct kvd_ground *g, struct queue *s)
{
	struct kvd_events *e = g->events;
	struct timespec ts;
	msgpack_packer pk;
	uint64_t seq = e->seq++;
	uint32_t k;
	int rc;

	clock_gettime(CLOCK_REALTIME, &ts);
	msgpack_sbuffer_clear(&e->sb);
	e->sb_failed = false;
	msgpack_packer_init(&pk, e, sb_write);
	msgpack_pack_array(&pk, 3);
	msgpack_pack_double(&pk, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);	/* ts */
	msgpack_pack_array(&pk, s->nev);					/* events */
	for (k = 0; k < s->nev; k++)
		pack_event(g, &pk, s, &s->ev[k]);
	msgpack_pack_uint32(&pk, 0);	/* data_parallel_rank */
	if (e->sb_failed)
		rc = -ENOMEM;
	else if (e->sink)
		rc = e->sink(e->sink_arg, s->topic, s->topic_len, seq, e->sb.data, e->sb.size);
	else
		rc = pub_send(g, s->topic, s->topic_len, seq, e->sb.data, e->sb.size);
	if (rc) {
		kvd_stat_add(&st_of(g)->kv_event_drops, 1);
		kvd_debug("kv events: batch %llu (%u events) dropped: %s",
			  (unsigned long long)seq, s->nev, strerror(-rc));
	} else {
		kvd_stat_add(&st_of(g)->kv_event_batches, 1);
		kvd_stat_add(&st_of(g)->kv_events, s->nev);
	}
	if (!e->sb_failed)
		ring_push(e, seq, e->sb.data, e->sb.size);
	queue_reset(s);
}

/* Send every topic's events of this tick, one batch per topic. */
static void flush_all(struct kvd_ground *g)
{
	struct kvd_events *e = g->events;
	uint32_t i;

	for (i = 0; i < e->max_ns; i++)
		if (e->st[i].nev)
			send_queue(g, &e->st[i]);
}

/* Row ns_id's topic, made for the row's current identity; NULL for a
 * muted shard, an engine-keyed namespace or a row out of range. */
static struct row *row_get(struct kvd_ground *g, uint32_t ns_id)
{
	struct kvd_events *e = g->events;
	const struct kvshm_ns *ns;
	struct row *r;
	char model[KVSHM_MODEL_NAME];

	if (ns_id >= e->max_ns)
		return NULL;
	ns = &kvshm_ns(g->h)[ns_id];
	r = &e->rows[ns_id];
	if (!r->known || !kvshm_key_eq(r->id, ns->id)) {
		memcpy(model, ns->model, sizeof(model));
		model[sizeof(model) - 1] = 0;
		r->known = true;
		r->id = ns->id;
		/* One stage speaks for a pipelined model, as vLLM's
		 * scheduler does for its workers: the others hold the same
		 * prefixes. (Tensor-parallel ranks share one namespace.) */
		r->muted = ns->pp_rank > 0 ||
			/* An engine-keyed namespace's "tokens" are digests
			 * of the engine's keys: no router can use them. */
			ns->kind != KVSHM_NS_TOKENS;
		r->topic_len = (uint32_t)kvd_events_topic(g->cfg->kv_events_topic, e->host, model,
							  r->topic, sizeof(r->topic));
	}
	return r->muted ? NULL : r;
}

static bool same_topic(const struct row *r, const struct queue *s)
{
	return r->topic_len == s->topic_len && !memcmp(r->topic, s->topic, r->topic_len);
}

/*
 * The queue of namespace row ns_id's topic (rows that share a topic share
 * one, so their events keep the order they happened in); NULL for a muted
 * shard. A row that now names another namespace (reclaimed) has a new
 * topic: what the old one queued stays queued under the old topic.
 */
static struct queue *queue_get(struct kvd_ground *g, uint32_t ns_id)
{
	struct kvd_events *e = g->events;
	struct row *r = row_get(g, ns_id);
	uint32_t i;

	if (!r)
		return NULL;
	/* At most one non-empty queue per topic: found, or a free one. */
	if (e->st[r->q].nev && same_topic(r, &e->st[r->q]))
		return &e->st[r->q];
	for (i = 0; i < e->max_ns; i++)
		if (e->st[i].nev && same_topic(r, &e->st[i]))
			break;
	if (i == e->max_ns) {
		for (i = 0; i < e->max_ns && e->st[i].nev; i++)
			;
		if (i == e->max_ns) {
			/* More topics in one tick than queues (rows reused
			 * over and over): send them all now. */
			flush_all(g);
			i = 0;
		}
		e->st[i].topic_len = r->topic_len;
		memcpy(e->st[i].topic, r->topic, r->topic_len);
	}
	r->q = i;
	return &e->st[i];
}

static bool grow(void **p, uint32_t *cap, uint64_t need, size_t elem)
{
	uint64_t nc;
	void *np;

	if (need <= *cap)
		return true;
	nc = *cap ? *cap : 64;
	while (nc < need)
		nc *= 2;
	if (nc > UINT32_MAX / 2)
		return false;
	np = realloc(*p, nc * elem);
	if (!np)
		return false;
	*p = np;
	*cap = (uint32_t)nc;
	return true;
}

/*
 * Room in queue s for one more event of one key and ntok tokens;
 * sends the queue's batch first when it is large. False (the event is lost,
 * counted as a dropped batch and a sequence number skipped, so that
 * subscribers see a gap) when memory runs out.
 */
static bool room(struct kvd_ground *g, struct queue *s, uint32_t ntok)
{
	if (s->bytes > BATCH_BYTES)
		send_queue(g, s);
	if (grow((void **)&s->ev, &s->cap_ev, (uint64_t)s->nev + 1, sizeof(*s->ev)) &&
	    grow((void **)&s->keys, &s->cap_keys, (uint64_t)s->nkeys + 1, sizeof(*s->keys)) &&
	    grow((void **)&s->tok, &s->cap_tok, (uint64_t)s->ntok + ntok, sizeof(*s->tok)))
		return true;
	kvd_err("kv events: out of memory; an event is lost (a sequence gap shows it)");
	g->events->seq++;
	kvd_stat_add(&st_of(g)->kv_event_drops, 1);
	return false;
}

static void add_stored(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key,
		       struct kvshm_key parent, bool root, const uint32_t *tokens)
{
	struct queue *s = queue_get(g, ns_id);
	uint32_t bt = g->events->bt;
	struct pev *last;

	if (!s || !room(g, s, bt))
		return;
	last = s->nev ? &s->ev[s->nev - 1] : NULL;
	/* The next block of the chain the last BlockStored holds: extend it
	 * (its keys and tokens are the last ones in the arrays). */
	if (last && last->type == EV_STORED && last->medium == m && !root &&
	    kvshm_key_eq(s->keys[last->first + last->n - 1], parent)) {
		last->n++;
	} else {
		last = &s->ev[s->nev++];
		memset(last, 0, sizeof(*last));
		last->type = EV_STORED;
		last->medium = (uint8_t)m;
		last->root = root;
		last->parent = parent;
		last->first = s->nkeys;
		last->n = 1;
		last->tok = s->ntok;
		s->bytes += 144;	/* the map form's field names too */
	}
	s->keys[s->nkeys++] = key;
	memcpy(s->tok + s->ntok, tokens, (size_t)bt * sizeof(*tokens));
	s->ntok += bt;
	s->bytes += 17 + (size_t)bt * 5;
}

static void add_removed(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key)
{
	struct queue *s = queue_get(g, ns_id);
	struct pev *last;

	if (!s || !room(g, s, 0))
		return;
	last = s->nev ? &s->ev[s->nev - 1] : NULL;
	if (!last || last->type != EV_REMOVED || last->medium != m) {
		last = &s->ev[s->nev++];
		memset(last, 0, sizeof(*last));
		last->type = EV_REMOVED;
		last->medium = (uint8_t)m;
		last->first = s->nkeys;
		s->bytes += 48;
	}
	last->n++;
	s->keys[s->nkeys++] = key;
	s->bytes += 17;
}

/* ------------------------------------------------------------- replay */

int kvd_events_replay_parse(const struct iovec *frames, size_t n, uint64_t *start,
			    const char **why)
{
	if (n != 3) {
		*why = "expected 3 frames: identity, empty delimiter, 8-byte start sequence";
		return -EBADMSG;
	}
	if (!frames[0].iov_len || frames[0].iov_len > 255) {
		*why = "identity frame is empty or longer than 255 bytes";
		return -EBADMSG;
	}
	if (frames[1].iov_len) {
		*why = "second frame is not the empty delimiter";
		return -EBADMSG;
	}
	if (frames[2].iov_len != 8) {
		*why = "start sequence is not 8 bytes (big-endian)";
		return -EBADMSG;
	}
	*start = get_be64(frames[2].iov_base);
	return 0;
}

static const uint8_t end_seq[8] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

/* Reply [identity, "", seq, payload] through fn. */
static int reply4(kvd_events_reply fn, void *arg, const struct replay *r, const uint8_t *seq,
		  const void *p, size_t len)
{
	struct iovec f[4] = {
		{ (void *)r->id, r->idlen }, { NULL, 0 }, { (void *)seq, 8 }, { (void *)p, len },
	};

	return fn(arg, f, 4);
}

/* First ring entry with seq >= want (the ring is in sequence order). */
static uint32_t ring_find(struct kvd_events *e, uint64_t want)
{
	uint32_t lo = 0, hi = e->ring_n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (ring_at(e, mid)->seq < want)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Go on with every replay in progress, up to the byte budget; a peer
 * whose queue is full (EAGAIN) waits for the next round. */
static void replay_pump(struct kvd_ground *g, kvd_events_reply fn, void *arg)
{
	struct kvd_events *e = g->events;
	uint64_t budget = REPLAY_BUDGET;
	uint8_t sb[8];
	int i, rc = 0;

	for (i = 0; i < REPLAYS && budget; i++) {
		struct replay *r = &e->rp[i];
		uint32_t k;

		if (!r->on)
			continue;
		for (k = ring_find(e, r->next); k < e->ring_n && budget; k++) {
			const struct rbatch *b = ring_at(e, k);

			put_be64(sb, b->seq);
			rc = reply4(fn, arg, r, sb, b->data, b->len);
			if (rc)
				break;
			r->next = b->seq + 1;
			r->stalled_ms = 0;
			budget = budget > b->len ? budget - b->len : 0;
		}
		if (!rc && k == e->ring_n)
			rc = reply4(fn, arg, r, end_seq, NULL, 0) == -EAGAIN ? -EAGAIN : 1;
		if (rc == -EAGAIN) {
			/* Its queue is full: it gets more when it reads; one
			 * that reads nothing for REPLAY_STALL_MS is ended. */
			uint64_t now = kvd_now_ms();

			if (!r->stalled_ms)
				r->stalled_ms = now;
			else if (now - r->stalled_ms >= REPLAY_STALL_MS)
				rc = -ETIMEDOUT;
		}
		if (rc && rc != -EAGAIN) {
			r->on = false;	/* done, the peer is gone, or it stalled */
			if (rc == -ETIMEDOUT)
				kvd_stat_add(&st_of(g)->kv_event_replay_errors, 1);
		}
		rc = 0;
	}
}

void kvd_events_replay_frames(struct kvd_ground *g, const struct iovec *frames, size_t n, bool once,
			      kvd_events_reply fn, void *arg)
{
	struct kvd_events *e = g->events;
	struct replay *r = NULL, tmp;
	const char *why = NULL;
	uint64_t start;
	int i;

	if (!frames) {
		replay_pump(g, fn, arg);
		return;
	}
	if (kvd_events_replay_parse(frames, n, &start, &why)) {
		kvd_stat_add(&st_of(g)->kv_event_replay_errors, 1);
		kvd_debug("kv events: replay request refused: %s", why);
		/* A REQ peer waits for an answer: give it the end marker. */
		if (n == 3 && frames[0].iov_len && frames[0].iov_len <= 255) {
			tmp.idlen = (uint32_t)frames[0].iov_len;
			memcpy(tmp.id, frames[0].iov_base, tmp.idlen);
			reply4(fn, arg, &tmp, end_seq, NULL, 0);
		}
		return;
	}
	if (once) {
		/* A REQ socket takes one message per request, and drops
		 * whatever else came when it sends the next: a stream would
		 * reach it with gaps. It gets the first batch from start on
		 * (or the end marker) and asks again from the one after,
		 * one binary search and one send each. */
		uint32_t k = ring_find(e, start);
		uint8_t sb[8];

		kvd_stat_add(&st_of(g)->kv_event_replays, 1);
		tmp.idlen = (uint32_t)frames[0].iov_len;
		memcpy(tmp.id, frames[0].iov_base, tmp.idlen);
		if (k < e->ring_n) {
			const struct rbatch *b = ring_at(e, k);

			put_be64(sb, b->seq);
			reply4(fn, arg, &tmp, sb, b->data, b->len);
		} else {
			reply4(fn, arg, &tmp, end_seq, NULL, 0);
		}
		return;
	}
	/* One replay at a time per peer: asking again while one is in
	 * progress does not restart it (a peer that asked "from 0" again and
	 * again made the daemon send the ring again and again). */
	for (i = 0; i < REPLAYS; i++)
		if (e->rp[i].on && e->rp[i].idlen == frames[0].iov_len &&
		    !memcmp(e->rp[i].id, frames[0].iov_base, e->rp[i].idlen)) {
			kvd_stat_add(&st_of(g)->kv_event_replay_errors, 1);
			kvd_debug("kv events: a replay to that peer is in progress; the request is ignored");
			replay_pump(g, fn, arg);
			return;
		}
	for (i = 0; i < REPLAYS && !r; i++)
		if (!e->rp[i].on)
			r = &e->rp[i];
	if (!r) {
		kvd_stat_add(&st_of(g)->kv_event_replay_errors, 1);
		kvd_debug("kv events: %d replays in progress; one more answered with nothing",
			  REPLAYS);
		tmp.idlen = (uint32_t)frames[0].iov_len;
		memcpy(tmp.id, frames[0].iov_base, tmp.idlen);
		reply4(fn, arg, &tmp, end_seq, NULL, 0);
		return;
	}
	kvd_stat_add(&st_of(g)->kv_event_replays, 1);
	r->on = true;
	r->idlen = (uint32_t)frames[0].iov_len;
	memcpy(r->id, frames[0].iov_base, r->idlen);
	r->next = start;
	r->stalled_ms = 0;
	kvd_debug("kv events: replay from %llu (%u batches buffered)", (unsigned long long)start,
		  e->ring_n);
	replay_pump(g, fn, arg);
}

/* ROUTER send of one reply: -EAGAIN when that peer's queue is full,
 * another -errno when it is gone (ZMQ_ROUTER_MANDATORY). */
static int zreply(void *arg, const struct iovec *f, size_t n)
{
	struct kvd_events *e = arg;
	size_t i;

	for (i = 0; i < n; i++) {
		int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);

		if (i == 3 && f[i].iov_len) {
			/* A batch's payload (only the ring's buffers are ever
			 * sent here): shared with libzmq, not copied. */
			struct rbuf *b = rbuf_of(f[i].iov_base);
			zmq_msg_t m;

			atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
			if (e->z.zmq_msg_init_data(&m, f[i].iov_base, f[i].iov_len, rbuf_release,
						   NULL)) {
				rbuf_put(b);
				return -EIO;
			}
			if (e->z.zmq_msg_send(&m, e->router, flags) < 0) {
				e->z.zmq_msg_close(&m);	/* drops the reference */
				return -EIO;
			}
			continue;
		}
		if (e->z.zmq_send(e->router, f[i].iov_base, f[i].iov_len, flags) < 0)
			return i ? -EIO : -e->z.zmq_errno();
	}
	return 0;
}

/* Is the peer that sent m a REQ socket? ZMTP tells each side the other's
 * socket type at the handshake; libzmq hands it on as the "Socket-Type"
 * property of every message it receives. */
static bool peer_is_req(struct kvd_events *e, zmq_msg_t *m)
{
	const char *t = e->z.zmq_msg_gets(m, "Socket-Type");

	return t && !strcmp(t, "REQ");
}

/* Read one request and answer it; false when none is waiting. At most 4
 * frames are kept; a longer request is refused, and one cut by the
 * per-service limit has its tail read and dropped by later calls. */
static bool read_request(struct kvd_ground *g, uint32_t *parts)
{
	struct kvd_events *e = g->events;
	zmq_msg_t m[4], extra;
	struct iovec f[4];
	size_t n = 0, i;
	bool over = false;
	int more = 1;

	while (e->discarding && *parts < PARTS_PER_SERVICE) {
		e->z.zmq_msg_init(&extra);
		if (e->z.zmq_msg_recv(&extra, e->router, ZMQ_DONTWAIT) < 0) {
			e->z.zmq_msg_close(&extra);
			return false;
		}
		(*parts)++;
		e->discarding = e->z.zmq_msg_more(&extra);
		e->z.zmq_msg_close(&extra);
	}
	if (e->discarding)
		return false;
	while (more && *parts < PARTS_PER_SERVICE) {
		zmq_msg_t *cur = n < 4 ? &m[n] : &extra;

		e->z.zmq_msg_init(cur);
		if (e->z.zmq_msg_recv(cur, e->router, ZMQ_DONTWAIT) < 0) {
			e->z.zmq_msg_close(cur);
			break;
		}
		(*parts)++;
		more = e->z.zmq_msg_more(cur);
		if (n < 4)
			n++;
		else
			over = true, e->z.zmq_msg_close(cur);
	}
	if (!n)
		return false;
	if (more) {
		e->discarding = true;	/* too long to read now: refused */
		kvd_stat_add(&st_of(g)->kv_event_replay_errors, 1);
	} else {
		for (i = 0; i < n; i++) {
			f[i].iov_base = e->z.zmq_msg_data(&m[i]);
			f[i].iov_len = e->z.zmq_msg_size(&m[i]);
		}
		/* Over 4 frames: 4 passed on, refused as the wrong count. */
		(void)over;
		kvd_events_replay_frames(g, f, n, peer_is_req(e, &m[n - 1]), zreply, e);
	}
	for (i = 0; i < n; i++)
		e->z.zmq_msg_close(&m[i]);
	return true;
}

void kvd_events_service(struct kvd_ground *g)
{
	struct kvd_events *e = g->events;
	uint32_t parts = 0;

	if (!e || !e->router)
		return;
	replay_pump(g, zreply, e);
	/* Edge-triggered: drain until ZMQ_EVENTS says nothing is readable
	 * (sends above may have consumed the fd's signal too). What the
	 * limit leaves waits for the next tick, which calls us again. */
	while (parts < PARTS_PER_SERVICE) {
		int ev = 0;
		size_t sz = sizeof(ev);

		if (e->z.zmq_getsockopt(e->router, ZMQ_EVENTS, &ev, &sz) || !(ev & ZMQ_POLLIN))
			break;
		if (!read_request(g, &parts))
			break;
	}
}

/* ------------------------------------------------------------- open/close */

static int setup(struct kvd_ground *g)
{
	struct kvd_events *e = g->events;
	const struct kvshm_geometry *geo = &g->h->geo;

	e->fd = -1;
	e->max_ns = geo->max_ns;
	e->n_pages = geo->n_pages;
	e->n_slots = geo->n_slots;
	e->bt = geo->block_tokens;
	if (gethostname(e->host, sizeof(e->host) - 1) || !e->host[0])
		strcpy(e->host, "localhost");
	e->rows = calloc(e->max_ns ? e->max_ns : 1, sizeof(*e->rows));
	e->st = calloc(e->max_ns ? e->max_ns : 1, sizeof(*e->st));
	e->flags = calloc((size_t)e->n_pages + e->n_slots, 1);
	e->ring_cap = g->cfg->kv_events_buffer;
	e->ring = calloc(e->ring_cap ? e->ring_cap : 1, sizeof(*e->ring));
	msgpack_sbuffer_init(&e->sb);
	if (!e->rows || !e->st || !e->flags || !e->ring) {
		kvd_err("kv events: out of memory");
		return -1;
	}
	atomic_store_explicit(&st_of(g)->kv_events_enabled, 1, memory_order_relaxed);
	return 0;
}

int kvd_events_open_sink(struct kvd_ground *g, kvd_events_sink sink, void *arg)
{
	g->events = calloc(1, sizeof(*g->events));
	if (!g->events)
		return -1;
	g->events->sink = sink;
	g->events->sink_arg = arg;
	if (setup(g)) {
		kvd_events_close(g);
		return -1;
	}
	return 0;
}

static int zopt(struct kvd_events *e, void *s, int opt, int v)
{
	return e->z.zmq_setsockopt(s, opt, &v, sizeof(v));
}

static const char *zerr(struct kvd_events *e)
{
	return e->z.zmq_strerror(e->z.zmq_errno());
}

/* The replay ROUTER socket, bound, its ZMQ_FD in e->fd. */
static int open_router(struct kvd_ground *g)
{
	struct kvd_events *e = g->events;
	int64_t maxmsg = 256;
	size_t sz = sizeof(e->fd);

	e->router = e->z.zmq_socket(e->ctx, ZMQ_ROUTER);
	/* Requests are 3 small frames: a peer that sends a larger frame is
	 * disconnected by libzmq before we see it. ROUTER_MANDATORY: a full
	 * or gone peer is an error we act on, not a silent drop. */
	if (!e->router || zopt(e, e->router, ZMQ_ROUTER_MANDATORY, 1) ||
	    e->z.zmq_setsockopt(e->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) ||
	    zopt(e, e->router, ZMQ_RCVHWM, 64) ||
	    zopt(e, e->router, ZMQ_SNDHWM, REPLAY_HWM) ||
	    zopt(e, e->router, ZMQ_LINGER, 0) ||
	    e->z.zmq_getsockopt(e->router, ZMQ_FD, &e->fd, &sz)) {
		kvd_err("kv-events-replay: ZMQ ROUTER socket: %s", zerr(e));
		return -1;
	}
	if (e->z.zmq_bind(e->router, g->cfg->kv_events_replay)) {
		kvd_err("kv-events-replay %s: cannot bind: %s", g->cfg->kv_events_replay, zerr(e));
		return -1;
	}
	e->router_bound = true;
	return 0;
}

int kvd_events_open(struct kvd_ground *g)
{
	const struct kvd_config *cfg = g->cfg;
	struct kvd_events *e;
	int major = 0, minor = 0, patch = 0;
	sigset_t all, old;

	if (!cfg->kv_events[0])
		return 0;
	e = g->events = calloc(1, sizeof(*e));
	if (!e) {
		kvd_err("kv events: out of memory");
		return -1;
	}
	e->lib = dlopen(ZMQ_LIB, RTLD_NOW | RTLD_LOCAL);
	if (!e->lib) {
		kvd_err("kv-events %s: cannot load %s (install libzmq5): %s", cfg->kv_events, ZMQ_LIB,
			dlerror());
		goto fail;
	}
#define F(n) \
	if (!(e->z.n = (__typeof__(n) *)dlsym(e->lib, #n))) { \
		kvd_err("kv-events: %s has no " #n, ZMQ_LIB); \
		goto fail; \
	}
	ZMQ_FUNCS(F)
#undef F
	e->z.zmq_version(&major, &minor, &patch);
	if (major < 4 || (major == 4 && minor < 2)) {
		kvd_err("kv-events: libzmq %d.%d.%d is too old (4.2 or later)", major, minor, patch);
		goto fail;
	}
	if (setup(g))
		goto fail;
	/* libzmq starts its threads with the first socket: they inherit a
	 * mask that blocks every signal (SIGTERM is the main loop's, through
	 * its signalfd; the main loop blocks it only later). */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	e->ctx = e->z.zmq_ctx_new();
	e->pub = e->ctx ? e->z.zmq_socket(e->ctx, ZMQ_PUB) : NULL;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!e->pub) {
		kvd_err("kv-events: cannot make a ZMQ PUB socket: %s", zerr(e));
		goto fail;
	}
	if (zopt(e, e->pub, ZMQ_SNDHWM, (int)cfg->kv_events_hwm) ||
	    zopt(e, e->pub, ZMQ_XPUB_NODROP, 1) || zopt(e, e->pub, ZMQ_LINGER, 0)) {
		kvd_err("kv-events: ZMQ socket options: %s", zerr(e));
		goto fail;
	}
	if ((cfg->kv_events_connect ? e->z.zmq_connect : e->z.zmq_bind)(e->pub, cfg->kv_events)) {
		kvd_err("kv-events %s: cannot %s: %s", cfg->kv_events,
			cfg->kv_events_connect ? "connect" : "bind", zerr(e));
		goto fail;
	}
	e->pub_bound = !cfg->kv_events_connect;
	if (cfg->kv_events_replay[0] && open_router(g))
		goto fail;
	kvd_info("kv events: %s %s (libzmq %d.%d.%d), topic %s, %s hashes%s%s, replay buffer %u batches",
		 cfg->kv_events_connect ? "connected to" : "publishing on", cfg->kv_events, major,
		 minor, patch, cfg->kv_events_topic,
		 cfg->kv_events_hash == KVD_EVENTS_HASH_INT64 ? "int64" :
		 cfg->kv_events_hash == KVD_EVENTS_HASH_BYTES ? "bytes" : "uint64",
		 cfg->kv_events_replay[0] ? ", replay on " : "", cfg->kv_events_replay,
		 cfg->kv_events_buffer);
	return 0;
fail:
	kvd_events_close(g);
	return -1;
}

/* The socket file of an ipc:// endpoint we bound (not an abstract one,
 * "ipc://@name", which has no file): libzmq leaves it behind. */
static void unlink_ipc(const char *ep)
{
	struct stat st;

	if (strncmp(ep, "ipc://", 6) || ep[6] == '@' || !ep[6])
		return;
	if (!lstat(ep + 6, &st) && S_ISSOCK(st.st_mode))
		unlink(ep + 6);
}

void kvd_events_close(struct kvd_ground *g)
{
	struct kvd_events *e = g->events;
	uint32_t i;

	if (!e)
		return;
	if (e->st && (e->pub || e->sink))
		flush_all(g);
	if (e->router)
		e->z.zmq_close(e->router);
	if (e->pub)
		e->z.zmq_close(e->pub);
	if (e->ctx)
		e->z.zmq_ctx_term(e->ctx);
	if (e->pub_bound)
		unlink_ipc(g->cfg->kv_events);
	if (e->router_bound)
		unlink_ipc(g->cfg->kv_events_replay);
	/* libzmq stays loaded: its threads are gone, unloading gains nothing. */
	for (i = 0; e->st && i < e->max_ns; i++) {
		free(e->st[i].ev);
		free(e->st[i].keys);
		free(e->st[i].tok);
	}
	while (e->ring && e->ring_n)
		ring_pop(e);
	msgpack_sbuffer_destroy(&e->sb);
	free(e->ring);
	free(e->st);
	free(e->rows);
	free(e->flags);
	free(e);
	g->events = NULL;
	atomic_store_explicit(&kvshm_stats(g->h)->kv_events_enabled, 0, memory_order_relaxed);
	atomic_store_explicit(&kvshm_stats(g->h)->kv_events_lossy, 0, memory_order_relaxed);
}

int kvd_events_fd(const struct kvd_ground *g)
{
	return g->events ? g->events->fd : -1;
}

void kvd_events_tick(struct kvd_ground *g)
{
	if (!g->events)
		return;
	flush_all(g);
	kvd_events_service(g);
}

/* ------------------------------------------------------------- hooks */

static uint8_t *slot_flags(struct kvd_events *e, uint32_t slot)
{
	return &e->flags[e->n_pages + slot];
}

/* Does the index hold parent as a block of namespace ns_id (any tier)? */
static bool parent_held(struct kvd_ground *g, uint32_t ns_id, struct kvshm_key parent)
{
	uint32_t loc = kvshm_index_find(g->h, parent);

	if (loc < g->h->geo.n_pages) {
		const struct kvshm_page *p = &kvshm_pages(g->h)[loc];

		return p->ns_id == ns_id && kvshm_key_eq(p->key, parent);
	}
	if (kvshm_loc_is_slot(loc) && (loc & ~KVSHM_LOC_SLOT) < g->h->geo.n_slots) {
		const struct kvshm_slot *s = &kvshm_slots(g->h)[loc & ~KVSHM_LOC_SLOT];

		return s->ns_id == ns_id && kvshm_key_eq(s->key, parent);
	}
	return false;
}

void kvd_events_stored_(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key,
			struct kvshm_key parent, bool root, const uint32_t *tokens)
{
	if (tokens)
		add_stored(g, ns_id, m, key, parent, root, tokens);
}

void kvd_events_removed_(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key)
{
	add_removed(g, ns_id, m, key);
}

/* Announce pool page `page` with root bit `root`. */
static void announce_page(struct kvd_ground *g, uint32_t page, bool root)
{
	const struct kvshm_page *p = &kvshm_pages(g->h)[page];
	struct kvd_events *e = g->events;

	e->flags[page] = root ? F_ROOT : 0;
	if (!queue_get(g, p->ns_id))
		return;
	add_stored(g, p->ns_id, KVD_MEDIUM_POOL, p->key, p->parent, root,
		   kvshm_tokens(g->h, page));
	e->flags[page] |= F_ANNOUNCED;
}

void kvd_events_published_(struct kvd_ground *g, uint32_t page, int status)
{
	const struct kvshm_page *p = &kvshm_pages(g->h)[page];

	if (status != KVSHM_PUBLISHED || page >= g->events->n_pages)
		return;
	/* A client publishes a prompt's misses in order after its hits,
	 * which it holds pinned: a parent the index does not hold is the
	 * start of the chain (its namespace or salt root). */
	announce_page(g, page, !parent_held(g, p->ns_id, p->parent));
}

void kvd_events_page_gone_(struct kvd_ground *g, uint32_t page)
{
	const struct kvshm_page *p = &kvshm_pages(g->h)[page];
	struct kvd_events *e = g->events;

	if (e->flags[page] & F_ANNOUNCED)
		add_removed(g, p->ns_id, KVD_MEDIUM_POOL, p->key);
	e->flags[page] &= (uint8_t)~F_ANNOUNCED;
}

void kvd_events_spilled_(struct kvd_ground *g, uint32_t page, uint32_t slot)
{
	const struct kvshm_page *p = &kvshm_pages(g->h)[page];
	struct kvd_events *e = g->events;
	uint8_t f = e->flags[page];

	if (slot >= e->n_slots)
		return;
	if (f & F_ANNOUNCED)
		add_removed(g, p->ns_id, KVD_MEDIUM_POOL, p->key);
	e->flags[page] = 0;
	*slot_flags(e, slot) = f & F_ROOT;
	if (!queue_get(g, p->ns_id))
		return;
	/* The page is free now, its identity and tokens still in place. */
	add_stored(g, p->ns_id, KVD_MEDIUM_SPILL, p->key, p->parent, f & F_ROOT,
		   kvshm_tokens(g->h, page));
	*slot_flags(e, slot) |= F_ANNOUNCED;
}

void kvd_events_restored_(struct kvd_ground *g, uint32_t page, uint32_t slot)
{
	const struct kvshm_page *p = &kvshm_pages(g->h)[page];
	struct kvd_events *e = g->events;
	uint8_t f;

	if (slot >= e->n_slots)
		return;
	f = *slot_flags(e, slot);
	if (f & F_ANNOUNCED)
		add_removed(g, p->ns_id, KVD_MEDIUM_SPILL, p->key);
	*slot_flags(e, slot) = 0;
	announce_page(g, page, f & F_ROOT);
}

void kvd_events_slot_gone_(struct kvd_ground *g, uint32_t slot)
{
	struct kvd_events *e = g->events;
	const struct kvshm_slot *s;

	if (slot >= e->n_slots)
		return;
	s = &kvshm_slots(g->h)[slot];
	if (*slot_flags(e, slot) & F_ANNOUNCED)
		add_removed(g, s->ns_id, KVD_MEDIUM_SPILL, s->key);
	*slot_flags(e, slot) = 0;
}

void kvd_events_slot_found_(struct kvd_ground *g, uint32_t slot, const uint32_t *tokens)
{
	struct kvd_events *e = g->events;
	const struct kvshm_slot *s;
	bool root;

	if (slot >= e->n_slots || !tokens)
		return;
	s = &kvshm_slots(g->h)[slot];
	if (s->ns_id >= e->max_ns)
		return;
	/* What was a chain start is not on disk: the unsalted root is
	 * recognised, a salted one is sent as a parent no router has. */
	root = kvshm_key_eq(s->parent, kvshm_key_root(kvshm_ns(g->h)[s->ns_id].id, NULL, 0));
	*slot_flags(e, slot) = root ? F_ROOT : 0;
	if (!queue_get(g, s->ns_id))
		return;
	add_stored(g, s->ns_id, KVD_MEDIUM_SPILL, s->key, s->parent, root, tokens);
	*slot_flags(e, slot) |= F_ANNOUNCED;
}
