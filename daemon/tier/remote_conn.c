// SPDX-License-Identifier: MIT
/*
 * remote_conn.c - see remote_conn.h. The memcached text protocol's set and
 * get, over a blocking connection with a timeout on every wait.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "remote_conn.h"

/* ------------------------------------------------------------ parsing */

static bool word_is(const char *s, size_t len, const char *w)
{
	size_t n = strlen(w);

	return len >= n && !memcmp(s, w, n) && (len == n || s[n] == ' ');
}

/* A decimal field of s[*at..len) up to the next space or the end: at most
 * 20 digits, no sign, value <= max. */
static bool field_u64(const char *s, size_t len, size_t *at, uint64_t max, uint64_t *out)
{
	size_t i = *at, digits = 0;
	uint64_t v = 0;

	for (; i < len && s[i] != ' '; i++, digits++) {
		if (s[i] < '0' || s[i] > '9' || digits == 20)
			return false;
		if (v > (max - (uint64_t)(s[i] - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (!digits)
		return false;
	*at = i;
	*out = v;
	return true;
}

enum kvd_mc_line kvd_mc_parse(const char *s, size_t len, const char **key, size_t *klen,
			      uint64_t *bytes)
{
	size_t at, k0, kl;
	uint64_t v;

	*key = NULL;
	*klen = 0;
	*bytes = 0;
	if (len > KVD_MC_LINE_MAX)
		return KVD_MC_BAD;
	if (word_is(s, len, "VALUE")) {
		/* VALUE <key> <flags> <bytes>[ <cas>] */
		uint64_t b;

		at = 6;
		k0 = at;
		while (at < len && s[at] != ' ' && (unsigned char)s[at] > ' ' &&
		       (unsigned char)s[at] != 0x7f)
			at++;
		if (at == k0 || at - k0 > 250 || at >= len || s[at] != ' ')
			return KVD_MC_BAD;
		kl = at - k0;
		at++;
		if (!field_u64(s, len, &at, UINT32_MAX, &v) || at >= len || s[at] != ' ')
			return KVD_MC_BAD;
		at++;
		if (!field_u64(s, len, &at, KVD_MC_VALUE_MAX, &b))
			return KVD_MC_BAD;
		if (at < len) {
			at++;	/* the cas */
			if (!field_u64(s, len, &at, UINT64_MAX, &v) || at != len)
				return KVD_MC_BAD;
		}
		*key = s + k0;
		*klen = kl;
		*bytes = b;
		return KVD_MC_VALUE;
	}
	if (len == 3 && !memcmp(s, "END", 3))
		return KVD_MC_END;
	if (len == 6 && !memcmp(s, "STORED", 6))
		return KVD_MC_STORED;
	if ((len == 10 && !memcmp(s, "NOT_STORED", 10)) || (len == 6 && !memcmp(s, "EXISTS", 6)) ||
	    (len == 9 && !memcmp(s, "NOT_FOUND", 9)))
		return KVD_MC_NOT_STORED;
	if (word_is(s, len, "SERVER_ERROR")) {
		if (len >= 29 && !memcmp(s + 13, "object too large", 16))
			return KVD_MC_TOOBIG;
		if (len >= 26 && !memcmp(s + 13, "out of memory", 13))
			return KVD_MC_NOMEM;
		return KVD_MC_ERROR;
	}
	if (word_is(s, len, "ERROR") || word_is(s, len, "CLIENT_ERROR"))
		return KVD_MC_ERROR;
	return KVD_MC_BAD;
}

/* ------------------------------------------------------------ I/O */

void kvd_mconn_init(struct kvd_mconn *c)
{
	c->fd = -1;
	c->in_off = c->in_len = 0;
}

void kvd_mconn_close(struct kvd_mconn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	kvd_mconn_init(c);
}

/* Until fd is ready for ev, at most tmo_ms: 0, -ETIMEDOUT or -errno. */
static int wait_fd(int fd, short ev, int tmo_ms)
{
	struct pollfd p = { .fd = fd, .events = ev };
	int n;

	do
		n = poll(&p, 1, tmo_ms);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n ? 0 : -ETIMEDOUT;	/* errors and hang-ups: the next call says which */
}

/* After a read or a write that failed: 0 to try again (interrupted, or the
 * socket became ready within the timeout), or -errno (-ETIMEDOUT). */
static int again(int fd, short ev, int tmo_ms)
{
	if (errno == EINTR)
		return 0;
	if (errno != EAGAIN && errno != EWOULDBLOCK)
		return -errno;
	return wait_fd(fd, ev, tmo_ms);
}

static int connect_one(int family, const struct sockaddr *sa, socklen_t sl, int tmo_ms)
{
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = 0, rc;
	socklen_t el = sizeof(err);

	if (fd < 0)
		return -errno;
	if (connect(fd, sa, sl) && errno != EINPROGRESS) {
		rc = -errno;
		close(fd);
		return rc;
	}
	if ((rc = wait_fd(fd, POLLOUT, tmo_ms)) ||
	    (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) ? (rc = -errno) : err ? (rc = -err) : 0)) {
		close(fd);
		return rc;
	}
	if (family != AF_UNIX)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	return fd;
}

static int conn_open(struct kvd_mconn *c, const struct kvd_rserver *at, int tmo_ms)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai, *a;
	char port[8];
	int fd = -ECONNREFUSED;

	if (c->fd >= 0)
		return 0;
	c->in_off = c->in_len = 0;
	if (!at->port) {
		struct sockaddr_un un = { .sun_family = AF_UNIX };

		if (strlen(at->host) >= sizeof(un.sun_path))
			return -ENAMETOOLONG;
		strcpy(un.sun_path, at->host);
		fd = connect_one(AF_UNIX, (struct sockaddr *)&un, sizeof(un), tmo_ms);
	} else {
		snprintf(port, sizeof(port), "%u", at->port);
		if (getaddrinfo(at->host, port, &hints, &ai))
			return -EHOSTUNREACH;
		for (a = ai; a; a = a->ai_next)
			if ((fd = connect_one(a->ai_family, a->ai_addr, a->ai_addrlen, tmo_ms)) >= 0)
				break;
		freeaddrinfo(ai);
	}
	if (fd < 0)
		return fd;
	c->fd = fd;
	return 0;
}

/* Send iov[0..n) whole (advanced in place). */
static int send_all(struct kvd_mconn *c, struct iovec *iov, int n, int tmo_ms)
{
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
	ssize_t k;
	int rc;

	while (m.msg_iovlen) {
		k = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k < 0) {
			if ((rc = again(c->fd, POLLOUT, tmo_ms)))
				return rc;
			continue;
		}
		while (m.msg_iovlen && (size_t)k >= m.msg_iov->iov_len) {
			k -= (ssize_t)m.msg_iov->iov_len;
			m.msg_iov++;
			m.msg_iovlen--;
		}
		if (m.msg_iovlen) {
			m.msg_iov->iov_base = (char *)m.msg_iov->iov_base + k;
			m.msg_iov->iov_len -= (size_t)k;
		}
	}
	return 0;
}

/* Read into iov[0..n) whole (advanced in place): the read-ahead first,
 * then straight from the socket. */
static int recv_all(struct kvd_mconn *c, struct iovec *iov, int n, int tmo_ms)
{
	ssize_t k;
	int rc;

	while (n && c->in_off < c->in_len) {
		size_t m = c->in_len - c->in_off < iov->iov_len ? c->in_len - c->in_off : iov->iov_len;

		memcpy(iov->iov_base, c->in + c->in_off, m);
		c->in_off += m;
		iov->iov_base = (char *)iov->iov_base + m;
		iov->iov_len -= m;
		if (!iov->iov_len) {
			iov++;
			n--;
		}
	}
	while (n) {
		if (!iov->iov_len) {
			iov++;
			n--;
			continue;
		}
		k = readv(c->fd, iov, n);
		if (k == 0)
			return -ECONNRESET;
		if (k < 0) {
			if ((rc = again(c->fd, POLLIN, tmo_ms)))
				return rc;
			continue;
		}
		while (n && (size_t)k >= iov->iov_len) {
			k -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (char *)iov->iov_base + k;
			iov->iov_len -= (size_t)k;
		}
	}
	return 0;
}

/* The next reply line (without CRLF) at *line, *len; valid until the next
 * read. */
static int read_line(struct kvd_mconn *c, const char **line, size_t *len, int tmo_ms)
{
	ssize_t k;
	int rc;

	for (;;) {
		char *s = c->in + c->in_off, *e;

		e = c->in_len > c->in_off ? memchr(s, '\n', c->in_len - c->in_off) : NULL;
		if (e) {
			if (e == s || e[-1] != '\r')
				return -EPROTO;
			*line = s;
			*len = (size_t)(e - 1 - s);
			c->in_off = (size_t)(e + 1 - c->in);
			return 0;
		}
		if (c->in_len - c->in_off > KVD_MC_LINE_MAX)
			return -EPROTO;
		if (c->in_off) {
			memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
			c->in_len -= c->in_off;
			c->in_off = 0;
		}
		k = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, MSG_DONTWAIT);
		if (k == 0)
			return -ECONNRESET;
		if (k < 0) {
			if ((rc = again(c->fd, POLLIN, tmo_ms)))
				return rc;
			continue;
		}
		c->in_len += (size_t)k;
	}
}

