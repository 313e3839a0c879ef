// SPDX-License-Identifier: MIT
/*
 * spill_open.c - the spill area: its files under spill-dir, the warm
 * restart that rebuilds the slot table from their headers, the tier's
 * registration, and closing it (marking each file clean).
 */
#include "spill_int.h"

int64_t kvd_spill_slots(const struct kvd_config *cfg)
{
	uint64_t slot;

	if (!cfg->spill_dir[0])
		return 0;
	slot = kvd_slot_hdr_bytes(cfg->block_tokens) + cfg->page_size;
	if (cfg->spill_size / slot < 1) {
		kvd_err("spill-size %llu: smaller than one slot (%llu bytes: header and page-size)",
			(unsigned long long)cfg->spill_size, (unsigned long long)slot);
		return -1;
	}
	if (cfg->spill_size / slot >= KVSHM_LOC_SLOT - 2) {
		kvd_err("spill-size %llu: more than 2^31 slots; raise page-size",
			(unsigned long long)cfg->spill_size);
		return -1;
	}
	return (int64_t)(cfg->spill_size / slot);
}

/* Write file f's area header, with the clean flag as given. */
static int area_write(struct kvd_spill *sp, uint32_t f, uint32_t bt, bool clean)
{
	uint32_t slots = f + 1 < sp->nfiles ? sp->spf : sp->n - f * sp->spf;

	memset(sp->staging, 0, KVD_SPILL_ALIGN);
	kvd_area_hdr_fill((struct kvd_area_hdr *)sp->staging, bt, sp->hdr_bytes, sp->page_bytes,
			  slots, clean);
	return pwrite(sp->fds[f], sp->staging, KVD_SPILL_ALIGN, 0) == (ssize_t)KVD_SPILL_ALIGN ? 0
												: -1;
}

/* Open file f: 1 when it holds slots of a previous run (*unclean set if
 * that run did not shut down cleanly), 0 when it starts empty, -1. */
static int open_file(struct kvd_ground *g, uint32_t f, uint32_t slots, bool *direct, bool *unclean)
{
	struct kvd_spill *sp = spill_of(g);
	char path[PATH_MAX + 32];
	const char *why = NULL;
	struct stat stt;
	int fd, rc = -1;

	snprintf(path, sizeof(path), "%s/kvcached-spill-%03u.slots", sp->dir, f);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | (*direct ? O_DIRECT : 0), 0600);
	if (fd < 0 && errno == EINVAL && *direct) {
		kvd_warn("spill: %s: the filesystem refuses O_DIRECT; using the page cache", sp->dir);
		*direct = false;
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	}
	if (fd < 0) {
		kvd_err("spill: cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	sp->fds[f] = fd;
	/* Two daemons on one spill area would overwrite each other's slots. */
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		kvd_err("spill: %s: %s", path, errno == EWOULDBLOCK ?
			"in use by another kvcached (each daemon needs its own spill-dir)" :
			strerror(errno));
		return -1;
	}
	memset(sp->staging, 0, KVD_SPILL_ALIGN);
	if (fstat(fd, &stt) == 0 && stt.st_size >= (off_t)KVD_SPILL_ALIGN &&
	    pread(fd, sp->staging, KVD_SPILL_ALIGN, 0) == (ssize_t)KVD_SPILL_ALIGN) {
		if (!kvd_area_hdr_check(sp->staging, KVD_SPILL_ALIGN, g->h->geo.block_tokens,
					sp->hdr_bytes, sp->page_bytes, slots, &why)) {
			rc = 1;	/* warm */
			if (!((struct kvd_area_hdr *)sp->staging)->clean)
				*unclean = true;
		} else {
			kvd_warn("spill: %s: %s; starting it empty", path, why);
		}
	}
	if (rc < 0 && ftruncate(fd, 0)) {
		kvd_err("spill: cannot truncate %s: %s", path, strerror(errno));
		return -1;
	}
	errno = 0;
	if (area_write(sp, f, g->h->geo.block_tokens, false)) {
		kvd_err("spill: cannot write %s: %s", path, strerror(errno ? errno : EIO));
		return -1;
	}
	/*
	 * Reserve the file's blocks now: an O_DIRECT write that extends a
	 * file (or allocates its blocks) cannot complete asynchronously on
	 * ext4 or XFS, io_uring punts it to a worker and the spill rate
	 * halves. Where that fails (no room, a file-size limit, no
	 * fallocate), slots get their blocks as they are written and a full
	 * disk shows up as a failed write.
	 */
	{
		off_t want = (off_t)(KVD_SPILL_ALIGN + (uint64_t)slots * sp->slot_bytes);
		int e = posix_fallocate(fd, 0, want);

		if (e)
			kvd_warn("spill: cannot reserve %lld bytes for %s (%s); its blocks are taken as slots are written",
				 (long long)want, path, strerror(e));
	}
	return rc < 0 ? 0 : 1;
}

