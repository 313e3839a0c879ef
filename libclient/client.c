// SPDX-License-Identifier: MIT
/*
 * client.c - attaching to kvcached: connect, HELLO, receive and map the
 * segment, pool and ledger fds; the socket round trip; close; errors.
 *
 * Everything the daemon sends is checked before use: the HELLO reply's
 * sizes against fstat of the fds it came with, the segment with
 * kvshm_validate, the ledger with kvshm_ledger_validate.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client_int.h"
#include "hostmap.h"
#include "connect.h"
#include "../shm/mapping.h"
#include "../shm/key.h"

static int send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -ENOTCONN;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Header and payload in one sendmsg (one wake-up of the daemon). */
static int send_frame(int fd, const struct kvproto_hdr *h, const void *payload,
		      uint32_t len)
{
	struct iovec iov[2] = { { (void *)h, sizeof(*h) }, { (void *)payload, len } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = len ? 2 : 1 };
	size_t total = sizeof(*h) + len;
	ssize_t n;

	do
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -ENOTCONN;
	if ((size_t)n == total)
		return 0;
	/* A short write (large PUBLISH): finish with plain sends. */
	if ((size_t)n < sizeof(*h)) {
		if (send_all(fd, (const char *)h + n, sizeof(*h) - (size_t)n))
			return -ENOTCONN;
		n = sizeof(*h);
	}
	return send_all(fd, (const char *)payload + ((size_t)n - sizeof(*h)),
			total - (size_t)n);
}

