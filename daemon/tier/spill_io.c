// SPDX-License-Identifier: MIT
/*
 * spill_io.c - the spill tier's I/O engine (see spill_io.h): io_uring with
 * registered buffers, or pread/pwrite worker threads.
 */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "../util/log.h"
#include "spill_io.h"

#define WORKERS 4

struct sio_req {
	int fd;
	bool write;
	void *buf;
	size_t len;
	off_t off;
	uint64_t tag;
	int res;
};

struct kvd_sio {
	enum kvd_sio_kind kind;
	unsigned depth, inflight, queued;
	int efd;
	/* io_uring */
	struct io_uring ring;
	bool ring_up;
	/* threads: requests in `q` (FIFO ring of depth), results in `done` */
	pthread_t th[WORKERS];
	unsigned nth;
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* a request was queued */
	pthread_cond_t fin_cv;	/* a request finished */
	bool stop;
	bool sync_up;		/* mu and the condition variables exist */
	struct sio_req *q, *fin;
	unsigned q_head, q_len, fin_len;
};

static bool room_ok(const struct kvd_sio *s)
{
	return s->inflight + s->queued < s->depth;
}

unsigned kvd_sio_room(const struct kvd_sio *s)
{
	return s->depth - s->inflight - s->queued;
}

unsigned kvd_sio_inflight(const struct kvd_sio *s)
{
	return s->inflight + s->queued;
}

int kvd_sio_eventfd(const struct kvd_sio *s)
{
	return s->efd;
}

/* ------------------------------------------------------------ threads */

/* The whole length, or -errno; a short transfer that makes no progress
 * (end of file on a read) is -EIO. */
static int do_io(const struct sio_req *r)
{
	size_t done = 0;

	while (done < r->len) {
		ssize_t n = r->write ? pwrite(r->fd, (char *)r->buf + done, r->len - done,
					      r->off + (off_t)done)
				     : pread(r->fd, (char *)r->buf + done, r->len - done,
					     r->off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		done += (size_t)n;
	}
	return (int)done;
}

static void *worker(void *arg)
{
	struct kvd_sio *s = arg;
	uint64_t one = 1;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct sio_req r;

		while (!s->stop && !s->q_len)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->stop)
			break;
		r = s->q[s->q_head];
		s->q_head = (s->q_head + 1) % s->depth;
		s->q_len--;
		pthread_mutex_unlock(&s->mu);
		r.res = do_io(&r);
		pthread_mutex_lock(&s->mu);
		s->fin[s->fin_len++] = r;
		pthread_cond_signal(&s->fin_cv);
		if (write(s->efd, &one, sizeof(one)) < 0) {
			/* The counter cannot overflow with depth requests. */
		}
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static int threads_open(struct kvd_sio *s, unsigned workers)
{
	sigset_t all, old;
	unsigned i;
	int rc = 0;

	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_cond_init(&s->fin_cv, NULL);
	s->sync_up = true;
	s->q = calloc(s->depth, sizeof(*s->q));
	s->fin = calloc(s->depth, sizeof(*s->fin));
	if (!s->q || !s->fin)
		return -ENOMEM;
	/* Signals are the main loop's (signalfd): workers take none, or a
	 * SIGTERM could land on one and kill the daemon uncleanly. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (i = 0; i < workers && !rc; i++) {
		rc = pthread_create(&s->th[i], NULL, worker, s);
		if (!rc)
			s->nth++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -rc;
}

/* ------------------------------------------------------------ io_uring */

static int uring_open(struct kvd_sio *s, const struct iovec *bufs, unsigned nbufs)
{
	int rc;

	rc = io_uring_queue_init(s->depth, &s->ring, 0);
	if (rc)
		return rc;
	s->ring_up = true;
	rc = io_uring_register_buffers(&s->ring, bufs, nbufs);
	if (rc)
		return rc;
	rc = io_uring_register_eventfd(&s->ring, s->efd);
	return rc;
}

/* ------------------------------------------------------------ common */

int kvd_sio_open(struct kvd_sio **out, enum kvd_sio_kind want, unsigned depth,
		 const struct iovec *bufs, unsigned nbufs, enum kvd_sio_kind *kind_out)
{
	struct kvd_sio *s = calloc(1, sizeof(*s));
	int rc = -ENOSYS;

	if (!s)
		return -ENOMEM;
	s->depth = depth;
	s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->efd < 0) {
		rc = -errno;
		free(s);
		return rc;
	}
	if (want == KVD_SIO_SYNC) {
		rc = threads_open(s, 0);
		if (rc)
			goto fail;
		s->kind = KVD_SIO_SYNC;
		goto ok;
	}
	if (want != KVD_SIO_THREADS) {
		rc = uring_open(s, bufs, nbufs);
		if (!rc) {
			s->kind = KVD_SIO_URING;
			goto ok;
		}
		if (s->ring_up)
			io_uring_queue_exit(&s->ring);
		s->ring_up = false;
		if (want == KVD_SIO_URING) {
			kvd_err("spill: io_uring unavailable: %s", strerror(-rc));
			goto fail;
		}
		kvd_warn("spill: io_uring unavailable (%s): using pread/pwrite on %u worker threads",
			 strerror(-rc), WORKERS);
	}
	rc = threads_open(s, WORKERS);
	if (rc) {
		kvd_err("spill: cannot start I/O threads: %s", strerror(-rc));
		goto fail;
	}
	s->kind = KVD_SIO_THREADS;
ok:
	*kind_out = s->kind;
	*out = s;
	return 0;
fail:
	kvd_sio_close(s);
	return rc;
}

void kvd_sio_close(struct kvd_sio *s)
{
	unsigned i;

	if (!s)
		return;
	if (s->nth) {
		pthread_mutex_lock(&s->mu);
		s->stop = true;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		for (i = 0; i < s->nth; i++)
			pthread_join(s->th[i], NULL);
	}
	if (s->sync_up) {
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		pthread_cond_destroy(&s->fin_cv);
	}
	if (s->ring_up)
		io_uring_queue_exit(&s->ring);
	free(s->q);
	free(s->fin);
	close(s->efd);
	free(s);
}

int kvd_sio_queue(struct kvd_sio *s, int fd, bool wr, void *buf, size_t len,
		  off_t off, unsigned buf_index, uint64_t tag)
{
	if (!room_ok(s))
		return -EBUSY;
	if (s->kind == KVD_SIO_URING) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);

		if (!sqe)
			return -EBUSY;
		if (wr)
			io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)len, (uint64_t)off,
						  (int)buf_index);
		else
			io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, (uint64_t)off,
						 (int)buf_index);
		io_uring_sqe_set_data64(sqe, tag);
	} else if (s->kind == KVD_SIO_SYNC) {
		struct sio_req r = { fd, wr, buf, len, off, tag, 0 };
		uint64_t one = 1;

		r.res = do_io(&r);
		pthread_mutex_lock(&s->mu);
		s->fin[s->fin_len++] = r;
		pthread_mutex_unlock(&s->mu);
		if (write(s->efd, &one, sizeof(one)) < 0) {
			/* cannot overflow with depth requests */
		}
	} else {
		struct sio_req r = { fd, wr, buf, len, off, tag, 0 };

		pthread_mutex_lock(&s->mu);
		s->q[(s->q_head + s->q_len) % s->depth] = r;
		s->q_len++;
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
	s->queued++;
	return 0;
}

