// SPDX-License-Identifier: MIT
/*
 * remote_open.c - starting the remote tier: the secret (refused when
 * other users can read it), libmemcached's settings per server, the
 * workers, the registration.
 */
#include "remote_int.h"

/* The cluster secret: a file only its owner may read. */
static int read_secret(const char *path, uint8_t *buf, size_t *len)
{
	struct stat sb;
	ssize_t got;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0) {
		kvd_err("remote-secret-file %s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		kvd_err("remote-secret-file %s: not a regular file", path);
		close(fd);
		return -1;
	}
	if (sb.st_mode & 077) {
		kvd_err("remote-secret-file %s: mode %04o lets other users at it; chmod 600 it",
			path, (unsigned)(sb.st_mode & 07777));
		close(fd);
		return -1;
	}
	got = read(fd, buf, SECRET_MAX + 1);
	close(fd);
	if (got < SECRET_MIN || got > SECRET_MAX) {
		kvd_err("remote-secret-file %s: %zd bytes; a secret has %d to %d (e.g. head -c 32 /dev/urandom)",
			path, got, SECRET_MIN, SECRET_MAX);
		return -1;
	}
	*len = (size_t)got;
	return 0;
}

/* A libmemcached handle with our behaviours: ketama, a timeout on every
 * operation, and no server ejected (its keys stay its own). */
static memcached_st *mc_new(struct kvd_remote *r, const struct kvd_rserver *one, uint32_t tmo_ms)
{
	memcached_st *m = memcached_create(NULL);
	unsigned i;
	memcached_return_t rc = MEMCACHED_SUCCESS;

	if (!m)
		return NULL;
	for (i = 0; i < (one ? 1 : r->nsrv) && memcached_success(rc); i++) {
		const struct kvd_rserver *s = one ? one : &r->srv[i].at;

		rc = s->port ? memcached_server_add(m, s->host, s->port)
			     : memcached_server_add_unix_socket(m, s->host);
	}
	if (!memcached_success(rc) ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_DISTRIBUTION,
				   MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_NO_BLOCK, 1) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, tmo_ms) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, tmo_ms) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_SND_TIMEOUT, (uint64_t)tmo_ms * 1000) !=
		    MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_RCV_TIMEOUT, (uint64_t)tmo_ms * 1000) !=
		    MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 1) != MEMCACHED_SUCCESS) {
		memcached_free(m);
		return NULL;
	}
	return m;
}

