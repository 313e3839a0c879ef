// SPDX-License-Identifier: MIT
/*
 * closer.c - closing client-controlled descriptors off the event loop
 * (see closer.h for why).
 *
 * A queue under a mutex and threads that pop from it. A thread is started
 * whenever work is queued and none is idle, up to KVD_CLOSERS; so one
 * close that hangs for hours (a FUSE server that never answers) costs one
 * thread, and the others go on. Threads block every signal (SIGTERM
 * belongs to the event loop's signalfd) and live until the process exits.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "closer.h"
#include "log.h"

#define KVD_CLOSERS 8
#define DRAIN_MAX (256u << 10)	/* bytes read out of a closing connection */

struct job {
	int fd;
	bool drain;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static struct job *q;
static uint32_t q_head, q_len, q_cap;
static uint32_t threads, idle, busy;
static _Atomic uint64_t passed_total;

/* A socket's last close must not wait for unsent data: no linger. */
static void defuse(int fd)
{
	struct linger lg = { 0, 0 };
	struct stat st;

	if (!fstat(fd, &st) && S_ISSOCK(st.st_mode))
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
}

static void close_passed_now(const int *fds, int n)
{
	int k;

	for (k = 0; k < n; k++) {
		defuse(fds[k]);
		close(fds[k]);
	}
}

/* Read what is queued on a closing connection, closing the descriptors
 * that come with it here, on this thread. */
static void drain(int fd)
{
	char buf[4096], cbuf[CMSG_SPACE(sizeof(int) * 64)];
	uint32_t total = 0;

	shutdown(fd, SHUT_RD);	/* the peer's sends fail from now on */
	while (total < DRAIN_MAX) {
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
				     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *cm;
		ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (n <= 0)
			break;
		total += (uint32_t)n;
		for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int fds[64];

			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			memcpy(fds, CMSG_DATA(cm), (size_t)cnt * sizeof(int));
			atomic_fetch_add(&passed_total, (uint64_t)cnt);
			close_passed_now(fds, cnt);
		}
	}
}

static void *closer_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		struct job j;

		while (!q_len) {
			idle++;
			pthread_cond_wait(&cv, &mu);
			idle--;
		}
		j = q[q_head];
		q_head = (q_head + 1) % q_cap;
		q_len--;
		busy++;
		pthread_mutex_unlock(&mu);
		if (j.drain)
			drain(j.fd);
		else
			defuse(j.fd);
		close(j.fd);
		pthread_mutex_lock(&mu);
		busy--;
		if (!q_len && !busy)
			pthread_cond_broadcast(&done_cv);
	}
	return NULL;
}

/* Called with mu held: room for one more job. */
static bool grow(void)
{
	uint32_t ncap = q_cap ? q_cap * 2 : 64, k;
	struct job *nq;

	if (q_len < q_cap)
		return true;
	nq = malloc((size_t)ncap * sizeof(*nq));
	if (!nq)
		return false;
	for (k = 0; k < q_len; k++)
		nq[k] = q[(q_head + k) % q_cap];
	free(q);
	q = nq;
	q_head = 0;
	q_cap = ncap;
	return true;
}

/* Called with mu held: a thread for the new job, if none is idle. */
static void spawn(void)
{
	sigset_t all, old;
	pthread_attr_t at;
	pthread_t t;

	if (idle >= q_len || threads >= KVD_CLOSERS)
		return;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 64u << 10);
	if (!pthread_create(&t, &at, closer_main, NULL))
		threads++;
	else if (!threads)
		kvd_warn("closer: cannot start a thread: %s", strerror(errno));
	pthread_attr_destroy(&at);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static bool push(int fd, bool drain_it)
{
	bool ok;

	pthread_mutex_lock(&mu);
	ok = grow();
	if (ok) {
		q[(q_head + q_len) % q_cap] = (struct job){ fd, drain_it };
		q_len++;
		spawn();
		ok = threads > 0;
		if (ok)
			pthread_cond_signal(&cv);
		else
			q_len--;
	}
	pthread_mutex_unlock(&mu);
	return ok;
}

void kvd_closer_put(int fd, bool drain_it)
{
	if (fd < 0)
		return;
	if (!push(fd, drain_it)) {
		/* No thread and no memory: better a possible stall than a
		 * leaked connection. Defused first, so a lingering socket
		 * at least does not linger. */
		if (drain_it)
			drain(fd);
		close(fd);
	}
}

void kvd_closer_passed(const int *fds, int n)
{
	int k;

	atomic_fetch_add(&passed_total, (uint64_t)(n > 0 ? n : 0));
	for (k = 0; k < n; k++)
		if (!push(fds[k], false))
			close_passed_now(&fds[k], 1);
}

uint64_t kvd_closer_passed_total(void)
{
	return atomic_load(&passed_total);
}

bool kvd_closer_flush(int timeout_ms)
{
	struct timespec ts;
	bool ok = true;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&mu);
	while ((q_len || busy) && ok)
		ok = pthread_cond_timedwait(&done_cv, &mu, &ts) != ETIMEDOUT;
	pthread_mutex_unlock(&mu);
	return ok;
}