/*
 * Submit what was queued. io_uring may take fewer SQEs than offered, or
 * none (-EAGAIN, -EBUSY, -EINTR): what it did not take stays in the
 * submission ring and goes with the next submit, so only what it took
 * counts as in flight.
 */
int kvd_sio_flush(struct kvd_sio *s)
{
	int rc;

	if (s->kind != KVD_SIO_URING) {
		s->inflight += s->queued;
		s->queued = 0;
		return 0;
	}
	if (!s->queued)
		return 0;
	rc = io_uring_submit(&s->ring);
	if (rc < 0)
		return rc;
	if ((unsigned)rc > s->queued)
		rc = (int)s->queued;
	s->inflight += (unsigned)rc;
	s->queued -= (unsigned)rc;
	return 0;
}

static void drain_efd(struct kvd_sio *s)
{
	uint64_t v;

	if (read(s->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing signalled; fine either way. */
	}
}

unsigned kvd_sio_reap(struct kvd_sio *s, bool wait,
		      void (*done)(void *arg, uint64_t tag, int res), void *arg)
{
	unsigned n = 0;
	int tries;

	/* Submitted work only can complete: retry a refused submit a while
	 * (it is transient: the ring is never deeper than depth). */
	for (tries = 0; kvd_sio_flush(s) && wait && !s->inflight && tries < 1000; tries++)
		usleep(1000);
	drain_efd(s);
	if (!s->inflight)
		return 0;
	if (s->kind == KVD_SIO_URING) {
		struct io_uring_cqe *cqe;

		if (wait) {
			int rc;

			do
				rc = io_uring_wait_cqe(&s->ring, &cqe);
			while (rc == -EINTR);
		}
		while (io_uring_peek_cqe(&s->ring, &cqe) == 0) {
			uint64_t tag = io_uring_cqe_get_data64(cqe);
			int res = cqe->res;

			io_uring_cqe_seen(&s->ring, cqe);
			s->inflight--;
			n++;
			done(arg, tag, res);
		}
		return n;
	}
	for (;;) {
		struct sio_req fin[64];
		unsigned k, i;

		pthread_mutex_lock(&s->mu);
		while (wait && !n && !s->fin_len)
			pthread_cond_wait(&s->fin_cv, &s->mu);
		k = s->fin_len < 64 ? s->fin_len : 64;
		memcpy(fin, s->fin + s->fin_len - k, k * sizeof(*fin));
		s->fin_len -= k;
		pthread_mutex_unlock(&s->mu);
		if (!k)
			return n;
		for (i = 0; i < k; i++) {
			s->inflight--;
			n++;
			done(arg, fin[i].tag, fin[i].res);
		}
	}
}