int kvd_remote_open(struct kvd_ground *g)
{
	static const char *const modes[] = { "published", "evicted" };
	struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS];
	uint8_t secret[SECRET_MAX + 1];
	size_t slen = 0;
	const char *why = NULL;
	struct kvd_remote *r;
	sigset_t all, old;
	unsigned i, k, n;
	uint32_t pages = g->h->geo.n_pages;

	if (!g->cfg->remote[0])
		return 0;
	if (kvd_remote_parse(g->cfg->remote, sv, KVD_REMOTE_MAX_SERVERS, &n, &why)) {
		kvd_err("remote %s: %s", g->cfg->remote, why);
		return -1;
	}
	if (g->cfg->remote_secret_file[0]) {
		if (read_secret(g->cfg->remote_secret_file, secret, &slen))
			return -1;
	} else if (g->cfg->remote_insecure) {
		kvd_warn("remote: no secret (remote-insecure): blocks are checked for damage only; any host that reaches the servers can forge KV for this fleet");
	} else {
		kvd_err("remote: needs remote-secret-file, or remote-insecure");
		return -1;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		goto nomem;
	r->efd = -1;
	for (i = 0; i < WORKERS; i++)
		for (k = 0; k < KVD_REMOTE_MAX_SERVERS; k++)
			kvd_mconn_init(&r->w[i].conn[k]);
	r->drop_log.what = "remote: dropped blocks";
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->wake, NULL);
	r->gets_tail = &r->gets;
	r->puts_tail = &r->puts;
	/* Registered at once: a failed open is undone by kvd_tiers_close. */
	kvd_tier_add(g, KVD_TIER_REMOTE, &kvd_remote_tier, r);
	r->g = g;
	r->nsrv = n;
	r->bt = g->h->geo.block_tokens;
	r->slot_bytes = g->h->geo.page_bytes;
	r->timeout_ns = (uint64_t)g->cfg->remote_timeout_ms * 1000000ull;
	r->cuda = g->h->pool_kind != KVSHM_POOL_HOST;
	r->mode = g->cfg->remote_write;
	snprintf(r->prefix, sizeof(r->prefix), "%s", g->cfg->remote_prefix);
	/* Held pages (publish) or copies (evict) in flight: a quarter of
	 * the pool at most, and 256 MiB of copies. */
	r->puts_cap = pages / 4 < 16 ? 16 : pages / 4 > 4096 ? 4096 : pages / 4;
	if (r->mode == KVD_REMOTE_EVICT && r->puts_cap > (256u << 20) / r->slot_bytes)
		r->puts_cap = (uint32_t)((256u << 20) / r->slot_bytes) ?: 8;
	r->hold = calloc(pages, sizeof(*r->hold));
	r->clean = calloc(pages, sizeof(*r->clean));
	r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!r->hold || !r->clean || r->efd < 0)
		goto nomem;
	for (i = 0; i < n; i++) {
		r->srv[i].at = sv[i];
		if (sv[i].port)
			snprintf(r->srv[i].name, sizeof(r->srv[i].name), strchr(sv[i].host, ':') ?
				 "[%.255s]:%u" : "%.255s:%u", sv[i].host, sv[i].port);
		else
			snprintf(r->srv[i].name, sizeof(r->srv[i].name), "%.255s", sv[i].host);
		r->srv[i].logged = 0;
	}
	r->mc = mc_new(r, NULL, g->cfg->remote_timeout_ms);
	if (!r->mc || kvd_rmac_new(&r->mac, secret, slen)) {
		kvd_err("remote: cannot set up libmemcached or the MAC");
		goto fail;
	}
	for (i = 0; i < n; i++) {
		r->srv[i].probe = mc_new(r, &sv[i], g->cfg->remote_timeout_ms);
		if (!r->srv[i].probe) {
			kvd_err("remote: cannot set up libmemcached for %s", r->srv[i].name);
			goto fail;
		}
	}
	for (i = 0; i < WORKERS; i++) {
		r->w[i].r = r;
		r->w[i].head = malloc(kvd_rval_payload_off(r->bt));
		if (!r->w[i].head || kvd_rmac_dup(&r->w[i].mac, r->mac))
			goto nomem;
	}
	memset(secret, 0, sizeof(secret));
	/* Signals are the main loop's (signalfd): workers take none. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (i = 0; i < WORKERS; i++)
		r->w[i].started = !pthread_create(&r->w[i].th, NULL, kvd_remote_worker, &r->w[i]);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	for (i = 0; i < WORKERS; i++)
		if (!r->w[i].started) {
			kvd_err("remote: cannot start kvd_remote_worker threads");
			goto fail;
		}
	atomic_store_explicit(&st_of(g)->remote_servers, n, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->remote_write_mode,
			      r->mode == KVD_REMOTE_PUBLISH ? KVSHM_REMOTE_PUBLISH : KVSHM_REMOTE_EVICT,
			      memory_order_relaxed);
	r->up_logged = 0;
	kvd_remote_probe_start(r, kvd_now_ns());
	kvd_info("remote: %u memcached servers (ketama), blocks written when %s, %u ms timeout, %s (Poly1305 of %s), item keys %s:*",
		 n, modes[r->mode], g->cfg->remote_timeout_ms,
		 slen ? "sealed (item format 2) under the cluster secret" : "NOT authenticated",
		 kvd_rmac_impl(r->mac), r->prefix);
	return 0;
nomem:
	kvd_err("remote: out of memory");
fail:
	memset(secret, 0, sizeof(secret));
	return -1;
}