/* Read past `bytes` of a value and its CRLF. */
static int skip_value(struct kvd_mconn *c, uint64_t bytes, int tmo_ms)
{
	char scratch[16384];
	int rc;

	bytes += 2;
	while (bytes) {
		struct iovec v = { scratch, bytes < sizeof(scratch) ? (size_t)bytes : sizeof(scratch) };
		size_t m = v.iov_len;

		if ((rc = recv_all(c, &v, 1, tmo_ms)))
			return rc;
		bytes -= m;
	}
	return 0;
}

static int fail(struct kvd_mconn *c, int rc)
{
	kvd_mconn_close(c);
	return rc;
}

int kvd_mconn_set(struct kvd_mconn *c, const struct kvd_rserver *at, const char *key,
		  size_t klen, const struct kvd_rpiece *p, int n, int tmo_ms)
{
	struct iovec iov[KVD_MC_PIECES + 2];
	char cmd[KVD_MC_LINE_MAX];
	const char *line, *k;
	uint64_t total = 0, b;
	size_t len, kl;
	int i, rc, cl;

	if (n > KVD_MC_PIECES || klen > 250)
		return -EINVAL;
	for (i = 0; i < n; i++)
		total += p[i].len;
	cl = snprintf(cmd, sizeof(cmd), "set %.*s 0 0 %llu\r\n", (int)klen, key,
		      (unsigned long long)total);
	iov[0] = (struct iovec){ cmd, (size_t)cl };
	for (i = 0; i < n; i++)
		iov[1 + i] = (struct iovec){ p[i].base, p[i].len };
	iov[1 + n] = (struct iovec){ (void *)"\r\n", 2 };
	if ((rc = conn_open(c, at, tmo_ms)) || (rc = send_all(c, iov, n + 2, tmo_ms)) ||
	    (rc = read_line(c, &line, &len, tmo_ms)))
		return fail(c, rc);
	switch (kvd_mc_parse(line, len, &k, &kl, &b)) {
	case KVD_MC_STORED:
		return 0;
	case KVD_MC_TOOBIG:
		return -E2BIG;
	case KVD_MC_NOMEM:
		return -ENOMEM;
	default:
		return fail(c, -EPROTO);
	}
}

