// SPDX-License-Identifier: MIT
/*
 * reload.c - SIGHUP (and `systemctl reload`, which sends it): read the
 * settings again, the way the start did (the table's defaults, the
 * --config file, the flags), and apply what can change while the daemon
 * serves, keeping every cached page and attached client:
 *
 *   low-watermark, high-watermark   the eviction targets, from the next tick
 *   eviction                        the pool's and the spill tier's cached
 *                                   blocks go over to the new policy (what
 *                                   the old one knew of recency is lost)
 *   max-share, tenant-share, namespace-share, tenant
 *                                   shares and tenants, for the next ALLOC
 *                                   (tenant rows are renamed, not emptied)
 *   log-level                       at once
 *   allow-users, allow-groups       for the next connection (attached
 *                                   clients stay attached)
 *   remote, remote-*                the remote tier is closed (its queued
 *                                   puts skipped, fetches in flight answered
 *                                   with what has come, each operation
 *                                   bounded by remote-timeout-ms) and opened
 *                                   again with the new settings
 *
 * Everything else (the pool, the socket, the spill area, the limits sized
 * at start) needs a restart: each such key that changed is named in the
 * log, and keeps its old value. A file that does not parse changes
 * nothing. The log says what was applied; kvstat shows the settings in
 * force (the segment's cfg_* stats, written here and at start).
 *
 * Lives on the top floor (it reads the config): the event loop reaches it
 * through d->reload, which main.c sets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "config.h"
#include "core/evict.h"
#include "core/kvd.h"
#include "core/quota.h"
#include "core/reply.h"
#include "reload.h"
#include "server/notify.h"
#include "tier/remote.h"
#include "tier/spill.h"
#include "util/log.h"

#define RELAXED memory_order_relaxed

void kvd_reload_publish(struct kvd *d)
{
	struct kvshm_stats *st = kvshm_stats(d->h);

	atomic_store_explicit(&st->cfg_low_watermark, d->cfg.low_watermark, RELAXED);
	atomic_store_explicit(&st->cfg_high_watermark, d->cfg.high_watermark, RELAXED);
	atomic_store_explicit(&st->cfg_eviction, (uint64_t)d->cfg.eviction, RELAXED);
	atomic_store_explicit(&st->cfg_max_share, d->cfg.max_share, RELAXED);
	atomic_store_explicit(&st->cfg_tenant_share, d->cfg.tenant_share, RELAXED);
	atomic_store_explicit(&st->cfg_namespace_share, d->cfg.namespace_share, RELAXED);
	atomic_store_explicit(&st->cfg_log_level, (uint64_t)d->cfg.log_level, RELAXED);
}

struct change {
	struct kvd *d;
	struct kvd_config *n;	/* the settings read now */
	unsigned applied, restart;
	bool remote, eviction, tenants, watermarks;
};

static void one(void *arg, const char *key, bool live)
{
	struct change *ch = arg;
	char was[128], now[128];

	kvd_config_show(&ch->d->cfg, key, was, sizeof(was));
	kvd_config_show(ch->n, key, now, sizeof(now));
	if (!live) {
		kvd_warn("reload: %s %s -> %s needs a restart; %s stays in force", key, was, now,
			 was);
		ch->restart++;
		return;
	}
	kvd_info("reload: %s %s -> %s", key, was, now);
	ch->applied++;
	if (!strncmp(key, "remote", 6))
		ch->remote = true;
	else if (!strcmp(key, "eviction"))
		ch->eviction = true;
	else if (!strcmp(key, "tenant") || !strcmp(key, "tenant-share") ||
		 !strcmp(key, "max-share") || !strcmp(key, "namespace-share"))
		ch->tenants = true;
	else if (!strcmp(key, "low-watermark") || !strcmp(key, "high-watermark"))
		ch->watermarks = true;
}

/* The remote tier again, with the new settings; a tier that will not open
 * (a server list that does not parse cannot get here; a secret file that
 * cannot be read can) leaves the daemon without one, said in the log. */
