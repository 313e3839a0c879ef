// SPDX-License-Identifier: MIT
/*
 * kvstat.c - the operator's live view of kvcached: pool occupancy by page
 * state and tier, the spill tier's slots and health, the remote tier's
 * servers and traffic, hit ratios in blocks
 * and tokens, event counts and rates (byte rates for spill I/O), one row
 * per attached client and the hottest prefixes.
 *
 * How it reads: kvobs_attach() makes one STAT round trip to get the
 * segment's file descriptor and maps it read-only; from then on every frame
 * is a kvshm_snap_take() of shared memory (relaxed loads, no lock, no
 * syscall to the daemon). Names and numbers come from shm/stats.c, the same
 * code that serves the daemon's /metrics, so `kvstat --json` counters carry
 * the kvshm_metrics[] JSON names and `kvstat --prometheus` is byte for byte
 * what /metrics would answer for the same snapshot.
 *
 * Modes:
 *   one-shot (default)   plain aligned text; rates are averages since the
 *                        daemon started (count / uptime), no interval.
 *   --watch SECONDS      a frame every SECONDS (fractions allowed), each
 *                        with the last interval's hit ratio and rates and a
 *                        sparkline of the block hit ratio over the last 40
 *                        intervals. On a terminal it redraws in place like
 *                        top; into a pipe or file, frames are separated by
 *                        a line. With --json: one object per line.
 *   --json               one object with stable field names (docs/KVSTAT.md).
 *   --prometheus         kvshm_prometheus() of one snapshot.
 *
 * Daemon restarts: the daemon bumps the header's heartbeat every tick. In
 * watch mode a heartbeat that has not moved for more than 3 s means the
 * daemon is gone or stuck: kvstat says so on one line, drops its mapping
 * and tries to attach again every interval (a new daemon has a new
 * segment; the old mapping would show frozen numbers forever).
 *
 * Strings that came from clients (process names, labels, model names) are
 * shown as printable ASCII in the table (anything else becomes '?', so a
 * client cannot send escape sequences to the operator's terminal) and as
 * properly escaped UTF-8 in JSON.
 *
 * Exit status: 0 ok (also after SIGINT/SIGTERM in watch mode), 1 no daemon
 * or a segment this build cannot read, 2 bad usage.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../libclient/kvclient.h"
#include "../libclient/observe.h"
#include "../shm/proto.h"
#include "../shm/segment.h"
#include "../shm/stats.h"

#define HIST		40	/* sparkline intervals */
#define STALL_S		3.0	/* heartbeat silence that means "gone" */
#define ATTACH_S	3	/* how long one attach may wait for a reply */
#define TOP_ROWS	10	/* top prefixes in the table (JSON: all) */
#define NOTE_S		10.0	/* a terminal shows the reattach note this long */

#define V(s, f) ((s)->v[KVSHM_STAT_ID(f)])

static struct {
	const char *socket;
	bool json;
	bool prom;
	double watch;		/* 0: one-shot */
	unsigned long count;	/* 0: until interrupted */
	bool reset;		/* --reset: zero the daemon's counters */
	/* Operator requests (ADMIN): one of these, then exit. */
	int admin;		/* enum kvproto_admin_op, 0: none */
	const char *drop_ns;	/* --drop-namespace MODEL */
	const char *tenant;	/* --drop-tenant NAME, --tenant NAME */
	const char *model;	/* --model MODEL */
	long ns_row;		/* --namespace ROW, -1: none */
	const char *pin_file;	/* --pin FILE */
	long ttl;		/* --ttl SECONDS, 0: none */
	const char *label;	/* --label TEXT */
	long unpin;		/* --unpin ID */
	bool pins;		/* --pins: list the pinned prefixes */
} opt = { .ns_row = -1 };

static volatile sig_atomic_t stop_sig;
static volatile sig_atomic_t alarmed;

/* What the previous frame left for this one. */
struct watch {
	struct kvobs o;
	bool attached;
	bool tty;
	bool have_prev;
	uint64_t prev[KVSHM_STAT_N];
	double prev_t;			/* CLOCK_MONOTONIC seconds */
	uint64_t hb;			/* last heartbeat seen ... */
	double hb_t;			/* ... and when it last moved */
	double hist[HIST];		/* block hit ratio; < 0: no lookups */
	unsigned int n_hist;
	char last_msg[512];
	char note[128];			/* atop terminal frames ... */
	double note_until;		/* ... until then (CLOCK_MONOTONIC s) */
};

/* Counter deltas between two snapshots of the same daemon. */
struct interval {
	bool valid;
	double dt;
	uint64_t d[KVSHM_STAT_N];
};

/* ------------------------------------------------------------- helpers */

static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double uptime_s(const struct kvshm_snap *s)
{
	struct timespec ts;
	double now;

	clock_gettime(CLOCK_REALTIME, &ts);
	now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	now -= (double)s->start_time_ns / 1e9;
	return now > 0 ? now : 0;
}

/* Seconds the counters have been counting: since the start, or since
 * the last reset (kvstat --reset). */
static double counted_s(const struct kvshm_snap *s)
{
	uint64_t r = s->v[KVSHM_STAT_ID(reset_time_ns)];
	struct timespec ts;
	double now;

	if (!r)
		return uptime_s(s);
	clock_gettime(CLOCK_REALTIME, &ts);
	now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 - (double)r / 1e9;
	return now > 0 ? now : 0;
}

static const char *pool_kind(uint32_t k)
{
	return k == KVSHM_POOL_HOST ? "host" : k == KVSHM_POOL_CUDA ? "cuda" : "unknown";
}

/* enum kvshm_pool_backing: the JSON name. */
static const char *backing_name(uint64_t b)
{
	return b == KVSHM_BACKING_SMALL ? "4k" : b == KVSHM_BACKING_THP ? "thp" :
	       b == KVSHM_BACKING_HUGETLB ? "hugetlb" : "none";
}

/*
 * A spill tier is configured when it has slots: spill_enabled drops to 0
 * when the tier degrades (writes stopped after an error), while its slots,
 * spilled blocks and restores go on.
 */
static bool spill_configured(const struct kvshm_snap *s)
{
	return V(s, spill_slots) > 0;
}

/* enum kvshm_spill_path: the JSON name, and the words of the table. */
static const char *spill_path_json(uint64_t p)
{
	switch (p) {
	case KVSHM_SPILL_OFF: return "off";
	case KVSHM_SPILL_URING: return "io_uring";
	case KVSHM_SPILL_THREADS: return "threads";
	case KVSHM_SPILL_DEGRADED: return "degraded";
	default: return "unknown";
	}
}

static const char *spill_path_text(uint64_t p)
{
	switch (p) {
	case KVSHM_SPILL_OFF: return "off";
	case KVSHM_SPILL_URING: return "io_uring";
	case KVSHM_SPILL_THREADS: return "worker threads";
	case KVSHM_SPILL_DEGRADED: return "DEGRADED: writes stopped after an error";
	default: return "unknown I/O path";
	}
}

/* A remote tier is configured when it has servers. */
static bool remote_configured(const struct kvshm_snap *s)
{
	return V(s, remote_servers) > 0;
}

/* enum kvshm_remote_write */
static const char *remote_write_name(uint64_t w)
{
	return w == KVSHM_REMOTE_PUBLISH ? "publish" : w == KVSHM_REMOTE_EVICT ? "evict" : "off";
}

/* -1 when there is nothing to divide by. */
static double ratio(uint64_t num, uint64_t den)
{
	return den ? (double)num / (double)den : -1;
}

static const char *fmt_bytes(char *buf, size_t len, uint64_t b)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)b;
	int u = -1;

	if (b < 1024) {
		snprintf(buf, len, "%llu B", (unsigned long long)b);
		return buf;
	}
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, unit[u]);
	return buf;
}

