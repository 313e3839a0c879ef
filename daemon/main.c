// SPDX-License-Identifier: MIT
/*
 * main.c - kvcached: read the settings, build the segment and the pool,
 * serve until SIGTERM or SIGINT, then take everything down cleanly.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "../shm/ledger.h"
#include "../shm/mapping.h"
#include "../shm/segment.h"
#include <arpa/inet.h>
#include <netinet/in.h>

#include "config.h"
#include "obs/events.h"
#include "core/kvd.h"
#include "core/pin.h"
#include "core/quota.h"
#include "core/restore.h"
#include "core/slice.h"
#include "reload.h"
#include "server/server.h"
#include "util/log.h"
#include "pool/memcheck.h"
#include "obs/metrics.h"
#include "server/notify.h"
#include "tier/remote.h"
#include "tier/spill.h"

/* KVSHM_F_MEMBARRIER when the evictor may order the clients' pins with
 * membarrier(2) (shm/ledger.h), else 0; the log says which. */
static uint32_t pin_barrier(const struct kvd_config *cfg)
{
	int rc;

	if (cfg->pin_barrier == KVD_PIN_BARRIER_FENCE) {
		kvd_info("pins: lookups fence each run of pins (pin-barrier fence)");
		return 0;
	}
	rc = kvshm_barrier_query();
	if (rc) {
		kvd_info("pins: lookups fence each run of pins (membarrier(2) global expedited unavailable: %s)",
			 strerror(-rc));
		return 0;
	}
	kvd_info("pins: ordered by membarrier(2) before each eviction scan; lookups pin without a fence");
	return KVSHM_F_MEMBARRIER;
}

/* The segment on shmem transparent huge pages: hugepages not off, a
 * segment of 2 MiB at least, and a kernel that does not deny them. */
static bool segment_thp(const struct kvd_config *cfg, uint64_t bytes)
{
	char thp[32];

	kvd_thp_shmem_mode(thp, sizeof(thp));
	return cfg->hugepages != KVD_HUGE_OFF && bytes >= KVSHM_HUGE_BYTES && thp[0] &&
	       strcmp(thp, "deny");
}

