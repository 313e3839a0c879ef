// SPDX-License-Identifier: MIT
/*
 * registry.c - attached clients: HELLO (namespace, ledger, fd hand-off),
 * STAT and POOL (descriptors handed to an observer or a cuda client),
 * dead-client cleanup, and the per-tick copy of client counters into the
 * segment for kvstat. The namespace table is ns.c's.
 *
 * Cleanup is what makes a crashed client cost the others nothing: when its
 * socket hangs up (exit, SIGKILL, or a protocol violation) every page it
 * held WRITING goes back to the free list and its ledger is unmapped, which
 * is all its pins ever were.
 */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../shm/key.h"
#include "../util/closer.h"
#include "kvd.h"
#include "publish.h"
#include "flight.h"
#include "ns.h"
#include "nsstat.h"
#include "quota.h"
#include "registry.h"
#include "reply.h"
#include "census.h"
#include "top.h"
#include "../util/log.h"

#define RELAXED memory_order_relaxed

static void read_comm(pid_t pid, char *out, size_t len)
{
	char path[64];
	FILE *f;

	memset(out, 0, len);
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return;
	if (fgets(out, (int)len, f))
		out[strcspn(out, "\n")] = 0;
	fclose(f);
}

/* A reply and its descriptors in one sendmsg (the socket is empty then). */
static int send_with_fds(struct kvd_client *c, uint16_t type, uint32_t seq,
			 const void *p, uint32_t len, const int *fds, int nfds)
{
	struct kvproto_hdr h = { KVPROTO_MAGIC, type, 0, len, seq };
	char cbuf[CMSG_SPACE(KVPROTO_MAX_CHUNKS * sizeof(int))];
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)p, len } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2, .msg_control = cbuf,
			     .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int)) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

	memset(cbuf, 0, sizeof(cbuf));
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	return sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) ==
	       (ssize_t)(sizeof(h) + len) ? 0 : -1;
}

int kvd_registry_stat(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		      const void *p)
{
	const uint32_t seq = hdr->seq;
	struct kvproto_stat st;
	struct kvproto_stat_r r = { KVPROTO_VERSION, KVSHM_VERSION, d->h->segment_bytes };

	memcpy(&st, p, sizeof(st));
	if (st.version != KVPROTO_VERSION) {
		kvd_reply_error(d, c, seq, -EPROTO, true, "protocol version %u, this kvcached speaks %u",
				st.version, KVPROTO_VERSION);
		return -1;
	}
	if (send_with_fds(c, KVPROTO_STAT_R, seq, &r, sizeof(r), &d->seg.fd, 1))
		kvd_debug("client %u (pid %d): STAT reply not delivered", c->id, (int)c->pid);
	kvd_client_close(d, c, "observer served", false);
	return -1;
}

/*
 * A model whose page fills at most half of a pool page leaves the rest of
 * every page it takes unused. It is attached anyway (one daemon serves
 * models of different sizes, e.g. a draft model beside its target, and a
 * refusal would force a daemon and a pool per size); the log says so here,
 * the library copies the same sentence into the client's errbuf, and
 * kvstat shows each namespace's share of the page and the bytes wasted.
 */
static void hello_page_waste(const struct kvd *d, const struct kvd_client *c,
			     const struct kvshm_ns *ns)
{
	char msg[300];

	if (kvproto_page_waste(msg, sizeof(msg), ns->model, ns->page_bytes, d->h->geo.page_bytes))
		kvd_warn("client %u (pid %d, %s): %s", c->id, (int)c->pid, c->comm, msg);
}

static int refuse_hello(struct kvd *d, struct kvd_client *c, uint32_t seq, int err,
			const char *msg)
{
	kvd_stat_add(&kvshm_stats(d->h)->clients_refused, 1);
	c->refused = true;
	kvd_reply_error(d, c, seq, err, true, "%s", msg);
	return -1;
}

/* Client c's pin ledger of nslots slots: created, reserved and sealed
 * at its size. 0 or -errno (nothing left open). */