/* Truncated, not rounded: 100.0% only when nothing was missed. */
static const char *fmt_pct(char *buf, size_t len, double r)
{
	if (r < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.1f%%", floor(r * 1000 + 1e-9) / 10);
	return buf;
}

static const char *fmt_rate(char *buf, size_t len, double r)
{
	if (r < 0)
		snprintf(buf, len, "-");
	else if (r >= 1e6)
		snprintf(buf, len, "%.2fM", r / 1e6);
	else if (r >= 1e4)
		snprintf(buf, len, "%.1fk", r / 1e3);
	else
		snprintf(buf, len, "%.1f", r);
	return buf;
}

/* Bytes per second: "1.5 GiB/s", or "-" when undefined (< 0). */
static const char *fmt_bps(char *buf, size_t len, double r)
{
	char b[32];

	if (r < 0 || !isfinite(r))
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%s/s", fmt_bytes(b, sizeof(b), (uint64_t)r));
	return buf;
}

static const char *fmt_uptime(char *buf, size_t len, double s)
{
	unsigned long long t = (unsigned long long)s;

	if (t >= 86400)
		snprintf(buf, len, "%llud %02llu:%02llu:%02llu", t / 86400, t / 3600 % 24,
			 t / 60 % 60, t % 60);
	else
		snprintf(buf, len, "%llu:%02llu:%02llu", t / 3600, t / 60 % 60, t % 60);
	return buf;
}

/* Printable ASCII only: what a client sent must not drive the terminal. */
static const char *safe(char *buf, size_t len, const char *s)
{
	size_t i;

	for (i = 0; s[i] && i + 1 < len; i++)
		buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
	buf[i] = 0;
	return buf;
}

/* A JSON string: quotes, backslashes and controls escaped; bytes that are
 * not valid UTF-8 become U+FFFD, so the output is always valid JSON. */
static void json_str(FILE *f, const char *str)
{
	const unsigned char *s = (const unsigned char *)str;
	int n;

	fputc('"', f);
	while (*s) {
		if (*s == '"' || *s == '\\') {
			fprintf(f, "\\%c", *s++);
		} else if (*s < 0x20 || *s == 0x7f) {
			switch (*s) {
			case '\n': fputs("\\n", f); break;
			case '\r': fputs("\\r", f); break;
			case '\t': fputs("\\t", f); break;
			default: fprintf(f, "\\u%04x", *s); break;
			}
			s++;
		} else if ((n = kvshm_utf8_len(s)) > 0) {
			fwrite(s, 1, (size_t)n, f);
			s += n;
		} else {
			fputs("\\ufffd", f);
			s++;
		}
	}
	fputc('"', f);
}

/* A ratio or a rate: a number, or null when undefined (< 0). */
static void json_num(FILE *f, double v, int prec)
{
	if (v < 0 || !isfinite(v))
		fputs("null", f);
	else
		fprintf(f, "%.*f", prec, v);
}

/* ------------------------------------------------------------ intervals */

static void interval_of(struct interval *iv, const struct watch *w, const struct kvshm_snap *s,
			double now)
{
	size_t k;

	memset(iv, 0, sizeof(*iv));
	if (!w || !w->have_prev || now <= w->prev_t)
		return;
	/* A counter that went backwards belongs to another daemon's life. */
	for (k = 0; k < kvshm_n_metrics; k++) {
		const struct kvshm_metric *m = &kvshm_metrics[k];

		if (!strcmp(m->type, "counter") && s->v[m->stat] < w->prev[m->stat])
			return;
	}
	iv->valid = true;
	iv->dt = now - w->prev_t;
	for (k = 0; k < KVSHM_STAT_N; k++)
		iv->d[k] = s->v[k] - w->prev[k];	/* counters only are used */
}

#define D(iv, f) ((iv)->d[KVSHM_STAT_ID(f)])

/* ------------------------------------------------------------------ JSON */

static void json_rates(FILE *f, const struct kvshm_snap *s, const uint64_t *d, double secs)
{
	bool first = true;
	size_t k;

	fputc('{', f);
	for (k = 0; k < kvshm_n_metrics; k++) {
		const struct kvshm_metric *m = &kvshm_metrics[k];
		uint64_t v = d ? d[m->stat] : s->v[m->stat];

		if (strcmp(m->type, "counter"))
			continue;
		fprintf(f, "%s\"%s\":", first ? "" : ",", m->json);
		json_num(f, secs > 0 ? (double)v / secs : -1, 3);
		first = false;
	}
	fputc('}', f);
}

/* The settings a reload changes, as in force ("eviction" by name). */
static const char *eviction_name(uint64_t e)
{
	return e == 0 ? "lru" : e == 1 ? "s3fifo" : e == 2 ? "clock" : "?";
}

static const char *log_name(uint64_t l)
{
	return l == 3 ? "error" : l == 4 ? "warning" : l == 6 ? "info" : l == 7 ? "debug" : "?";
}

static void json_settings(FILE *f, const struct kvshm_snap *s)
{
	uint64_t t = V(s, reload_time_ns);

	fprintf(f, "{\"low_watermark\":%llu,\"high_watermark\":%llu,\"eviction\":\"%s\","
		"\"max_share\":%llu,\"tenant_share\":%llu,\"namespace_share\":%llu,"
		"\"log_level\":\"%s\",\"reloads\":%llu,\"reload_errors\":%llu,"
		"\"reload_time_seconds\":",
		(unsigned long long)V(s, cfg_low_watermark),
		(unsigned long long)V(s, cfg_high_watermark), eviction_name(V(s, cfg_eviction)),
		(unsigned long long)V(s, cfg_max_share), (unsigned long long)V(s, cfg_tenant_share),
		(unsigned long long)V(s, cfg_namespace_share), log_name(V(s, cfg_log_level)),
		(unsigned long long)V(s, reloads), (unsigned long long)V(s, reload_errors));
	if (t)
		fprintf(f, "%.3f}", (double)t / 1e9);
	else
		fputs("null}", f);
}

static void json_tenants(FILE *f, const struct kvshm_snap *s)
{
	uint32_t i, k = 0;

	fputc('[', f);
	for (i = 0; i < s->n_tenants; i++) {
		const struct kvshm_tenant *t = &s->tenants[i];

		if (!kvshm_snap_tenant_used(s, i))
			continue;
		fprintf(f, "%s{\"row\":%u,\"name\":", k++ ? "," : "", i);
		json_str(f, t->name);
		fprintf(f, ",\"configured\":%s,\"no_insert\":%s,\"share\":%llu,\"held\":%llu,"
			"\"pinned\":%llu,\"pages\":%llu,\"clients\":%llu,\"lookups\":%llu,"
			"\"hit_blocks\":%llu,\"miss_blocks\":%llu,\"lookup_tokens\":%llu,"
			"\"hit_tokens\":%llu,\"published\":%llu,\"refused\":%llu,"
			"\"no_insert_refused\":%llu,\"dropped\":%llu,\"hit_ratio\":{\"blocks\":",
			t->flags & KVSHM_TENANT_CONFIGURED ? "true" : "false",
			t->flags & KVSHM_TENANT_NO_INSERT ? "true" : "false",
			(unsigned long long)t->share, (unsigned long long)t->held,
			(unsigned long long)t->pinned, (unsigned long long)t->pages,
			(unsigned long long)t->clients, (unsigned long long)t->lookups,
			(unsigned long long)t->hit_blocks, (unsigned long long)t->miss_blocks,
			(unsigned long long)t->lookup_tokens, (unsigned long long)t->hit_tokens,
			(unsigned long long)t->published, (unsigned long long)t->refused,
			(unsigned long long)t->no_insert_refused, (unsigned long long)t->dropped);
		json_num(f, ratio(t->hit_blocks, t->hit_blocks + t->miss_blocks), 6);
		fputs(",\"tokens\":", f);
		json_num(f, ratio(t->hit_tokens, t->lookup_tokens), 6);
		fputs("}}", f);
	}
	fputc(']', f);
}

static double pin_left_s(const struct kvshm_pinned *p)
{
	struct timespec ts;
	double now;

	clock_gettime(CLOCK_REALTIME, &ts);
	now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	now = (double)p->expires_ns / 1e9 - now;
	return now > 0 ? now : 0;
}

static void json_pinned(FILE *f, const struct kvshm_snap *s)
{
	uint32_t i;

	fputc('[', f);
	for (i = 0; i < s->n_pinned; i++) {
		const struct kvshm_pinned *p = &s->pinned[i];

		fprintf(f, "%s{\"id\":%u,\"namespace\":", i ? "," : "", p->id);
		json_str(f, kvshm_snap_model(s, p->ns_id));
		fputs(",\"tenant\":", f);
		json_str(f, kvshm_snap_tenant(s, p->tenant));
		fprintf(f, ",\"blocks\":%u,\"resident\":%u,\"expires_seconds\":%.3f,"
			"\"ttl_left_seconds\":%.3f,\"since_seconds\":%.3f,\"pid\":%d,\"uid\":%u,"
			"\"first_key\":\"%016llx%016llx\",\"label\":",
			p->blocks, p->resident, (double)p->expires_ns / 1e9, pin_left_s(p),
			(double)p->since_ns / 1e9, p->pid, p->uid, (unsigned long long)p->first.hi,
			(unsigned long long)p->first.lo);
		json_str(f, p->label);
		fputc('}', f);
	}
	fputc(']', f);
}

static void print_json(FILE *f, const struct kvobs *o, const struct kvshm_snap *s,
		       const struct interval *iv)
{
	const struct kvshm_geometry *g = &s->geo;
	double up = uptime_s(s), counted = counted_s(s);
	uint64_t reset = V(s, reset_time_ns);
	uint32_t i;
	size_t k;

	fprintf(f, "{\"kvstat\":1,\"version\":\"%s\",\"shm_version\":%u,\"daemon_pid\":%d,"
		"\"uptime_seconds\":%.3f,\"start_time_seconds\":%.3f,\"reset_time_seconds\":",
		KVC_VERSION_STRING, o->h->version, s->daemon_pid, up,
		(double)s->start_time_ns / 1e9);
	if (reset)
		fprintf(f, "%.3f", (double)reset / 1e9);
	else
		fputs("null", f);
	fprintf(f, ",\"counted_seconds\":%.3f,\"heartbeat\":%llu,", counted,
		(unsigned long long)s->heartbeat);
	fprintf(f, "\"pool\":{\"bytes\":%llu,\"page_bytes\":%llu,\"pages\":%u,\"block_tokens\":%u,"
		"\"kind\":\"%s\",\"backing\":\"%s\",\"memory_page_bytes\":%llu,\"huge_bytes\":%llu,"
		"\"prefault_seconds\":%.3f,\"segment_bytes\":%llu,\"segment_huge_bytes\":%llu},",
		(unsigned long long)g->pool_bytes, (unsigned long long)g->page_bytes, g->n_pages,
		g->block_tokens, pool_kind(s->pool_kind), backing_name(V(s, pool_backing)),
		(unsigned long long)V(s, pool_memory_page_bytes),
		(unsigned long long)V(s, pool_huge_bytes), (double)V(s, pool_prefault_ns) / 1e9,
		(unsigned long long)s->segment_bytes, (unsigned long long)V(s, segment_huge_bytes));
	fprintf(f, "\"pages\":{\"free\":%llu,\"writing\":%llu,\"ready\":%llu,\"pinned\":%llu,"
		"\"spilled\":%llu},",
		(unsigned long long)V(s, pages_free), (unsigned long long)V(s, pages_writing),
		(unsigned long long)V(s, pages_ready), (unsigned long long)V(s, pages_pinned),
		(unsigned long long)V(s, pages_spilled));
	fputs("\"counters\":{", f);
	for (k = 0; k < kvshm_n_metrics; k++)
		fprintf(f, "%s\"%s\":%llu", k ? "," : "", kvshm_metrics[k].json,
			(unsigned long long)s->v[kvshm_metrics[k].stat]);
	fputs("},\"hit_ratio\":{\"blocks\":", f);
	json_num(f, ratio(V(s, hit_blocks), V(s, hit_blocks) + V(s, miss_blocks)), 6);
	fputs(",\"tokens\":", f);
	json_num(f, ratio(V(s, hit_tokens), V(s, lookup_tokens)), 6);
	fputs("},\"rates_since_start\":", f);
	json_rates(f, s, NULL, counted);
	fputs(",\"interval\":", f);
	if (iv && iv->valid) {
		fprintf(f, "{\"seconds\":%.3f,\"hit_ratio\":{\"blocks\":", iv->dt);
		json_num(f, ratio(D(iv, hit_blocks), D(iv, hit_blocks) + D(iv, miss_blocks)), 6);
		fputs(",\"tokens\":", f);
		json_num(f, ratio(D(iv, hit_tokens), D(iv, lookup_tokens)), 6);
		fputs("},\"rates\":", f);
		json_rates(f, s, iv->d, iv->dt);
		fputc('}', f);
	} else {
		fputs("null", f);
	}
	fputs(",\"clients\":[", f);
	for (i = 0; i < s->n_clients; i++) {
		const struct kvshm_snap_client *c = &s->clients[i];

		fprintf(f, "%s{\"pid\":%d,\"uid\":%u,\"comm\":", i ? "," : "", c->pid, c->uid);
		json_str(f, c->comm);
		fputs(",\"namespace\":", f);
		json_str(f, kvshm_snap_model(s, c->ns_id));
		fprintf(f, ",\"lookups\":%llu,\"hit_blocks\":%llu,\"miss_blocks\":%llu,"
			"\"pins\":%llu,\"published\":%llu,\"writing\":%llu}",
			(unsigned long long)c->lookups, (unsigned long long)c->hit_blocks,
			(unsigned long long)c->miss_blocks, (unsigned long long)c->pins_held,
			(unsigned long long)c->published, (unsigned long long)c->writing);
	}
	fputs("],\"namespaces\":[", f);
	for (i = 0, k = 0; i < s->n_ns; i++) {
		const struct kvshm_ns_stats *n = &s->ns_st[i];
		uint64_t slot = g->page_bytes, pb = s->ns[i].page_bytes;

		if (!kvshm_snap_ns_used(s, i))
			continue;
		fprintf(f, "%s{\"row\":%u,\"name\":", k++ ? "," : "", i);
		json_str(f, s->ns_name[i]);
		fputs(",\"model\":", f);
		json_str(f, s->ns[i].model);
		fprintf(f, ",\"page_bytes\":%llu,\"page_use\":", (unsigned long long)pb);
		json_num(f, ratio(pb, slot), 6);
		fprintf(f, ",\"pages\":%llu,\"wasted_bytes\":%llu,\"clients\":%llu,"
			"\"lookups\":%llu,\"hit_blocks\":%llu,\"miss_blocks\":%llu,"
			"\"lookup_tokens\":%llu,\"hit_tokens\":%llu,\"published\":%llu,"
			"\"dropped\":%llu,\"hit_ratio\":{\"blocks\":",
			(unsigned long long)n->pages,
			(unsigned long long)(n->pages * (slot > pb ? slot - pb : 0)),
			(unsigned long long)n->clients, (unsigned long long)n->lookups,
			(unsigned long long)n->hit_blocks, (unsigned long long)n->miss_blocks,
			(unsigned long long)n->lookup_tokens, (unsigned long long)n->hit_tokens,
			(unsigned long long)n->published, (unsigned long long)n->dropped);
		json_num(f, ratio(n->hit_blocks, n->hit_blocks + n->miss_blocks), 6);
		fputs(",\"tokens\":", f);
		json_num(f, ratio(n->hit_tokens, n->lookup_tokens), 6);
		/* How its blocks are keyed: by tokens, or by the engine's keys. */
		fprintf(f, "},\"keys\":\"%s\"}",
			s->ns[i].kind == KVSHM_NS_ENGINE ? "engine" : "tokens");
	}
	fputs("],\"top_prefixes\":[", f);
	for (i = 0; i < s->n_top; i++) {
		const struct kvshm_top_entry *e = &s->top[i];

		fprintf(f, "%s{\"key\":\"%016llx%016llx\",\"hit_tokens\":%llu,\"error\":%llu,"
			"\"label\":", i ? "," : "", (unsigned long long)e->key.hi,
			(unsigned long long)e->key.lo, (unsigned long long)e->hit_tokens,
			(unsigned long long)e->err);
		json_str(f, e->label);
		fputs(",\"namespace\":", f);
		json_str(f, kvshm_snap_model(s, e->ns_id));
		fputc('}', f);
	}
	fputs("],\"tenants\":", f);
	json_tenants(f, s);
	fputs(",\"pinned\":", f);
	json_pinned(f, s);
	fputs(",\"settings\":", f);
	json_settings(f, s);
	fputs(",\"spill\":", f);
	if (spill_configured(s)) {
		/* "pages" is "slots_used" by the name earlier kvstat 1 output used. */
		fprintf(f, "{\"enabled\":%s,\"path\":\"%s\",\"slots\":%llu,\"slots_used\":%llu,"
			"\"pages\":%llu,\"bytes\":%llu,\"spills\":%llu,\"restores\":%llu,"
			"\"restore_misses\":%llu,\"write_bytes\":%llu,\"read_bytes\":%llu,"
			"\"dropped\":%llu,\"recycled\":%llu,\"clean\":%llu,\"errors\":%llu,"
			"\"read_bps\":%llu,\"warm\":%llu}",
			V(s, spill_enabled) ? "true" : "false", spill_path_json(V(s, spill_path)),
			(unsigned long long)V(s, spill_slots),
			(unsigned long long)V(s, pages_spilled),
			(unsigned long long)V(s, pages_spilled),
			(unsigned long long)(V(s, pages_spilled) * g->page_bytes),
			(unsigned long long)V(s, spills), (unsigned long long)V(s, restores),
			(unsigned long long)V(s, restore_misses),
			(unsigned long long)V(s, spill_write_bytes),
			(unsigned long long)V(s, spill_read_bytes),
			(unsigned long long)V(s, spill_dropped),
			(unsigned long long)V(s, spill_recycled),
			(unsigned long long)V(s, spill_clean), (unsigned long long)V(s, spill_errors),
			(unsigned long long)V(s, spill_read_bps),
			(unsigned long long)V(s, spill_warm));
	} else {
		fputs("{\"enabled\":false,\"path\":\"off\",\"slots\":0}", f);
	}
	fputs(",\"remote\":", f);
	if (remote_configured(s))
		fprintf(f, "{\"enabled\":true,\"servers\":%llu,\"servers_up\":%llu,\"write\":\"%s\","
			"\"puts\":%llu,\"put_bytes\":%llu,\"put_skipped\":%llu,\"put_errors\":%llu,"
			"\"fetches\":%llu,\"hits\":%llu,\"misses\":%llu,\"dropped\":%llu,\"stale\":%llu,"
			"\"timeouts\":%llu,\"fetch_bytes\":%llu,\"fetch_bps\":%llu}",
			(unsigned long long)V(s, remote_servers),
			(unsigned long long)V(s, remote_servers_up),
			remote_write_name(V(s, remote_write_mode)),
			(unsigned long long)V(s, remote_puts),
			(unsigned long long)V(s, remote_put_bytes),
			(unsigned long long)V(s, remote_put_skipped),
			(unsigned long long)V(s, remote_put_errors),
			(unsigned long long)V(s, remote_fetches), (unsigned long long)V(s, remote_hits),
			(unsigned long long)V(s, remote_misses),
			(unsigned long long)V(s, remote_dropped),
			(unsigned long long)V(s, remote_stale),
			(unsigned long long)V(s, remote_timeouts),
			(unsigned long long)V(s, remote_fetch_bytes),
			(unsigned long long)V(s, remote_fetch_bps));
	else
		fputs("{\"enabled\":false,\"servers\":0}", f);
	fputs("}\n", f);
}

/* ------------------------------------------------------------------ text */

static void page_row(FILE *f, const char *state, const char *tier, uint64_t pages,
		     const struct kvshm_snap *s, const char *note)
{
	char b[32], p[16];

	fprintf(f, "%-9s %-9s %10llu %12s %7s%s\n", state, tier, (unsigned long long)pages,
		fmt_bytes(b, sizeof(b), pages * s->geo.page_bytes),
		fmt_pct(p, sizeof(p), ratio(pages, s->geo.n_pages)), note);
}

static void event_row(FILE *f, const char *name, uint64_t total, double up, const uint64_t *d,
		      const struct interval *iv, bool watch)
{
	char a[32], b[32];

	fprintf(f, "%-14s %14llu %18s", name, (unsigned long long)total,
		fmt_rate(a, sizeof(a), up > 0 ? (double)total / up : -1));
	if (watch)
		fprintf(f, " %16s", fmt_rate(b, sizeof(b),
					     iv && iv->valid ? (double)*d / iv->dt : -1));
	fputc('\n', f);
}

/* event_row for a byte counter: totals in KiB/MiB/..., rates per second. */
static void event_bytes_row(FILE *f, const char *name, uint64_t total, double up,
			    const uint64_t *d, const struct interval *iv, bool watch)
{
	char a[32], b[32], c[32];

	fprintf(f, "%-14s %14s %18s", name, fmt_bytes(c, sizeof(c), total),
		fmt_bps(a, sizeof(a), up > 0 ? (double)total / up : -1));
	if (watch)
		fprintf(f, " %16s", fmt_bps(b, sizeof(b),
					    iv && iv->valid ? (double)*d / iv->dt : -1));
	fputc('\n', f);
}

/* The spill tier's state under the PAGES table: path, slots, health.
 * Bytes are page data; each slot also has a header on disk. */
static void spill_lines(FILE *f, const struct kvshm_snap *s)
{
	uint64_t slots = V(s, spill_slots), used = V(s, pages_spilled);
	char b1[32], b2[32], b3[32], p[16];

	fprintf(f, "spill tier: %s, %llu of %llu slots used (%s), %s of %s page data\n",
		spill_path_text(V(s, spill_path)), (unsigned long long)used,
		(unsigned long long)slots, fmt_pct(p, sizeof(p), ratio(used, slots)),
		fmt_bytes(b1, sizeof(b1), used * s->geo.page_bytes),
		fmt_bytes(b2, sizeof(b2), slots * s->geo.page_bytes));
	if (V(s, spill_read_bps))
		fprintf(f, "            restore bandwidth %s (measured), ",
			fmt_bps(b3, sizeof(b3), (double)V(s, spill_read_bps)));
	else
		fputs("            restore bandwidth not measured yet, ", f);
	fprintf(f, "%llu slots warm at start\n", (unsigned long long)V(s, spill_warm));
	fprintf(f, "            %llu dropped, %llu recycled, %llu clean evictions, %llu errors\n",
		(unsigned long long)V(s, spill_dropped), (unsigned long long)V(s, spill_recycled),
		(unsigned long long)V(s, spill_clean), (unsigned long long)V(s, spill_errors));
}

/* The remote tier's state: servers, when it writes, health. */
static void remote_lines(FILE *f, const struct kvshm_snap *s)
{
	char b[32];

	fprintf(f, "remote tier: %llu of %llu memcached servers up, blocks written on %s, ",
		(unsigned long long)V(s, remote_servers_up), (unsigned long long)V(s, remote_servers),
		remote_write_name(V(s, remote_write_mode)));
	if (V(s, remote_fetch_bps))
		fprintf(f, "fetch bandwidth %s (measured)\n",
			fmt_bps(b, sizeof(b), (double)V(s, remote_fetch_bps)));
	else
		fputs("fetch bandwidth not measured yet\n", f);
	fprintf(f, "             %llu dropped (failed verification), %llu stale (another item format), %llu timeouts, %llu puts skipped, %llu put errors\n",
		(unsigned long long)V(s, remote_dropped), (unsigned long long)V(s, remote_stale),
		(unsigned long long)V(s, remote_timeouts),
		(unsigned long long)V(s, remote_put_skipped),
		(unsigned long long)V(s, remote_put_errors));
}

/* U+2581..U+2588; '.' for an interval without lookups. */
static void sparkline(FILE *f, const struct watch *w)
{
	static const char *const bar[8] = { "\u2581", "\u2582", "\u2583", "\u2584",
					    "\u2585", "\u2586", "\u2587", "\u2588" };
	unsigned int i, n = w->n_hist < HIST ? w->n_hist : HIST;

	for (i = 0; i < n; i++) {
		double r = w->hist[(w->n_hist - n + i) % HIST];
		int k = (int)(r * 8);

		if (r < 0)
			fputc('.', f);
		else
			fputs(bar[k < 0 ? 0 : k > 7 ? 7 : k], f);
	}
}

/*
 * NAMESPACES: per model, its page size and the share of a pool page it
 * fills (a smaller page leaves the rest of every page it takes unused:
 * WASTED), its ready pages, clients, lookups, hit ratios, publishes and
 * drops; then the daemon's own warning for each namespace that fills at
 * most half a page.
 */
static void print_namespaces(FILE *f, const struct kvshm_snap *s)
{
	uint64_t slot = s->geo.page_bytes;
	char b1[32], b2[32], p1[16], p2[16], p3[16], name[KVSHM_NS_NAME], msg[300], out[300];
	uint32_t i, n = 0;
	int wn = 9;

	for (i = 0; i < s->n_ns; i++) {
		if (!kvshm_snap_ns_used(s, i))
			continue;
		n++;
		if ((int)strlen(s->ns_name[i]) > wn)
			wn = (int)strlen(s->ns_name[i]);
	}
	fprintf(f, "\nNAMESPACES (%u)\n", n);
	if (!n)
		return;
	fprintf(f, "%-*s %10s %6s %8s %10s %7s %10s %7s %7s %10s %8s\n", wn, "NAMESPACE", "PAGE",
		"USE", "PAGES", "WASTED", "CLIENTS", "LOOKUPS", "HIT%", "TOK%", "PUBLISHED",
		"DROPPED");
	for (i = 0; i < s->n_ns; i++) {
		const struct kvshm_ns_stats *st = &s->ns_st[i];
		uint64_t pb = s->ns[i].page_bytes;

		if (!kvshm_snap_ns_used(s, i))
			continue;
		fprintf(f, "%-*s %10s %6s %8llu %10s %7llu %10llu %7s %7s %10llu %8llu\n", wn,
			safe(name, sizeof(name), s->ns_name[i]), fmt_bytes(b1, sizeof(b1), pb),
			fmt_pct(p1, sizeof(p1), ratio(pb, slot)), (unsigned long long)st->pages,
			fmt_bytes(b2, sizeof(b2), st->pages * (slot > pb ? slot - pb : 0)),
			(unsigned long long)st->clients, (unsigned long long)st->lookups,
			fmt_pct(p2, sizeof(p2), ratio(st->hit_blocks, st->hit_blocks + st->miss_blocks)),
			fmt_pct(p3, sizeof(p3), ratio(st->hit_tokens, st->lookup_tokens)),
			(unsigned long long)st->published, (unsigned long long)st->dropped);
	}
	for (i = 0; i < s->n_ns; i++)
		if (kvshm_snap_ns_used(s, i) &&
		    kvproto_page_waste(msg, sizeof(msg), s->ns_name[i], s->ns[i].page_bytes, slot))
			fprintf(f, "! %s\n", safe(out, sizeof(out), msg));
}

/*
 * TENANTS: per salt, by the operator's name: its share of the pool and
 * what it holds of it (pinned or writing, and by pinned prefixes), its
 * ready pages, clients, lookups, hit ratios, publishes, refusals (shares,
 * no-insert) and drops.
 */
static void print_tenants(FILE *f, const struct kvshm_snap *s)
{
	char p1[16], p2[16], p3[16], name[KVSHM_TENANT_NAME];
	uint32_t i, n = 0;

	for (i = 0; i < s->n_tenants; i++)
		n += kvshm_snap_tenant_used(s, i) != 0;
	fprintf(f, "\nTENANTS (%u)\n", n);
	if (!n)
		return;
	fprintf(f, "%-20s %6s %8s %8s %8s %7s %10s %7s %7s %10s %8s %8s %8s\n", "TENANT", "SHARE",
		"HELD", "PINNED", "PAGES", "CLIENTS", "LOOKUPS", "HIT%", "TOK%", "PUBLISHED",
		"REFUSED", "NOINSERT", "DROPPED");
	for (i = 0; i < s->n_tenants; i++) {
		const struct kvshm_tenant *t = &s->tenants[i];

		if (!kvshm_snap_tenant_used(s, i))
			continue;
		snprintf(p1, sizeof(p1), "%llu%%", (unsigned long long)t->share);
		fprintf(f, "%-20s %6s %8llu %8llu %8llu %7llu %10llu %7s %7s %10llu %8llu %8llu %8llu%s\n",
			safe(name, sizeof(name), t->name), p1, (unsigned long long)t->held,
			(unsigned long long)t->pinned, (unsigned long long)t->pages,
			(unsigned long long)t->clients, (unsigned long long)t->lookups,
			fmt_pct(p2, sizeof(p2), ratio(t->hit_blocks, t->hit_blocks + t->miss_blocks)),
			fmt_pct(p3, sizeof(p3), ratio(t->hit_tokens, t->lookup_tokens)),
			(unsigned long long)t->published, (unsigned long long)t->refused,
			(unsigned long long)t->no_insert_refused, (unsigned long long)t->dropped,
			t->flags & KVSHM_TENANT_NO_INSERT ? "  no-insert" : "");
	}
}

/* PINNED: the prefixes kept resident, how much of each is, and for how
 * long still. */
static void print_pinned(FILE *f, const struct kvshm_snap *s)
{
	char t[64], name[KVSHM_NS_NAME], tn[KVSHM_TENANT_NAME], label[24];
	uint32_t i;

	fprintf(f, "\nPINNED (%u; kvstat --unpin ID ends one)\n", s->n_pinned);
	if (!s->n_pinned)
		return;
	fprintf(f, "%6s  %-20s %-16s %8s %9s %12s %8s  %s\n", "ID", "NAMESPACE", "TENANT",
		"BLOCKS", "RESIDENT", "TTL LEFT", "PID", "LABEL");
	for (i = 0; i < s->n_pinned; i++) {
		const struct kvshm_pinned *p = &s->pinned[i];

		fprintf(f, "%6u  %-20s %-16s %8u %9u %12s %8d  %s\n", p->id,
			safe(name, sizeof(name), kvshm_snap_model(s, p->ns_id)),
			safe(tn, sizeof(tn), kvshm_snap_tenant(s, p->tenant)), p->blocks,
			p->resident, fmt_uptime(t, sizeof(t), pin_left_s(p)), p->pid,
			safe(label, sizeof(label), p->label));
	}
}

/*
 * MEMORY: what the kernel made the host pool and the segment of, as the
 * daemon read it back once they were faulted in, and what faulting the
 * pool in cost at start.
 */
static void memory_line(FILE *f, const struct kvshm_snap *s)
{
	uint64_t b = V(s, pool_backing), huge = V(s, pool_huge_bytes);
	uint64_t pool = s->geo.pool_bytes, seg = V(s, segment_huge_bytes);
	double secs = (double)V(s, pool_prefault_ns) / 1e9;
	char b1[32];

	if (b == KVSHM_BACKING_NONE)
		return;
	fprintf(f, "memory   pool ");
	if (b == KVSHM_BACKING_SMALL)
		fprintf(f, "in 4 KiB pages");
	else
		fprintf(f, "%.0f%% in 2 MiB pages (%s)", pool ? 100.0 * (double)huge / (double)pool : 0,
			b == KVSHM_BACKING_HUGETLB ? "hugetlb" : "shmem THP");
	fprintf(f, ", faulted in at start in %.2f s (%.2f s/GiB); segment %s: ", secs,
		pool ? secs / ((double)pool / (1ull << 30)) : 0,
		fmt_bytes(b1, sizeof(b1), s->segment_bytes));
	if (seg)
		fprintf(f, "%.0f%% in 2 MiB pages\n",
			s->segment_bytes ? 100.0 * (double)seg / (double)s->segment_bytes : 0);
	else
		fprintf(f, "in 4 KiB pages\n");
}

static void print_text(FILE *f, const struct kvshm_snap *s, const struct interval *iv,
		       const struct watch *w)
{
	const struct kvshm_geometry *g = &s->geo;
	const char *sock = opt.socket ? opt.socket : getenv("KVCACHED_SOCKET");
	bool watch = w != NULL;
	double up = uptime_s(s), counted = counted_s(s);
	char b1[32], b2[32], b3[32], t[64];
	int wc = 4, wn = 9, wl = 5;
	uint32_t i, ntop = s->n_top < TOP_ROWS ? s->n_top : TOP_ROWS;
	char buf[KVSHM_MODEL_NAME];

	fprintf(f, "kvcached pid %d%s%s, up %s, segment v%u, heartbeat %llu\n", s->daemon_pid,
		sock && *sock ? " on " : "", sock && *sock ? sock : "",
		fmt_uptime(t, sizeof(t), up), KVSHM_VERSION, (unsigned long long)s->heartbeat);
	if (V(s, reset_time_ns))
		fprintf(f, "counters reset %s ago (kvstat --reset): totals and rates since then\n",
			fmt_uptime(t, sizeof(t), counted));
	fprintf(f, "pool     %s, %s = %u pages x %s, %u-token blocks, %llu index entries\n",
		pool_kind(s->pool_kind), fmt_bytes(b1, sizeof(b1), g->pool_bytes), g->n_pages,
		fmt_bytes(b2, sizeof(b2), g->page_bytes), g->block_tokens,
		(unsigned long long)V(s, index_entries));
	memory_line(f, s);
	fprintf(f, "clients  %llu attached, %llu accepted, %llu refused, %llu dropped; %llu pins\n",
		(unsigned long long)V(s, clients_attached), (unsigned long long)V(s, clients_total),
		(unsigned long long)V(s, clients_refused), (unsigned long long)V(s, clients_dropped),
		(unsigned long long)V(s, pins));
	fprintf(f, "settings watermarks %llu%%..%llu%%, eviction %s, shares: process %llu%%, tenant %llu%%, namespace %llu%%; log %s",
		(unsigned long long)V(s, cfg_low_watermark),
		(unsigned long long)V(s, cfg_high_watermark), eviction_name(V(s, cfg_eviction)),
		(unsigned long long)V(s, cfg_max_share), (unsigned long long)V(s, cfg_tenant_share),
		(unsigned long long)V(s, cfg_namespace_share), log_name(V(s, cfg_log_level)));
	if (V(s, reloads) || V(s, reload_errors))
		fprintf(f, "; %llu reloads (%llu refused)", (unsigned long long)V(s, reloads),
			(unsigned long long)V(s, reload_errors));
	fputc('\n', f);
	if (V(s, clients_timed_out) || V(s, fds_passed) || V(s, pool_holes) || V(s, share_refused))
		fprintf(f, "guards   %llu idle connections timed out, %llu passed fds closed, %llu punched pages dropped, %llu allocs over max-share\n",
			(unsigned long long)V(s, clients_timed_out),
			(unsigned long long)V(s, fds_passed), (unsigned long long)V(s, pool_holes),
			(unsigned long long)V(s, share_refused));

	fprintf(f, "\n%-9s %-9s %10s %12s %7s\n", "PAGES", "TIER", "COUNT", "BYTES", "SHARE");
	page_row(f, "free", "0 pool", V(s, pages_free), s, "");
	page_row(f, "writing", "0 pool", V(s, pages_writing), s, "");
	page_row(f, "ready", "0 pool", V(s, pages_ready), s, "");
	page_row(f, "pinned", "0 pool", V(s, pages_pinned), s, "  (part of ready)");
	if (spill_configured(s)) {
		fprintf(f, "%-9s %-9s %10llu %12s %7s\n", "spilled", "1 spill",
			(unsigned long long)V(s, pages_spilled),
			fmt_bytes(b1, sizeof(b1), V(s, pages_spilled) * g->page_bytes), "-");
		spill_lines(f, s);
	} else {
		fputs("spill tier: off\n", f);
	}
	if (remote_configured(s))
		remote_lines(f, s);
	else
		fputs("remote tier: off\n", f);

	fprintf(f, "\n%-14s %10s", "HIT RATIO", "OVERALL");
	if (watch) {
		snprintf(t, sizeof(t), "LAST %.1fs", iv && iv->valid ? iv->dt : opt.watch);
		fprintf(f, " %12s", t);
	}
	fprintf(f, "\n%-14s %10s", "blocks",
		fmt_pct(b1, sizeof(b1), ratio(V(s, hit_blocks), V(s, hit_blocks) + V(s, miss_blocks))));
	if (watch)
		fprintf(f, " %12s", fmt_pct(b2, sizeof(b2), iv && iv->valid ?
				ratio(D(iv, hit_blocks), D(iv, hit_blocks) + D(iv, miss_blocks)) : -1));
	fprintf(f, "\n%-14s %10s", "tokens",
		fmt_pct(b1, sizeof(b1), ratio(V(s, hit_tokens), V(s, lookup_tokens))));
	if (watch)
		fprintf(f, " %12s", fmt_pct(b2, sizeof(b2), iv && iv->valid ?
				ratio(D(iv, hit_tokens), D(iv, lookup_tokens)) : -1));
	fputc('\n', f);
	if (watch) {
		fprintf(f, "%-14s ", "history");
		sparkline(f, w);
		fprintf(f, "  (block hit ratio per interval, oldest first, '.' idle)\n");
	}

	fprintf(f, "\n%-14s %14s %18s", "EVENTS", "TOTAL",
		V(s, reset_time_ns) ? "AVG/S SINCE RESET" : "AVG/S SINCE START");
	if (watch) {
		snprintf(t, sizeof(t), "/S LAST %.1fs", iv && iv->valid ? iv->dt : opt.watch);
		fprintf(f, " %16s", t);
	}
	fputc('\n', f);
#define EV(name, field) \
	event_row(f, name, V(s, field), counted, iv ? &D(iv, field) : NULL, iv, watch)
	EV("lookups", lookups);
	EV("lookup tokens", lookup_tokens);
	EV("hit tokens", hit_tokens);
	EV("hit blocks", hit_blocks);
	EV("miss blocks", miss_blocks);
	EV("pin failures", pin_failures);
	EV("allocations", allocs);
	EV("publishes", publishes);
	EV("publish dups", publish_dups);
	EV("evictions", evictions);
	EV("pin barriers", pin_barriers);
#define EVB(name, field) \
	event_bytes_row(f, name, V(s, field), counted, iv ? &D(iv, field) : NULL, iv, watch)
	if (spill_configured(s)) {
		EV("spills", spills);
		EV("restores", restores);
		EV("restore misses", restore_misses);
		EVB("spill written", spill_write_bytes);
		EVB("spill read", spill_read_bytes);
	}
	if (remote_configured(s)) {
		EV("remote puts", remote_puts);
		EV("remote hits", remote_hits);
		EV("remote misses", remote_misses);
		EVB("remote written", remote_put_bytes);
		EVB("remote fetched", remote_fetch_bytes);
	}
	if (V(s, kv_events_enabled) || V(s, kv_event_batches) || V(s, kv_event_drops)) {
		EV("kv events", kv_events);
		EV("kv batches", kv_event_batches);
		EV("kv drops", kv_event_drops);
		EV("kv replays", kv_event_replays);
		EV("kv replay errs", kv_event_replay_errors);
		if (V(s, kv_events_lossy))
			fputs("kv events: a subscriber stopped reading; it alone loses batches now\n", f);
	}
#undef EVB
#undef EV
	fprintf(f, "\nsingle flight  %llu waits: %llu served, %llu timed out, %llu lost writer; "
		"%llu tokens saved; %llu pages in flight\n",
		(unsigned long long)V(s, waits), (unsigned long long)V(s, wait_served),
		(unsigned long long)V(s, wait_timeouts), (unsigned long long)V(s, wait_lost),
		(unsigned long long)V(s, wait_tokens), (unsigned long long)V(s, pages_in_flight));
	if (V(s, slice_joins) || V(s, slice_dropped))
		fprintf(f, "tp slices      %llu joined by another rank; %llu pages given up unwhole\n",
			(unsigned long long)V(s, slice_joins),
			(unsigned long long)V(s, slice_dropped));

	for (i = 0; i < s->n_clients; i++) {
		int a = (int)strlen(s->clients[i].comm);
		int b = (int)strlen(kvshm_snap_model(s, s->clients[i].ns_id));

		wc = a > wc ? a : wc;
		wn = b > wn ? b : wn;
	}
	for (i = 0; i < ntop; i++) {
		int a = (int)strlen(s->top[i].label);
		int b = (int)strlen(kvshm_snap_model(s, s->top[i].ns_id));

		wl = a > wl ? a : wl;
		wn = b > wn ? b : wn;
	}
	print_namespaces(f, s);
	print_tenants(f, s);
	if (s->n_pinned)
		print_pinned(f, s);
	fprintf(f, "\nCLIENTS (%u)\n", s->n_clients);
	if (s->n_clients)
		fprintf(f, "%8s  %-*s  %-*s %10s %10s %10s %7s %7s %10s\n", "PID", wc, "COMM", wn,
			"NAMESPACE", "LOOKUPS", "HIT BLK", "MISS BLK", "HIT%", "PINS", "PUBLISHED");
	for (i = 0; i < s->n_clients; i++) {
		const struct kvshm_snap_client *c = &s->clients[i];
		char comm[16];

		fprintf(f, "%8d  %-*s  %-*s %10llu %10llu %10llu %7s %7llu %10llu\n", c->pid, wc,
			safe(comm, sizeof(comm), c->comm), wn,
			safe(buf, sizeof(buf), kvshm_snap_model(s, c->ns_id)),
			(unsigned long long)c->lookups, (unsigned long long)c->hit_blocks,
			(unsigned long long)c->miss_blocks,
			fmt_pct(b3, sizeof(b3), ratio(c->hit_blocks, c->hit_blocks + c->miss_blocks)),
			(unsigned long long)c->pins_held, (unsigned long long)c->published);
	}

	fprintf(f, "\nTOP PREFIXES (%u; hit tokens, true count within ERROR below)\n", s->n_top);
	if (ntop)
		fprintf(f, "%-32s %12s %10s  %-*s  %s\n", "KEY", "HIT TOKENS", "ERROR", wl, "LABEL",
			"NAMESPACE");
	for (i = 0; i < ntop; i++) {
		const struct kvshm_top_entry *e = &s->top[i];
		char label[KVSHM_LABEL];

		fprintf(f, "%016llx%016llx %12llu %10llu  %-*s  %s\n", (unsigned long long)e->key.hi,
			(unsigned long long)e->key.lo, (unsigned long long)e->hit_tokens,
			(unsigned long long)e->err, wl, safe(label, sizeof(label), e->label),
			safe(buf, sizeof(buf), kvshm_snap_model(s, e->ns_id)));
	}
	if (s->n_top > ntop)
		fprintf(f, "(%u more: kvstat --json lists them all)\n", s->n_top - ntop);
}

/* ---------------------------------------------------------------- attach */

static void on_alarm(int sig)
{
	(void)sig;
	alarmed = 1;
}

static void on_stop(int sig)
{
	(void)sig;
	stop_sig = 1;
}

/*
 * kvobs_attach with a bound on the wait: a stopped (SIGSTOP) or wedged
 * daemon accepts the connection but never answers, and an interrupted
 * recvmsg makes kvobs_attach give up.
 */
static int attach(struct kvobs *o, char *err, size_t len)
{
	int rc;

	alarmed = 0;
	alarm(ATTACH_S);
	rc = kvobs_attach(opt.socket, o, err, len);
	alarm(0);
	if (rc && alarmed)
		snprintf(err, len, "kvcached did not answer within %d s (stopped or overloaded?)",
			 ATTACH_S);
	return rc;
}

/* ---------------------------------------------------------------- modes */

/* --reset: one RESET round trip (the daemon checks who asks). */
static int reset(void)
{
	char err[512];
	int rc;

	alarmed = 0;
	alarm(ATTACH_S);
	rc = kvobs_reset(opt.socket, err, sizeof(err));
	alarm(0);
	if (rc && alarmed)
		snprintf(err, sizeof(err), "kvcached did not answer within %d s (stopped or overloaded?)",
			 ATTACH_S);
	if (rc) {
		fprintf(stderr, "kvstat: --reset: %s\n", err);
		return 1;
	}
	printf("kvstat: counters of kvcached reset (totals, rates, hit ratios, namespaces, top prefixes)\n");
	return 0;
}

/*
 * A prompt's token ids from a file: decimal numbers separated by white
 * space or commas (an engine's tokenizer prints them: `print(*ids)`).
 * Returns the count, or -1 after a message naming the file and the word.
 */
static long read_tokens(const char *path, uint32_t **out)
{
	FILE *f = fopen(path, "r");
	size_t n = 0, cap = 0;
	uint32_t *t = NULL;
	char word[32];
	int c, len = 0;

	if (!f) {
		fprintf(stderr, "kvstat: --pin %s: %s\n", path, strerror(errno));
		return -1;
	}
	for (;;) {
		c = fgetc(f);
		if (c != EOF && c != ',' && !isspace(c)) {
			if (len == (int)sizeof(word) - 1 || !isdigit(c)) {
				word[len] = 0;
				fprintf(stderr, "kvstat: --pin %s: '%s%c...' is not a token id (the file holds decimal token ids, separated by spaces or commas)\n",
					path, word, c);
				goto fail;
			}
			word[len++] = (char)c;
			continue;
		}
		if (len) {
			unsigned long long v;

			word[len] = 0;
			len = 0;
			v = strtoull(word, NULL, 10);
			if (v > UINT32_MAX) {
				fprintf(stderr, "kvstat: --pin %s: token id %s is over 2^32-1\n", path, word);
				goto fail;
			}
			if (n == cap) {
				uint32_t *nt = realloc(t, (cap = cap ? cap * 2 : 1024) * sizeof(*t));

				if (!nt) {
					fprintf(stderr, "kvstat: out of memory\n");
					goto fail;
				}
				t = nt;
			}
			t[n++] = (uint32_t)v;
			if (n > KVC_MAX_TOKENS) {
				fprintf(stderr, "kvstat: --pin %s: more than %u tokens\n", path,
					KVC_MAX_TOKENS);
				goto fail;
			}
		}
		if (c == EOF)
			break;
	}
	if (ferror(f)) {
		fprintf(stderr, "kvstat: --pin %s: read error\n", path);
		goto fail;
	}
	fclose(f);
	if (!n) {
		fprintf(stderr, "kvstat: --pin %s: no token ids in it\n", path);
		free(t);
		return -1;
	}
	*out = t;
	return (long)n;
fail:
	fclose(f);
	free(t);
	return -1;
}

/* --drop-namespace, --drop-tenant, --pin, --unpin: one ADMIN round trip
 * (the daemon checks who asks, like --reset). */
static int admin(void)
{
	struct kvproto_admin q;
	struct kvproto_admin_r r;
	uint32_t *tokens = NULL;
	char err[512];
	long n = 0;
	int rc;

	memset(&q, 0, sizeof(q));
	q.version = KVPROTO_VERSION;
	q.op = (uint32_t)opt.admin;
	q.ns_row = opt.ns_row >= 0 ? (uint32_t)opt.ns_row : KVPROTO_ADMIN_ANY;
	if (opt.drop_ns)
		snprintf(q.model, sizeof(q.model), "%s", opt.drop_ns);
	else if (opt.model)
		snprintf(q.model, sizeof(q.model), "%s", opt.model);
	if (opt.tenant)
		snprintf(q.tenant, sizeof(q.tenant), "%s", opt.tenant);
	if (opt.label)
		snprintf(q.label, sizeof(q.label), "%s", opt.label);
	q.ttl_s = (uint32_t)opt.ttl;
	q.pin_id = (uint32_t)opt.unpin;
	if (opt.admin == KVPROTO_ADMIN_PIN) {
		n = read_tokens(opt.pin_file, &tokens);
		if (n < 0)
			return 1;
		q.n_tokens = (uint32_t)n;
	}
	alarmed = 0;
	alarm(ATTACH_S * 4);
	rc = kvobs_admin(opt.socket, &q, tokens, &r, err, sizeof(err));
	alarm(0);
	free(tokens);
	if (rc && alarmed)
		snprintf(err, sizeof(err), "kvcached did not answer within %d s (stopped or overloaded?)",
			 ATTACH_S * 4);
	if (rc) {
		fprintf(stderr, "kvstat: %s\n", err);
		return 1;
	}
	switch (opt.admin) {
	case KVPROTO_ADMIN_PIN:
		printf("kvstat: pin %u: %u of the prompt's %u blocks resident now (the rest as they are cached), for %ld s\n",
		       r.pin_id, r.resident, r.blocks, opt.ttl);
		break;
	case KVPROTO_ADMIN_UNPIN:
		printf("kvstat: pin %u ended: its pages are evictable again\n", r.pin_id);
		break;
	default:
		printf("kvstat: dropped %u pages and %u spill slots; %u pages pinned or being written stay\n",
		       r.dropped, r.slots, r.left);
	}
	return 0;
}

/* Attach and take one snapshot; 0, or 1 after saying why. */
static int snapshot(struct kvobs *o, struct kvshm_snap *s)
{
	char err[512];
	int rc;

	if (attach(o, err, sizeof(err))) {
		fprintf(stderr, "kvstat: %s\n", err);
		return 1;
	}
	if ((rc = kvshm_snap_take(o->h, s))) {
		fprintf(stderr, "kvstat: snapshot: %s\n", strerror(-rc));
		kvobs_detach(o);
		return 1;
	}
	return 0;
}

/* --pins: the pinned prefixes (shared memory, no permission needed). */
static int list_pins(void)
{
	struct kvshm_snap s;
	struct kvobs o;

	if (snapshot(&o, &s))
		return 1;
	if (opt.json) {
		json_pinned(stdout, &s);
		fputc('\n', stdout);
	} else {
		print_pinned(stdout, &s);
	}
	kvshm_snap_free(&s);
	kvobs_detach(&o);
	return fflush(stdout) ? 1 : 0;
}

static int one_shot(void)
{
	struct kvshm_snap s;
	struct kvobs o;
	int rc = 0;

	if (snapshot(&o, &s))
		return 1;
	if (opt.prom) {
		size_t need = kvshm_prometheus(&s, NULL, 0);
		char *buf = malloc(need + 1);

		if (!buf) {
			fprintf(stderr, "kvstat: out of memory\n");
			rc = 1;
		} else {
			kvshm_prometheus(&s, buf, need + 1);
			fwrite(buf, 1, need, stdout);
			free(buf);
		}
	} else if (opt.json) {
		print_json(stdout, &o, &s, NULL);
	} else {
		print_text(stdout, &s, NULL, NULL);
	}
	kvshm_snap_free(&s);
	kvobs_detach(&o);
	if (fflush(stdout) || ferror(stdout)) {
		fprintf(stderr, "kvstat: writing the output: %s\n", strerror(errno));
		return 1;
	}
	return rc;
}

/* Write a finished frame: on a terminal over the previous one (each line
 * cleared to its end, the rest of the screen cleared after, and no more
 * lines than the window holds, so it never scrolls). */
static void emit(struct watch *w, const char *frame, size_t len, unsigned long n)
{
	const char *p = frame, *e = frame + len, *nl;
	struct winsize ws;
	unsigned int rows = UINT32_MAX;

	if (!w->tty) {
		if (n && !opt.json)
			fputs("----------------------------------------------------------------\n",
			      stdout);
		fwrite(frame, 1, len, stdout);
	} else {
		if (!ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) && ws.ws_row > 1)
			rows = ws.ws_row - 1u;
		fputs("\033[H", stdout);
		for (; p < e && rows; p = nl + 1, rows--) {
			nl = memchr(p, '\n', (size_t)(e - p));
			if (!nl) {
				fwrite(p, 1, (size_t)(e - p), stdout);
				break;
			}
			fwrite(p, 1, (size_t)(nl - p), stdout);
			fputs("\033[K\n", stdout);
		}
		fputs("\033[J", stdout);
	}
	fflush(stdout);
}

