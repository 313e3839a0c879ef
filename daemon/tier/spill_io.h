/* SPDX-License-Identifier: MIT */
/*
 * spill_io.h - the spill tier's I/O engine: positioned reads and writes
 * with several in flight, completed through an eventfd the main loop
 * polls. Two backends behind one interface:
 *
 *   io_uring   READ_FIXED / WRITE_FIXED on registered buffers (the host
 *              pool and the header staging area), O_DIRECT files;
 *   threads    pread / pwrite on worker threads, for kernels or sandboxes
 *              where io_uring is missing or forbidden (io_uring_disabled,
 *              seccomp), or when the operator asks for it.
 *
 * Only the daemon's main thread calls these functions. The worker threads
 * of the fallback touch nothing but the buffers and files of the requests
 * they are given, and the engine's own queues.
 */
#ifndef KVD_SPILL_IO_H
#define KVD_SPILL_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

enum kvd_sio_kind {
	KVD_SIO_AUTO = 0,	/* io_uring, else threads (one log line) */
	KVD_SIO_URING = 1,
	KVD_SIO_THREADS = 2,
	/* Every request done inline when queued, its completion reaped as
	 * usual: deterministic, for the fuzz target; never a setting. */
	KVD_SIO_SYNC = 3,
};

struct kvd_sio;

/*
 * Open an engine for up to `depth` requests in flight. `bufs` are the
 * memory areas requests will use (registered with io_uring; each a
 * multiple of 4096 bytes at a 4096-aligned address). On success *kind_out
 * says which backend runs. Returns 0 or -errno (the reason logged).
 */
int kvd_sio_open(struct kvd_sio **out, enum kvd_sio_kind want, unsigned depth,
		 const struct iovec *bufs, unsigned nbufs, enum kvd_sio_kind *kind_out);

void kvd_sio_close(struct kvd_sio *s);

/* Requests the engine will take now (depth minus those in flight). */
unsigned kvd_sio_room(const struct kvd_sio *s);

/*
 * Queue one read or write of `len` bytes at `off` in fd, to or from `buf`
 * (inside registered area `buf_index`). `tag` comes back with the result.
 * Submission happens at the next kvd_sio_flush / kvd_sio_reap. Returns 0,
 * or -EBUSY when kvd_sio_room() is 0.
 */
int kvd_sio_queue(struct kvd_sio *s, int fd, bool write, void *buf, size_t len,
		  off_t off, unsigned buf_index, uint64_t tag);

/* Submit what was queued. Returns 0 or -errno. */
int kvd_sio_flush(struct kvd_sio *s);

/*
 * Call done(arg, tag, res) for every finished request: res is the byte
 * count, or -errno. With `wait`, first block until at least one request
 * has finished (returns at once when none is in flight). Returns the
 * number of completions handled.
 */
unsigned kvd_sio_reap(struct kvd_sio *s, bool wait,
		      void (*done)(void *arg, uint64_t tag, int res), void *arg);

/* The eventfd that becomes readable when completions wait; the main loop
 * polls it and then calls kvd_sio_reap(…, false, …). */
int kvd_sio_eventfd(const struct kvd_sio *s);

/* Requests in flight. */
unsigned kvd_sio_inflight(const struct kvd_sio *s);

#endif
