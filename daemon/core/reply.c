// SPDX-License-Identifier: MIT
/*
 * reply.c - what a handler sends a client, and how it ends the client's
 * connection: replies are queued on the client and sent as far as the
 * socket takes them (the event loop sends the rest on EPOLLOUT); a
 * restore parks the client until its reply; and a handler never drops a
 * client itself. A failed send, a fatal ERROR, a BYE or a served observer
 * marks the client closing (kvd_client_close), and the event loop drops
 * it once the handler has returned (server.c), as redis does with
 * freeClientAsync. So no handler has a client disappear under it, and
 * only the loop reaches the cleanup in registry.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "kvd.h"
#include "reply.h"
#include "../util/log.h"

int kvd_ep_set(struct kvd *d, int op, int fd, uint32_t events, uint64_t tag)
{
	struct epoll_event ev = { .events = events, .data.u64 = tag };

	return epoll_ctl(d->epfd, op, fd, &ev);
}

void kvd_client_close(struct kvd *d, struct kvd_client *c, const char *why, bool bye)
{
	if (!c->used || c->lingering || c->closing)
		return;	/* the first reason stands */
	c->closing = true;
	c->close_bye = bye;
	snprintf(c->close_why, sizeof(c->close_why), "%s", why);
	c->close_next = NULL;
	if (d->closing_tail)
		d->closing_tail->close_next = c;
	else
		d->closing = c;
	d->closing_tail = c;
}

int kvd_client_flush(struct kvd *d, struct kvd_client *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			/*
			 * Stop reading until the client takes its replies. No
			 * EPOLLRDHUP meanwhile: level-triggered, a half-closed peer
			 * would wake us on every wait while we cannot read (a spin).
			 * A peer that is gone entirely still raises EPOLLHUP/ERR.
			 */
			kvd_ep_set(d, EPOLL_CTL_MOD, c->fd, EPOLLOUT, KVD_EV_CLIENT + c->id);
			return 0;
		}
		if (n <= 0)
			return -1;
		c->out_off += (uint32_t)n;
	}
	if (c->out_len)
		kvd_ep_set(d, EPOLL_CTL_MOD, c->fd, EPOLLIN | EPOLLRDHUP, KVD_EV_CLIENT + c->id);
	c->out_len = c->out_off = 0;
	return 0;
}

int kvd_reply(struct kvd *d, struct kvd_client *c, uint16_t type, uint32_t seq,
	      const void *p1, uint32_t n1, const void *p2, uint32_t n2)
{
	struct kvproto_hdr h = { KVPROTO_MAGIC, type, 0, n1 + n2, seq };
	uint64_t need = (uint64_t)c->out_len + sizeof(h) + n1 + n2;

	if (c->lingering || c->closing || c->fd < 0)
		return -1;

	if (need > c->out_cap) {
		uint8_t *nb = realloc(c->out, need);

		if (!nb) {
			kvd_client_close(d, c, "out of memory for a reply", false);
			return -1;
		}
		c->out = nb;
		c->out_cap = (uint32_t)need;
	}
	memcpy(c->out + c->out_len, &h, sizeof(h));
	c->out_len += sizeof(h);
	if (n1)
		memcpy(c->out + c->out_len, p1, n1);
	c->out_len += n1;
	if (n2)
		memcpy(c->out + c->out_len, p2, n2);
	c->out_len += n2;
	if (kvd_client_flush(d, c)) {
		kvd_client_close(d, c, "hung up", false);
		return -1;
	}
	return 0;
}

void kvd_client_park(struct kvd *d, struct kvd_client *c)
{
	/* No EPOLLIN: level-triggered, unread input would wake us in a spin.
	 * EPOLLHUP and EPOLLERR are reported regardless. */
	kvd_ep_set(d, EPOLL_CTL_MOD, c->fd, 0, KVD_EV_CLIENT + c->id);
}

void kvd_client_resume(struct kvd *d, struct kvd_client *c)
{
	/* With a reply still queued, kvd_client_flush re-arms once it is sent. */
	if (kvd_live(c) && !c->out_len)
		kvd_ep_set(d, EPOLL_CTL_MOD, c->fd, EPOLLIN | EPOLLRDHUP, KVD_EV_CLIENT + c->id);
}

void kvd_reply_error(struct kvd *d, struct kvd_client *c, uint32_t seq,
		     int err, bool fatal, const char *fmt, ...)
{
	struct kvproto_error e = { err, fatal };
	char msg[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (fatal) {
		kvd_warn("client %u (pid %d): %s; disconnecting", c->id, (int)c->pid, msg);
		if (!c->refused)	/* a refused HELLO counts as refused only */
			kvd_stat_add(&kvshm_stats(d->h)->clients_dropped, 1);
	}
	if (kvd_reply(d, c, KVPROTO_ERROR, seq, &e, sizeof(e), msg, (uint32_t)strlen(msg)))
		return;
	if (fatal)
		kvd_client_close(d, c, msg, false);
}

int kvd_client_bye(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		   const void *p)
{
	(void)hdr;
	(void)p;
	kvd_client_close(d, c, "closed", true);
	return -1;
}