static int ledger_create(struct kvd_client *c, uint32_t nslots)
{
	int rc = kvd_memfd_create(&c->ledger, "kvcached-ledger", kvshm_ledger_bytes(nslots),
				  KVD_MEM_SMALL);

	if (!rc) {
		rc = kvd_memfd_reserve(&c->ledger);
		if (rc)
			kvd_memfd_close(&c->ledger);
	}
	if (!rc)
		rc = kvd_memfd_seal(&c->ledger, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	return rc;
}

/* HELLO's answer to an accepted c (its namespace's pages are pb bytes). */
static void hello_reply(const struct kvd *d, const struct kvd_client *c, uint64_t pb,
			struct kvproto_hello_r *hr)
{
	memset(hr, 0, sizeof(*hr));
	hr->version = KVPROTO_VERSION;
	hr->client_id = c->id;
	hr->ns_id = c->ns_id;
	hr->n_pages = d->h->geo.n_pages;
	hr->page_bytes = d->h->geo.page_bytes;
	hr->ns_page_bytes = pb;
	hr->segment_bytes = d->h->segment_bytes;
	hr->pool_bytes = d->pool.bytes;
	hr->ledger_bytes = c->ledger.bytes;
	hr->block_tokens = d->h->geo.block_tokens;
	hr->pool_kind = d->pool.kind;
	hr->nslots = c->nslots;
}

int kvd_registry_hello(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		       const void *p)
{
	const uint32_t seq = hdr->seq;
	struct kvproto_hello hello;
	const struct kvproto_hello *hi = &hello;
	struct kvproto_hello_r hr;
	struct kvshm_ns ns;
	struct kvshm_client_row *row;
	char msg[400];
	const char *why = "";
	uint64_t pb;
	uint32_t nslots;
	int nsid, fds[3], nfds, rc;

	if (c->hello) {
		kvd_reply_error(d, c, seq, -EPROTO, true, "second HELLO");
		return -1;
	}
	memcpy(&hello, p, sizeof(hello));
	if (hi->version != KVPROTO_VERSION) {
		snprintf(msg, sizeof(msg), "protocol version %u, this kvcached speaks %u",
			 hi->version, KVPROTO_VERSION);
		return refuse_hello(d, c, seq, -EPROTO, msg);
	}
	if (kvproto_part(hi->kv_heads, hi->flags & KVPROTO_HELLO_LATENT, &hi->shard, &c->part,
			 &why)) {
		snprintf(msg, sizeof(msg), "HELLO: %u KV heads, tensor-parallel rank %u of %u: %s",
			 hi->kv_heads, hi->shard.tp_rank, hi->shard.tp_size, why);
		return refuse_hello(d, c, seq, -EINVAL, msg);
	}
	if (kvproto_hello_ns(hi, &ns))
		return refuse_hello(d, c, seq, -EINVAL,
				    "HELLO: model name, flags, dtype or geometry out of range");
	if (ns.block_tokens != d->h->geo.block_tokens) {
		snprintf(msg, sizeof(msg),
			 "geometry: model %s uses %u-token blocks, this pool caches %u-token blocks (block-tokens)",
			 ns.model, ns.block_tokens, d->h->geo.block_tokens);
		return refuse_hello(d, c, seq, -EMEDIUMTYPE, msg);
	}
	pb = ns.page_bytes;
	if (pb > d->h->geo.page_bytes) {
		snprintf(msg, sizeof(msg),
			 "geometry: model %s needs %llu-byte pages (%u tokens x %u layers x %u x %u kv heads x %u head dim x %u bytes: every head of the model, whatever its tensor-parallel size) but the pool's pages are %llu bytes (page-size)",
			 ns.model, (unsigned long long)pb, ns.block_tokens, ns.layers,
			 ns.layout == KVSHM_KV_LATENT ? 1 : 2, ns.kv_heads, ns.head_dim,
			 ns.dtype_bytes, (unsigned long long)d->h->geo.page_bytes);
		return refuse_hello(d, c, seq, -EMEDIUMTYPE, msg);
	}
	nsid = kvd_ns_get(d, &ns, true);
	if (nsid < 0)
		return refuse_hello(d, c, seq, -ETOOMANYREFS,
				    "namespace table full: 64 models have clients attached");

	nslots = hi->max_pins && hi->max_pins < d->cfg.max_pins ? hi->max_pins : d->cfg.max_pins;
	rc = ledger_create(c, nslots);
	if (rc) {
		snprintf(msg, sizeof(msg), "cannot create a pin ledger: %s", strerror(-rc));
		return refuse_hello(d, c, seq, rc, msg);
	}
	c->l = c->ledger.base;
	kvshm_ledger_init(c->l, nslots, c->id, (uint32_t)nsid);
	c->nslots = nslots;
	c->ns_id = (uint32_t)nsid;
	c->bt = hi->block_tokens;
	c->root = kvshm_key_root(ns.id, hi->salt, hi->salt_len);
	c->no_insert = hi->flags & KVPROTO_HELLO_NO_INSERT;
	c->own_share = hi->max_share;
	{
		int t = kvd_quota_tenant_salt(d, hi->salt, hi->salt_len);

		if (t < 0) {
			kvd_memfd_close(&c->ledger);
			c->l = NULL;
			return refuse_hello(d, c, seq, -ETOOMANYREFS,
					    "tenant table full: 64 tenants (salts) have clients attached or prefixes pinned");
		}
		c->tenant = (uint32_t)t;
	}
	memcpy(c->comm, hi->name, sizeof(c->comm));
	c->comm[sizeof(c->comm) - 1] = 0;
	if (!c->comm[0])
		read_comm(c->pid, c->comm, sizeof(c->comm));

	hello_reply(d, c, pb, &hr);

	/* A cuda pool's chunks follow on request (POOL), not here. */
	nfds = 0;
	fds[nfds++] = d->seg.fd;
	if (d->pool.kind == KVSHM_POOL_HOST)
		fds[nfds++] = kvd_pool_fd(&d->pool);
	fds[nfds++] = c->ledger.fd;
	if (send_with_fds(c, KVPROTO_HELLO_R, seq, &hr, sizeof(hr), fds, nfds)) {
		kvd_client_close(d, c, "HELLO reply not delivered", false);
		return -1;
	}
	/* The ledger fd now lives in the client; our mapping stays. */
	close(c->ledger.fd);
	c->ledger.fd = -1;
	c->hello = true;
	kvd_quota_attach(d, c);	/* into its tenant's and namespace's accounts */

	row = &kvshm_clients(d->h)[c->id];
	row->uid = c->uid;
	row->ns_id = c->ns_id;
	memcpy(row->comm, c->comm, sizeof(row->comm));
	atomic_store_explicit(&row->pid, c->pid, memory_order_release);
	kvd_stat_add(&kvshm_stats(d->h)->clients_attached, 1);
	kvd_stat_add(&kvshm_stats(d->h)->clients_total, 1);
	kvd_info("client %u attached: pid %d (%s) uid %u, namespace %u, tenant %s, %u pin slots%s",
		 c->id, (int)c->pid, c->comm, c->uid, c->ns_id,
		 kvshm_tenants(d->h)[c->tenant].name, nslots,
		 kvd_quota_no_insert(d, c) ? ", no-insert" : "");
	hello_page_waste(d, c, &ns);
	return 0;
}

/* POOL: hand a cuda pool's chunk fds to an attached client. */
int kvd_registry_pool(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		      const void *p)
{
	const uint32_t seq = hdr->seq;
	struct kvproto_pool q;
	struct kvproto_pool_r r;
	const int *fds;

	memcpy(&q, p, sizeof(q));
	if (q.version != KVPROTO_VERSION) {
		kvd_reply_error(d, c, seq, -EPROTO, true, "POOL: protocol version %u, this kvcached speaks %u",
				q.version, KVPROTO_VERSION);
		return -1;
	}
	if (kvd_pool_cuda_share(&d->pool, &r, &fds)) {
		kvd_reply_error(d, c, seq, -EPROTO, true,
				"POOL: this pool is host memory, its fd came with HELLO");
		return -1;
	}
	if (send_with_fds(c, KVPROTO_POOL_R, seq, &r, sizeof(r), fds, (int)r.n_chunks)) {
		kvd_client_close(d, c, "POOL reply not delivered", false);
		return -1;
	}
	kvd_debug("client %u: %u cuda pool chunk fds sent", c->id, r.n_chunks);
	return 0;
}

static void fold_stats(struct kvd *d);

/* Fold a leaving client's counters into the totals and clear its row. */
static void retire_counters(struct kvd *d, struct kvd_client *c)
{
	struct kvshm_client_row *row = &kvshm_clients(d->h)[c->id];
	struct kvshm_ledger_counts n;

	kvshm_ledger_sum(c->l, &n);
	d->gone_lookups += n.lookups;
	d->gone_hits += n.hit_blocks;
	d->gone_misses += n.miss_blocks;
	d->gone_pinfail += n.pin_failures;
	d->gone_lookup_tokens += n.lookup_tokens;
	d->gone_hit_tokens += n.hit_tokens;
	kvd_nsstat_retire(d, c);
	kvd_flight_retire(d, c);
	kvd_top_drain(d, c);
	atomic_store_explicit(&row->pid, 0, memory_order_release);
	kvd_stat_add(&kvshm_stats(d->h)->clients_attached, -1);
}

/* Release everything the client holds and free its row. */
static void release(struct kvd *d, struct kvd_client *c, const char *why)
{
	uint32_t reclaimed = kvd_reclaim(d, c);

	if (c->hello)
		kvd_quota_detach(d, c);

	if (c->hello)
		kvd_info("client %u detached: pid %d (%s), %s; %u writing pages reclaimed",
			 c->id, (int)c->pid, c->comm, why, reclaimed);
	else
		kvd_debug("client %u (pid %d) gone before HELLO: %s", c->id, (int)c->pid, why);
	if (c->pidfd >= 0) {
		epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->pidfd, NULL);
		close(c->pidfd);
	}
	/* Unmapping the ledger is what releases every pin it held. */
	kvd_memfd_close(&c->ledger);
	free(c->in);
	free(c->out);
	/* Out of its process's list of handles. */
	if (c->proc_prev)
		d->clients[c->proc_prev - 1].proc_next = c->proc_next;
	if (c->proc_next)
		d->clients[c->proc_next - 1].proc_prev = c->proc_prev;
	memset(c, 0, sizeof(*c));
	d->n_clients--;
	/* Its counts reach the totals now, not a tick after its row is gone. */
	fold_stats(d);
}