/* Rebuild the tier-1 entries of file f from its slot headers. */
static void warm_file(struct kvd_ground *g, uint32_t f, uint32_t *good, uint32_t *bad,
		      uint32_t *norow)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t first = f * sp->spf, last = first + sp->spf, slot;
	uint32_t bt = g->h->geo.block_tokens;

	if (last > sp->n)
		last = sp->n;
	for (slot = first; slot < last; slot++) {
		struct kvd_slot_hdr h;
		const char *why = NULL;
		ssize_t got;
		uint32_t have;
		int rc, ns;

		got = pread(sp->fds[f], sp->staging, sp->hdr_bytes, kvd_spill_slot_off(sp, slot));
		if (got <= 0)
			break;	/* past the end: the rest was never written */
		if (!((const uint64_t *)sp->staging)[0])
			continue;	/* never written (reserved, reads as zeros) */
		if ((uint64_t)got < sp->hdr_bytes)
			memset(sp->staging + got, 0, sp->hdr_bytes - (uint64_t)got);
		rc = kvd_slot_hdr_check(sp->staging, sp->hdr_bytes, bt, sp->page_bytes, &why);
		if (rc == 1)
			continue;
		if (rc) {
			kvd_debug("spill: slot %u: %s: dropped", slot, why);
			(*bad)++;
			continue;
		}
		memcpy(&h, sp->staging, sizeof(h));
		ns = g->host->ns(g, &h.ns, false);
		if (ns < 0) {
			(*norow)++;
			continue;
		}
		have = kvshm_index_find(g->h, h.key);
		if (kvshm_loc_is_slot(have)) {
			/* Two copies of a block: the newer one stays. */
			if (sp->s[have & ~KVSHM_LOC_SLOT].seq > h.seq)
				continue;
			kvd_events_slot_gone(g, have & ~KVSHM_LOC_SLOT);
			kvd_spill_slot_forget(g, have & ~KVSHM_LOC_SLOT);
		}
		if (kvshm_index_insert(g->h, h.key, KVSHM_LOC_SLOT | slot)) {
			(*bad)++;
			continue;
		}
		kvd_stat_add(&st_of(g)->index_entries, 1);
		kvd_stat_add(&st_of(g)->pages_spilled, 1);
		/* Whose salt it was is not on disk: no tenant until restored. */
		kvd_spill_shared_set(g, slot, KVSHM_SLOT_SPILLED, &h.key, &h.parent, (uint32_t)ns,
			   KVSHM_TENANT_NONE);
		kvd_events_slot_found(g, slot, (const uint32_t *)(sp->staging + sizeof(h)));
		sp->s[slot].seq = h.seq;
		sp->s[slot].tok = tok_hash(sp, (const uint32_t *)(sp->staging + sizeof(h)), bt);
		if (h.seq > sp->seq)
			sp->seq = h.seq;
		(*good)++;
	}
}

static bool spill_put(struct kvd_ground *g, uint32_t page, enum kvd_tier_put why)
{
	/* Tier 1 takes evicted pages only. */
	return why == KVD_PUT_EVICT && kvd_spill_page(g, page);
}

static const struct kvd_tier spill_tier = {
	.name = "spill",
	.fd = kvd_spill_fd,
	.reap = kvd_spill_reap,
	.put = spill_put,
	.flush = kvd_spill_flush,
	.room = kvd_spill_room,
	.pending = kvd_spill_pending,
	.busy = kvd_spill_busy,
	.drain = kvd_spill_drain,
	.cancel = kvd_spill_cancel,
	.claim = kvd_spill_claim,
	.fetch = kvd_spill_fetch,
	.unindex = kvd_spill_unindex,
	.forget_ns = kvd_spill_forget_ns,
	.forget_tenant = kvd_spill_forget_tenant,
	.close = kvd_spill_close,
};