static int segment_open(struct kvd *d)
{
	struct kvshm_geometry geo = { 0 };
	struct kvshm_header h;
	struct kvd_memfd_fill fill;
	int64_t slots = kvd_spill_slots(&d->cfg);
	uint64_t seg_huge = 0;
	int rc;

	if (slots < 0)
		return -1;
	geo.page_bytes = d->cfg.page_size;
	geo.n_pages = (uint32_t)(d->cfg.pool_size / d->cfg.page_size);
	geo.block_tokens = d->cfg.block_tokens;
	geo.n_slots = (uint32_t)slots;
	/* Room for both tiers: a block is indexed once, page or slot. */
	geo.n_buckets = kvshm_buckets_for((uint64_t)geo.n_pages + geo.n_slots);
	geo.max_clients = d->cfg.max_clients;
	geo.max_ns = KVD_MAX_NS;
	geo.ledger_slots = d->cfg.max_pins;
	if (kvshm_layout(&h, &geo)) {
		kvd_err("segment: geometry out of range");
		return -1;
	}
	/* Every lookup reads it at random: on 2 MiB pages where the kernel
	 * gives them as for the pool (shmem THP; the hugetlb reserve is the
	 * pool's), so that its buckets and page entries cost fewer TLB
	 * misses and every client fewer page tables. */
	rc = kvd_memfd_create(&d->seg, "kvcached-segment", h.segment_bytes,
			      segment_thp(&d->cfg, h.segment_bytes) ? KVD_MEM_THP : KVD_MEM_SMALL);
	if (!rc)
		rc = kvd_memfd_fill(&d->seg, 0, &fill);
	if (rc) {
		kvd_err("segment: cannot reserve %llu bytes: %s",
			(unsigned long long)h.segment_bytes, strerror(-rc));
		return -1;
	}
	if (kvd_memfd_huge_bytes(&d->seg, &seg_huge))
		seg_huge = fill.collapsed * KVSHM_HUGE_BYTES;
	h.pool_kind = strcmp(d->cfg.pool, "cuda") ? KVSHM_POOL_HOST : KVSHM_POOL_CUDA;
	h.flags = pin_barrier(&d->cfg);
	d->h = d->seg.base;
	kvd_ground_bind(d);
	kvshm_init(d->h, &h);
	atomic_store_explicit(&kvshm_stats(d->h)->segment_huge_bytes, seg_huge,
			      memory_order_relaxed);
	/* From here on only our existing mapping can write it. */
	rc = kvd_memfd_seal(&d->seg, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE |
				     F_SEAL_SEAL);
	if (rc) {
		kvd_err("segment: cannot seal: %s", strerror(-rc));
		return -1;
	}
	d->mark = calloc(geo.n_pages, 1);
	d->clients = calloc(geo.max_clients, sizeof(*d->clients));
	if (!d->mark || !d->clients || kvd_slice_init(d)) {
		kvd_err("out of memory");
		return -1;
	}
	if (kvd_policy_open(&d->pol, d->cfg.eviction, geo.n_pages)) {
		kvd_err("out of memory");
		return -1;
	}
	d->low_pages = (uint32_t)((uint64_t)geo.n_pages * d->cfg.low_watermark / 100);
	d->high_pages = (uint32_t)((uint64_t)geo.n_pages * d->cfg.high_watermark / 100);
	/* The configured tenants have their rows (and names in kvstat) before
	 * any client attaches; kvstat shows the settings in force. */
	kvd_quota_configure(d);
	kvd_reload_publish(d);
	return 0;
}

static const char *gib(char *buf, size_t len, uint64_t b)
{
	snprintf(buf, len, "%.1f GiB (%llu bytes)", (double)b / (1ull << 30),
		 (unsigned long long)b);
	return buf;
}

/*
 * Refuse, before touching anything, a pool the kernel could only provide
 * by OOM-killing someone (memcheck.h). A hugetlb pool comes from the huge
 * page reserve, not from MemAvailable or the memory cgroup; a cuda pool
 * takes host memory only for the spill staging ring.
 */
static int memory_fits(const struct kvd *d)
{
	const struct kvd_config *cfg = &d->cfg;
	uint64_t pool = (uint64_t)(cfg->pool_size / cfg->page_size) * cfg->page_size;
	uint64_t need, avail;
	char what[160], a[64], b[64];
	bool cuda = !strcmp(cfg->pool, "cuda");

	if (!cuda && cfg->hugepages != KVD_HUGE_OFF && pool % (2ull << 20) == 0 &&
	    kvd_hugetlb_free() >= pool)
		return 0;	/* hugetlb: reserved pages, no OOM risk */
	need = cuda ? (cfg->spill_dir[0] ? 64ull << 20 : 0) : pool;
	if (kvd_mem_available(&avail, what, sizeof(what))) {
		kvd_warn("memory: cannot tell how much is available; not checking pool-size");
		return 0;
	}
	if (need > avail) {
		char where[256];

		if (cuda)
			kvd_err("spill staging: needs %s of host memory but %s is available (%s)",
				gib(a, sizeof(a), need), gib(b, sizeof(b), avail), what);
		else
			kvd_err("%s: %s, more than the memory available to kvcached, %s (%s); give a smaller size or a share such as --pool-size 40%%",
				kvd_config_where(cfg, "pool-size", where, sizeof(where)),
				gib(a, sizeof(a), need), gib(b, sizeof(b), avail), what);
		return -1;
	}
	if (need > avail / 10 * 9)
		kvd_warn("pool-size %s: leaves less than a tenth of the %s available (%s) to everything else",
			 gib(a, sizeof(a), need), gib(b, sizeof(b), avail), what);
	return 0;
}