/* A status line: stdout in text mode (it is part of what the operator
 * watches), stderr in JSON mode (stdout stays one object per line). */
static void status(struct watch *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void status(struct watch *w, const char *fmt, ...)
{
	va_list ap;
	FILE *f = opt.json ? stderr : stdout;

	va_start(ap, fmt);
	vsnprintf(w->last_msg, sizeof(w->last_msg), fmt, ap);
	va_end(ap);
	if (w->tty && !opt.json)
		fputs("\033[H\033[2J", f);
	fprintf(f, "kvstat: %s\n", w->last_msg);
	fflush(f);
}

/* One frame of watch mode; false when kvstat should exit 1. */
static bool watch_frame(struct watch *w, unsigned long n)
{
	struct interval iv;
	struct kvshm_snap s;
	char err[512], *frame = NULL;
	size_t len = 0;
	double now;
	FILE *f;

	if (!w->attached) {
		if (attach(&w->o, err, sizeof(err))) {
			if (!n) {
				fprintf(stderr, "kvstat: %s\n", err);
				return false;
			}
			/* Said once per distinct problem, not every interval. */
			if (strstr(w->last_msg, err) == NULL || w->tty)
				status(w, "waiting for kvcached: %s", err);
			return true;
		}
		w->attached = true;
		w->have_prev = false;
		w->hb_t = mono_now();
		w->hb = atomic_load_explicit(&w->o.h->heartbeat, memory_order_relaxed);
		if (n) {
			time_t t = time(NULL);
			char hms[16];

			strftime(hms, sizeof(hms), "%H:%M:%S", localtime(&t));
			status(w, "reattached to kvcached pid %d", w->o.h->daemon_pid);
			/* A redraw would wipe that line at once on a terminal:
			 * it stays atop the frames for a few seconds. */
			snprintf(w->note, sizeof(w->note),
				 "kvstat: reattached to kvcached pid %d at %s (the previous one stopped)",
				 w->o.h->daemon_pid, hms);
			w->note_until = mono_now() + NOTE_S;
		}
	}
	if (kvshm_snap_take(w->o.h, &s)) {
		fprintf(stderr, "kvstat: snapshot: out of memory\n");
		return false;
	}
	now = mono_now();
	if (s.heartbeat != w->hb) {
		w->hb = s.heartbeat;
		w->hb_t = now;
	} else if (now - w->hb_t > STALL_S) {
		status(w, "kvcached pid %d stopped updating (no heartbeat for %.1f s): %s every %g s",
		       s.daemon_pid, now - w->hb_t, "restarted or gone; reattaching", opt.watch);
		kvshm_snap_free(&s);
		kvobs_detach(&w->o);
		w->attached = false;
		return true;
	}
	interval_of(&iv, w, &s, now);
	if (iv.valid) {
		w->hist[w->n_hist % HIST] = ratio(D(&iv, hit_blocks),
						  D(&iv, hit_blocks) + D(&iv, miss_blocks));
		w->n_hist++;
	}
	f = open_memstream(&frame, &len);
	if (!f) {
		kvshm_snap_free(&s);
		fprintf(stderr, "kvstat: out of memory\n");
		return false;
	}
	if (opt.json) {
		print_json(f, &w->o, &s, &iv);
	} else {
		if (w->tty && w->note[0] && now < w->note_until)
			fprintf(f, "%s\n", w->note);
		print_text(f, &s, &iv, w);
	}
	fclose(f);
	emit(w, frame, len, n);
	free(frame);
	memcpy(w->prev, s.v, sizeof(w->prev));
	w->prev_t = now;
	w->have_prev = true;
	w->last_msg[0] = 0;
	kvshm_snap_free(&s);
	return true;
}

static void sleep_until(double t)
{
	struct timespec ts;

	ts.tv_sec = (time_t)t;
	ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L)
		ts.tv_nsec = 999999999L;
	while (!stop_sig && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int watch_loop(void)
{
	struct watch w;
	unsigned long n;
	double next;
	int rc = 0;

	memset(&w, 0, sizeof(w));
	w.tty = isatty(STDOUT_FILENO) && !opt.json;
	if (w.tty)
		fputs("\033[?25l\033[H\033[2J", stdout);	/* hide the cursor */
	next = mono_now();
	for (n = 0; !stop_sig && (!opt.count || n < opt.count); n++) {
		if (n) {
			next += opt.watch;
			/* Fell behind (suspended, slow terminal): start over. */
			if (mono_now() > next + opt.watch)
				next = mono_now();
			sleep_until(next);
			if (stop_sig)
				break;
		}
		if (!watch_frame(&w, n)) {
			rc = 1;
			break;
		}
	}
	if (w.attached)
		kvobs_detach(&w.o);
	if (w.tty)
		fputs("\033[?25h", stdout);	/* the cursor back */
	fflush(stdout);
	return rc;
}

/* ----------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvstat [--socket PATH] [--json | --prometheus] [--watch SECONDS [--count N]]\n"
"       kvstat [--socket PATH] --reset\n"
"       kvstat [--socket PATH] --drop-namespace MODEL | --drop-tenant NAME\n"
"              [--model MODEL | --namespace ROW]\n"
"       kvstat [--socket PATH] --pin FILE (--model MODEL | --namespace ROW)\n"
"              [--tenant NAME] --ttl SECONDS [--label TEXT]\n"
"       kvstat [--socket PATH] --unpin ID | --pins [--json]\n"
"\n"
"Shows what kvcached is doing: pool pages by state and tier, hit ratios in\n"
"blocks and tokens, lookups, publishes, evictions, spills and restores with\n"
"rates, the spill tier (slots, I/O path, bytes written and read, health),\n"
"the remote tier (servers up, blocks written and fetched, verification),\n"
"one row per attached client and the most hit prefixes. Reads the\n"
"daemon's shared memory read-only, with no lock and no daemon round trip\n"
"after attaching.\n"
"\n"
"  --socket PATH      kvcached's socket (default: $KVCACHED_SOCKET, else\n"
"                     /run/kvcached/kvcached.sock as root,\n"
"                     $XDG_RUNTIME_DIR/kvcached.sock otherwise)\n"
"  --json             one JSON object (with --watch: one per line); fields\n"
"                     in docs/KVSTAT.md\n"
"  --prometheus       the Prometheus text kvcached serves at /metrics\n"
"  --watch SECONDS    redraw every SECONDS (e.g. 1 or 0.5) with the last\n"
"                     interval's hit ratio and rates and a hit-ratio\n"
"                     sparkline; Ctrl-C stops\n"
"  --count N          with --watch: stop after N frames\n"
"  --reset            zero the daemon's counters (totals, rates, hit ratios,\n"
"                     per namespace and tenant, top prefixes); allowed to\n"
"                     root and the daemon's own user\n"
"  --drop-namespace MODEL\n"
"                     drop the cached pages of every namespace of MODEL (or\n"
"                     of row ROW with --namespace), every tenant's, and the\n"
"                     prefixes pinned there; pages pinned or being written\n"
"                     by clients stay; root and the daemon's own user\n"
"  --drop-tenant NAME drop tenant NAME's cached pages (TENANTS names it), in\n"
"                     every namespace or one (--model, --namespace)\n"
"  --pin FILE         keep the prefix of the prompt whose token ids FILE\n"
"                     holds (decimal, separated by spaces or commas)\n"
"                     resident for --ttl SECONDS (up to 30 days), in the\n"
"                     namespace --model or --namespace names, in the key\n"
"                     space of tenant --tenant (default: the unsalted one);\n"
"                     counted against that tenant's share; blocks not cached\n"
"                     yet are kept as they are published\n"
"  --unpin ID         end pin ID before its time\n"
"  --pins             list the pinned prefixes (with --json: as JSON)\n"
"  --help             this text\n"
"  --version          kvstat's version\n"
"\n"
"Exit status: 0 ok, 1 no kvcached, a segment version this kvstat does not\n"
"read, or a refused --reset, drop, pin or unpin, 2 bad usage.\n");
}

static void __attribute__((noreturn, format(printf, 1, 2))) bad_usage(const char *fmt, ...)
{
	va_list ap;

	fputs("kvstat: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (see kvstat --help)\n", stderr);
	exit(2);
}

/* One operator request at a time. */
static void admin_op(int op)
{
	if (opt.admin && opt.admin != op)
		bad_usage("--drop-namespace, --drop-tenant, --pin and --unpin exclude each other");
	opt.admin = op;
}

static long whole(const char *s, const char *what, long lo, unsigned long hi)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < (unsigned long long)lo || v > hi)
		bad_usage("%s '%s': must be a whole number from %ld to %lu", what, s, lo, hi);
	return (long)v;
}