static bool process_alive(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };

	/* A pidfd polls readable once its process has exited. */
	return pidfd >= 0 && poll(&p, 1, 0) == 0;
}

static void end_connection(struct kvd *d, struct kvd_client *c, const char *why, bool bye)
{
	if (!c->used || c->lingering)
		return;
	epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	/* Closing with unread input resets the peer, which would lose the
	 * ERROR just sent: a bounded amount is drained first. Both happen
	 * on a closer thread: the close drops whatever descriptors the peer
	 * queued, and that can block for as long as the peer wants. */
	kvd_closer_put(c->fd, true);
	c->fd = -1;
	if (c->hello)
		retire_counters(d, c);
	/* A process that lives on may still read the pages it pinned: they
	 * stay in force until its pidfd (watched since accept) says it
	 * exited. One that holds nothing has nothing to keep. */
	if (!bye && c->hello && process_alive(c->pidfd) && kvd_client_holds(d, c)) {
		kvd_flight_drop(d, c);
		c->lingering = true;
		kvd_stat_add(&kvshm_stats(d->h)->clients_lingering, 1);
		free(c->in);
		free(c->out);
		c->in = c->out = NULL;
		c->in_len = c->in_cap = c->out_len = c->out_off = c->out_cap = 0;
		kvd_info("client %u (pid %d, %s): connection ended (%s) while the process lives on; its %u pin slots and writing pages stay in force until it exits",
			 c->id, (int)c->pid, c->comm, why, c->nslots);
		fold_stats(d);
		return;
	}
	release(d, c, why);
}