/*
 * Before anything can start a thread: every asynchronous signal blocked,
 * so that each thread started from here on inherits a mask that takes
 * none. Not only ours (which block everything themselves): the CUDA
 * driver starts threads when a cuda pool opens, and a SIGTERM the kernel
 * hands to one of those kills the process (status 143, socket left
 * behind). kvd_server_open then sets the main thread's mask to the
 * signals its signalfd reads (SIGTERM, SIGINT, SIGHUP), which makes the
 * event loop their only receiver, and gives back the default action of
 * the rest to the main thread alone. Faults stay unblocked: a fault while
 * blocked kills without the sanitizers' or anyone's handler.
 */
static void signals_block_all(void)
{
	static const int faults[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT };
	sigset_t all;
	size_t i;

	sigfillset(&all);
	for (i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
		sigdelset(&all, faults[i]);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
}

/* What the pool is made of, for kvstat and /metrics (segment.h). */
static void pool_stats(struct kvd *d)
{
	struct kvshm_stats *st = kvshm_stats(d->h);
	enum kvshm_pool_backing b = kvd_pool_backing(&d->pool);

	atomic_store_explicit(&st->pool_backing, b, memory_order_relaxed);
	atomic_store_explicit(&st->pool_memory_page_bytes,
			      b == KVSHM_BACKING_NONE ? 0 :
			      b == KVSHM_BACKING_SMALL ? 4096 : KVSHM_HUGE_BYTES,
			      memory_order_relaxed);
	atomic_store_explicit(&st->pool_huge_bytes, d->pool.huge_bytes, memory_order_relaxed);
	atomic_store_explicit(&st->pool_prefault_ns, d->pool.prefault_ns, memory_order_relaxed);
}

/* The /metrics server on metrics-listen, said in the log; NULL after a
 * message when it cannot start. */
static struct kvd_metrics *metrics_start(const struct kvd *d)
{
	const struct sockaddr_storage *a = &d->cfg.metrics_addr;
	char ip[INET6_ADDRSTRLEN] = "?";
	bool v6 = a->ss_family == AF_INET6;
	struct kvd_metrics *m;
	uint16_t port = 0;

	m = kvd_metrics_start(d->h, (const struct sockaddr *)a, &port);
	if (!m)
		return NULL;
	inet_ntop(a->ss_family, v6 ? (const void *)&((const struct sockaddr_in6 *)a)->sin6_addr
				   : (const void *)&((const struct sockaddr_in *)a)->sin_addr,
		  ip, sizeof(ip));
	kvd_info("metrics: serving http://%s%s%s:%u/metrics", v6 ? "[" : "", ip, v6 ? "]" : "",
		 port);
	return m;
}

/* Everything main() opened, in the reverse order (what was not opened is
 * closed as a no-op). */
static void teardown(struct kvd *d)
{
	if (d->h)
		kvd_pin_forget(d, UINT32_MAX, UINT32_MAX);
	kvd_server_close(d);
	kvd_events_close(&d->g);
	kvd_tiers_close(&d->g);
	kvd_pool_close(&d->pool);
	kvd_slice_fini(d);
	kvd_memfd_close(&d->seg);
	kvd_policy_close(&d->pol);
	free(d->mark);
	free(d->g.damaged);
	free(d->spare);
	free(d->census_stamp);
	free(d->qstamp_t);
	free(d->qstamp_n);
	free(d->pin_held);
	free(d->clients);
}

int main(int argc, char **argv)
{
	struct kvd_metrics *metrics = NULL;	/* /metrics server, or NULL */
	char where[256];
	struct kvd d;
	int rc;

	memset(&d, 0, sizeof(d));
	d.lfd = d.sigfd = d.tfd = d.epfd = -1;
	d.seg.fd = d.pool.mem.fd = -1;
	d.g.host = &kvd_core_tier_host;	/* what the tiers may ask of the core */
	signals_block_all();
	d.reload = kvd_reload;			/* SIGHUP, from the event loop */
	d.argc = argc;
	d.argv = argv;
	kvd_config_defaults(&d.cfg);
	rc = kvd_config_args(&d.cfg, argc, argv);
	if (rc)
		return rc > 0 ? 0 : 2;
	kvd_log_level = d.cfg.log_level;
	/* A same-uid process could otherwise write our memory through
	 * /proc/<pid>/mem or ptrace: the protection against lying clients
	 * holds only for other uids (ARCHITECTURE.md, "Trust"), but nothing
	 * needs it to be easier than it must. Also no core dump of the
	 * index and every cached prompt. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
		kvd_warn("prctl(PR_SET_DUMPABLE): %s", strerror(errno));
	/* Before the pool, which can take seconds to reserve: a socket path
	 * that cannot work, or a pool this host cannot hold, is a bad
	 * setting (exit 2); a live socket means another kvcached serves it
	 * (exit 1). */
	rc = kvd_server_precheck(&d, kvd_config_where(&d.cfg, "socket", where, sizeof(where)));
	if (rc) {
		rc = rc == -EADDRINUSE ? 1 : 2;
		goto out;
	}
	rc = 2;
	if (memory_fits(&d))
		goto out;
	rc = 1;
	/* The segment and the pool are faulted in before READY=1: a big pool
	 * of 4 KiB pages on a slow host can take minutes, past systemd's
	 * default start timeout. Ask for 10 s per GiB and a minute more. */
	{
		char st[64];

		snprintf(st, sizeof(st), "EXTEND_TIMEOUT_USEC=%llu",
			 (unsigned long long)(60 + d.cfg.pool_size / (1ull << 30) * 10) * 1000000ull);
		kvd_notify(st);
	}
	if (segment_open(&d))
		goto out;
	if (kvd_pool_open(&d.pool, &d.cfg, (uint64_t)d.h->geo.n_pages * d.cfg.page_size,
			  d.cfg.page_size))
		goto out;
	pool_stats(&d);
	/* Before the spill tier: its warm restart announces what it finds. */
	if (kvd_events_open(&d.g))
		goto out;
	if (kvd_spill_open(&d.g))
		goto out;
	if (kvd_remote_open(&d.g))
		goto out;
	if (kvd_server_open(&d))
		goto out;
	/* The metrics port is bound before "ready:", so that a busy port
	 * fails the start with our message, not after it. */
	if (d.cfg.metrics_listen[0] && !(metrics = metrics_start(&d)))
		goto out;
	kvd_info("ready: socket %s, %u KV pages of %llu bytes (page-size), %u-token blocks, %u index buckets, segment %llu bytes",
		 d.cfg.socket, d.h->geo.n_pages, (unsigned long long)d.h->geo.page_bytes,
		 d.h->geo.block_tokens, d.h->geo.n_buckets,
		 (unsigned long long)d.h->segment_bytes);
	/* The socket listens already: clients that come now are accepted. */
	{
		char st[256];

		snprintf(st, sizeof(st), "READY=1\nSTATUS=serving %u pages of %llu bytes on %s",
			 d.h->geo.n_pages, (unsigned long long)d.h->geo.page_bytes, d.cfg.socket);
		if (kvd_notify(st))
			kvd_warn("NOTIFY_SOCKET: readiness not delivered");
	}
	d.watchdog_usec = kvd_watchdog_usec();
	if (d.watchdog_usec)
		kvd_info("systemd watchdog: pinging every %llu ms",
			 (unsigned long long)d.watchdog_usec / 2000);
	rc = kvd_server_run(&d) ? 1 : 0;
	kvd_notify("STOPPING=1");
out:
	kvd_metrics_stop(metrics);
	teardown(&d);
	if (!rc)
		kvd_info("stopped cleanly");
	return rc;
}
