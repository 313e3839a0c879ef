// SPDX-License-Identifier: MIT
/*
 * tenants.c - tenants and operators (issue #35), against the real daemon:
 * shares of the pool per tenant and per namespace beside max-share, each
 * tenant's refusals in its own counters under the name the operator gave
 * (never the salt), no-insert clients, an operator's drops of a tenant's
 * and a namespace's pages, and prefixes pinned with a time to live that
 * survive pool turnovers within it and are evictable after.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../../libclient/observe.h"
#include "../../shm/proto.h"
#include "../../shm/stats.h"

#define BT 16
#define PAGES 256	/* the harness's pool: 1 MiB of 4 KiB pages */

static kvc_t *open_as(const struct kvt_daemon *d, const char *salt, uint32_t flags,
		      uint32_t max_share, const char *model)
{
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock, .flags = flags,
				 .salt = salt, .salt_len = salt ? strlen(salt) : 0,
				 .max_share = max_share };
	kvc_t *c = NULL;

	if (model)
		m.name = model;
	return kvc_open(&m, &o, &c) ? NULL : c;
}

/* A snapshot of the daemon's shared memory, as kvstat takes it. */
static void snap(const struct kvt_daemon *d, struct kvobs *o, struct kvshm_snap *s)
{
	char err[256];

	assert_int_equal(kvobs_attach(d->sock, o, err, sizeof(err)), 0);
	assert_int_equal(kvshm_snap_take(o->h, s), 0);
}

static void unsnap(struct kvobs *o, struct kvshm_snap *s)
{
	kvshm_snap_free(s);
	kvobs_detach(o);
}

