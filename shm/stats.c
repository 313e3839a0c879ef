// SPDX-License-Identifier: MIT
/*
 * stats.c - snapshots of the segment's statistics and their Prometheus
 * rendering (see stats.h). Names follow the Prometheus conventions: the
 * kvcached_ prefix, _total on counters, base units (bytes, seconds).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

#define M(n, t, h, l, j, f) { n, t, h, l, j, KVSHM_STAT_ID(f) }
const struct kvshm_metric kvshm_metrics[] = {
	M("kvcached_pool_pages", "gauge", "Pool pages by state; pinned pages are also ready.",
	  "state=\"free\"", "pages_free", pages_free),
	M("kvcached_pool_pages", "gauge", NULL, "state=\"writing\"", "pages_writing", pages_writing),
	M("kvcached_pool_pages", "gauge", NULL, "state=\"ready\"", "pages_ready", pages_ready),
	M("kvcached_pool_pages", "gauge", NULL, "state=\"pinned\"", "pages_pinned", pages_pinned),
	M("kvcached_pool_pages", "gauge", NULL, "state=\"spilled\"", "pages_spilled", pages_spilled),
	M("kvcached_index_entries", "gauge", "Blocks in the shared index.", NULL, "index_entries",
	  index_entries),
	M("kvcached_pool_backing", "gauge",
	  "What the host pool's memory is: 1 normal 4 KiB pages, 2 shmem transparent huge "
	  "pages, 3 hugetlb pages; 0 a cuda pool.", NULL, "pool_backing", pool_backing),
	M("kvcached_pool_memory_page_bytes", "gauge",
	  "Kernel page size the host pool is made of: 2097152 (hugetlb, shmem THP) or 4096; "
	  "0 for a cuda pool.", NULL, "pool_memory_page_bytes", pool_memory_page_bytes),
	M("kvcached_pool_huge_bytes", "gauge",
	  "Bytes of the host pool in 2 MiB pages, as the kernel mapped them once the pool was "
	  "faulted in (the daemon's /proc/self/smaps).", NULL, "pool_huge_bytes",
	  pool_huge_bytes),
	M("kvcached_segment_huge_bytes", "gauge",
	  "Bytes of the shared segment (index, page table) in 2 MiB pages, read as for the "
	  "pool.", NULL, "segment_huge_bytes", segment_huge_bytes),
	M("kvcached_pins", "gauge", "Pin slots in use over all clients.", NULL, "pins", pins),
	M("kvcached_clients", "gauge", "Clients attached now.", NULL, "clients_attached",
	  clients_attached),
	M("kvcached_clients_lingering", "gauge",
	  "Disconnected clients whose process lives on; their pins still count.", NULL,
	  "clients_lingering", clients_lingering),
	M("kvcached_clients_accepted_total", "counter", "Clients ever attached.", NULL,
	  "clients_total", clients_total),
	M("kvcached_clients_refused_total", "counter",
	  "Connections refused (peer, geometry, limits, protocol version).", NULL,
	  "clients_refused", clients_refused),
	M("kvcached_clients_dropped_total", "counter",
	  "Clients disconnected for breaking the protocol.", NULL, "clients_dropped",
	  clients_dropped),
	M("kvcached_lookups_total", "counter", "Prefix lookups.", NULL, "lookups", lookups),
	M("kvcached_lookup_blocks_total", "counter", "Blocks looked up, by result.",
	  "result=\"hit\"", "hit_blocks", hit_blocks),
	M("kvcached_lookup_blocks_total", "counter", NULL, "result=\"miss\"", "miss_blocks",
	  miss_blocks),
	M("kvcached_lookup_tokens_total", "counter", "Prompt tokens looked up.", NULL,
	  "lookup_tokens", lookup_tokens),
	M("kvcached_hit_tokens_total", "counter", "Prompt tokens served from the cache.", NULL,
	  "hit_tokens", hit_tokens),
	M("kvcached_pin_failures_total", "counter",
	  "Hits lost because the page was evicted between find and pin.", NULL, "pin_failures",
	  pin_failures),
	M("kvcached_allocations_total", "counter", "Pages handed to clients for writing.", NULL,
	  "allocs", allocs),
	M("kvcached_allocations_short_total", "counter",
	  "Allocation requests served only in part.", NULL, "alloc_short", alloc_short),
	M("kvcached_publishes_total", "counter", "Pages published into the index.", NULL,
	  "publishes", publishes),
	M("kvcached_publish_duplicates_total", "counter",
	  "Publishes that lost a race to an identical block.", NULL, "publish_dups",
	  publish_dups),
	M("kvcached_publish_refused_total", "counter",
	  "Publishes refused (key collision or full index window).", NULL, "publish_refused",
	  publish_refused),
	M("kvcached_frees_total", "counter", "Granted pages given back unpublished.", NULL,
	  "frees", frees),
	M("kvcached_evictions_total", "counter", "Pages evicted from the pool.", NULL,
	  "evictions", evictions),
	M("kvcached_eviction_backoffs_total", "counter",
	  "Eviction candidates spared because a client pinned them.", NULL, "evict_backoffs",
	  evict_backoffs),
	M("kvcached_reclaimed_pages_total", "counter",
	  "Writing pages taken back from clients that died.", NULL, "reclaimed", reclaimed),
	M("kvcached_spill_enabled", "gauge",
	  "1 while the spill tier takes writes; 0 without one or after it degraded.", NULL,
	  "spill_enabled", spill_enabled),
	M("kvcached_spill_io_path", "gauge",
	  "Spill tier I/O: 0 off, 1 io_uring, 2 worker threads, 3 degraded (writes stopped "
	  "after an error).", NULL, "spill_path", spill_path),
	M("kvcached_spill_slots", "gauge", "Slots in the spill area; 0 without a spill tier.",
	  NULL, "spill_slots", spill_slots),
	M("kvcached_spills_total", "counter", "Pages written to the spill tier.", NULL, "spills",
	  spills),
	M("kvcached_restores_total", "counter", "Pages restored from the spill tier.", NULL,
	  "restores", restores),
	M("kvcached_restore_misses_total", "counter",
	  "Spilled blocks asked for and not restored.", NULL, "restore_misses", restore_misses),
	M("kvcached_spill_written_bytes_total", "counter",
	  "Bytes written to the spill tier (slot headers and payloads).", NULL,
	  "spill_write_bytes", spill_write_bytes),
	M("kvcached_spill_read_bytes_total", "counter",
	  "Bytes read back from the spill tier (slot headers and payloads).", NULL,
	  "spill_read_bytes", spill_read_bytes),
	M("kvcached_spill_clean_evictions_total", "counter",
	  "Evictions that needed no write: a clean copy was in the spill tier.", NULL,
	  "spill_clean", spill_clean),
	M("kvcached_spill_recycled_slots_total", "counter",
	  "Spill slots given up, coldest first, to make room.", NULL, "spill_recycled",
	  spill_recycled),
	M("kvcached_spill_dropped_slots_total", "counter",
	  "Spill slots dropped for a bad header or checksum, never served.", NULL,
	  "spill_dropped", spill_dropped),
	M("kvcached_spill_errors_total", "counter", "Failed spill writes and reads.", NULL,
	  "spill_errors", spill_errors),
	M("kvcached_spill_read_bandwidth_bytes_per_second", "gauge",
	  "Measured restore bandwidth (moving average); 0 before the first restore.", NULL,
	  "spill_read_bps", spill_read_bps),
	M("kvcached_spill_warm_slots", "gauge",
	  "Spilled blocks found on disk at start (warm restart).", NULL, "spill_warm",
	  spill_warm),
	M("kvcached_clients_timed_out_total", "counter",
	  "Connections dropped for sending no HELLO within hello-timeout-ms.", NULL,
	  "clients_timed_out", clients_timed_out),
	M("kvcached_fds_passed_total", "counter",
	  "File descriptors clients sent (not part of the protocol; closed off the event loop).",
	  NULL, "fds_passed", fds_passed),
	M("kvcached_pool_holes_total", "counter",
	  "Pool pages found punched out (fallocate or MADV_REMOVE by a client); their blocks dropped.",
	  NULL, "pool_holes", pool_holes),
	M("kvcached_ticks_slow_total", "counter",
	  "Daemon ticks that took longer than tick-ms (the event loop fell behind).", NULL,
	  "ticks_slow", ticks_slow),
	M("kvcached_share_refused_total", "counter",
	  "ALLOCs refused because the process holds its max-share of the pool.", NULL,
	  "share_refused", share_refused),
	M("kvcached_kv_events_enabled", "gauge",
	  "1 while KV events for cluster routers are published (--kv-events).", NULL,
	  "kv_events_enabled", kv_events_enabled),
	M("kvcached_kv_events_total", "counter",
	  "KV events (BlockStored, BlockRemoved, AllBlocksCleared) in batches sent.", NULL,
	  "kv_events", kv_events),
	M("kvcached_kv_event_batches_total", "counter",
	  "KV event batches, by outcome; dropped: a subscriber's queue was full.",
	  "result=\"sent\"", "kv_event_batches", kv_event_batches),
	M("kvcached_kv_event_batches_total", "counter", NULL, "result=\"dropped\"",
	  "kv_event_drops", kv_event_drops),
	M("kvcached_kv_events_subscriber_stalled", "gauge",
	  "1 while a subscriber that stopped reading loses KV event batches alone "
	  "(uncounted) so that the others get them.", NULL, "kv_events_lossy",
	  kv_events_lossy),
	M("kvcached_kv_event_replays_total", "counter",
	  "KV event replay requests from subscribers, by outcome.", "result=\"served\"",
	  "kv_event_replays", kv_event_replays),
	M("kvcached_kv_event_replays_total", "counter", NULL, "result=\"refused\"",
	  "kv_event_replay_errors", kv_event_replay_errors),
	M("kvcached_remote_servers", "gauge",
	  "Remote tier servers (memcached) by state; 0 without a remote tier.", "state=\"up\"",
	  "remote_servers_up", remote_servers_up),
	M("kvcached_remote_servers_configured", "gauge",
	  "Remote tier servers configured; 0 without a remote tier.", NULL, "remote_servers",
	  remote_servers),
	M("kvcached_remote_write_mode", "gauge",
	  "When blocks are written to the remote tier: 0 off, 1 on publish, 2 on eviction.",
	  NULL, "remote_write_mode", remote_write_mode),
	M("kvcached_remote_puts_total", "counter", "Blocks written to the remote tier.", NULL,
	  "remote_puts", remote_puts),
	M("kvcached_remote_put_bytes_total", "counter",
	  "Bytes written to the remote tier (headers, tokens, payloads, MACs).", NULL,
	  "remote_put_bytes", remote_put_bytes),
	M("kvcached_remote_puts_skipped_total", "counter",
	  "Blocks not written to the remote tier: queue full or server down.", NULL,
	  "remote_put_skipped", remote_put_skipped),
	M("kvcached_remote_put_errors_total", "counter",
	  "Remote writes refused (item too large for -I) or failed.", NULL, "remote_put_errors",
	  remote_put_errors),
	M("kvcached_remote_fetches_total", "counter", "Blocks asked of the remote tier.", NULL,
	  "remote_fetches", remote_fetches),
	M("kvcached_remote_fetch_blocks_total", "counter",
	  "Blocks asked of the remote tier, by result (dropped: failed verification, never "
	  "served).", "result=\"hit\"", "remote_hits", remote_hits),
	M("kvcached_remote_fetch_blocks_total", "counter", NULL, "result=\"miss\"",
	  "remote_misses", remote_misses),
	M("kvcached_remote_fetch_blocks_total", "counter", NULL, "result=\"dropped\"",
	  "remote_dropped", remote_dropped),
	M("kvcached_remote_fetch_blocks_total", "counter", NULL, "result=\"stale\"",
	  "remote_stale", remote_stale),
	M("kvcached_remote_timeouts_total", "counter",
	  "Remote operations past remote-timeout-ms, and fetches answered at their deadline.",
	  NULL, "remote_timeouts", remote_timeouts),
	M("kvcached_remote_fetch_bytes_total", "counter",
	  "Bytes fetched from the remote tier into pages.", NULL, "remote_fetch_bytes",
	  remote_fetch_bytes),
	M("kvcached_remote_fetch_bandwidth_bytes_per_second", "gauge",
	  "Measured remote fetch bandwidth (moving average); 0 before the first fetch.", NULL,
	  "remote_fetch_bps", remote_fetch_bps),
	M("kvcached_flights_total", "counter",
	  "Pages announced in flight: granted for a block other clients may wait for.", NULL,
	  "flights", flights),
	M("kvcached_pages_in_flight", "gauge",
	  "Pages announced in flight and not yet published or released.", NULL,
	  "pages_in_flight", pages_in_flight),
	M("kvcached_waits_total", "counter",
	  "Waits for blocks another client was writing (single flight), by outcome.",
	  "result=\"served\"", "wait_served", wait_served),
	M("kvcached_waits_total", "counter", NULL, "result=\"timeout\"", "wait_timeouts",
	  wait_timeouts),
	M("kvcached_waits_total", "counter", NULL, "result=\"lost\"", "wait_lost", wait_lost),
	M("kvcached_wait_saved_tokens_total", "counter",
	  "Prefill tokens clients got by waiting for another client's pages.", NULL,
	  "wait_tokens", wait_tokens),
	M("kvcached_quota_refused_total", "counter",
	  "Allocations refused for a share of the pool, by share (process: max-share).",
	  "share=\"tenant\"", "tenant_refused", tenant_refused),
	M("kvcached_quota_refused_total", "counter", NULL, "share=\"namespace\"",
	  "namespace_refused", namespace_refused),
	M("kvcached_no_insert_refused_total", "counter",
	  "Allocations of no-insert clients (KVC_OPEN_NO_INSERT, or a no-insert tenant) refused.",
	  NULL, "no_insert_refused", no_insert_refused),
	M("kvcached_pinned_prefixes", "gauge", "Prefixes pinned resident with a time to live.",
	  NULL, "pinned_prefixes", pinned_prefixes),
	M("kvcached_pinned_pages", "gauge", "Pages the pinned prefixes hold resident.", NULL,
	  "pinned_pages", pinned_pages),
	M("kvcached_pins_expired_total", "counter", "Pinned prefixes whose time to live ran out.",
	  NULL, "pins_expired", pins_expired),
	M("kvcached_operator_drops_total", "counter",
	  "Drops of a namespace's or a tenant's pages by an operator (kvstat --drop).", NULL,
	  "operator_drops", operator_drops),
	M("kvcached_config_watermark_percent", "gauge",
	  "Eviction watermarks in force (percent of pages free).", "which=\"low\"",
	  "cfg_low_watermark", cfg_low_watermark),
	M("kvcached_config_watermark_percent", "gauge", NULL, "which=\"high\"",
	  "cfg_high_watermark", cfg_high_watermark),
	M("kvcached_config_eviction", "gauge",
	  "Eviction policy in force: 0 lru, 1 s3fifo, 2 clock.", NULL, "cfg_eviction",
	  cfg_eviction),
	M("kvcached_config_share_percent", "gauge", "Shares of the pool in force.",
	  "share=\"process\"", "cfg_max_share", cfg_max_share),
	M("kvcached_config_share_percent", "gauge", NULL, "share=\"tenant\"",
	  "cfg_tenant_share", cfg_tenant_share),
	M("kvcached_config_share_percent", "gauge", NULL, "share=\"namespace\"",
	  "cfg_namespace_share", cfg_namespace_share),
	M("kvcached_config_log_level", "gauge",
	  "Log level in force, as a syslog priority: 3 error, 4 warning, 6 info, 7 debug.", NULL,
	  "cfg_log_level", cfg_log_level),
	M("kvcached_reloads_total", "counter",
	  "Configuration reloads (SIGHUP), by outcome; refused: the file did not parse.",
	  "result=\"applied\"", "reloads", reloads),
	M("kvcached_reloads_total", "counter", NULL, "result=\"refused\"", "reload_errors",
	  reload_errors),
	M("kvcached_slice_joins_total", "counter",
	  "Pages a tensor-parallel rank joined to write its slice of heads (a page several ranks write).",
	  NULL, "slice_joins", slice_joins),
	M("kvcached_slice_dropped_total", "counter",
	  "Pages several ranks were writing, given up before the last slice: a rank released its slice, died, or did not come within slice-timeout-ms.",
	  NULL, "slice_dropped", slice_dropped),
	M("kvcached_pin_barriers_total", "counter",
	  "membarrier(2) calls before eviction scans (pin-barrier auto): each interrupts the CPUs running clients, so that lookups pin with no fence.",
	  NULL, "pin_barriers", pin_barriers),
};
#undef M
const size_t kvshm_n_metrics = sizeof(kvshm_metrics) / sizeof(kvshm_metrics[0]);

_Static_assert(sizeof(struct kvshm_stats) % sizeof(uint64_t) == 0, "stats are u64s");

static int cmp_top(const void *a, const void *b)
{
	const struct kvshm_top_entry *x = a, *y = b;

	return x->hit_tokens < y->hit_tokens ? 1 : x->hit_tokens > y->hit_tokens ? -1 : 0;
}

static void copy_relaxed(void *dst, const void *src, size_t bytes)
{
	const uint64_t *s = src;
	uint64_t *d = dst;
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}

static void ns_name(const struct kvshm_ns *ns, char *out)
{
	int n = snprintf(out, KVSHM_NS_NAME, "%s", ns->model);

	if (ns->pp_size > 1)
		n += snprintf(out + n, KVSHM_NS_NAME - n, " pp%u/%u", ns->pp_rank, ns->pp_size);
	if (ns->layout == KVSHM_KV_LATENT && n < KVSHM_NS_NAME)
		n += snprintf(out + n, KVSHM_NS_NAME - n, " (MLA)");
	if (ns->kind == KVSHM_NS_ENGINE && n < KVSHM_NS_NAME)
		snprintf(out + n, KVSHM_NS_NAME - n, " (engine keys)");
}

int kvshm_snap_take(const struct kvshm_header *h, struct kvshm_snap *s)
{
	const _Atomic uint64_t *st = (const _Atomic uint64_t *)kvshm_stats(h);
	const struct kvshm_top *t = kvshm_top(h);
	uint32_t i, n, tries;
	size_t k;

	memset(s, 0, sizeof(*s));
	s->geo = h->geo;
	s->segment_bytes = h->segment_bytes;
	s->pool_kind = h->pool_kind;
	s->daemon_pid = h->daemon_pid;
	s->start_time_ns = h->start_time_ns;
	s->heartbeat = atomic_load_explicit(&h->heartbeat, memory_order_relaxed);
	for (i = 0; i < KVSHM_STAT_N; i++)
		s->v[i] = atomic_load_explicit(&st[i], memory_order_relaxed);

	s->ns = calloc(h->geo.max_ns, sizeof(*s->ns));
	s->ns_name = calloc(h->geo.max_ns, sizeof(*s->ns_name));
	s->ns_st = calloc(h->geo.max_ns, sizeof(*s->ns_st));
	s->clients = calloc(h->geo.max_clients, sizeof(*s->clients));
	s->tenants = calloc(KVSHM_TENANTS, sizeof(*s->tenants));
	s->pinned = calloc(KVSHM_PINNED, sizeof(*s->pinned));
	if (!s->ns || !s->ns_name || !s->ns_st || !s->clients || !s->tenants || !s->pinned) {
		kvshm_snap_free(s);
		return -ENOMEM;
	}
	for (i = 0; i < h->geo.max_ns; i++) {
		const struct kvshm_ns *r = &kvshm_ns(h)[i];

		if (!atomic_load_explicit(&r->used, memory_order_acquire))
			continue;	/* free, or being rewritten for a reuse */
		copy_relaxed(&s->ns[i], r, sizeof(*r));
		copy_relaxed(&s->ns_st[i], &kvshm_ns_stats(h)[i], sizeof(s->ns_st[i]));
		s->ns[i].model[KVSHM_MODEL_NAME - 1] = 0;
		ns_name(&s->ns[i], s->ns_name[i]);
		s->n_ns = i + 1;
	}
	for (i = 0, n = 0; i < h->geo.max_clients; i++) {
		const struct kvshm_client_row *r = &kvshm_clients(h)[i];
		struct kvshm_snap_client *c = &s->clients[n];
		int32_t pid = atomic_load_explicit(&r->pid, memory_order_acquire);

		if (!pid)
			continue;
		c->pid = pid;
		c->uid = __atomic_load_n(&r->uid, __ATOMIC_RELAXED);
		c->ns_id = __atomic_load_n(&r->ns_id, __ATOMIC_RELAXED);
		for (k = 0; k < sizeof(c->comm); k++)	/* comm is not 8-byte aligned */
			c->comm[k] = __atomic_load_n(&r->comm[k], __ATOMIC_RELAXED);
		c->comm[sizeof(c->comm) - 1] = 0;
		c->lookups = atomic_load_explicit(&r->lookups, memory_order_relaxed);
		c->hit_blocks = atomic_load_explicit(&r->hit_blocks, memory_order_relaxed);
		c->miss_blocks = atomic_load_explicit(&r->miss_blocks, memory_order_relaxed);
		c->pins_held = atomic_load_explicit(&r->pins_held, memory_order_relaxed);
		c->published = atomic_load_explicit(&r->published, memory_order_relaxed);
		c->writing = atomic_load_explicit(&r->writing, memory_order_relaxed);
		/* The row was cleared meanwhile: skip it. */
		if (atomic_load_explicit(&r->pid, memory_order_acquire) == pid)
			n++;
	}
	s->n_clients = n;
	for (i = 0; i < KVSHM_TENANTS; i++) {
		const struct kvshm_tenant *r = &kvshm_tenants(h)[i];

		if (!atomic_load_explicit(&r->used, memory_order_acquire))
			continue;	/* free, or being rewritten */
		copy_relaxed(&s->tenants[i], r, sizeof(*r));
		s->tenants[i].name[KVSHM_TENANT_NAME - 1] = 0;
		if (!atomic_load_explicit(&r->used, memory_order_acquire))
			memset(&s->tenants[i], 0, sizeof(s->tenants[i]));
		else if (s->tenants[i].name[0])
			s->n_tenants = i + 1;
	}
	for (i = 0, n = 0; i < KVSHM_PINNED; i++) {
		const struct kvshm_pinned *r = &kvshm_pinned(h)[i];
		uint32_t id = atomic_load_explicit(&r->id, memory_order_acquire);

		if (!id)
			continue;
		copy_relaxed(&s->pinned[n], r, sizeof(*r));
		s->pinned[n].label[sizeof(s->pinned[n].label) - 1] = 0;
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&r->id, memory_order_relaxed) == id)
			n++;	/* else reused meanwhile: skip it */
	}
	s->n_pinned = n;
	/* The sketch, under its seqcount. Bounded: a daemon that died in the
	 * middle of an update leaves the count odd for ever. */
	for (tries = 0;; tries++) {
		uint32_t seq = atomic_load_explicit(&t->seq, memory_order_acquire);

		if (tries == 100000) {
			s->n_top = 0;
			break;
		}
		if (seq & 1)
			continue;
		s->n_top = __atomic_load_n(&t->n, __ATOMIC_RELAXED);
		if (s->n_top > KVSHM_TOP)
			s->n_top = KVSHM_TOP;
		copy_relaxed(s->top, t->e, sizeof(s->top));
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&t->seq, memory_order_relaxed) == seq)
			break;
	}
	for (i = 0; i < s->n_top; i++)
		s->top[i].label[KVSHM_LABEL - 1] = 0;
	qsort(s->top, s->n_top, sizeof(s->top[0]), cmp_top);
	return 0;
}

