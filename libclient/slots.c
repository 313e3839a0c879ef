// SPDX-License-Identifier: MIT
/*
 * slots.c - a handle's pin slots and ledger counter rows, and each
 * thread's share of them, so that a lookup takes no lock and makes no
 * locked read-modify-write.
 *
 * The handle's free slots are a stack under slot_lock. A thread that uses
 * a handle gets a record of its own the first time (struct kvci_thr): a
 * cache of up to c->tcache free slots that it takes and gives back with
 * no lock (refilled from the stack, and spilled to it, half a cache at a
 * time), and a ledger counter row while one of rows 1..15 is free, which
 * it then writes alone with plain relaxed stores (else it adds to row 0
 * atomically, as every thread did before: ledger.h).
 *
 * A thread finds its records through a small thread-local array of
 * (handle serial, record) pairs, the last used first; a serial is never
 * reused, so an entry of a closed handle never matches again. Records are
 * owned by their handle (c->thr) and freed by kvc_close. A record goes
 * back to its handle, with its slots and its row, when its thread exits
 * (a pthread key's destructor) or when the thread's array is full and it
 * is the least recently used; both look the handle up by serial among the
 * live handles first, under kvci_thr_lock, so a closed handle is never
 * touched. Slots a thread caches are not in the stack: kvc_alloc and
 * kvc_restore see the stack and their own thread's cache, at most
 * tcache x (threads - 1) fewer than are free (tcache is small next to
 * the handle's slots: at most 1/64 of them).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

__thread struct kvci_tls kvci_tls[KVCI_TLS] __attribute__((tls_model("initial-exec")));

/* Guards every handle's thr list and the list of live handles. */
static pthread_mutex_t thr_lock = PTHREAD_MUTEX_INITIALIZER;
static kvc_t *live;
static uint64_t next_serial;
static pthread_key_t exit_key;
static bool exit_key_ok;

static void lock_prepare(void)
{
	pthread_mutex_lock(&thr_lock);
}

static void lock_release(void)
{
	pthread_mutex_unlock(&thr_lock);
}

static void thr_exit(void *unused);

static void setup(void)
{
	exit_key_ok = !pthread_key_create(&exit_key, thr_exit);
	/* A fork while another thread holds the lock would leave the child
	 * a lock nobody releases. */
	pthread_atfork(lock_prepare, lock_release, lock_release);
}

/* No destructor may run from an unloaded library. */
static void __attribute__((destructor)) teardown(void)
{
	if (exit_key_ok)
		pthread_key_delete(exit_key);
	exit_key_ok = false;
}

void kvci_slots_init(kvc_t *c)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, setup);
	c->tcache = c->nslots / 64 < KVCI_TCACHE ? c->nslots / 64 : KVCI_TCACHE;
	pthread_mutex_lock(&thr_lock);
	c->serial = ++next_serial;
	c->live_next = live;
	live = c;
	pthread_mutex_unlock(&thr_lock);
}

/* Move up to n slots off the top of the stack into out[] (slot_lock
 * held; slots are all alike, so their order does not matter). */
static uint32_t stack_pop(kvc_t *c, uint32_t *out, uint32_t n)
{
	if (n > c->n_free_slots)
		n = c->n_free_slots;
	c->n_free_slots -= n;
	memcpy(out, c->free_slots + c->n_free_slots, (size_t)n * sizeof(*out));
	return n;
}

static void stack_push(kvc_t *c, const uint32_t *s, uint32_t n)
{
	memcpy(c->free_slots + c->n_free_slots, s, (size_t)n * sizeof(*s));
	c->n_free_slots += n;
}

/* A record's slots and row back to its handle (thr_lock held). */
static void thr_unlink(kvc_t *c, struct kvci_thr *t)
{
	struct kvci_thr **p;

	for (p = &c->thr; *p && *p != t; p = &(*p)->next)
		;
	if (*p)
		*p = t->next;
	pthread_mutex_lock(&c->slot_lock);
	stack_push(c, t->slot, t->n);
	t->n = 0;
	if (t->row)
		c->rows_used &= ~(1u << t->row);
	pthread_mutex_unlock(&c->slot_lock);
	free(t);
}

/* TLS entry e goes back to its handle, if that handle is still open
 * (thr_lock held). */
