/* SPDX-License-Identifier: MIT */
/*
 * remote_conn.h - one remote-tier worker's connection to one memcached
 * server, speaking the text protocol itself, for the two operations that
 * move pages: a set whose value goes out from where its pieces lie (the
 * payload straight from its pool page: sendmsg of an iovec), and a
 * multi-get whose values come in where the caller says (the payload
 * straight into the page it will be checked and published in: readv).
 * libmemcached has neither (its set takes one buffer; its get returns a
 * copy), and a 2 MiB page copied on each side was a third of the tier's
 * CPU. The server's choice (ketama) and the probe stay libmemcached's.
 *
 * Blocking, and for worker threads only: every wait is a poll of at most
 * the timeout, so a server that stops answering costs a worker that long,
 * never the daemon's main thread. Any failure closes the connection; the
 * next operation connects again.
 *
 * kvd_mc_parse, the reply-line parser, is pure and fuzzed
 * (tests/fuzz/remote_val.c): whatever a server sends, a line is one of the
 * kinds below or KVD_MC_BAD, and a VALUE's length is bounded.
 */
#ifndef KVD_REMOTE_CONN_H
#define KVD_REMOTE_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "../../fmt/remote_item.h"

/* Longest reply line kept (a VALUE line: key, flags, length, cas). */
#define KVD_MC_LINE_MAX 512u
/* Largest value length a VALUE line may announce. */
#define KVD_MC_VALUE_MAX (1ull << 30)

enum kvd_mc_line {
	KVD_MC_BAD = 0,		/* not a line of the protocol (or too long) */
	KVD_MC_VALUE,		/* VALUE <key> <flags> <bytes> [<cas>] */
	KVD_MC_END,
	KVD_MC_STORED,
	KVD_MC_NOT_STORED,	/* NOT_STORED, EXISTS, NOT_FOUND */
	KVD_MC_TOOBIG,		/* SERVER_ERROR object too large for cache */
	KVD_MC_NOMEM,		/* SERVER_ERROR out of memory ... */
	KVD_MC_ERROR,		/* ERROR, CLIENT_ERROR ..., other SERVER_ERROR */
};

/* One reply line s[0..len) (without its CRLF): its kind, and for VALUE the
 * key (pointing into s) and the value's length (<= KVD_MC_VALUE_MAX). */
enum kvd_mc_line kvd_mc_parse(const char *s, size_t len, const char **key, size_t *klen,
			      uint64_t *bytes);

struct kvd_mconn {
	int fd;				/* -1: not connected */
	size_t in_off, in_len;		/* read ahead, in[in_off..in_len) */
	char in[8192];
};

void kvd_mconn_init(struct kvd_mconn *c);
void kvd_mconn_close(struct kvd_mconn *c);

/*
 * set <key> 0 0 <len> with the value in pieces p[0..n) (len their sum).
 * Returns 0 (STORED), -E2BIG (the server's item size limit, -I), -ENOMEM
 * (the server is out of memory for it), -EPROTO (another answer),
 * -ETIMEDOUT (no progress for tmo_ms), or another -errno; the last three
 * close the connection.
 */
int kvd_mconn_set(struct kvd_mconn *c, const struct kvd_rserver *at, const char *key,
		  size_t klen, const struct kvd_rpiece *p, int n, int tmo_ms);

/*
 * For a value of `bytes` bytes of key i: where its bytes go, in up to
 * KVD_MC_PIECES pieces whose lengths add up to bytes (returns how many),
 * or 0 to read past it.
 */
#define KVD_MC_PIECES 4
typedef int (*kvd_mc_where)(void *arg, uint32_t i, uint64_t bytes, struct kvd_rpiece *p);
/* Key i's value is in the pieces `where` gave. */
typedef void (*kvd_mc_got)(void *arg, uint32_t i);

/*
 * get keys[0..n) (one request), each value read where `where` says and
 * `got` called for it. A key named twice by the server, or one not asked
 * for, is read past. Returns 0 once END came, or -ETIMEDOUT, -EPROTO or
 * another -errno (connection closed; values not yet in did not come).
 */
int kvd_mconn_mget(struct kvd_mconn *c, const struct kvd_rserver *at, const char *const *keys,
		   const size_t *klen, uint32_t n, kvd_mc_where where, kvd_mc_got got, void *arg,
		   int tmo_ms);

#endif
