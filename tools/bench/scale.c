// SPDX-License-Identifier: MIT
/*
 * scale.c - kvbench's scale mode: does the daemon's cost grow with its
 * pool, its cached blocks or its clients? (issue #23)
 *
 * For each pool size (64 MiB, 1, 4, 16 GiB; --scale-max-pool caps it, and
 * a size MemAvailable cannot hold with 2 GiB to spare is skipped with the
 * reason):
 *   - idle CPU: a daemon of 4 KiB pages and one of 2 MiB pages, nobody
 *     attached, once the pool is faulted in: CPU time of all its threads
 *     (/proc/PID/task/TID/schedstat, ns) over the window, as a share of
 *     one core; and the tick p99 meanwhile, from the daemon's tick
 *     histogram in the segment (the upper end of the bucket, buckets of a
 *     half power of two);
 *   - fill: one client publishes fresh 256-block prompts (4 KiB pages)
 *     until the pool is full, just above its low watermark (5% free):
 *     blocks/s;
 *   - verified lookups: kvc_req_new + kvc_lookup + kvc_req_free of the
 *     cached prompts in random order, every block checked against its
 *     key, parent and tokens by the library: blocks/s, against the same
 *     lookups of only the first 4,096 blocks cached (the lines a 4k-block
 *     cache touches) in alternating slices on the same daemon;
 *   - alloc+publish of one fresh block per request on the full pool
 *     (the daemon evicts to make room): p50 and p99 of the round trips;
 *   - tick p99 during the fill.
 * Then, on a 1 GiB pool (64 MiB when --quick), 1, 4, 16 and 32 client
 * processes attached at once, each mixing lookups of cached prompts with
 * alloc+publish of fresh ones: alloc+publish p99 over all, the daemon's
 * CPU and tick p99.
 *
 * Every other figure is a row whose peer is the same figure at the
 * smallest point of its sweep (64 MiB pool, 1 process), so the ratio
 * column reads as "times the smallest point".
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../libclient/observe.h"
#include "../../tests/lib/procfs.h"
#include "bench.h"

#define PROMPT 256	/* blocks per fill prompt */
#define PB 4096		/* page bytes of the tiny model */

uint64_t scale_max_pool;	/* --scale-max-pool; 0: no cap */

static const struct {
	const char *arg;
	uint64_t bytes;
	const char *name;
} pools[] = {
	{ "64M", 64ull << 20, "64 MiB" },
	{ "1G", 1ull << 30, "1 GiB" },
	{ "4G", 4ull << 30, "4 GiB" },
	{ "16G", 16ull << 30, "16 GiB" },
};

/* ---- the daemon, seen from outside */

/* CPU time (ns) of each thread of pid: tid[i], ns[i]; returns how many.
 * Threads come and go (the metrics thread, tier workers), so a window's
 * CPU is the sum over the threads present at both ends. */
#define MAX_TASKS 64
static int cpu_tasks(pid_t pid, int *tid, uint64_t *ns)
{
	char path[64], p2[384];
	struct dirent *e;
	int n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	if (!dir)
		die("cannot read %s: %s", path, strerror(errno));
	while ((e = readdir(dir)) && n < MAX_TASKS) {
		unsigned long long run = 0;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(p2, sizeof(p2), "%s/%.256s/schedstat", path, e->d_name);
		f = fopen(p2, "r");
		if (f && fscanf(f, "%llu", &run) == 1) {
			tid[n] = atoi(e->d_name);
			ns[n++] = run;
		}
		if (f)
			fclose(f);
	}
	closedir(dir);
	return n;
}

struct seen {
	struct kvobs o;
	pid_t pid;
	uint64_t hist[KVSHM_TICK_BUCKETS];
	int ntask, tid[MAX_TASKS];
	uint64_t ns[MAX_TASKS], t;
};

static void seen_attach(struct seen *s, const char *sock)
{
	char err[256];

	if (kvobs_attach(sock, &s->o, err, sizeof(err)))
		die("observer: %s", err);
	s->pid = s->o.h->daemon_pid;
}

static void seen_mark(struct seen *s)
{
	const struct kvshm_stats *st = kvshm_stats(s->o.h);
	uint32_t b;

	for (b = 0; b < KVSHM_TICK_BUCKETS; b++)
		s->hist[b] = atomic_load_explicit(&st->tick_hist[b], memory_order_relaxed);
	s->ntask = cpu_tasks(s->pid, s->tid, s->ns);
	s->t = now_ns();
}