static void remote_again(struct kvd *d)
{
	int fd;

	if (d->g.tier[KVD_TIER_REMOTE])
		d->g.tier[KVD_TIER_REMOTE]->close(&d->g);	/* its eventfd leaves the epoll set */
	if (!d->cfg.remote[0]) {
		kvd_info("reload: no remote tier now");
		return;
	}
	if (kvd_remote_open(&d->g)) {
		kvd_err("reload: the remote tier did not open with the new settings (above): running without one");
		if (d->g.tier[KVD_TIER_REMOTE])
			d->g.tier[KVD_TIER_REMOTE]->close(&d->g);
		return;
	}
	fd = kvd_tiers_fd(&d->g, KVD_TIER_REMOTE);
	if (fd >= 0 && kvd_ep_set(d, EPOLL_CTL_ADD, fd, EPOLLIN, KVD_EV_TIER + KVD_TIER_REMOTE))
		kvd_err("reload: remote tier: epoll: its completions would not be seen");
}

void kvd_reload(struct kvd *d)
{
	struct kvshm_stats *st = kvshm_stats(d->h);
	struct change ch = { .d = d };
	struct timespec ts;
	char msg[96];

	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
		 (unsigned long long)(kvd_now_ns() / 1000));
	kvd_notify(msg);
	ch.n = malloc(sizeof(*ch.n));
	if (!ch.n) {
		kvd_err("reload: out of memory; nothing changed");
		goto out;
	}
	kvd_config_defaults(ch.n);
	/* The messages of a bad file or flag go to the log (stderr). */
	if (kvd_config_args(ch.n, d->argc, d->argv)) {
		kvd_err("reload: the settings have errors (above): nothing changed");
		atomic_store_explicit(&st->reload_errors,
				      atomic_load_explicit(&st->reload_errors, RELAXED) + 1, RELAXED);
		goto out;
	}
	kvd_config_diff(&d->cfg, ch.n, one, &ch);
	/* The live settings, field by field; everything else stays. */
	d->cfg.low_watermark = ch.n->low_watermark;
	d->cfg.high_watermark = ch.n->high_watermark;
	d->cfg.max_share = ch.n->max_share;
	d->cfg.tenant_share = ch.n->tenant_share;
	d->cfg.namespace_share = ch.n->namespace_share;
	memcpy(d->cfg.tenants, ch.n->tenants, sizeof(d->cfg.tenants));
	d->cfg.n_tenants = ch.n->n_tenants;
	d->cfg.log_level = ch.n->log_level;
	kvd_log_level = d->cfg.log_level;
	memcpy(d->cfg.allow_uid, ch.n->allow_uid, sizeof(d->cfg.allow_uid));
	d->cfg.n_allow_uid = ch.n->n_allow_uid;
	memcpy(d->cfg.allow_gid, ch.n->allow_gid, sizeof(d->cfg.allow_gid));
	d->cfg.n_allow_gid = ch.n->n_allow_gid;
	if (ch.watermarks) {
		d->low_pages = (uint32_t)((uint64_t)d->h->geo.n_pages * d->cfg.low_watermark / 100);
		d->high_pages = (uint32_t)((uint64_t)d->h->geo.n_pages * d->cfg.high_watermark / 100);
		d->evict_quiet_until = 0;
	}
	if (ch.eviction) {
		if (kvd_evict_policy(d, ch.n->eviction) || kvd_spill_policy(&d->g, ch.n->eviction))
			kvd_err("reload: out of memory switching eviction policy; the old one stays where it could not");
		else
			d->cfg.eviction = ch.n->eviction;
	}
	if (ch.tenants)
		kvd_quota_configure(d);
	if (ch.remote) {
		memcpy(d->cfg.remote, ch.n->remote, sizeof(d->cfg.remote));
		d->cfg.remote_write = ch.n->remote_write;
		memcpy(d->cfg.remote_secret_file, ch.n->remote_secret_file,
		       sizeof(d->cfg.remote_secret_file));
		d->cfg.remote_insecure = ch.n->remote_insecure;
		d->cfg.remote_timeout_ms = ch.n->remote_timeout_ms;
		memcpy(d->cfg.remote_prefix, ch.n->remote_prefix, sizeof(d->cfg.remote_prefix));
		remote_again(d);
	}
	kvd_reload_publish(d);
	atomic_store_explicit(&st->reloads, atomic_load_explicit(&st->reloads, RELAXED) + 1, RELAXED);
	clock_gettime(CLOCK_REALTIME, &ts);
	atomic_store_explicit(&st->reload_time_ns,
			      (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec, RELAXED);
	kvd_info("reload: %u settings applied, %u need a restart%s", ch.applied, ch.restart,
		 ch.applied || ch.restart ? "" : " (nothing changed)");
out:
	free(ch.n);
	kvd_notify("READY=1");
}
