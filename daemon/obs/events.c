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
#include "events_int.h"

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
		kvd_ev_flush_all(g);
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
		kvd_ev_ring_pop(e);
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
	kvd_ev_flush_all(g);
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
		kvd_ev_add_stored(g, ns_id, m, key, parent, root, tokens);
}

void kvd_events_removed_(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key)
{
	kvd_ev_add_removed(g, ns_id, m, key);
}

/* Announce pool page `page` with root bit `root`. */
static void announce_page(struct kvd_ground *g, uint32_t page, bool root)
{
	const struct kvshm_page *p = &kvshm_pages(g->h)[page];
	struct kvd_events *e = g->events;

	e->flags[page] = root ? F_ROOT : 0;
	if (!kvd_ev_queue_get(g, p->ns_id))
		return;
	kvd_ev_add_stored(g, p->ns_id, KVD_MEDIUM_POOL, p->key, p->parent, root,
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
		kvd_ev_add_removed(g, p->ns_id, KVD_MEDIUM_POOL, p->key);
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
		kvd_ev_add_removed(g, p->ns_id, KVD_MEDIUM_POOL, p->key);
	e->flags[page] = 0;
	*slot_flags(e, slot) = f & F_ROOT;
	if (!kvd_ev_queue_get(g, p->ns_id))
		return;
	/* The page is free now, its identity and tokens still in place. */
	kvd_ev_add_stored(g, p->ns_id, KVD_MEDIUM_SPILL, p->key, p->parent, f & F_ROOT,
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
		kvd_ev_add_removed(g, p->ns_id, KVD_MEDIUM_SPILL, p->key);
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
		kvd_ev_add_removed(g, s->ns_id, KVD_MEDIUM_SPILL, s->key);
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
	if (!kvd_ev_queue_get(g, s->ns_id))
		return;
	kvd_ev_add_stored(g, s->ns_id, KVD_MEDIUM_SPILL, s->key, s->parent, root, tokens);
	*slot_flags(e, slot) |= F_ANNOUNCED;
}