int kvd_mconn_mget(struct kvd_mconn *c, const struct kvd_rserver *at, const char *const *keys,
		   const size_t *klen, uint32_t n, kvd_mc_where where, kvd_mc_got got, void *arg,
		   int tmo_ms)
{
	char cmd[64 * 260 + 8], crlf[2];
	uint64_t seen[4] = { 0, 0, 0, 0 }, bytes;
	const char *line, *key;
	size_t len, kl, at_cmd = 3;
	uint32_t i;
	int rc, np, k;

	if (n > 64)
		return -EINVAL;
	memcpy(cmd, "get", 3);
	for (i = 0; i < n; i++) {
		if (klen[i] > 250)
			return -EINVAL;
		cmd[at_cmd++] = ' ';
		memcpy(cmd + at_cmd, keys[i], klen[i]);
		at_cmd += klen[i];
	}
	memcpy(cmd + at_cmd, "\r\n", 2);
	at_cmd += 2;
	if ((rc = conn_open(c, at, tmo_ms)) ||
	    (rc = send_all(c, &(struct iovec){ cmd, at_cmd }, 1, tmo_ms)))
		return fail(c, rc);
	for (;;) {
		struct kvd_rpiece p[KVD_MC_PIECES];
		struct iovec v[KVD_MC_PIECES + 1];
		uint64_t sum = 0;

		if ((rc = read_line(c, &line, &len, tmo_ms)))
			return fail(c, rc);
		switch (kvd_mc_parse(line, len, &key, &kl, &bytes)) {
		case KVD_MC_END:
			return 0;
		case KVD_MC_VALUE:
			break;
		default:
			return fail(c, -EPROTO);
		}
		/* Which key (the line is in the read-ahead: matched before
		 * any of the value is read). */
		for (i = 0; i < n; i++)
			if (klen[i] == kl && !memcmp(keys[i], key, kl) && !(seen[i / 64] >> (i % 64) & 1))
				break;
		np = i < n ? where(arg, i, bytes, p) : 0;
		for (k = 0; k < np; k++)
			sum += p[k].len;
		if (np <= 0 || np > KVD_MC_PIECES || sum != bytes) {
			if ((rc = skip_value(c, bytes, tmo_ms)))
				return fail(c, rc);
			continue;
		}
		for (k = 0; k < np; k++)
			v[k] = (struct iovec){ p[k].base, p[k].len };
		v[np] = (struct iovec){ crlf, 2 };
		if ((rc = recv_all(c, v, np + 1, tmo_ms)))
			return fail(c, rc);
		if (memcmp(crlf, "\r\n", 2))
			return fail(c, -EPROTO);
		seen[i / 64] |= 1ull << (i % 64);
		got(arg, i);
	}
}