/* Since seen_mark: share of a core (percent) and tick p99 (us). */
static void seen_since(const struct seen *s, double *cpu_pct, double *tick_p99_us)
{
	const struct kvshm_stats *st = kvshm_stats(s->o.h);
	uint64_t d[KVSHM_TICK_BUCKETS], n = 0, acc = 0, ns[MAX_TASKS], cpu = 0, t = now_ns();
	int tid[MAX_TASKS], nt = cpu_tasks(s->pid, tid, ns), i, j;
	uint32_t b;

	for (i = 0; i < nt; i++)
		for (j = 0; j < s->ntask; j++)
			if (tid[i] == s->tid[j] && ns[i] >= s->ns[j])
				cpu += ns[i] - s->ns[j];
	*cpu_pct = 100.0 * (double)cpu / (double)(t - s->t);
	for (b = 0; b < KVSHM_TICK_BUCKETS; b++) {
		d[b] = atomic_load_explicit(&st->tick_hist[b], memory_order_relaxed) - s->hist[b];
		n += d[b];
	}
	*tick_p99_us = 0;
	for (b = 0; b < KVSHM_TICK_BUCKETS && n; b++) {
		acc += d[b];
		if (acc * 100 >= n * 99) {
			uint64_t up = kvshm_tick_bucket_ns(b);

			*tick_p99_us = up == UINT64_MAX ? 1e6 : (double)up / 1e3;
			break;
		}
	}
}

/* The daemon faults its pool in before it serves (issue #40; before, on
 * a thread after): check that it is resident (waiting up to a minute),
 * so that idle means idle. */
static void wait_resident(const struct seen *s, uint64_t bytes)
{
	char path[64];
	int i;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)s->pid);
	for (i = 0; i < 600; i++) {
		if (kvt_proc_kb(path, "RssShmem:") * 1024 >= bytes)
			return;
		sleep_ms(100);
	}
	fprintf(stderr, "kvbench: scale: the pool was not resident after 60 s; measuring anyway\n");
}

/* ---- rows: each figure against the smallest point of its sweep */

static void row(const char *op, int procs, size_t blocks, const char *pct, const char *unit,
		const char *base, double kv, double first)
{
	struct row r = { .mode = "scale", .op = op, .procs = procs, .blocks = blocks,
			 .page_bytes = strcmp(op, "idle_cpu_2m") ? PB : 2u << 20, .pct = pct,
			 .unit = unit, .peer_kind = base, .kv = kv, .peer = first };

	add_row(&r);
}

static void skip_row(const char *op, size_t blocks, const char *unit, const char *why)
{
	/* Rows keep the pointer until the end: the reason must outlive us. */
	static char reasons[NELEM(pools)][160];
	static size_t n;
	struct row r = { .mode = "scale", .op = op, .procs = 0, .blocks = blocks,
			 .page_bytes = PB, .unit = unit, .peer_kind = "-" };

	snprintf(reasons[n % NELEM(pools)], sizeof(reasons[0]), "%s", why);
	r.skipped = reasons[n++ % NELEM(pools)];
	add_row(&r);
}

/* ---- client work */

static uint64_t prompt_seed(uint64_t i)
{
	return (3ull << 40) + i;
}

/* Publish prompt i (n fresh blocks); returns the ns it took. */
static uint64_t put_prompt(kvc_t *c, uint32_t *t, uint64_t i, size_t n, const uint8_t *src)
{
	struct kvc_req *r;
	uint64_t t0;
	size_t k;
	int got;

	make_tokens(t, n * BT, prompt_seed(i));
	t0 = now_ns();
	ck(kvc_req_new(c, t, n * BT, NULL, 0, &r), "kvc_req_new");
	got = ck(kvc_lookup(r), "kvc_lookup");
	if (got) {	/* cached already (a rerun on the same pool) */
		kvc_req_free(r);
		return now_ns() - t0;
	}
	got = ck(kvc_alloc(r), "kvc_alloc");
	if ((size_t)got != n)
		die("kvc_alloc granted %d of %zu pages", got, n);
	for (k = 0; k < n; k++)
		memcpy(kvc_block(r, k), src, PB);
	got = ck(kvc_publish(r), "kvc_publish");
	if ((size_t)got != n)
		die("kvc_publish cached %d of %zu blocks", got, n);
	kvc_req_free(r);
	return now_ns() - t0;
}