static void tls_release(struct kvci_tls *e)
{
	kvc_t *c;

	for (c = live; c && c->serial != e->serial; c = c->live_next)
		;
	if (c)
		thr_unlink(c, e->t);
	e->serial = 0;
	e->t = NULL;
}

static void thr_exit(void *unused)
{
	int i;

	(void)unused;
	pthread_mutex_lock(&thr_lock);
	for (i = 0; i < KVCI_TLS; i++)
		if (kvci_tls[i].serial)
			tls_release(&kvci_tls[i]);
	pthread_mutex_unlock(&thr_lock);
}

void kvci_slots_close(kvc_t *c)
{
	struct kvci_thr *t;
	kvc_t **p;

	if (!c->serial)
		return;
	pthread_mutex_lock(&thr_lock);
	for (p = &live; *p && *p != c; p = &(*p)->live_next)
		;
	if (*p)
		*p = c->live_next;
	while ((t = c->thr)) {
		c->thr = t->next;
		free(t);
	}
	pthread_mutex_unlock(&thr_lock);
}

struct kvci_thr *kvci_thr_find(kvc_t *c)
{
	struct kvci_tls e;
	struct kvci_thr *t;
	uint32_t row;
	int i;

	for (i = 1; i < KVCI_TLS; i++)
		if (kvci_tls[i].serial == c->serial)
			break;
	if (i == KVCI_TLS) {
		/* A new record; the least recently used entry makes room. */
		t = calloc(1, sizeof(*t));
		if (!t)
			return NULL;
		pthread_mutex_lock(&thr_lock);
		i = KVCI_TLS - 1;
		if (kvci_tls[i].serial)
			tls_release(&kvci_tls[i]);
		pthread_mutex_lock(&c->slot_lock);
		for (row = 1; row < KVSHM_LEDGER_ROWS && (c->rows_used >> row & 1); row++)
			;
		if (row < KVSHM_LEDGER_ROWS) {
			c->rows_used |= 1u << row;
			t->row = row;
		}
		pthread_mutex_unlock(&c->slot_lock);
		t->next = c->thr;
		c->thr = t;
		kvci_tls[i] = (struct kvci_tls){ c->serial, t };
		pthread_mutex_unlock(&thr_lock);
		if (exit_key_ok)
			pthread_setspecific(exit_key, (void *)1);
	}
	/* The last used first. */
	e = kvci_tls[i];
	for (; i > 0; i--)
		kvci_tls[i] = kvci_tls[i - 1];
	kvci_tls[0] = e;
	return e.t;
}

uint32_t kvci_slots_take_slow(kvc_t *c, struct kvci_thr *t, uint32_t *out, uint32_t n)
{
	uint32_t k = 0;

	if (t) {
		k = t->n < n ? t->n : n;
		t->n -= k;
		memcpy(out, t->slot + t->n, (size_t)k * sizeof(*out));
		if (k == n)
			return k;
	}
	pthread_mutex_lock(&c->slot_lock);
	k += stack_pop(c, out + k, n - k);
	/* The cache ran dry: half of it again, for the next lookups. */
	if (t && t->n < c->tcache / 2)
		t->n += stack_pop(c, t->slot + t->n, c->tcache / 2 - t->n);
	pthread_mutex_unlock(&c->slot_lock);
	return k;
}

void kvci_slots_give_slow(kvc_t *c, struct kvci_thr *t, const uint32_t *s, uint32_t n)
{
	uint32_t k = 0;

	if (t) {
		k = c->tcache - t->n < n ? c->tcache - t->n : n;
		memcpy(t->slot + t->n, s, (size_t)k * sizeof(*s));
		t->n += k;
		if (k == n)
			return;
	}
	pthread_mutex_lock(&c->slot_lock);
	stack_push(c, s + k, n - k);
	/* The cache is full: back to half of it. */
	if (t && t->n > c->tcache / 2) {
		stack_push(c, t->slot + c->tcache / 2, t->n - c->tcache / 2);
		t->n = c->tcache / 2;
	}
	pthread_mutex_unlock(&c->slot_lock);
}

uint32_t kvci_slots_free(kvc_t *c, const struct kvci_thr *t)
{
	uint32_t n;

	pthread_mutex_lock(&c->slot_lock);
	n = c->n_free_slots;
	pthread_mutex_unlock(&c->slot_lock);
	return n + (t ? t->n : 0);
}
