// SPDX-License-Identifier: MIT
/*
 * events_replay.c - the replay socket (--kv-events-replay): a router
 * asks for the batches from a sequence number on and gets what the ring
 * still holds, paced by a byte budget per tick, then an end marker.
 */
#include "events_int.h"

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

		if (kvd_ev_ring_at(e, mid)->seq < want)
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
			const struct rbatch *b = kvd_ev_ring_at(e, k);

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
			const struct rbatch *b = kvd_ev_ring_at(e, k);

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
			struct rbuf *b = kvd_ev_rbuf_of(f[i].iov_base);
			zmq_msg_t m;

			atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
			if (e->z.zmq_msg_init_data(&m, f[i].iov_base, f[i].iov_len, kvd_ev_rbuf_release,
						   NULL)) {
				kvd_ev_rbuf_put(b);
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