/* Receive exactly len bytes; collect fds passed with them into fds[]. */
static int recv_all(int fd, void *buf, size_t len, int *fds, int *nfds)
{
	char *p = buf;

	while (len) {
		char cbuf[CMSG_SPACE(sizeof(int) * KVC_MAX_FDS)];
		struct iovec iov = { p, len };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
				     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *cm;
		ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -ENOTCONN;
		for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			int k, cnt;

			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (k = 0; k < cnt; k++) {
				int f;

				memcpy(&f, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
				if (fds && nfds && *nfds < KVC_MAX_FDS)
					fds[(*nfds)++] = f;
				else
					close(f);
			}
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* The stream is out of step: nothing more can be trusted on it. */
void kvci_mark_dead(kvc_t *c)
{
	close(c->fd);
	c->fd = -1;
	atomic_store_explicit(&c->dead, true, memory_order_release);
}

/*
 * Receive the reply to request `seq` (send_rc: how sending it went). A
 * reply that does not parse, or any failure when the send failed and no
 * ERROR explains it, kills the handle.
 */
static int recv_reply(kvc_t *c, uint32_t seq, int send_rc, uint16_t want, void **reply,
		      uint32_t *reply_len, int *fds, int *nfds, char *errbuf, size_t errlen)
{
	struct kvproto_hdr r;
	const char *why;
	void *buf = NULL;
	int rc = send_rc;

	/*
	 * Read even when the send failed: a daemon that refuses us writes its
	 * ERROR and closes, possibly before our request arrived.
	 */
	if (recv_all(c->fd, &r, sizeof(r), fds, nfds)) {
		rc = -ENOTCONN;
		goto out_dead;
	}
	if (rc && r.type != KVPROTO_ERROR)
		goto out_dead;
	if (r.magic != KVPROTO_MAGIC || r.seq != seq || r.len > KVPROTO_MAX_LEN) {
		rc = -EPROTO;
		goto out_dead;
	}
	if (r.len) {
		buf = malloc(r.len);
		if (!buf) {
			rc = -ENOMEM;
			goto out_dead;
		}
		rc = recv_all(c->fd, buf, r.len, fds, nfds);
		if (rc)
			goto out_dead;
	}
	if (kvproto_decode(&r, buf, c->bt, &why)) {
		rc = -EPROTO;
		goto out_dead;
	}
	if (r.type == KVPROTO_ERROR) {
		struct kvproto_error e;

		memcpy(&e, buf, sizeof(e));
		if (errbuf && errlen) {
			size_t m = r.len - sizeof(e);

			if (m >= errlen)
				m = errlen - 1;
			memcpy(errbuf, (char *)buf + sizeof(e), m);
			errbuf[m] = 0;
		}
		free(buf);
		if (e.fatal)
			kvci_mark_dead(c);
		return e.err < 0 && e.err > -4096 ? e.err : -EPROTO;
	}
	if (r.type != want) {
		rc = -EPROTO;
		goto out_dead;
	}
	*reply = buf;
	*reply_len = r.len;
	return 0;

out_dead:
	free(buf);
	kvci_mark_dead(c);
	return rc;
}

/*
 * Alloc-ahead (KVC_OPEN_ALLOC_AHEAD): take in the reply to the ALLOC sent
 * after the last publish, keeping its pages (held in our ledger) for the
 * next kvc_alloc. Called with io_lock held, before anything else is read
 * from the socket. Returns 0, or -errno when the handle died.
 */
static int ahead_collect(kvc_t *c)
{
	struct kvproto_count cnt;
	struct kvproto_pg pg;
	uint32_t seq = c->ahead_seq, rlen, got, k;
	void *reply = NULL;
	int rc;

	c->ahead_seq = 0;
	rc = recv_reply(c, seq, 0, KVPROTO_ALLOC_R, &reply, &rlen, NULL, NULL, NULL, 0);
	if (rc)
		return c->fd < 0 ? rc : 0;	/* a refusal: simply none ahead */
	memcpy(&cnt, reply, sizeof(cnt));
	got = rlen == sizeof(cnt) ? 0 : cnt.n;
	for (k = 0; k < got; k++) {
		uint32_t s;

		memcpy(&pg, (char *)reply + sizeof(cnt) + k * sizeof(pg), sizeof(pg));
		if (pg.page >= c->n_pages || c->n_ahead == c->ahead_cap) {
			free(reply);
			kvci_mark_dead(c);
			return -EPROTO;
		}
		if (!kvci_slots_take(c, NULL, &s, 1))
			s = UINT32_MAX;
		if (s != UINT32_MAX) {
			kvshm_ledger_hold(c->ledger, s, pg.page, pg.gen);
			KVCI_COUNT(c, NULL, pins_held, 1);
		}
		c->ahead[c->n_ahead] = pg;
		c->ahead_slot[c->n_ahead++] = s;
	}
	free(reply);
	return 0;
}

int kvci_ahead_take(kvc_t *c, uint32_t want, struct kvproto_pg *pg, uint32_t *slot)
{
	uint32_t k = 0;
	int rc = 0;

	if (!c->ahead_cap)
		return 0;
	pthread_mutex_lock(&c->io_lock);
	if (c->ahead_seq && c->fd >= 0)
		rc = ahead_collect(c);
	while (!rc && k < want && c->n_ahead) {
		c->n_ahead--;
		pg[k] = c->ahead[c->n_ahead];
		slot[k++] = c->ahead_slot[c->n_ahead];
	}
	pthread_mutex_unlock(&c->io_lock);
	return rc ? rc : (int)k;
}

void kvci_ahead_ask(kvc_t *c, uint32_t n)
{
	struct kvproto_alloc a = { 0, 0 };

	if (!c->ahead_cap || kvc_usable(c))
		return;
	/* Never more than half the pin slots left: the next lookup needs some. */
	if (n > kvci_slots_free(c, NULL) / 2)
		n = kvci_slots_free(c, NULL) / 2;
	pthread_mutex_lock(&c->io_lock);
	if (n > c->ahead_cap - c->n_ahead)
		n = c->ahead_cap - c->n_ahead;
	if (n && c->fd >= 0 && !c->ahead_seq && !c->n_ahead) {
		struct kvproto_hdr h = { KVPROTO_MAGIC, KVPROTO_ALLOC, 0, sizeof(a), ++c->seq };

		a.n = n;
		/* Not waited for: the daemon answers while we go on. */
		if (send_frame(c->fd, &h, &a, sizeof(a)))
			kvci_mark_dead(c);
		else
			c->ahead_seq = h.seq;
	}
	pthread_mutex_unlock(&c->io_lock);
}

static int rpc_fds(kvc_t *c, uint16_t type, const void *payload, uint32_t len,
		   uint16_t want, void **reply, uint32_t *reply_len, int *fds,
		   int *nfds, char *errbuf, size_t errlen)
{
	struct kvproto_hdr h = { KVPROTO_MAGIC, type, 0, len, 0 };
	int rc;

	*reply = NULL;
	*reply_len = 0;
	if (c->fd < 0)
		return -ENOTCONN;
	/* A reply to an alloc-ahead comes first on the stream. */
	if (c->ahead_seq && (rc = ahead_collect(c)))
		return rc;
	h.seq = ++c->seq;
	rc = send_frame(c->fd, &h, payload, len);
	return recv_reply(c, h.seq, rc, want, reply, reply_len, fds, nfds, errbuf, errlen);
}

int kvc_rpc_why(kvc_t *c, uint16_t type, const void *payload, uint32_t len,
		uint16_t want, void **reply, uint32_t *reply_len, char *why, size_t why_len)
{
	int rc;

	*reply = NULL;
	*reply_len = 0;
	if (why && why_len)
		why[0] = 0;
	if ((rc = kvc_usable(c)))
		return rc;
	pthread_mutex_lock(&c->io_lock);
	rc = rpc_fds(c, type, payload, len, want, reply, reply_len, NULL, NULL, why, why_len);
	pthread_mutex_unlock(&c->io_lock);
	return rc;
}

int kvc_rpc(kvc_t *c, uint16_t type, const void *payload, uint32_t len,
	    uint16_t want, void **reply, uint32_t *reply_len)
{
	return kvc_rpc_why(c, type, payload, len, want, reply, reply_len, NULL, 0);
}

static bool zero_resv(const uint64_t *r, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (r[i])
			return false;
	return true;
}

static void comm_name(char *name, size_t len)
{
	FILE *f = fopen("/proc/self/comm", "r");

	memset(name, 0, len);
	if (f) {
		if (fgets(name, (int)len, f))
			name[strcspn(name, "\n")] = 0;
		fclose(f);
	}
}

/* Everything but the geometry, which kvproto_hello_ns checks. */
static int check_model(const struct kvc_model *m)
{
	size_t nl;

	if (!m || m->size != sizeof(*m) || (m->flags & ~(KVC_MODEL_ENGINE_KEYS | KVC_MODEL_MLA)) ||
	    !m->name ||
	    !zero_resv(m->resv, 3) ||
	    m->shard.tp_rank >= (m->shard.tp_size ? m->shard.tp_size : 1) ||
	    m->shard.pp_rank >= (m->shard.pp_size ? m->shard.pp_size : 1))
		return -EINVAL;
	nl = strnlen(m->name, KVSHM_MODEL_NAME);
	if (!nl || nl >= KVSHM_MODEL_NAME)
		return -EINVAL;
	return 0;
}

static void hello_of(const struct kvc_model *m, const struct kvc_options *o,
		     struct kvproto_hello *hi)
{
	memset(hi, 0, sizeof(*hi));
	hi->version = KVPROTO_VERSION;
	hi->flags = (m->flags & KVC_MODEL_ENGINE_KEYS ? KVPROTO_HELLO_ENGINE_KEYS : 0) |
		    (m->flags & KVC_MODEL_MLA ? KVPROTO_HELLO_LATENT : 0);
	if (o && (o->flags & KVC_OPEN_NO_INSERT))
		hi->flags |= KVPROTO_HELLO_NO_INSERT;
	if (o && o->salt_len) {
		hi->salt_len = (uint32_t)o->salt_len;
		memcpy(hi->salt, o->salt, o->salt_len);
	}
	hi->max_share = o ? o->max_share : 0;
	hi->dtype_bytes = m->dtype_bytes;
	hi->layers = m->layers;
	hi->kv_heads = m->kv_heads;
	hi->head_dim = m->head_dim;
	hi->block_tokens = m->block_tokens;
	hi->pos_kind = m->pos_kind;
	hi->max_pins = o ? o->max_pins : 0;
	hi->shard.tp_rank = m->shard.tp_rank;
	hi->shard.tp_size = m->shard.tp_size;
	hi->shard.pp_rank = m->shard.pp_rank;
	hi->shard.pp_size = m->shard.pp_size;
	strncpy(hi->model, m->name, sizeof(hi->model) - 1);
	comm_name(hi->name, sizeof(hi->name));
}

static int map_fd(int fd, uint64_t want, int prot, void **out)
{
	struct stat st;
	void *p;

	if (fd < 0 || fstat(fd, &st) || (uint64_t)st.st_size < want || !want)
		return -EPROTO;
	/* At a 2 MiB boundary, so that the daemon's 2 MiB pages are mapped
	 * whole here too (shm/mapping.h). */
	p = kvshm_map(fd, want, prot);
	if (!p)
		return -errno;
	*out = p;
	return 0;
}

/* A cuda pool: ask for its chunk fds (POOL), import and map them. */
static int attach_cuda(kvc_t *c, const struct kvproto_hello_r *hr, const struct kvc_options *o)
{
	struct kvproto_pool q = { KVPROTO_VERSION, 0 };
	struct kvproto_pool_r pr;
	char *errbuf = o ? o->errbuf : NULL;
	size_t errlen = o ? o->errbuf_len : 0;
	int fds[KVC_MAX_FDS], nfds = 0, rc, i;
	void *reply = NULL;
	uint32_t rlen;

	for (i = 0; i < KVC_MAX_FDS; i++)
		fds[i] = -1;
	rc = rpc_fds(c, KVPROTO_POOL, &q, sizeof(q), KVPROTO_POOL_R, &reply, &rlen, fds, &nfds,
		     errbuf, errlen);
	if (rc)
		goto out;
	memcpy(&pr, reply, sizeof(pr));
	rc = -EPROTO;
	if (pr.version != KVPROTO_VERSION || (uint32_t)nfds != pr.n_chunks ||
	    pr.pool_bytes != hr->pool_bytes)
		goto out;
	rc = kvc_gpu_attach(c, &pr, fds, errbuf, errlen);
out:
	for (i = 0; i < KVC_MAX_FDS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(reply);
	return rc;
}

/*
 * Take part in the daemon's membarrier (ledger.h). The kernel keeps the
 * registration per process, across fork and not across exec; asking
 * again is one cheap system call, so a process asks once per pid (a
 * forked child once more). Returns whether this process could not, and
 * must fence its pins.
 */
static bool barrier_join(void)
{
	static _Atomic pid_t joined;
	pid_t me = getpid();

	if (atomic_load_explicit(&joined, memory_order_acquire) == me)
		return false;
	if (kvshm_barrier_register())
		return true;
	atomic_store_explicit(&joined, me, memory_order_release);
	return false;
}

static int attach(kvc_t *c, const struct kvc_model *m, const struct kvc_options *o)
{
	struct kvproto_hello hi;
	struct kvproto_hello_r hr;
	struct kvshm_ns ns;
	int fds[KVC_MAX_FDS], nfds = 0, rc, i;
	void *reply = NULL, *p;
	uint32_t rlen;
	const char *why = "";

	for (i = 0; i < KVC_MAX_FDS; i++)
		fds[i] = -1;
	/* Geometry first: a bad model is -EINVAL whether a daemon runs or not. */
	hello_of(m, o, &hi);
	if (kvproto_part(hi.kv_heads, hi.flags & KVPROTO_HELLO_LATENT, &hi.shard, &c->part, &why)) {
		if (o && o->errbuf && o->errbuf_len)
			snprintf(o->errbuf, o->errbuf_len,
				 "%u KV heads, tensor-parallel rank %u of %u: %s", hi.kv_heads,
				 hi.shard.tp_rank, hi.shard.tp_size, why);
		return -EINVAL;
	}
	if (kvproto_hello_ns(&hi, &ns))
		return -EINVAL;
	/* Whom we reach is checked before any token leaves this process. */
	c->fd = kvc_connect_daemon(o ? o->socket_path : NULL, o ? o->errbuf : NULL,
				   o ? o->errbuf_len : 0);
	if (c->fd < 0) {
		rc = c->fd;
		c->fd = -1;
		return rc;
	}
	rc = rpc_fds(c, KVPROTO_HELLO, &hi, sizeof(hi), KVPROTO_HELLO_R, &reply, &rlen,
		     fds, &nfds, o ? o->errbuf : NULL, o ? o->errbuf_len : 0);
	if (rc)
		goto out;
	memcpy(&hr, reply, sizeof(hr));
	rc = -EPROTO;
	/* A cuda pool's HELLO_R has no pool fd: [segment, ledger]. */
	if (hr.version != KVPROTO_VERSION ||
	    (hr.pool_kind != KVSHM_POOL_HOST && hr.pool_kind != KVSHM_POOL_CUDA) ||
	    nfds != (hr.pool_kind == KVSHM_POOL_HOST ? 3 : 2) || hr.block_tokens != m->block_tokens ||
	    !hr.n_pages || hr.ns_page_bytes > hr.page_bytes ||
	    hr.pool_bytes / hr.n_pages != hr.page_bytes)
		goto out;
	c->client_id = hr.client_id;
	c->ns_id = hr.ns_id;
	c->n_pages = hr.n_pages;
	c->bt = hr.block_tokens;
	c->slot_bytes = hr.page_bytes;
	c->page_bytes = hr.ns_page_bytes;
	c->pool_kind = hr.pool_kind;
	c->layers = ns.layers;
	c->latent = ns.layout == KVSHM_KV_LATENT;
	c->kv_heads = ns.kv_heads;
	c->head_bytes = (uint64_t)ns.head_dim * ns.dtype_bytes;
	c->half = (uint64_t)ns.block_tokens * ns.kv_heads * c->head_bytes;

	if ((rc = map_fd(fds[0], hr.segment_bytes, PROT_READ, &p)))
		goto out;
	c->seg = p;
	c->seg_bytes = hr.segment_bytes;
	if (kvshm_validate(c->seg, c->seg_bytes, &why) ||
	    c->seg->geo.n_pages != hr.n_pages || c->seg->geo.page_bytes != hr.page_bytes ||
	    hr.ns_id >= c->seg->geo.max_ns) {
		rc = -EPROTO;
		goto out;
	}
	c->view = kvshm_view(c->seg);
	c->pin_fence = !(c->seg->flags & KVSHM_F_MEMBARRIER) || barrier_join();
	if (c->pool_kind == KVSHM_POOL_HOST) {
		if ((rc = map_fd(fds[1], hr.pool_bytes, PROT_READ | PROT_WRITE, &p)))
			goto out;
		c->pool = p;
		c->pool_bytes = hr.pool_bytes;
	}
	if ((rc = map_fd(fds[nfds - 1], hr.ledger_bytes, PROT_READ | PROT_WRITE, &p)))
		goto out;
	c->ledger = p;
	c->ledger_bytes = hr.ledger_bytes;
	if (kvshm_ledger_validate(c->ledger, c->ledger_bytes) ||
	    c->ledger->nslots != hr.nslots || !hr.nslots) {
		rc = -EPROTO;
		goto out;
	}
	c->nslots = hr.nslots;
	c->free_slots = malloc(sizeof(uint32_t) * c->nslots);
	if (!c->free_slots) {
		rc = -ENOMEM;
		goto out;
	}
	for (i = 0; i < (int)c->nslots; i++)
		c->free_slots[i] = c->nslots - 1 - (uint32_t)i;
	c->n_free_slots = c->nslots;
	kvci_slots_init(c);

	/* The namespace id is ours to compute, the same way the daemon did. */
	if (ns.page_bytes != hr.ns_page_bytes) {
		rc = -EPROTO;
		goto out;
	}
	c->root = kvshm_key_root(ns.id, o ? o->salt : NULL, o ? o->salt_len : 0);
	c->engine_keys = ns.kind == KVSHM_NS_ENGINE;
	c->no_insert = o && (o->flags & KVC_OPEN_NO_INSERT);
	rc = 0;
	if (c->pool_kind == KVSHM_POOL_CUDA)
		rc = attach_cuda(c, &hr, o);
	/* Attached, but most of each page wasted: say so (kvc_open). */
	if (!rc && o && o->errbuf && o->errbuf_len)
		kvproto_page_waste(o->errbuf, o->errbuf_len, m->name, hr.ns_page_bytes, hr.page_bytes);
out:
	for (i = 0; i < KVC_MAX_FDS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(reply);
	return rc;
}

atomic_uint kvc_fork_gen;

static void atfork_child(void)
{
	atomic_fetch_add_explicit(&kvc_fork_gen, 1, memory_order_relaxed);
}

static void register_atfork(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

int kvc_open(const struct kvc_model *model, const struct kvc_options *opts,
	     kvc_t **out)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	kvc_t *c;
	int rc;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if ((rc = check_model(model)))
		return rc;
	if (opts && (opts->size != sizeof(*opts) ||
		     (opts->flags & ~(KVC_OPEN_ALLOC_AHEAD | KVC_OPEN_NO_INSERT)) ||
		     (opts->flags & KVC_OPEN_ALLOC_AHEAD && opts->flags & KVC_OPEN_NO_INSERT) ||
		     !zero_resv(opts->resv, 3) || opts->pad2 || opts->max_share > 100 ||
		     (opts->salt_len && !opts->salt) ||
		     opts->salt_len > KVC_MAX_SALT || (opts->errbuf_len && !opts->errbuf)))
		return -EINVAL;
	if (opts && opts->errbuf && opts->errbuf_len)
		opts->errbuf[0] = 0;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	pthread_once(&once, register_atfork);
	c->fork_gen = atomic_load(&kvc_fork_gen);
	pthread_mutex_init(&c->io_lock, NULL);
	pthread_mutex_init(&c->slot_lock, NULL);
	rc = attach(c, model, opts);
	/* Not for a rank writing slices: its pages come block by block,
	 * each joined to the page its engine's other ranks write. */
	if (!rc && opts && (opts->flags & KVC_OPEN_ALLOC_AHEAD) && c->part.writers == 1 &&
	    c->part.writes) {
		/* At most 1/16 of the pool and a quarter of our pin slots. */
		c->ahead_cap = c->n_pages / 16 < c->nslots / 4 ? c->n_pages / 16 : c->nslots / 4;
		if (c->ahead_cap > KVPROTO_MAX_COUNT)
			c->ahead_cap = KVPROTO_MAX_COUNT;
		if (!c->ahead_cap)
			c->ahead_cap = 1;
		c->ahead = calloc(c->ahead_cap, sizeof(*c->ahead));
		c->ahead_slot = calloc(c->ahead_cap, sizeof(*c->ahead_slot));
		if (!c->ahead || !c->ahead_slot)
			rc = -ENOMEM;
	}
	if (rc) {
		kvc_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

int kvc_connected(kvc_t *c)
{
	struct pollfd p;
	int rc;

	if (!c)
		return -EINVAL;
	if ((rc = kvc_usable(c)))
		return rc;
	/* A round trip in progress will see for itself. */
	if (pthread_mutex_trylock(&c->io_lock))
		return 0;
	rc = 0;
	if (c->fd < 0) {
		rc = -ENOTCONN;
	} else {
		p.fd = c->fd;
		p.events = POLLRDHUP;
		p.revents = 0;
		if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
			kvci_mark_dead(c);
			rc = -ENOTCONN;
		}
	}
	pthread_mutex_unlock(&c->io_lock);
	return rc;
}

void kvc_close(kvc_t *c)
{
	if (!c)
		return;
	if (c->fd >= 0) {
		/*
		 * BYE tells the daemon we release everything now; without it a
		 * hang-up from a live process keeps its pins in force until the
		 * process exits. A child of fork() must not say BYE for its
		 * parent: it only drops its own copies.
		 */
		if (!kvc_usable(c)) {
			struct kvproto_hdr h = { KVPROTO_MAGIC, KVPROTO_BYE, 0, 0, ++c->seq };

			/* BYE frees our pages at once: no gather or scatter may
			 * still be running on them. */
			kvc_gpu_quiesce(c);
			kvc_hostmap_quiesce(c);

			(void)!send(c->fd, &h, sizeof(h), MSG_NOSIGNAL);
		}
		close(c->fd);
	}
	if (c->seg)
		munmap((void *)c->seg, c->seg_bytes);
	if (c->gpu) {
		kvc_gpu_detach(c);
	} else if (c->pool) {
		kvc_hostmap_close(c);	/* unregisters the pool from CUDA */
		munmap(c->pool, c->pool_bytes);
	}
	kvci_slots_close(c);
	if (c->ledger)
		munmap(c->ledger, c->ledger_bytes);
	free(c->free_slots);
	free(c->ahead);
	free(c->ahead_slot);
	pthread_mutex_destroy(&c->io_lock);
	pthread_mutex_destroy(&c->slot_lock);
	free(c);
}

size_t kvc_page_bytes(const kvc_t *c)
{
	return c ? c->page_bytes : 0;
}

size_t kvc_block_tokens(const kvc_t *c)
{
	return c ? c->bt : 0;
}

int kvc_heads(const kvc_t *c, uint32_t *first, uint32_t *count)
{
	if (!c || !first || !count)
		return -EINVAL;
	*first = c->part.head0;
	*count = c->part.heads;
	return c->part.writes;
}

int kvc_stats(const kvc_t *c, struct kvc_stats *out)
{
	struct kvshm_ledger_counts n;

	if (!c || !out)
		return -EINVAL;
	kvshm_ledger_sum(c->ledger, &n);
	memset(out, 0, sizeof(*out));
	out->lookups = n.lookups;
	out->hit_blocks = n.hit_blocks;
	out->miss_blocks = n.miss_blocks;
	out->lookup_tokens = n.lookup_tokens;
	out->hit_tokens = n.hit_tokens;
	out->pin_failures = n.pin_failures;
	out->pins_held = n.pins_held;
	out->published = n.published;
	out->pages_total = c->n_pages;
	out->pages_free = atomic_load_explicit(&kvshm_stats(c->seg)->pages_free,
					       memory_order_relaxed);
	out->pages_ready = atomic_load_explicit(&kvshm_stats(c->seg)->pages_ready,
						memory_order_relaxed);
	out->pages_writing = atomic_load_explicit(&kvshm_stats(c->seg)->pages_writing,
						  memory_order_relaxed);
	return 0;
}

/*
 * Every error the library names, one row each: the negative errno and what
 * kvc_strerror says (NULL: strerror's text). The Python binding has one
 * exception class per row (kvclient/errors.py); tests/python/
 * test_error_table.py checks the two against each other both ways, and
 * kvc_strerror against the rows.
 */
static const struct error_row {
	int err;
	const char *text;
} errors[] = {
	{ 0, "success" },
	{ -EINVAL, "invalid argument" },
	{ -E2BIG, "too long: a prompt over KVC_MAX_TOKENS, extra keys over KVC_MAX_EXTRA bytes or a label over KVC_MAX_LABEL" },
	{ -ENOMEM, "out of memory" },
	{ -ENAMETOOLONG, "socket path too long" },
	{ -ENOENT, "no kvcached socket at that path (is the daemon running?)" },
	{ -ECONNREFUSED, "kvcached is not accepting connections" },
	{ -EACCES, "permission denied: the socket's mode, or kvcached's allow-users / allow-groups, keep this user out (errbuf says which)" },
	{ -EKEYREJECTED, "refused to trust the socket: its folder, or the user the daemon runs as, is not this user's, root's or the kvcached service user's (errbuf says which)" },
	{ -EDQUOT, "this process, its tenant or its namespace holds its share of the pool (kvcached max-share, tenant or namespace share)" },
	{ -EROFS, "no-insert client: it reads the cache and never publishes (KVC_OPEN_NO_INSERT, or its tenant is no-insert in kvcached's config)" },
	{ -EPROTO, "protocol or shared-memory version mismatch with kvcached" },
	{ -EBADMSG, NULL },	/* a reply or shared memory that does not parse */
	{ -EMEDIUMTYPE, "model geometry does not fit the kvcached pool" },
	{ -EUSERS, "kvcached has too many clients (max-clients)" },
	{ -ENOTCONN, "connection to kvcached lost" },
	{ -ENOSPC, "no free pages or pin slots" },
	{ -EEXIST, "key collision: block refused" },
	{ -ECHILD, "handle inherited across fork(): open a new one in the child" },
	{ -ETOOMANYREFS, "kvcached serves too many models at once (64 namespaces)" },
	{ -ENOTSUP, "not supported here: a cuda pool needs libkvclient built with CUDA, a CUDA driver and a GPU with VMM fd export" },
	{ -ENODEV, "the GPU holding kvcached's pool is not visible to this process (CUDA_VISIBLE_DEVICES?)" },
	{ -EPERM, "block is a shared (hit or published) page: scatter only into pages kvc_alloc granted" },
	{ -EFAULT, "a tensor of the layout is not GPU memory CUDA knows (host pointer for a cuda pool?)" },
	{ -EXDEV, "a tensor of the layout is on another GPU than kvcached's pool" },
	{ -EINPROGRESS, "another client is writing that block now: kvc_wait for it, then kvc_alloc" },
};

const char *kvc_strerror(int err)
{
	size_t i;

	for (i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].err == err)
			return errors[i].text ? errors[i].text : strerror(-err);
	return err < 0 ? strerror(-err) : "not an error code";
}

int kvc_version(void)
{
	return KVC_VERSION_NUMBER;
}

const char *kvc_version_string(void)
{
	return KVC_VERSION_STRING;
}