static void parse_args(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "prometheus", no_argument, NULL, 'p' },
		{ "watch", required_argument, NULL, 'w' },
		{ "count", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "reset", no_argument, NULL, 'r' },
		{ "drop-namespace", required_argument, NULL, 'D' },
		{ "drop-tenant", required_argument, NULL, 'T' },
		{ "tenant", required_argument, NULL, 't' },
		{ "model", required_argument, NULL, 'm' },
		{ "namespace", required_argument, NULL, 'n' },
		{ "pin", required_argument, NULL, 'P' },
		{ "ttl", required_argument, NULL, 'L' },
		{ "label", required_argument, NULL, 'l' },
		{ "unpin", required_argument, NULL, 'U' },
		{ "pins", no_argument, NULL, 'i' },
		{ NULL, 0, NULL, 0 },
	};
	bool watch_set = false;
	char *end;
	int ch;

	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (ch) {
		case 'S':
			if (!*optarg || strlen(optarg) >= sizeof(((struct sockaddr_un *)0)->sun_path))
				bad_usage("--socket '%s': empty, or longer than 107 bytes", optarg);
			opt.socket = optarg;
			break;
		case 'j':
			opt.json = true;
			break;
		case 'p':
			opt.prom = true;
			break;
		case 'w':
			errno = 0;
			opt.watch = strtod(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(opt.watch) ||
			    opt.watch < 0.05 || opt.watch > 86400)
				bad_usage("--watch '%s': must be a number of seconds from 0.05 to 86400",
					  optarg);
			watch_set = true;
			break;
		case 'c': {
			unsigned long long v;

			errno = 0;
			v = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || *optarg == '-' || !v ||
			    v > 1000000000ull)
				bad_usage("--count '%s': must be a whole number of frames from 1 to 1000000000",
					  optarg);
			opt.count = (unsigned long)v;
			break;
		}
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("kvstat %s (shm layout %u)\n", KVC_VERSION_STRING, KVSHM_VERSION);
			exit(0);
		case 'r':
			opt.reset = true;
			break;
		case 'D':
			if (!*optarg || strlen(optarg) >= KVSHM_MODEL_NAME)
				bad_usage("--drop-namespace '%s': a model name of 1..63 bytes", optarg);
			opt.drop_ns = optarg;
			admin_op(KVPROTO_ADMIN_DROP_NS);
			break;
		case 'T':
		case 't':
			if (!*optarg || strlen(optarg) >= KVSHM_TENANT_NAME)
				bad_usage("--%s '%s': a tenant name of 1..31 bytes",
					  ch == 'T' ? "drop-tenant" : "tenant", optarg);
			opt.tenant = optarg;
			if (ch == 'T')
				admin_op(KVPROTO_ADMIN_DROP_TENANT);
			break;
		case 'm':
			if (!*optarg || strlen(optarg) >= KVSHM_MODEL_NAME)
				bad_usage("--model '%s': a model name of 1..63 bytes", optarg);
			opt.model = optarg;
			break;
		case 'n':
			opt.ns_row = whole(optarg, "--namespace", 0, 63);
			break;
		case 'P':
			opt.pin_file = optarg;
			admin_op(KVPROTO_ADMIN_PIN);
			break;
		case 'L':
			opt.ttl = whole(optarg, "--ttl", 1, KVPROTO_PIN_TTL_MAX);
			break;
		case 'l':
			if (strlen(optarg) >= 24)
				bad_usage("--label '%s': at most 23 bytes", optarg);
			opt.label = optarg;
			break;
		case 'U':
			opt.unpin = whole(optarg, "--unpin", 1, UINT32_MAX);
			admin_op(KVPROTO_ADMIN_UNPIN);
			break;
		case 'i':
			opt.pins = true;
			break;
		case ':':
			bad_usage("%s needs a value", argv[optind - 1]);
		default:
			if (optopt)
				bad_usage("unknown option '-%c'", optopt);
			bad_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		bad_usage("unexpected argument '%s'", argv[optind]);
	if (opt.json && opt.prom)
		bad_usage("--json and --prometheus exclude each other");
	if (opt.prom && watch_set)
		bad_usage("--prometheus prints one scrape; it takes no --watch");
	if (opt.count && !watch_set)
		bad_usage("--count needs --watch");
	if (opt.reset && (watch_set || opt.json || opt.prom || opt.admin || opt.pins))
		bad_usage("--reset only resets (with --socket): run kvstat again to watch");
	if (opt.admin && (watch_set || opt.json || opt.prom || opt.pins))
		bad_usage("--drop-namespace, --drop-tenant, --pin and --unpin only do that (with --socket)");
	if (opt.pins && (watch_set || opt.prom))
		bad_usage("--pins lists once, as text or --json");
	if (opt.admin == KVPROTO_ADMIN_PIN && (opt.ns_row < 0) == !opt.model)
		bad_usage("--pin needs the namespace: --model MODEL or --namespace ROW (one of them)");
	if (opt.admin == KVPROTO_ADMIN_PIN && !opt.ttl)
		bad_usage("--pin needs --ttl SECONDS");
	if ((opt.ttl || opt.label) && opt.admin != KVPROTO_ADMIN_PIN)
		bad_usage("--ttl and --label go with --pin");
	if (opt.tenant && opt.admin != KVPROTO_ADMIN_PIN && opt.admin != KVPROTO_ADMIN_DROP_TENANT)
		bad_usage("--tenant goes with --pin (--drop-tenant names its own)");
	if ((opt.model || opt.ns_row >= 0) && opt.admin != KVPROTO_ADMIN_PIN &&
	    opt.admin != KVPROTO_ADMIN_DROP_TENANT && opt.admin != KVPROTO_ADMIN_DROP_NS)
		bad_usage("--model and --namespace go with --pin, --drop-tenant or --drop-namespace");
	if (opt.admin == KVPROTO_ADMIN_DROP_NS && opt.model)
		bad_usage("--drop-namespace names the model itself (or --namespace ROW)");
}

int main(int argc, char **argv)
{
	struct sigaction sa;

	parse_args(argc, argv);
	/* No SA_RESTART: a signal must interrupt the sleep or the attach. */
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	if (opt.reset)
		return reset();
	if (opt.admin)
		return admin();
	if (opt.pins)
		return list_pins();
	if (!opt.watch)
		return one_shot();
	sa.sa_handler = on_stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	return watch_loop();
}