void kvshm_snap_free(struct kvshm_snap *s)
{
	free(s->ns);
	free(s->ns_name);
	free(s->ns_st);
	free(s->clients);
	free(s->tenants);
	free(s->pinned);
	s->tenants = NULL;
	s->pinned = NULL;
	s->ns_st = NULL;
	s->ns_name = NULL;
	s->ns = NULL;
	s->clients = NULL;
}

const char *kvshm_snap_tenant(const struct kvshm_snap *s, uint32_t t)
{
	return kvshm_snap_tenant_used(s, t) ? s->tenants[t].name : "-";
}

const char *kvshm_snap_model(const struct kvshm_snap *s, uint32_t ns_id)
{
	return ns_id < s->n_ns && s->ns_name[ns_id][0] ? s->ns_name[ns_id] : "?";
}

/* snprintf into a moving window; `need` counts what the whole text takes. */
struct out {
	char *buf;
	size_t len, need;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...)
{
	size_t room = o->need < o->len ? o->len - o->need : 0;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(room ? o->buf + o->need : NULL, room, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->need += (size_t)n;
}

int kvshm_utf8_len(const unsigned char *s)
{
	unsigned char c = s[0];
	uint32_t cp;
	int n, i;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, cp = c & 0x07;
	else
		return 0;
	for (i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/*
 * A label value with \, " and newline escaped, as the format requires, and
 * every byte that is not valid UTF-8 as U+FFFD: a scraper refuses the whole
 * page over one such label value, and model and process names come from
 * clients (a process name is cut at 15 bytes, mid-character or not).
 */
static void put_escaped(struct out *o, const char *v)
{
	const unsigned char *s = (const unsigned char *)v;
	int n;

	while (*s) {
		if (*s == '\\' || *s == '"') {
			put(o, "\\%c", *s++);
		} else if (*s == '\n') {
			put(o, "\\n");
			s++;
		} else if ((n = kvshm_utf8_len(s)) > 0) {
			put(o, "%.*s", n, (const char *)s);
			s += n;
		} else {
			put(o, "\xef\xbf\xbd");	/* U+FFFD */
			s++;
		}
	}
}

static void family(struct out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One metric family per field of a table's rows (namespaces, tenants). */
struct series {
	const char *name, *type, *help;
	size_t off;
};

/* Every field of `f` over rows 0..n-1 (`stride` bytes apart from base),
 * the rows in use labelled {key="name",row="i"}. */
static void table_series(struct out *o, const struct series *f, size_t nf, const void *base,
			 size_t stride, uint32_t n, const char *key,
			 const char *(*name)(const struct kvshm_snap *, uint32_t),
			 const struct kvshm_snap *s)
{
	size_t k;
	uint32_t i;

	for (k = 0; k < nf; k++) {
		family(o, f[k].name, f[k].type, f[k].help);
		for (i = 0; i < n; i++) {
			const char *nm = name(s, i);
			uint64_t v;

			if (!nm)
				continue;
			memcpy(&v, (const char *)base + i * stride + f[k].off, sizeof(v));
			put(o, "%s{%s=\"", f[k].name, key);
			put_escaped(o, nm);
			put(o, "\",row=\"%u\"} %llu\n", i, (unsigned long long)v);
		}
	}
}

static const char *ns_label(const struct kvshm_snap *s, uint32_t i)
{
	return kvshm_snap_ns_used(s, i) ? s->ns_name[i] : NULL;
}

static const char *tenant_label(const struct kvshm_snap *s, uint32_t i)
{
	return kvshm_snap_tenant_used(s, i) ? s->tenants[i].name : NULL;
}

/* Per namespace: one family per field of struct kvshm_ns_stats; the row
 * label keeps two namespaces of one model name apart. */
static void ns_series(struct out *o, const struct kvshm_snap *s)
{
	static const struct series f[] = {
#define F(n, t, h, field) { n, t, h, offsetof(struct kvshm_ns_stats, field) }
		F("kvcached_namespace_lookups_total", "counter", "Prefix lookups, per namespace.",
		  lookups),
		F("kvcached_namespace_hit_blocks_total", "counter",
		  "Blocks found in the cache, per namespace.", hit_blocks),
		F("kvcached_namespace_miss_blocks_total", "counter",
		  "Blocks looked up and not found, per namespace.", miss_blocks),
		F("kvcached_namespace_lookup_tokens_total", "counter",
		  "Prompt tokens looked up, per namespace.", lookup_tokens),
		F("kvcached_namespace_hit_tokens_total", "counter",
		  "Prompt tokens served from the cache, per namespace.", hit_tokens),
		F("kvcached_namespace_published_total", "counter",
		  "Pages published, per namespace.", published),
		F("kvcached_namespace_dropped_total", "counter",
		  "Pages dropped at a client's or an operator's request, per namespace.", dropped),
		F("kvcached_namespace_refused_total", "counter",
		  "Allocations refused for the namespace-share, per namespace.", refused),
		F("kvcached_namespace_pages", "gauge", "Ready pool pages, per namespace.", pages),
		F("kvcached_namespace_held_pages", "gauge",
		  "Pages pinned or being written, as the namespace-share counts them.", held),
		F("kvcached_namespace_clients", "gauge", "Clients attached, per namespace.",
		  clients),
#undef F
	};
	uint32_t i;

	family(o, "kvcached_namespace_page_bytes", "gauge",
	       "Bytes of a namespace's page (at most a pool page; the rest of the pool page is unused).");
	for (i = 0; i < s->n_ns; i++) {
		if (!kvshm_snap_ns_used(s, i))
			continue;
		put(o, "kvcached_namespace_page_bytes{namespace=\"");
		put_escaped(o, s->ns_name[i]);
		put(o, "\",row=\"%u\"} %llu\n", i, (unsigned long long)s->ns[i].page_bytes);
	}
	table_series(o, f, sizeof(f) / sizeof(f[0]), s->ns_st, sizeof(*s->ns_st), s->n_ns,
		     "namespace", ns_label, s);
}

/* Per tenant, labelled with the operator's name for it (never the salt). */
static void tenant_series(struct out *o, const struct kvshm_snap *s)
{
	static const struct series f[] = {
#define F(n, t, h, field) { n, t, h, offsetof(struct kvshm_tenant, field) }
		F("kvcached_tenant_lookups_total", "counter", "Prefix lookups, per tenant.", lookups),
		F("kvcached_tenant_hit_blocks_total", "counter",
		  "Blocks found in the cache, per tenant.", hit_blocks),
		F("kvcached_tenant_miss_blocks_total", "counter",
		  "Blocks looked up and not found, per tenant.", miss_blocks),
		F("kvcached_tenant_lookup_tokens_total", "counter",
		  "Prompt tokens looked up, per tenant.", lookup_tokens),
		F("kvcached_tenant_hit_tokens_total", "counter",
		  "Prompt tokens served from the cache, per tenant.", hit_tokens),
		F("kvcached_tenant_published_total", "counter", "Pages published, per tenant.",
		  published),
		F("kvcached_tenant_refused_total", "counter",
		  "Allocations of the tenant's clients refused for a share (max-share, its "
		  "tenant share, its namespace's).", refused),
		F("kvcached_tenant_no_insert_refused_total", "counter",
		  "Allocations of the tenant's no-insert clients refused.", no_insert_refused),
		F("kvcached_tenant_dropped_total", "counter",
		  "Pages of the tenant an operator dropped.", dropped),
		F("kvcached_tenant_pages", "gauge", "Ready pool pages holding the tenant's blocks.",
		  pages),
		F("kvcached_tenant_held_pages", "gauge",
		  "Pages the tenant pins or writes and its pinned prefixes hold, as its share "
		  "counts them.", held),
		F("kvcached_tenant_pinned_pages", "gauge",
		  "Pages the tenant's pinned prefixes hold resident.", pinned),
		F("kvcached_tenant_share_percent", "gauge",
		  "The share of the pool the tenant may hold.", share),
		F("kvcached_tenant_clients", "gauge", "Clients attached, per tenant.", clients),
#undef F
	};

	table_series(o, f, sizeof(f) / sizeof(f[0]), s->tenants, sizeof(*s->tenants),
		     s->n_tenants, "tenant", tenant_label, s);
}

static void client_labels(struct out *o, const struct kvshm_snap *s,
			  const struct kvshm_snap_client *c)
{
	put(o, "pid=\"%d\",comm=\"", c->pid);
	put_escaped(o, c->comm);
	put(o, "\",namespace=\"");
	put_escaped(o, kvshm_snap_model(s, c->ns_id));
	put(o, "\"");
}

size_t kvshm_prometheus(const struct kvshm_snap *s, char *buf, size_t len)
{
	struct out o = { buf, len, 0 };
	const char *last = "";
	uint32_t i;
	size_t k;

	if (len)
		buf[0] = 0;
	family(&o, "kvcached_pool_bytes", "gauge", "Bytes of the page pool.");
	put(&o, "kvcached_pool_bytes %llu\n", (unsigned long long)s->geo.pool_bytes);
	family(&o, "kvcached_page_bytes", "gauge", "Bytes of one pool page slot.");
	put(&o, "kvcached_page_bytes %llu\n", (unsigned long long)s->geo.page_bytes);
	family(&o, "kvcached_block_tokens", "gauge", "Tokens per cached block.");
	put(&o, "kvcached_block_tokens %u\n", s->geo.block_tokens);
	family(&o, "kvcached_start_time_seconds", "gauge",
	       "When the daemon started, in seconds since the epoch.");
	put(&o, "kvcached_start_time_seconds %.3f\n", (double)s->start_time_ns / 1e9);
	family(&o, "kvcached_pool_prefault_seconds", "gauge",
	       "How long faulting the host pool in took at start (before the daemon served).");
	put(&o, "kvcached_pool_prefault_seconds %.3f\n",
	    (double)s->v[KVSHM_STAT_ID(pool_prefault_ns)] / 1e9);
	for (k = 0; k < kvshm_n_metrics; k++) {
		const struct kvshm_metric *m = &kvshm_metrics[k];

		if (strcmp(m->name, last)) {
			family(&o, m->name, m->type, m->help);
			last = m->name;
		}
		if (m->label)
			put(&o, "%s{%s} %llu\n", m->name, m->label,
			    (unsigned long long)s->v[m->stat]);
		else
			put(&o, "%s %llu\n", m->name, (unsigned long long)s->v[m->stat]);
	}
	family(&o, "kvcached_client_lookups_total", "counter", "Prefix lookups, per client.");
	for (i = 0; i < s->n_clients; i++) {
		put(&o, "kvcached_client_lookups_total{");
		client_labels(&o, s, &s->clients[i]);
		put(&o, "} %llu\n", (unsigned long long)s->clients[i].lookups);
	}
	family(&o, "kvcached_client_lookup_blocks_total", "counter",
	       "Blocks looked up, per client and result.");
	for (i = 0; i < s->n_clients; i++) {
		put(&o, "kvcached_client_lookup_blocks_total{");
		client_labels(&o, s, &s->clients[i]);
		put(&o, ",result=\"hit\"} %llu\n", (unsigned long long)s->clients[i].hit_blocks);
		put(&o, "kvcached_client_lookup_blocks_total{");
		client_labels(&o, s, &s->clients[i]);
		put(&o, ",result=\"miss\"} %llu\n", (unsigned long long)s->clients[i].miss_blocks);
	}
	family(&o, "kvcached_client_pins", "gauge", "Pin slots in use, per client.");
	for (i = 0; i < s->n_clients; i++) {
		put(&o, "kvcached_client_pins{");
		client_labels(&o, s, &s->clients[i]);
		put(&o, "} %llu\n", (unsigned long long)s->clients[i].pins_held);
	}
	family(&o, "kvcached_client_published_total", "counter", "Pages published, per client.");
	for (i = 0; i < s->n_clients; i++) {
		put(&o, "kvcached_client_published_total{");
		client_labels(&o, s, &s->clients[i]);
		put(&o, "} %llu\n", (unsigned long long)s->clients[i].published);
	}
	family(&o, "kvcached_prefix_hit_tokens", "gauge",
	       "Hit tokens of the hottest prefix roots (a space-saving sketch: a root that "
	       "entered late may be overcounted; kvstat --json shows the bound).");
	for (i = 0; i < s->n_top; i++) {
		const struct kvshm_top_entry *e = &s->top[i];

		put(&o, "kvcached_prefix_hit_tokens{key=\"%016llx%016llx\",label=\"",
		    (unsigned long long)e->key.hi, (unsigned long long)e->key.lo);
		put_escaped(&o, e->label);
		put(&o, "\",namespace=\"");
		put_escaped(&o, kvshm_snap_model(s, e->ns_id));
		put(&o, "\"} %llu\n", (unsigned long long)e->hit_tokens);
	}
	ns_series(&o, s);
	tenant_series(&o, s);
	return o.need;
}