/* Look prompt i up; returns the blocks hit. ns accumulates the time. */
static int get_prompt(kvc_t *c, uint32_t *t, uint64_t i, size_t n, uint64_t *ns)
{
	struct kvc_req *r;
	uint64_t t0;
	int got;

	make_tokens(t, n * BT, prompt_seed(i));
	t0 = now_ns();
	ck(kvc_req_new(c, t, n * BT, NULL, 0, &r), "kvc_req_new");
	got = ck(kvc_lookup(r), "kvc_lookup");
	kvc_req_free(r);
	*ns += now_ns() - t0;
	return got;
}

/*
 * Verified lookups of prompts [0, prompts) in random order, against the
 * same lookups of the first 4,096 blocks' prompts only (what a 4k-block
 * cache touches), in alternating slices on the same daemon, so that the
 * ratio does not depend on how fast this machine was minutes apart:
 * blocks/s of each. Every cached prompt is looked up once first,
 * untimed, and must hit whole.
 */
static void lookup_rates(kvc_t *c, uint32_t *t, uint64_t prompts, double *all, double *ref)
{
	const uint64_t small = 4096 / PROMPT < prompts ? 4096 / PROMPT : prompts;
	uint64_t ns[2] = { 0, 0 }, blocks[2] = { 0, 0 }, x = 0x9e3779b97f4a7c15ull, i = 0, p;
	double budget = opt.quick ? 0.3 : opt.seconds;
	int round;

	for (p = 0; p < prompts; p++)
		if (get_prompt(c, t, p, PROMPT, &ns[0]) != PROMPT)
			die("scale: cached prompt %llu did not hit whole", (unsigned long long)p);
	ns[0] = 0;
	for (round = 0; round < 2 * ROUNDS; round++) {
		int w = round & 1;
		uint64_t until = ns[w] + (uint64_t)(budget * 1e9 / ROUNDS);

		while (ns[w] < until) {
			int got;

			p = mix64(x + i++) % (w ? small : prompts);
			got = get_prompt(c, t, p, PROMPT, &ns[w]);
			if (got != PROMPT)
				die("scale: cached prompt %llu hit %d of %d blocks",
				    (unsigned long long)p, got, PROMPT);
			blocks[w] += (uint64_t)got;
		}
	}
	*all = (double)blocks[0] * 1e9 / (double)ns[0];
	*ref = (double)blocks[1] * 1e9 / (double)ns[1];
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * One-block alloc+publish round trips on a full pool: p50 over all, and
 * the median of five rounds' p99 (this VM stalls its guest for a few ms
 * now and then, and one stall in one round was the whole p99 of a run),
 * in us.
 */
static void alloc_publish(kvc_t *c, uint32_t *t, uint64_t first, const uint8_t *src,
			  double *p50, double *p99)
{
	enum { ROUNDS99 = 5 };
	size_t per = opt.quick ? 300 : 2000, n = per * ROUNDS99, i, r;
	uint64_t *v = xmalloc(n * sizeof(*v)), q[ROUNDS99];

	for (i = 0; i < n; i++)
		v[i] = put_prompt(c, t, first + i, 1, src);
	for (r = 0; r < ROUNDS99; r++) {
		qsort(v + r * per, per, sizeof(*v), cmp_u64);
		q[r] = v[r * per + per * 99 / 100];
	}
	qsort(q, ROUNDS99, sizeof(*q), cmp_u64);
	qsort(v, n, sizeof(*v), cmp_u64);
	*p50 = (double)v[n / 2] / 1e3;
	*p99 = (double)q[ROUNDS99 / 2] / 1e3;
	free(v);
}

/* ---- the sweeps */

struct firsts {
	double idle4k, idle2m, tick_idle, fill, ap50, ap99, tick_fill;
	bool set;
};

static double idle_cpu(const char *page, const struct seen *s0, double *tick_p99)
{
	struct seen s = *s0;
	double cpu;

	(void)page;
	seen_mark(&s);
	sleep_ms(opt.quick ? 1000 : 3000);
	seen_since(&s, &cpu, tick_p99);
	return cpu;
}