/* mkdir -p, mode 0700 for what it creates. */
static int mkdir_p(const char *dir)
{
	char tmp[PATH_MAX], *s;

	snprintf(tmp, sizeof(tmp), "%s", dir);
	for (s = tmp + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(tmp, 0700) && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdir(tmp, 0700) && errno != EEXIST ? -1 : 0;
}

/* Open the area's files (*direct: all of them O_DIRECT) and rebuild the
 * slot table from what a previous run left in them, said in the log.
 * 0, or -1 after a message. */
static int files_open(struct kvd_ground *g, struct kvd_spill *sp, bool *direct)
{
	uint32_t i, good = 0, bad = 0, norow = 0;
	bool unclean = false;
	int rc;

	for (i = 0; i < sp->nfiles; i++) {
		uint32_t slots = i + 1 < sp->nfiles ? sp->spf : sp->n - i * sp->spf;

		rc = open_file(g, i, slots, direct, &unclean);
		if (rc < 0)
			return -1;
		if (rc == 1)
			warm_file(g, i, &good, &bad, &norow);
	}
	sp->nfree = 0;	/* warm_file's kvd_spill_slot_forget listed some: list afresh */
	for (i = sp->n; i-- > 0;)
		if (sp->s[i].state == KVSHM_SLOT_FREE)
			sp->freel[sp->nfree++] = i;
	if (good || bad || norow)
		kvd_info("spill: warm restart%s: %u spilled blocks found in %s, %u slots dropped (bad header or checksum)%s",
			 unclean ? " after an unclean stop" : "", good, sp->dir, bad + norow,
			 norow ? ", some for want of a namespace row" : "");
	atomic_store_explicit(&st_of(g)->spill_dropped, bad + norow, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->spill_warm, good, memory_order_relaxed);
	return 0;
}

int kvd_spill_open(struct kvd_ground *g)
{
	static const char *const kinds[] = { "auto", "io_uring", "worker threads",
					     "inline I/O (tests)" };
	struct kvd_spill *sp;
	struct iovec *iov;
	uint32_t i, pages = g->h->geo.n_pages;
	bool direct = true;
	int rc;

	if (!g->h->geo.n_slots)
		return 0;
	/* A file-size limit must become EFBIG, not a dead daemon. */
	signal(SIGXFSZ, SIG_IGN);
	sp = calloc(1, sizeof(*sp));
	if (!sp)
		goto nomem;
	if (getrandom(&sp->tok_seed, sizeof(sp->tok_seed), 0) != sizeof(sp->tok_seed))
		sp->tok_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	/* Registered at once: a failed open is undone by kvd_tiers_close. */
	kvd_tier_add(g, KVD_TIER_SPILL, &spill_tier, sp);
	snprintf(sp->dir, sizeof(sp->dir), "%s", g->cfg->spill_dir);
	if (mkdir_p(sp->dir)) {
		kvd_err("spill: cannot create %s: %s", sp->dir, strerror(errno));
		return -1;
	}
	sp->n = g->h->geo.n_slots;
	sp->hdr_bytes = kvd_slot_hdr_bytes(g->h->geo.block_tokens);
	sp->page_bytes = g->h->geo.page_bytes;
	sp->slot_bytes = sp->hdr_bytes + sp->page_bytes;
	sp->spf = (uint32_t)(FILE_BYTES / sp->slot_bytes);
	if (!sp->spf)
		sp->spf = 1;
	if (sp->spf > sp->n)
		sp->spf = sp->n;
	sp->nfiles = (sp->n + sp->spf - 1) / sp->spf;
	sp->fds = malloc(sp->nfiles * sizeof(int));
	for (i = 0; sp->fds && i < sp->nfiles; i++)
		sp->fds[i] = -1;
	sp->s = calloc(sp->n, sizeof(*sp->s));
	sp->freel = malloc(sp->n * sizeof(uint32_t));
	sp->page_op = calloc(pages, sizeof(uint32_t));
	sp->backing = calloc(pages, sizeof(uint32_t));
	if (!sp->fds || !sp->s || !sp->freel || !sp->page_op || !sp->backing ||
	    kvd_policy_open(&sp->pol, g->cfg->eviction, sp->n) ||
	    posix_memalign((void **)&sp->staging, KVD_SPILL_ALIGN, OPS * sp->hdr_bytes))
		goto nomem;
	for (i = 0; i < OPS; i++)
		sp->opfree[sp->nopfree++] = OPS - 1 - i;

	/* Files, and what a previous run left in them. */
	if (files_open(g, sp, &direct))
		return -1;

	/* The I/O engine, with the pool (in areas of at most 1 GiB) and the
	 * header staging registered; a cuda pool's pages cannot be the target
	 * of O_DIRECT, so a pinned host staging ring of OPS pages stands in
	 * for it (ARCHITECTURE.md §13). */
	sp->pages_per_area = (uint32_t)(POOL_AREA / sp->page_bytes);
	if (!sp->pages_per_area)
		sp->pages_per_area = 1;
	sp->nareas = g->h->pool_kind == KVSHM_POOL_HOST ?
		     (pages + sp->pages_per_area - 1) / sp->pages_per_area : 1;
	iov = calloc(sp->nareas + 1, sizeof(*iov));
	if (!iov)
		goto nomem;
	if (g->h->pool_kind != KVSHM_POOL_HOST) {
		if (posix_memalign((void **)&sp->stage, KVD_SPILL_ALIGN, OPS * sp->page_bytes)) {
			free(iov);
			goto nomem;
		}
		if (kvd_pool_pin_host(g->pool, sp->stage, OPS * sp->page_bytes))
			kvd_warn("spill: cannot page-lock the %llu-byte staging ring (LimitMEMLOCK?); copies to and from the GPU go slower",
				 (unsigned long long)(OPS * sp->page_bytes));
		iov[0].iov_base = sp->stage;
		iov[0].iov_len = OPS * sp->page_bytes;
	}
	for (i = 0; !sp->stage && i < sp->nareas; i++) {
		uint32_t first = i * sp->pages_per_area;
		uint32_t k = pages - first < sp->pages_per_area ? pages - first : sp->pages_per_area;

		iov[i].iov_base = kvd_spill_page_at(g, first);
		iov[i].iov_len = (uint64_t)k * sp->page_bytes;
	}
	iov[sp->nareas].iov_base = sp->staging;
	iov[sp->nareas].iov_len = OPS * sp->hdr_bytes;
	rc = kvd_sio_open(&sp->io, (enum kvd_sio_kind)g->cfg->spill_io, 2 * OPS, iov,
			  sp->nareas + 1, &sp->kind);
	free(iov);
	if (rc)
		return -1;
	sp->writes_on = true;
	atomic_store_explicit(&st_of(g)->spill_enabled, 1, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->spill_slots, sp->n, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->spill_path,
			      sp->kind == KVD_SIO_URING ? KVSHM_SPILL_URING : KVSHM_SPILL_THREADS,
			      memory_order_relaxed);
	kvd_info("spill: %u slots of %llu bytes in %u files under %s, %s, %s",
		 sp->n, (unsigned long long)sp->slot_bytes, sp->nfiles, sp->dir,
		 kinds[sp->kind], direct ? "O_DIRECT" : "buffered");
	return 0;
nomem:
	kvd_err("spill: out of memory");
	return -1;
}

void kvd_spill_close(struct kvd_ground *g)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t i;

	if (!sp)
		return;
	if (sp->io) {
		kvd_spill_drain(g);
		kvd_sio_close(sp->io);
	}
	for (i = 0; sp->fds && i < sp->nfiles; i++) {
		if (sp->fds[i] < 0)
			continue;
		if (sp->io && sp->staging && area_write(sp, i, g->h->geo.block_tokens, true))
			kvd_warn("spill: cannot mark file %u clean: %s", i, strerror(errno));
		close(sp->fds[i]);
	}
	free(sp->fds);
	free(sp->s);
	free(sp->freel);
	kvd_policy_close(&sp->pol);
	free(sp->page_op);
	free(sp->backing);
	free(sp->staging);
	if (sp->stage) {
		kvd_pool_unpin_host(g->pool, sp->stage);
		free(sp->stage);
	}
	free(sp);
	kvd_tier_remove(g, KVD_TIER_SPILL);
}