static const struct kvshm_tenant *tenant_row(const struct kvshm_snap *s, const char *name)
{
	uint32_t i;

	for (i = 0; i < s->n_tenants; i++)
		if (kvshm_snap_tenant_used(s, i) && !strcmp(s->tenants[i].name, name))
			return &s->tenants[i];
	return NULL;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------- shares */

/*
 * One engine of a tenant: publish fresh 8-block prompts and keep each
 * request (its pages stay pinned) until kvc_alloc refuses (-EDQUOT); then
 * tell the parent how many pages it holds, how many refusals it saw and
 * the last message, and hold them until the parent says go.
 */
struct engine {
	const struct kvt_daemon *d;
	const char *salt;
	uint32_t seed;
	int report[2], go[2];
};

struct report {
	int held, refused, short_allocs;
	char msg[256];
};

static int engine(void *arg)
{
	struct engine *e = arg;
	struct kvc_req *r[64];
	struct report rep = { 0 };
	kvc_t *c = open_as(e->d, e->salt, 0, 0, NULL);
	uint32_t t[8 * BT];
	int n = 0, i, got;
	int in_a_row = 0;
	char b;

	if (!c)
		return 2;
	alarm(120);
	while (n < 64) {
		kvt_tokens(t, 8 * BT, 0, e->seed + (uint32_t)n);
		if (kvc_req_new(c, t, 8 * BT, NULL, 0, &r[n]) || kvc_lookup(r[n]) != 0)
			return 3;
		got = kvc_alloc(r[n]);
		if (got == -EDQUOT) {
			/* What the tenant holds errs high until the pin census
			 * has read the ledgers since the last publishes: wait
			 * a few passes before taking no for an answer. */
			rep.refused++;
			snprintf(rep.msg, sizeof(rep.msg), "%s", kvc_req_message(r[n]));
			kvc_req_free(r[n]);
			if (++in_a_row == 3)
				break;
			usleep(200 * 1000);
			continue;
		}
		in_a_row = 0;
		if (got < 0)
			return 4;
		if (got < 8)
			rep.short_allocs++;
		if (got && kvc_publish(r[n]) != got)
			return 5;
		rep.held += got;
		n++;
	}
	if (write(e->report[1], &rep, sizeof(rep)) != sizeof(rep))
		return 6;
	if (read(e->go[0], &b, 1) != 1)
		return 7;
	for (i = 0; i < n; i++)
		kvc_req_free(r[i]);
	kvc_close(c);
	return 0;
}

/*
 * Two tenants of one model at 50% each on a full pool (max-share 100%: a
 * process alone could take it all): tenant a's two engines, then tenant
 * b's two, each publishing until refused. Neither tenant holds more than
 * its 128 pages; each got close to it; every refusal is in its own
 * tenant's counters, with a message naming the tenant and its share.
 */
static void test_two_tenants_half_each(void **state)
{
	const char *args[] = { "--max-share", "100", "--eviction", "lru",
			       "--tenant", "a salt=salt-of-a share=50",
			       "--tenant", "b salt=salt-of-b share=50%", NULL };
	struct kvt_daemon d;
	struct engine e[4];
	struct report rep[4];
	struct kvshm_snap s;
	struct kvobs o;
	int held[2] = { 0, 0 }, refused[2] = { 0, 0 }, i;
	pid_t p[4];

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	/* A full pool: unsalted prompts cached everywhere, nobody pins them. */
	assert_int_equal(kvt_flood(&d, 40, 5000), 0);
	for (i = 0; i < 4; i++) {
		e[i].d = &d;
		e[i].salt = i < 2 ? "salt-of-a" : "salt-of-b";
		e[i].seed = 10000 + 1000 * (uint32_t)i;
		assert_int_equal(pipe(e[i].report), 0);
		assert_int_equal(pipe(e[i].go), 0);
	}
	/* Tenant a's engines together, then b's: both tenants fill their
	 * share of the same pool. */
	for (i = 0; i < 4; i++) {
		p[i] = kvt_fork(engine, &e[i]);
		if (i == 1 || i == 3) {
			assert_int_equal(read(e[i - 1].report[0], &rep[i - 1], sizeof(rep[0])),
					 sizeof(rep[0]));
			assert_int_equal(read(e[i].report[0], &rep[i], sizeof(rep[0])),
					 sizeof(rep[0]));
		}
	}
	for (i = 0; i < 4; i++) {
		held[i / 2] += rep[i].held;
		refused[i / 2] += rep[i].refused;
		assert_true(rep[i].refused >= 3);
		assert_non_null(strstr(rep[i].msg, i < 2 ? "tenant a holds" : "tenant b holds"));
		assert_non_null(strstr(rep[i].msg, "its share of 50%"));
	}
	print_message("tenant a holds %d pages, b %d (share 128 each)\n", held[0], held[1]);
	assert_true(held[0] <= PAGES / 2 && held[1] <= PAGES / 2);
	assert_true(held[0] >= PAGES / 2 - 8 && held[1] >= PAGES / 2 - 8);
	/* Each tenant's refusals in its own row, by its name; the daemon's
	 * count of tenant-share refusals is their sum. What a tenant holds,
	 * as its share counts it, errs high until the pin census has read
	 * every ledger since the last publish (a pass every few ticks): then
	 * it is exact. */
	for (i = 0; i < 200; i++) {
		snap(&d, &o, &s);
		if (tenant_row(&s, "a")->held == (uint64_t)held[0] &&
		    tenant_row(&s, "b")->held == (uint64_t)held[1])
			break;
		unsnap(&o, &s);
		sleep_ms(10);
	}
	assert_non_null(tenant_row(&s, "a"));
	assert_non_null(tenant_row(&s, "b"));
	assert_int_equal(tenant_row(&s, "a")->refused, (uint64_t)refused[0]);
	assert_int_equal(tenant_row(&s, "b")->refused, (uint64_t)refused[1]);
	assert_int_equal(s.v[KVSHM_STAT_ID(tenant_refused)], (uint64_t)(refused[0] + refused[1]));
	assert_true(tenant_row(&s, "a")->held <= PAGES / 2);
	assert_true(tenant_row(&s, "b")->held <= PAGES / 2);
	assert_int_equal(tenant_row(&s, "a")->published, (uint64_t)held[0]);
	assert_int_equal(tenant_row(&s, "b")->published, (uint64_t)held[1]);
	unsnap(&o, &s);
	for (i = 0; i < 4; i++) {
		assert_int_equal(write(e[i].go[1], "x", 1), 1);
		assert_int_equal(kvt_wait(p[i]), 0);
		close(e[i].report[0]);
		close(e[i].report[1]);
		close(e[i].go[0]);
		close(e[i].go[1]);
	}
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* Publish fresh 8-block prompts of c (seeds seed, seed+1, ...) keeping
 * each request, until kvc_alloc fails (at most 8): r[0..*n] are the
 * requests (r[*n] the refused one), the pages granted in *got; returns
 * what the last kvc_alloc returned. */
static int fill_until_refused(kvc_t *c, uint32_t seed, struct kvc_req **r, int *n, int *got)
{
	uint32_t t[8 * BT];
	int rc = 0;

	for (*n = 0, *got = 0; *n < 8; (*n)++) {
		kvt_tokens(t, 8 * BT, 0, seed + (uint32_t)*n);
		assert_int_equal(kvc_req_new(c, t, 8 * BT, NULL, 0, &r[*n]), 0);
		kvc_lookup(r[*n]);
		rc = kvc_alloc(r[*n]);
		if (rc < 0)
			return rc;
		*got += rc;
		assert_int_equal(kvc_publish(r[*n]), rc);
	}
	(*n)--;
	return rc;
}

/* A namespace's share, and a client that asks for less than max-share:
 * both refuse with a message that names them. */
static void test_namespace_and_own_share(void **state)
{
	const char *args[] = { "--namespace-share", "10", NULL };
	struct kvt_daemon d;
	struct kvc_req *r[8];
	int n, got = 0, rc = 0;
	kvc_t *c;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = open_as(&d, NULL, 0, 0, NULL);
	assert_non_null(c);
	rc = fill_until_refused(c, 700, r, &n, &got);
	/* 10% of 256 pages: 25 */
	assert_int_equal(rc, -EDQUOT);
	assert_true(got <= 25 && got >= 17);
	assert_non_null(strstr(kvc_req_message(r[n]), "namespace 0 (kvt-tiny) holds"));
	assert_non_null(strstr(kvc_req_message(r[n]), "namespace-share"));
	while (n >= 0)
		kvc_req_free(r[n--]);
	kvc_close(c);

	/* max_share in kvc_options: at most that, never more than max-share. */
	c = open_as(&d, "own", 0, 5, "kvt-own");
	assert_non_null(c);
	rc = fill_until_refused(c, 800, r, &n, &got);
	assert_int_equal(rc, -EDQUOT);
	assert_true(got <= 12);		/* 5% of 256 */
	assert_non_null(strstr(kvc_req_message(r[n]), "max-share of 5% (as its client asked)"));
	while (n >= 0)
		kvc_req_free(r[n--]);
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* ------------------------------------------------------------ no-insert */

/*
 * A no-insert client hits what others published and never publishes: its
 * kvc_alloc says -EROFS and why, no round trip. A tenant the config makes
 * no-insert: the daemon refuses its ALLOCs with the tenant's name.
 */
static void test_no_insert(void **state)
{
	const char *args[] = { "--tenant", "audit salt=audit-salt no-insert", NULL };
	struct kvt_daemon d;
	struct kvc_req *r;
	struct kvshm_snap s;
	struct kvobs o;
	uint32_t t[3 * BT], u[3 * BT];
	uint64_t published;
	int cached = 0;
	kvc_t *w, *ro, *au;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	w = open_as(&d, NULL, 0, 0, NULL);
	ro = open_as(&d, NULL, KVC_OPEN_NO_INSERT, 0, NULL);
	au = open_as(&d, "audit-salt", 0, 0, NULL);
	assert_non_null(w);
	assert_non_null(ro);
	assert_non_null(au);
	kvt_tokens(t, 3 * BT, 0, 42);
	kvt_tokens(u, 3 * BT, 0, 43);
	assert_int_equal(kvt_put(w, t, 3 * BT, &cached), 0);
	assert_int_equal(cached, 3);
	snap(&d, &o, &s);
	published = s.v[KVSHM_STAT_ID(publishes)];
	unsnap(&o, &s);
	/* It hits the shared prompt... */
	assert_int_equal(kvt_get(ro, t, 3 * BT), 3);
	/* ...and publishes nothing of its own. */
	assert_int_equal(kvc_req_new(ro, u, 3 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), -EROFS);
	assert_int_equal(kvc_req_short_reason(r), -EROFS);
	assert_non_null(strstr(kvc_req_message(r), "KVC_OPEN_NO_INSERT"));
	kvc_req_free(r);
	/* The tenant made no-insert by the config. */
	assert_int_equal(kvc_req_new(au, u, 3 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), -EROFS);
	assert_non_null(strstr(kvc_req_message(r), "tenant audit is no-insert"));
	kvc_req_free(r);
	assert_int_equal(kvt_put(au, u, 3 * BT, NULL), -EROFS);
	snap(&d, &o, &s);
	assert_int_equal(s.v[KVSHM_STAT_ID(publishes)], published);
	assert_int_equal(tenant_row(&s, "audit")->no_insert_refused, 2);
	assert_int_equal(tenant_row(&s, "audit")->published, 0);
	assert_true(tenant_row(&s, "audit")->flags & KVSHM_TENANT_NO_INSERT);
	assert_int_equal(s.v[KVSHM_STAT_ID(no_insert_refused)], 2);	/* ro's is the library's */
	unsnap(&o, &s);
	assert_true(kvt_log_has(&d, "tenant audit, 16384") || kvt_log_has(&d, "tenant audit,"));
	kvc_close(w);
	kvc_close(ro);
	kvc_close(au);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* --------------------------------------------------- names, not salts */

/* Per-tenant hits and publishes, under the operator's name in kvstat's
 * view and the metrics; no salt anywhere in what an observer reads. */
static void test_counters_by_name_never_salt(void **state)
{
	const char *args[] = { "--tenant", "acme salt=Secret-Salt-1", NULL };
	struct kvt_daemon d;
	struct kvshm_snap s;
	struct kvobs o;
	uint32_t t[4 * BT];
	char *text, out[65536];
	size_t need;
	int cached = 0;
	kvc_t *a, *b;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	a = open_as(&d, "Secret-Salt-1", 0, 0, NULL);
	b = open_as(&d, "Secret-Salt-2", 0, 0, NULL);	/* named by nobody */
	assert_non_null(a);
	assert_non_null(b);
	kvt_tokens(t, 4 * BT, 0, 99);
	assert_int_equal(kvt_put(a, t, 4 * BT, &cached), 0);
	assert_int_equal(kvt_get(a, t, 4 * BT), 4);
	assert_int_equal(kvt_get(b, t, 4 * BT), 0);	/* another salt: another key space */
	sleep_ms(100);					/* a few ticks: folded */
	snap(&d, &o, &s);
	assert_non_null(tenant_row(&s, "acme"));
	assert_int_equal(tenant_row(&s, "acme")->published, 4);
	assert_int_equal(tenant_row(&s, "acme")->hit_blocks, 4);
	assert_int_equal(tenant_row(&s, "acme")->pages, 4);
	assert_int_equal(tenant_row(&s, "acme")->clients, 1);
	assert_non_null(tenant_row(&s, "unnamed-1"));
	assert_int_equal(tenant_row(&s, "unnamed-1")->hit_blocks, 0);
	assert_int_equal(tenant_row(&s, "unnamed-1")->miss_blocks, 4);
	need = kvshm_prometheus(&s, NULL, 0);
	text = malloc(need + 1);
	assert_non_null(text);
	kvshm_prometheus(&s, text, need + 1);
	assert_non_null(strstr(text, "kvcached_tenant_published_total{tenant=\"acme\",row=\"0\"} 4"));
	assert_non_null(strstr(text, "kvcached_tenant_hit_blocks_total{tenant=\"acme\",row=\"0\"} 4"));
	assert_null(strstr(text, "Secret-Salt"));
	free(text);
	unsnap(&o, &s);
	/* kvstat's table and JSON: the names, never a salt. */
	{
		const char *ka[] = { "--socket", d.sock, NULL };
		const char *kj[] = { "--socket", d.sock, "--json", NULL };

		assert_int_equal(kvt_run(kvt_bin("kvstat"), ka, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "TENANTS (2)"));
		assert_non_null(strstr(out, "acme"));
		assert_null(strstr(out, "Secret-Salt"));
		assert_int_equal(kvt_run(kvt_bin("kvstat"), kj, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "\"tenants\":[{\"row\":0,\"name\":\"acme\""));
		assert_null(strstr(out, "Secret-Salt"));
	}
	assert_false(kvt_log_has(&d, "Secret-Salt"));
	kvc_close(a);
	kvc_close(b);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* -------------------------------------------------------- operators */

static int kvstat(const struct kvt_daemon *d, char *out, size_t len, ...)
{
	const char *args[24] = { "--socket", d->sock };
	va_list ap;
	int n = 2;

	va_start(ap, len);
	while (n < 23 && (args[n] = va_arg(ap, const char *)))
		n++;
	va_end(ap);
	args[n] = NULL;
	return kvt_run(kvt_bin("kvstat"), args, out, len);
}

/*
 * kvstat --drop-tenant drops that tenant's pages only; --drop-namespace a
 * model's, every tenant's; a client's pins keep what they hold; someone
 * other than root or the daemon's user is refused.
 */
static void test_operator_drops(void **state)
{
	const char *args[] = { "--tenant", "a salt=sa", "--tenant", "b salt=sb", "--socket-mode",
			       "0666", "--allow-users", "0,65534", NULL };
	struct kvt_daemon d;
	uint32_t ta[4 * BT], tb[4 * BT], tc[4 * BT];
	char out[4096];
	kvc_t *a, *b, *c;
	struct kvc_req *held;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	a = open_as(&d, "sa", 0, 0, NULL);
	b = open_as(&d, "sb", 0, 0, NULL);
	c = open_as(&d, "sa", 0, 0, "kvt-other");
	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(c);
	kvt_tokens(ta, 4 * BT, 0, 1);
	kvt_tokens(tb, 4 * BT, 0, 2);
	kvt_tokens(tc, 4 * BT, 0, 3);
	assert_int_equal(kvt_put(a, ta, 4 * BT, NULL), 0);
	assert_int_equal(kvt_put(b, tb, 4 * BT, NULL), 0);
	assert_int_equal(kvt_put(c, tc, 4 * BT, NULL), 0);
	/* a client's pins stay through a drop */
	assert_int_equal(kvc_req_new(a, ta, 2 * BT, NULL, 0, &held), 0);
	assert_int_equal(kvc_lookup(held), 2);

	assert_int_equal(kvstat(&d, out, sizeof(out), "--drop-tenant", "a", "--model", "kvt-tiny",
				NULL), 0);
	assert_non_null(strstr(out, "dropped 2 pages"));
	assert_non_null(strstr(out, "2 pages pinned or being written stay"));
	kvc_req_free(held);
	assert_int_equal(kvt_get(a, ta, 4 * BT), 2);	/* the pinned two stayed */
	assert_int_equal(kvt_get(b, tb, 4 * BT), 4);	/* another tenant: untouched */
	assert_int_equal(kvt_get(c, tc, 4 * BT), 4);	/* another model: untouched */
	assert_true(kvt_log_has(&d, "dropped tenant a"));

	assert_int_equal(kvstat(&d, out, sizeof(out), "--drop-namespace", "kvt-other", NULL), 0);
	assert_non_null(strstr(out, "dropped 4 pages"));
	assert_int_equal(kvt_get(c, tc, 4 * BT), 0);
	assert_int_equal(kvt_get(b, tb, 4 * BT), 4);

	/* A tenant of every namespace; unknown names are refused by name. */
	assert_int_equal(kvstat(&d, out, sizeof(out), "--drop-tenant", "b", NULL), 0);
	assert_int_equal(kvt_get(b, tb, 4 * BT), 0);
	assert_int_equal(kvstat(&d, out, sizeof(out), "--drop-tenant", "nobody", NULL), 1);
	assert_non_null(strstr(out, "no tenant named nobody"));
	assert_int_equal(kvstat(&d, out, sizeof(out), "--drop-namespace", "no-such-model", NULL), 1);
	assert_non_null(strstr(out, "no model no-such-model"));

	/* Root and the daemon's own user only. */
	if (geteuid() == 0) {
		pid_t p = fork();

		if (!p) {
			struct kvproto_admin q = { .version = KVPROTO_VERSION,
						   .op = KVPROTO_ADMIN_DROP_TENANT,
						   .ns_row = KVPROTO_ADMIN_ANY, .tenant = "a" };
			struct kvproto_admin_r r;
			char err[256];

			if (setgid(65534) || setuid(65534))
				_exit(9);
			_exit(kvobs_admin(d.sock, &q, NULL, &r, err, sizeof(err)) == -EPERM &&
				      strstr(err, "dropping pages is allowed to root") ? 0 : 1);
		}
		assert_int_equal(kvt_wait(p), 0);
	} else {
		print_message("skip part: not root, cannot ask as another user\n");
	}
	kvc_close(a);
	kvc_close(b);
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* ------------------------------------------------------------ pins */

/* Hits of prompt t (n blocks) for a fresh request of c. */
static int hits_of(kvc_t *c, const uint32_t *t, size_t n)
{
	struct kvc_req *r;
	int h;

	if (kvc_req_new(c, t, n, NULL, 0, &r))
		return -1;
	h = kvc_lookup(r);
	kvc_req_free(r);
	return h;
}

static uint64_t stat_of(const struct kvt_daemon *d, size_t id)
{
	struct kvshm_snap s;
	struct kvobs o;
	uint64_t v;

	snap(d, &o, &s);
	v = s.v[id];
	unsnap(&o, &s);
	return v;
}

/*
 * A prompt pinned by the operator (kvstat --pin FILE --ttl) survives 10
 * turnovers of the pool within its TTL, counted in its tenant's held
 * pages; a client's pin (kvc_pin) likewise, and once its TTL has run out
 * its blocks are evictable like any others. Without the pins the same
 * prompts are gone after one turnover.
 */
static void test_pins_survive_turnovers(void **state)
{
	/* LRU: the blocks looked up again and again here must still go once
	 * nothing holds them, which S3-FIFO by design would not let a flood
	 * of one-off prompts do. */
	const char *args[] = { "--eviction", "lru", NULL };
	struct kvt_daemon d;
	uint32_t p[8 * BT], q[8 * BT], x[8 * BT];
	struct kvc_req *r;
	struct kvshm_snap s;
	struct kvobs o;
	char out[4096], path[96], num[16];
	FILE *f;
	int i, id, turn, pin_id = 0;
	time_t t0;
	kvc_t *c;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = open_as(&d, NULL, 0, 0, NULL);
	assert_non_null(c);
	kvt_tokens(p, 8 * BT, 0, 31);
	kvt_tokens(q, 8 * BT, 0, 32);
	kvt_tokens(x, 8 * BT, 0, 33);
	assert_int_equal(kvt_put(c, p, 8 * BT, NULL), 0);
	assert_int_equal(kvt_put(c, q, 8 * BT, NULL), 0);
	assert_int_equal(kvt_put(c, x, 8 * BT, NULL), 0);

	/* The operator pins p from a file of its token ids (and a partial
	 * block, which is not cached). */
	snprintf(path, sizeof(path), "%s/p.ids", d.dir);
	f = fopen(path, "w");
	assert_non_null(f);
	for (i = 0; i < 8 * BT; i++)
		fprintf(f, "%u%s", p[i], i % 10 == 9 ? "\n" : ", ");
	fprintf(f, "7 7 7\n");
	fclose(f);
	assert_int_equal(kvstat(&d, out, sizeof(out), "--pin", path, "--model", "kvt-tiny", "--ttl",
				"120", "--label", "system-v1", NULL), 0);
	assert_non_null(strstr(out, "8 of the prompt's 8 blocks resident now"));
	assert_int_equal(sscanf(strstr(out, "pin ") + 4, "%d", &pin_id), 1);
	/* The client pins q for 120 s too. */
	assert_int_equal(kvc_req_new(c, q, 8 * BT, NULL, 0, &r), 0);
	id = kvc_pin(r, 120);
	assert_true(id > 0);
	kvc_req_free(r);
	sleep_ms(50);	/* the tenants' gauges are written each tick */
	snap(&d, &o, &s);
	assert_int_equal(s.n_pinned, 2);
	assert_int_equal(s.v[KVSHM_STAT_ID(pinned_pages)], 16);
	assert_int_equal(tenant_row(&s, "unsalted")->pinned, 16);
	assert_true(tenant_row(&s, "unsalted")->held >= 16);	/* counted against its share */
	assert_string_equal(s.pinned[0].label, "system-v1");
	unsnap(&o, &s);
	assert_int_equal(kvstat(&d, out, sizeof(out), "--pins", NULL), 0);
	assert_non_null(strstr(out, "PINNED (2"));
	assert_non_null(strstr(out, "system-v1"));

	/* Ten turnovers of the pool (256 pages; 40 prompts of 8 blocks). */
	t0 = time(NULL);
	for (turn = 0; turn < 10; turn++)
		assert_int_equal(kvt_flood(&d, 40, 20000 + 100 * (uint32_t)turn), 0);
	assert_true(time(NULL) - t0 < 120);	/* all within the TTL */
	assert_true(stat_of(&d, KVSHM_STAT_ID(evictions)) >= 10 * PAGES - 3 * 8);
	assert_int_equal(hits_of(c, p, 8 * BT), 8);
	assert_int_equal(hits_of(c, q, 8 * BT), 8);
	assert_int_equal(hits_of(c, x, 8 * BT), 0);	/* unpinned: gone */

	/* Unpinned by the operator, and by the client: evictable again. */
	snprintf(num, sizeof(num), "%d", pin_id);
	assert_int_equal(kvstat(&d, out, sizeof(out), "--unpin", num, NULL), 0);
	assert_int_equal(kvc_unpin(c, id), 0);
	assert_int_equal(kvc_unpin(c, id), -ENOENT);
	assert_int_equal(stat_of(&d, KVSHM_STAT_ID(pinned_pages)), 0);
	assert_int_equal(kvt_flood(&d, 40, 30000), 0);
	assert_int_equal(kvt_flood(&d, 40, 30100), 0);
	assert_int_equal(hits_of(c, p, 8 * BT), 0);
	assert_int_equal(hits_of(c, q, 8 * BT), 0);

	/* A pin whose TTL runs out: held while it lasts, evictable after. */
	assert_int_equal(kvt_put(c, x, 8 * BT, NULL), 0);
	assert_int_equal(kvc_req_new(c, x, 8 * BT, NULL, 0, &r), 0);
	id = kvc_pin(r, 1);
	assert_true(id > 0);
	kvc_req_free(r);
	assert_int_equal(stat_of(&d, KVSHM_STAT_ID(pinned_pages)), 8);
	for (i = 0; i < 500 && stat_of(&d, KVSHM_STAT_ID(pins_expired)) < 1; i++)
		sleep_ms(20);
	assert_int_equal(stat_of(&d, KVSHM_STAT_ID(pins_expired)), 1);
	assert_int_equal(stat_of(&d, KVSHM_STAT_ID(pinned_pages)), 0);
	assert_true(kvt_log_has(&d, "its time to live ran out"));
	assert_int_equal(kvt_flood(&d, 40, 40000), 0);
	assert_int_equal(kvt_flood(&d, 40, 40100), 0);
	assert_int_equal(hits_of(c, x, 8 * BT), 0);
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/*
 * A pin of blocks not cached yet holds them as they are published; a pin
 * of another namespace's model or of an engine-keyed one, a TTL out of
 * range and a 65th pin are refused with a reason.
 */
static void test_pin_edges(void **state)
{
	const char *args[] = { NULL };
	struct kvt_daemon d;
	uint32_t p[4 * BT];
	struct kvc_req *r, *rr[64];
	char out[4096];
	int i, id;
	kvc_t *c;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = open_as(&d, NULL, 0, 0, NULL);
	assert_non_null(c);
	kvt_tokens(p, 4 * BT, 0, 77);
	assert_int_equal(kvc_req_new(c, p, 4 * BT, NULL, 0, &r), 0);
	id = kvc_pin(r, 60);	/* nothing cached yet */
	assert_true(id > 0);
	assert_int_equal(kvc_pin(r, 60), id);	/* the same prefix again: the same pin */
	assert_int_equal(kvc_pin(r, 0), -EINVAL);
	assert_int_equal(kvc_pin(r, KVPROTO_PIN_TTL_MAX + 1), -EINVAL);
	kvc_req_free(r);
	assert_int_equal(stat_of(&d, KVSHM_STAT_ID(pinned_pages)), 0);
	assert_int_equal(kvt_put(c, p, 4 * BT, NULL), 0);
	for (i = 0; i < 200 && stat_of(&d, KVSHM_STAT_ID(pinned_pages)) < 4; i++)
		sleep_ms(10);
	assert_int_equal(stat_of(&d, KVSHM_STAT_ID(pinned_pages)), 4);
	/* 64 pins at most. */
	for (i = 0; i < 63; i++) {
		uint32_t t[BT];

		kvt_tokens(t, BT, 0, 5000 + (uint32_t)i);
		assert_int_equal(kvc_req_new(c, t, BT, NULL, 0, &rr[i]), 0);
		assert_true(kvc_pin(rr[i], 60) > 0);
	}
	assert_int_equal(kvc_pin(rr[0], 60) > 0, 1);	/* the same: still fine */
	{
		uint32_t t[BT];

		kvt_tokens(t, BT, 0, 9999);
		assert_int_equal(kvc_req_new(c, t, BT, NULL, 0, &rr[63]), 0);
		assert_int_equal(kvc_pin(rr[63], 60), -ENOSPC);
		assert_non_null(strstr(kvc_req_message(rr[63]), "64 prefixes are pinned already"));
	}
	for (i = 0; i < 64; i++)
		kvc_req_free(rr[i]);
	/* kvstat: a model with no namespace; a prompt shorter than a block. */
	{
		char path[96];
		FILE *f;

		snprintf(path, sizeof(path), "%s/short.ids", d.dir);
		f = fopen(path, "w");
		assert_non_null(f);
		fprintf(f, "1 2 3\n");
		fclose(f);
		assert_int_equal(kvstat(&d, out, sizeof(out), "--pin", path, "--model", "nope",
					"--ttl", "5", NULL), 1);
		assert_non_null(strstr(out, "no model nope"));
		assert_int_equal(kvstat(&d, out, sizeof(out), "--pin", path, "--model", "kvt-tiny",
					"--ttl", "5", NULL), 1);
		assert_non_null(strstr(out, "fewer than one 16-token block"));
		f = fopen(path, "w");
		assert_non_null(f);
		fprintf(f, "1 2 x3\n");
		fclose(f);
		assert_int_equal(kvstat(&d, out, sizeof(out), "--pin", path, "--model", "kvt-tiny",
					"--ttl", "5", NULL), 1);
		assert_non_null(strstr(out, "is not a token id"));
		assert_int_equal(kvstat(&d, out, sizeof(out), "--pin", path, "--ttl", "5", NULL), 2);
	}
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_tenants_half_each),
		cmocka_unit_test(test_namespace_and_own_share),
		cmocka_unit_test(test_no_insert),
		cmocka_unit_test(test_counters_by_name_never_salt),
		cmocka_unit_test(test_operator_drops),
		cmocka_unit_test(test_pins_survive_turnovers),
		cmocka_unit_test(test_pin_edges),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
