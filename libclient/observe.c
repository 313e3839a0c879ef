// SPDX-License-Identifier: MIT
/*
 * observe.c - the observer's attach (see observe.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "connect.h"
#include "observe.h"
#include "../shm/proto.h"

static int fail(char *err, size_t len, int rc, const char *fmt, const char *a)
{
	if (err && len)
		snprintf(err, len, fmt, a);
	return rc;
}

/* Connect to path (NULL: the default socket), checking whom we reached
 * (connect.c); the path, for messages, in sa. */
static int obs_connect(const char *path, struct sockaddr_un *sa, char *err, size_t errlen)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (path)
		snprintf(sa->sun_path, sizeof(sa->sun_path), "%s", path);
	else if (kvproto_client_socket_path(sa->sun_path, sizeof(sa->sun_path)))
		sa->sun_path[0] = 0;
	return kvc_connect_daemon(path, err, errlen);
}

/*
 * One request of an observer (STAT, RESET) on its own connection, then
 * the connection is closed: the reply (small, in one piece) lands in buf
 * (*n bytes) and the fd that came with it, if any, in *sfd. Returns 0, or
 * a negative errno with a sentence in err: no daemon, the connection
 * closed, or the ERROR the daemon sent.
 */
static int obs_request(const char *path, uint16_t type, const void *q, uint32_t qlen,
		       char *buf, size_t cap, ssize_t *n, int *sfd, struct sockaddr_un *sa,
		       char *err, size_t errlen)
{
	struct kvproto_hdr h = { KVPROTO_MAGIC, type, 0, qlen, 1 }, rh;
	char cbuf[CMSG_SPACE(sizeof(int))], *out;
	struct iovec iov = { buf, cap };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	int fd = obs_connect(path, sa, err, errlen);

	*sfd = -1;
	if (fd < 0)
		return fd;
	out = malloc(sizeof(h) + qlen);
	if (!out) {
		close(fd);
		return fail(err, errlen, -ENOMEM, "out of memory%s", "");
	}
	memcpy(out, &h, sizeof(h));
	memcpy(out + sizeof(h), q, qlen);
	/* If the send fails the reply below does not come either. */
	(void)!send(fd, out, sizeof(h) + qlen, MSG_NOSIGNAL);
	free(out);
	*n = recvmsg(fd, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC);
	for (cm = *n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			memcpy(sfd, CMSG_DATA(cm), sizeof(int));
	close(fd);
	if (*n < (ssize_t)sizeof(rh))
		return fail(err, errlen, -EPROTO, "kvcached at %s closed the connection",
			    sa->sun_path);
	memcpy(&rh, buf, sizeof(rh));
	if (rh.magic == KVPROTO_MAGIC && rh.type == KVPROTO_ERROR &&
	    (size_t)*n >= sizeof(rh) + sizeof(struct kvproto_error)) {
		struct kvproto_error e;
		size_t m = (size_t)*n - sizeof(rh) - sizeof(e);

		memcpy(&e, buf + sizeof(rh), sizeof(e));
		buf[sizeof(rh) + sizeof(e) + (m < 400 ? m : 400)] = 0;
		return fail(err, errlen, e.err < 0 && e.err > -4096 ? e.err : -EPROTO,
			    "kvcached refused: %s", buf + sizeof(rh) + sizeof(e));
	}
	return 0;
}

int kvobs_attach(const char *path, struct kvobs *o, char *err, size_t errlen)
{
	struct kvproto_stat st = { KVPROTO_VERSION, 0 };
	char buf[sizeof(struct kvproto_hdr) + 512];
	struct sockaddr_un sa;
	struct kvproto_stat_r r;
	struct kvproto_hdr rh;
	const char *why;
	struct stat fs;
	ssize_t n;
	int sfd, rc;
	void *p;

	memset(o, 0, sizeof(*o));
	rc = obs_request(path, KVPROTO_STAT, &st, sizeof(st), buf, sizeof(buf), &n, &sfd, &sa,
			 err, errlen);
	if (rc)
		goto out;
	memcpy(&rh, buf, sizeof(rh));
	if (rh.magic != KVPROTO_MAGIC || rh.type != KVPROTO_STAT_R ||
	    (size_t)n != sizeof(rh) + sizeof(r) || sfd < 0) {
		rc = -EPROTO;
		fail(err, errlen, rc, "kvcached at %s speaks another protocol version",
		     sa.sun_path);
		goto out;
	}
	memcpy(&r, buf + sizeof(rh), sizeof(r));
	if (r.shm_version != KVSHM_VERSION) {
		rc = -EPROTO;
		if (err && errlen)
			snprintf(err, errlen,
				 "kvcached's segment layout is version %u, this build reads version %u: use the kvstat of the same release",
				 r.shm_version, KVSHM_VERSION);
		goto out;
	}
	if (fstat(sfd, &fs) || (uint64_t)fs.st_size < r.segment_bytes || !r.segment_bytes) {
		rc = -EPROTO;
		fail(err, errlen, rc, "kvcached sent a segment of the wrong size%s", "");
		goto out;
	}
	p = mmap(NULL, r.segment_bytes, PROT_READ, MAP_SHARED, sfd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		fail(err, errlen, rc, "cannot map the segment: %s", strerror(errno));
		goto out;
	}
	if ((rc = kvshm_validate(p, r.segment_bytes, &why))) {
		munmap(p, r.segment_bytes);
		fail(err, errlen, rc, "segment: %s", why);
		goto out;
	}
	o->h = p;
	o->bytes = r.segment_bytes;
	rc = 0;
out:
	if (sfd >= 0)
		close(sfd);
	return rc;
}

void kvobs_detach(struct kvobs *o)
{
	if (o->h)
		munmap((void *)o->h, o->bytes);
	o->h = NULL;
}

int kvobs_reset(const char *path, char *err, size_t errlen)
{
	struct kvproto_reset q = { KVPROTO_VERSION, 0 };
	char buf[sizeof(struct kvproto_hdr) + 512];
	struct sockaddr_un sa;
	struct kvproto_hdr rh;
	ssize_t n;
	int sfd, rc;

	rc = obs_request(path, KVPROTO_RESET, &q, sizeof(q), buf, sizeof(buf), &n, &sfd, &sa,
			 err, errlen);
	if (sfd >= 0)
		close(sfd);
	if (rc)
		return rc;
	memcpy(&rh, buf, sizeof(rh));
	if (rh.magic != KVPROTO_MAGIC || rh.type != KVPROTO_RESET_R ||
	    (size_t)n != sizeof(rh) + sizeof(struct kvproto_reset_r))
		return fail(err, errlen, -EPROTO,
			    "kvcached at %s does not know RESET (an older release?)", sa.sun_path);
	return 0;
}

int kvobs_admin(const char *path, const struct kvproto_admin *q, const uint32_t *tokens,
		struct kvproto_admin_r *r, char *err, size_t errlen)
{
	size_t len = sizeof(*q) + (size_t)q->n_tokens * 4;
	char buf[sizeof(struct kvproto_hdr) + 512];
	struct sockaddr_un sa;
	struct kvproto_hdr rh;
	uint8_t *msg;
	ssize_t n;
	int sfd, rc;

	if (len > KVPROTO_MAX_LEN)
		return fail(err, errlen, -E2BIG, "the prompt is longer than one message carries%s", "");
	msg = malloc(len);
	if (!msg)
		return fail(err, errlen, -ENOMEM, "out of memory%s", "");
	memcpy(msg, q, sizeof(*q));
	if (q->n_tokens)
		memcpy(msg + sizeof(*q), tokens, (size_t)q->n_tokens * 4);
	rc = obs_request(path, KVPROTO_ADMIN, msg, (uint32_t)len, buf, sizeof(buf), &n, &sfd, &sa,
			 err, errlen);
	free(msg);
	if (sfd >= 0)
		close(sfd);
	if (rc)
		return rc;
	memcpy(&rh, buf, sizeof(rh));
	if (rh.magic != KVPROTO_MAGIC || rh.type != KVPROTO_ADMIN_R ||
	    (size_t)n != sizeof(rh) + sizeof(*r))
		return fail(err, errlen, -EPROTO,
			    "kvcached at %s does not know ADMIN (an older release?)", sa.sun_path);
	memcpy(r, buf + sizeof(rh), sizeof(*r));
	return 0;
}