static void pool_point(size_t k, struct firsts *f)
{
	char name[32], why[160];
	uint64_t bytes = pools[k].bytes, avail = kvt_proc_kb("/proc/meminfo", "MemAvailable:") * 1024;
	const char *sock;
	struct seen s;
	double cpu2m, cpu4k, tick, tick2m, fill, look, look4k, p50, p99, tfill, dummy;
	uint64_t pages, prompts, i, fill_ns;
	uint32_t *t = xmalloc(PROMPT * BT * sizeof(*t));
	uint8_t *src = xmalloc(PB);
	kvc_t *c;
	struct kvc_model m = tiny_model("kvbench-scale");

	if (scale_max_pool && bytes > scale_max_pool) {
		snprintf(why, sizeof(why), "pool %s is over --scale-max-pool", pools[k].name);
		skip_row("idle_cpu", bytes / PB, "%core", why);
		free(t);
		free(src);
		return;
	}
	if (bytes + (2ull << 30) > avail) {
		snprintf(why, sizeof(why),
			 "pool %s: MemAvailable %.1f GiB cannot hold it with 2 GiB to spare",
			 pools[k].name, (double)avail / (1u << 30));
		skip_row("idle_cpu", bytes / PB, "%core", why);
		free(t);
		free(src);
		return;
	}
	for (i = 0; i < PB; i++)
		src[i] = (uint8_t)mix64(i);

	/* Idle, 2 MiB pages. */
	snprintf(name, sizeof(name), "scale-2m-%zu", k);
	sock = daemon_start(name, "2M", pools[k].arg);
	seen_attach(&s, sock);
	wait_resident(&s, bytes);
	cpu2m = idle_cpu("2M", &s, &tick2m);
	kvobs_detach(&s.o);
	daemon_stop(false);

	/* Idle, 4 KiB pages; then fill, look up, alloc+publish. */
	snprintf(name, sizeof(name), "scale-4k-%zu", k);
	sock = daemon_start(name, "4K", pools[k].arg);
	seen_attach(&s, sock);
	wait_resident(&s, bytes);
	cpu4k = idle_cpu("4K", &s, &tick);
	c = open_model(sock, &m);
	/* Full: just above the low watermark (5%), so that the round trips
	 * below evict as they go, on every pool size alike. */
	pages = bytes / PB;
	prompts = (pages * 95 / 100 - 2 * PROMPT) / PROMPT;
	seen_mark(&s);
	fill_ns = 0;
	for (i = 0; i < prompts; i++)
		fill_ns += put_prompt(c, t, i, PROMPT, src);
	fill = (double)(prompts * PROMPT) * 1e9 / (double)fill_ns;
	seen_since(&s, &dummy, &tfill);
	lookup_rates(c, t, prompts, &look, &look4k);
	alloc_publish(c, t, prompts + 1, src, &p50, &p99);
	bench_close(c);
	kvobs_detach(&s.o);
	daemon_stop(false);

	if (!f->set) {
		*f = (struct firsts){ cpu4k, cpu2m, tick, fill, p50, p99, tfill, true };
	}
	row("idle_cpu", 0, pages, NULL, "%core", "64MiB pool", cpu4k, f->idle4k);
	row("idle_cpu_2m", 0, bytes >> 21, NULL, "%core", "64MiB pool", cpu2m, f->idle2m);
	row("tick_idle", 0, pages, "p99", "us", "64MiB pool", tick, f->tick_idle);
	row("fill", 1, prompts * PROMPT, NULL, "blk/s", "64MiB pool", fill, f->fill);
	row("tick_fill", 1, prompts * PROMPT, "p99", "us", "64MiB pool", tfill, f->tick_fill);
	row("lookup", 1, prompts * PROMPT, NULL, "blk/s", "4k blocks", look, look4k);
	row("alloc_pub", 1, prompts * PROMPT, "p50", "us", "64MiB pool", p50, f->ap50);
	row("alloc_pub", 1, prompts * PROMPT, "p99", "us", "64MiB pool", p99, f->ap99);
	free(t);
	free(src);
}

/* One of n client processes: mixed work for `secs`; writes its
 * alloc+publish latencies (ns) to fd. */
static int client_proc(const char *sock, int round, int id, uint64_t cached, double secs,
		       int fd)
{
	struct kvc_model m = tiny_model("kvbench-scale");
	uint32_t *t = xmalloc(PROMPT * BT * sizeof(*t));
	uint8_t src[PB];
	uint64_t end = now_ns() + (uint64_t)(secs * 1e9), i, ns = 0;
	uint32_t lat[4096];
	size_t n = 0;
	char err[256];
	kvc_t *c;

	memset(src, id, sizeof(src));
	if (try_open(sock, &m, &c, err, sizeof(err)))
		return 2;
	for (i = 0; now_ns() < end && n < NELEM(lat); i++) {
		if (i % 4 == 3)
			lat[n++] = (uint32_t)put_prompt(c, t, ((uint64_t)(round + 1) << 48) +
							((uint64_t)(id + 1) << 32) + i, 4, src);
		else	/* hits or, once evicted, misses: both are work */
			get_prompt(c, t, mix64(i * 131 + (uint64_t)id) % cached, PROMPT, &ns);
	}
	if (write(fd, lat, n * sizeof(lat[0])) != (ssize_t)(n * sizeof(lat[0])))
		return 4;
	kvc_close(c);
	return 0;
}

