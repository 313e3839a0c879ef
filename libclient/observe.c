// SPDX-License-Identifier: MIT
/*
 * observe.c - the observer's attach (see observe.h).
 */
#include <errno.h>
#include <stdio.h>
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

int kvobs_attach(const char *path, struct kvobs *o, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvproto_stat st = { KVPROTO_VERSION, 0 };
	struct kvproto_hdr h = { KVPROTO_MAGIC, KVPROTO_STAT, 0, sizeof(st), 1 };
	char buf[sizeof(struct kvproto_hdr) + 512], cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct kvproto_stat_r r;
	struct kvproto_hdr rh;
	struct cmsghdr *cm;
	const char *why;
	struct stat fs;
	ssize_t n;
	int fd, sfd = -1, rc;
	void *p;

	memset(o, 0, sizeof(*o));
	fd = kvc_connect_daemon(path, err, errlen);
	if (fd < 0)
		return fd;
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), &st, sizeof(st));
	/* If the send fails the reply below does not come either. */
	(void)!send(fd, buf, sizeof(h) + sizeof(st), MSG_NOSIGNAL);
	/* The reply is small and comes in one piece, with its fd. */
	n = recvmsg(fd, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC);
	for (cm = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			memcpy(&sfd, CMSG_DATA(cm), sizeof(int));
	close(fd);
	if (n < (ssize_t)sizeof(rh)) {
		rc = -EPROTO;
		fail(err, errlen, rc, "kvcached at %s closed the connection", sa.sun_path);
		goto out;
	}
	memcpy(&rh, buf, sizeof(rh));
	if (rh.magic == KVPROTO_MAGIC && rh.type == KVPROTO_ERROR &&
	    (size_t)n >= sizeof(rh) + sizeof(struct kvproto_error)) {
		struct kvproto_error e;
		size_t m = (size_t)n - sizeof(rh) - sizeof(e);

		memcpy(&e, buf + sizeof(rh), sizeof(e));
		buf[sizeof(rh) + sizeof(e) + (m < 400 ? m : 400)] = 0;
		rc = e.err < 0 && e.err > -4096 ? e.err : -EPROTO;
		fail(err, errlen, rc, "kvcached refused: %s", buf + sizeof(rh) + sizeof(e));
		goto out;
	}
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