void kvd_registry_drop(struct kvd *d, struct kvd_client *c, const char *why)
{
	end_connection(d, c, why, false);
}

void kvd_registry_bye(struct kvd *d, struct kvd_client *c)
{
	end_connection(d, c, "closed", true);
}

void kvd_registry_exited(struct kvd *d, struct kvd_client *c)
{
	if (!c->used)
		return;
	if (c->lingering) {
		kvd_stat_add(&kvshm_stats(d->h)->clients_lingering, -1);
		release(d, c, "process exited");
		return;
	}
	/* Its socket is still open (a child it forked holds it): the
	 * resources were the attaching process's, and it is gone. */
	end_connection(d, c, "process exited (its socket lives on in another process)", true);
}

/* Connections that have not said HELLO (or STAT) in time hold a client
 * row for nothing: drop them. */
static void hello_deadline(struct kvd *d)
{
	uint64_t now = kvd_now_ms();
	uint32_t i;

	for (i = 0; i < d->cfg.max_clients; i++) {
		struct kvd_client *c = &d->clients[i];

		if (c->used && !c->hello && !c->lingering &&
		    now - c->since_ms >= d->cfg.hello_timeout_ms) {
			kvd_stat_add(&kvshm_stats(d->h)->clients_timed_out, 1);
			kvd_reply_error(d, c, 0, -ETIMEDOUT, true, "no HELLO within %u ms (hello-timeout-ms)",
					d->cfg.hello_timeout_ms);
		}
	}
}