static void procs_sweep(void)
{
	static const int nprocs[] = { 1, 4, 16, 32 };
	const char *arg = opt.quick ? "64M" : "1G";
	uint64_t bytes = opt.quick ? 64ull << 20 : 1ull << 30, prompts = 16, i;
	double first_p99 = 0, first_cpu = 0, first_tick = 0;
	uint32_t *t = xmalloc(PROMPT * BT * sizeof(*t));
	uint8_t *src = xmalloc(PB);
	struct kvc_model m = tiny_model("kvbench-scale");
	const char *sock;
	struct seen s;
	size_t k;
	kvc_t *c;

	if (scale_max_pool && bytes > scale_max_pool)
		arg = "64M", bytes = 64ull << 20;
	sock = daemon_start("scale-procs", "4K", arg);
	seen_attach(&s, sock);
	wait_resident(&s, bytes);
	c = open_model(sock, &m);
	for (i = 0; i < prompts; i++)
		put_prompt(c, t, i, PROMPT, src);
	for (k = 0; k < NELEM(nprocs); k++) {
		double secs = opt.quick ? 1.0 : 3.0, cpu, tick, p99;
		uint32_t *all = xmalloc(sizeof(uint32_t) * 4096 * (size_t)nprocs[k]);
		size_t n = 0;
		int fds[2], j, st, bad = 0;
		pid_t pid[32];
		ssize_t got;

		if (pipe(fds))
			die("pipe: %s", strerror(errno));
		seen_mark(&s);
		for (j = 0; j < nprocs[k]; j++) {
			pid[j] = fork();
			if (!pid[j]) {
				close(fds[0]);
				_exit(client_proc(sock, (int)k, j, prompts, secs, fds[1]));
			}
		}
		close(fds[1]);
		while ((got = read(fds[0], (uint8_t *)all + n * 4,
				   sizeof(uint32_t) * 4096 * (size_t)nprocs[k] - n * 4)) > 0)
			n += (size_t)got / 4;
		close(fds[0]);
		for (j = 0; j < nprocs[k]; j++)
			if (waitpid(pid[j], &st, 0) != pid[j] || !WIFEXITED(st) || WEXITSTATUS(st))
				bad++;
		if (bad)
			die("scale: %d of %d client processes failed", bad, nprocs[k]);
		seen_since(&s, &cpu, &tick);
		qsort(all, n, sizeof(*all), cmp_u32);
		p99 = n ? (double)all[n * 99 / 100] / 1e3 : 0;
		if (!k) {
			first_p99 = p99;
			first_cpu = cpu;
			first_tick = tick;
		}
		row("procs_ap", nprocs[k], prompts * PROMPT, "p99", "us", "1 process", p99,
		    first_p99);
		row("procs_cpu", nprocs[k], prompts * PROMPT, NULL, "%core", "1 process", cpu,
		    first_cpu);
		row("procs_tick", nprocs[k], prompts * PROMPT, "p99", "us", "1 process", tick,
		    first_tick);
		free(all);
	}
	bench_close(c);
	kvobs_detach(&s.o);
	daemon_stop(false);
	free(t);
	free(src);
}

void mode_scale(void)
{
	struct firsts f = { 0 };
	size_t k;

	if (opt.socket) {
		struct row r = { .mode = "scale", .op = "idle_cpu", .procs = 0, .unit = "%core",
				 .peer_kind = "-",
				 .skipped = "needs daemons of its own sizes (not with --socket)" };

		add_row(&r);
		return;
	}
	for (k = 0; k < NELEM(pools) && (!opt.quick || k < 2); k++)
		pool_point(k, &f);
	procs_sweep();
	snprintf(mode_text + strlen(mode_text), sizeof(mode_text) - strlen(mode_text),
		 "\nscale: 4 KiB pages (idle_cpu_2m: 2 MiB pages), fills of %d-block prompts to the low\n"
		 "  watermark; idle CPU over %d s from /proc/PID/task/*/schedstat; tick p99 from the\n"
		 "  daemon's histogram (bucket upper ends); ratio: times the smallest point\n",
		 PROMPT, opt.quick ? 1 : 3);
}
