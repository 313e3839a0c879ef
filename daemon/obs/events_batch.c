// SPDX-License-Identifier: MIT
/*
 * events_batch.c - KV events' batches: a queue per topic filled by the
 * hooks, packed with msgpack (vLLM's array or map form) at the tick, sent
 * without blocking, and kept in the replay ring with its sequence number.
 */
#include "events_int.h"

static void queue_reset(struct queue *s)
{
	s->nev = s->nkeys = s->ntok = 0;
	s->bytes = 0;
}

struct rbuf *kvd_ev_rbuf_of(const void *data)
{
	return (struct rbuf *)((uint8_t *)data - offsetof(struct rbuf, data));
}

void kvd_ev_rbuf_put(struct rbuf *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		free(b);
}

/* libzmq's free function of a replay payload (any thread). */
void kvd_ev_rbuf_release(void *data, void *hint)
{
	(void)hint;
	kvd_ev_rbuf_put(kvd_ev_rbuf_of(data));
}

void kvd_ev_ring_pop(struct kvd_events *e)
{
	struct rbatch *b = &e->ring[e->ring_head];

	e->ring_bytes -= b->len;
	kvd_ev_rbuf_put(kvd_ev_rbuf_of(b->data));
	b->data = NULL;
	e->ring_head = (e->ring_head + 1) % e->ring_cap;
	e->ring_n--;
}

struct rbatch *kvd_ev_ring_at(struct kvd_events *e, uint32_t i)
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
		kvd_ev_ring_pop(e);
	copy = malloc(sizeof(*copy) + (len ? len : 1));
	if (!copy)
		return;	/* not replayable: a replay skips it, as a gap */
	atomic_init(&copy->refs, 1);
	copy->len = (uint32_t)len;
	memcpy(copy->data, p, len);
	b = kvd_ev_ring_at(e, e->ring_n++);
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
void kvd_ev_flush_all(struct kvd_ground *g)
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
struct queue *kvd_ev_queue_get(struct kvd_ground *g, uint32_t ns_id)
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
			kvd_ev_flush_all(g);
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
bool kvd_ev_room(struct kvd_ground *g, struct queue *s, uint32_t ntok)
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

void kvd_ev_add_stored(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key,
		       struct kvshm_key parent, bool root, const uint32_t *tokens)
{
	struct queue *s = kvd_ev_queue_get(g, ns_id);
	uint32_t bt = g->events->bt;
	struct pev *last;

	if (!s || !kvd_ev_room(g, s, bt))
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

void kvd_ev_add_removed(struct kvd_ground *g, uint32_t ns_id, enum kvd_medium m, struct kvshm_key key)
{
	struct queue *s = kvd_ev_queue_get(g, ns_id);
	struct pev *last;

	if (!s || !kvd_ev_room(g, s, 0))
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