/* Totals = clients gone + clients attached, into the segment's stats. */
static void fold_stats(struct kvd *d)
{
	struct kvshm_stats *st = kvshm_stats(d->h);
	uint64_t lk = d->gone_lookups, hit = d->gone_hits, miss = d->gone_misses,
		 pf = d->gone_pinfail, lt = d->gone_lookup_tokens, ht = d->gone_hit_tokens;
	uint32_t i;

	for (i = 0; i < d->cfg.max_clients; i++) {
		struct kvd_client *c = &d->clients[i];
		struct kvshm_client_row *row = &kvshm_clients(d->h)[i];
		struct kvshm_ledger_counts n;

		if (!kvd_live(c))
			continue;
		kvshm_ledger_sum(c->l, &n);
		lk += n.lookups;
		atomic_store_explicit(&row->lookups, n.lookups, RELAXED);
		hit += n.hit_blocks;
		atomic_store_explicit(&row->hit_blocks, n.hit_blocks, RELAXED);
		miss += n.miss_blocks;
		atomic_store_explicit(&row->miss_blocks, n.miss_blocks, RELAXED);
		pf += n.pin_failures;
		lt += n.lookup_tokens;
		ht += n.hit_tokens;
		kvd_top_drain(d, c);
		atomic_store_explicit(&row->pins_held, n.pins_held, RELAXED);
		atomic_store_explicit(&row->published, n.published, RELAXED);
		atomic_store_explicit(&row->writing, c->writing, RELAXED);
	}
	atomic_store_explicit(&st->lookups, lk, RELAXED);
	atomic_store_explicit(&st->hit_blocks, hit, RELAXED);
	atomic_store_explicit(&st->miss_blocks, miss, RELAXED);
	atomic_store_explicit(&st->pin_failures, pf, RELAXED);
	atomic_store_explicit(&st->lookup_tokens, lt, RELAXED);
	atomic_store_explicit(&st->hit_tokens, ht, RELAXED);
	kvd_flight_fold(d);
}

void kvd_registry_tick(struct kvd *d)
{
	hello_deadline(d);
	fold_stats(d);
	atomic_store_explicit(&kvshm_stats(d->h)->fds_passed, kvd_closer_passed_total(), RELAXED);
	d->ticks++;
	kvd_pin_census(d);
	atomic_store_explicit(&d->h->heartbeat,
			      atomic_load_explicit(&d->h->heartbeat, RELAXED) + 1, RELAXED);
}
