// SPDX-License-Identifier: MIT
/*
 * server.c - the Unix socket, the epoll loop and message framing.
 *
 * Every byte from a client is untrusted: a frame is read in full (header,
 * then exactly `len` payload bytes, `len` bounded by KVPROTO_MAX_LEN)
 * before kvproto_decode checks it, and any file descriptor a client sends
 * along is closed unread. A client that breaks the protocol gets one
 * ERROR and is disconnected; nothing it sent is applied in part.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <time.h>

#include "../util/closer.h"
#include "../obs/events.h"
#include "../core/admin.h"
#include "../core/pin.h"
#include "../core/quota.h"
#include "../core/kvd.h"
#include "../core/alloc.h"
#include "../core/publish.h"
#include "../core/drop.h"
#include "../core/evict.h"
#include "../core/nsstat.h"
#include "../core/registry.h"
#include "../core/reply.h"
#include "../core/restore.h"
#include "../core/census.h"
#include "../core/slice.h"
#include "server.h"
#include "../tier/tier.h"
#include "../util/log.h"
#include "notify.h"


/* Connect to path: 0 when a kvcached answers there right now, else the
 * errno (ECONNREFUSED: a stale socket of a daemon that died). */
static int socket_probe(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, err = 0;

	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		err = errno;
	close(fd);
	return err;
}

int kvd_server_precheck(const struct kvd *d, const char *where)
{
	struct sockaddr_un sa;
	char dir[sizeof(sa.sun_path)], *slash;
	struct stat st;

	if (strlen(d->cfg.socket) >= sizeof(sa.sun_path)) {
		kvd_err("%s: longer than a Unix socket path may be (%zu bytes)", where,
			sizeof(sa.sun_path) - 1);
		return -EINVAL;
	}
	/* prepare_path creates a missing folder, one level: one deeper, or
	 * one it cannot create, fails now rather than after the pool. */
	strcpy(dir, d->cfg.socket);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (stat(dir, &st) && errno == ENOENT) {
			char parent[sizeof(dir)], *ps;

			strcpy(parent, dir);
			ps = strrchr(parent, '/');
			if (ps)
				*(ps == parent ? ps + 1 : ps) = 0;
			if (!ps || stat(parent, &st) || !S_ISDIR(st.st_mode)) {
				kvd_err("%s: folder %s does not exist, nor does %s: kvcached creates the socket's own folder only; create %s first",
					where, dir, ps ? parent : ".", ps ? parent : dir);
				return -EINVAL;
			}
			if (access(parent, W_OK | X_OK)) {
				kvd_err("%s: folder %s does not exist and cannot be created in %s: %s",
					where, dir, parent, strerror(errno));
				return -EINVAL;
			}
		} else if (!S_ISDIR(st.st_mode)) {
			kvd_err("%s: %s is not a folder", where, dir);
			return -EINVAL;
		}
	}
	if (!socket_probe(d->cfg.socket)) {
		kvd_err("socket %s: another kvcached is serving it", d->cfg.socket);
		return -EADDRINUSE;
	}
	return 0;
}

/*
 * Make sure the socket's folder exists (creating a missing one, mode 0755,
 * said in the log and removed again at a clean stop); refuse to steal a
 * live socket.
 */
static int prepare_path(struct kvd *d, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[sizeof(sa.sun_path)], *slash;
	int err;

	strcpy(dir, path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		struct stat st;

		if (!mkdir(dir, 0755)) {
			d->made_sock_dir = true;
			kvd_info("socket %s: folder %s did not exist: created it (mode 0755), to be removed when kvcached stops",
				 path, dir);
		} else if (errno != EEXIST) {
			kvd_err("socket %s: cannot create folder %s: %s", path, dir, strerror(errno));
			return -1;
		}
		/* A folder someone else controls could have the socket
		 * replaced under us (and clients would talk to them). */
		if (lstat(dir, &st) || !S_ISDIR(st.st_mode) ||
		    (st.st_uid != geteuid() && st.st_uid != 0) ||
		    ((st.st_mode & 0002) && !(st.st_mode & S_ISVTX))) {
			kvd_err("socket %s: folder %s is owned by uid %u with mode %04o: not ours (or root's) and closed to others; choose another --socket",
				path, dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
			return -1;
		}
	}
	err = socket_probe(path);
	if (!err) {
		kvd_err("socket %s: another kvcached is serving it", path);
		return -1;
	}
	if (err == ECONNREFUSED)
		unlink(path);	/* stale socket of a daemon that died */
	return 0;
}

/* Is uid (of a user with these groups) let through a file of st? */
static bool may_write(const struct stat *st, uid_t uid, const gid_t *g, int ng)
{
	int i;

	if (uid == 0 || st->st_mode & 0002)
		return true;
	if (uid == st->st_uid)
		return st->st_mode & 0200;
	for (i = 0; i < ng; i++)
		if (g[i] == st->st_gid)
			return st->st_mode & 0020;
	return false;
}

/*
 * allow-users / allow-groups name who may attach; the socket file's mode
 * decides who can connect at all. A user allowed by one and kept out by
 * the other would only ever see "permission denied": refuse to start
 * instead, naming both.
 */
static int check_reach(const struct kvd *d)
{
	struct stat st;
	int i;

	if (stat(d->cfg.socket, &st))
		return 0;
	for (i = 0; i < d->cfg.n_allow_uid; i++) {
		uid_t u = d->cfg.allow_uid[i];
		struct passwd pw, *res = NULL;
		char buf[2048];
		gid_t g[256];
		int ng = 256;

		if (u == 0 || u == geteuid())
			continue;
		if (!getpwuid_r(u, &pw, buf, sizeof(buf), &res) && res) {
			if (getgrouplist(res->pw_name, res->pw_gid, g, &ng) < 0)
				ng = 0;
		} else {
			ng = 0;
		}
		if (!may_write(&st, u, g, ng)) {
			kvd_err("allow-users: uid %u cannot connect to %s (mode %04o, owner uid %u gid %u): set socket-mode 0666, or give the socket a group of theirs",
				(unsigned)u, d->cfg.socket, (unsigned)(st.st_mode & 07777),
				(unsigned)st.st_uid, (unsigned)st.st_gid);
			return -1;
		}
	}
	for (i = 0; i < d->cfg.n_allow_gid; i++) {
		gid_t g = d->cfg.allow_gid[i];

		if (!(st.st_mode & 0002) && !(g == st.st_gid && (st.st_mode & 0020))) {
			kvd_err("allow-groups: gid %u cannot connect to %s (mode %04o, owner uid %u gid %u): set socket-mode 0666, or run kvcached with that group",
				(unsigned)g, d->cfg.socket, (unsigned)(st.st_mode & 07777),
				(unsigned)st.st_uid, (unsigned)st.st_gid);
			return -1;
		}
	}
	return 0;
}

int kvd_server_open(struct kvd *d)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct itimerspec it = { 0 };
	sigset_t ss;
	int lv;

	if (strlen(d->cfg.socket) >= sizeof(sa.sun_path) || prepare_path(d, d->cfg.socket))
		return -1;
	strcpy(sa.sun_path, d->cfg.socket);
	d->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->lfd < 0 || bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa))) {
		kvd_err("socket %s: cannot bind: %s", d->cfg.socket, strerror(errno));
		if (d->lfd >= 0)
			close(d->lfd);
		d->lfd = -1;	/* never unlink a path we did not bind */
		return -1;
	}
	if (chmod(d->cfg.socket, d->cfg.socket_mode) || listen(d->lfd, 128)) {
		kvd_err("socket %s: %s", d->cfg.socket, strerror(errno));
		return -1;
	}
	if (check_reach(d))
		return -1;

	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigaddset(&ss, SIGHUP);
	/* main.c blocked every signal before any thread could start; from
	 * here the main thread blocks exactly what the signalfd reads, and
	 * threads started later inherit that. */
	sigprocmask(SIG_SETMASK, &ss, NULL);
	signal(SIGPIPE, SIG_IGN);
	d->sigfd = signalfd(-1, &ss, SFD_CLOEXEC | SFD_NONBLOCK);
	d->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	d->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (d->sigfd < 0 || d->tfd < 0 || d->epfd < 0) {
		kvd_err("event setup: %s", strerror(errno));
		return -1;
	}
	it.it_interval.tv_nsec = (long)d->cfg.tick_ms % 1000 * 1000000L;
	it.it_interval.tv_sec = d->cfg.tick_ms / 1000;
	it.it_value = it.it_interval;
	timerfd_settime(d->tfd, 0, &it, NULL);
	if (kvd_ep_set(d, EPOLL_CTL_ADD, d->lfd, EPOLLIN, KVD_EV_LISTEN) ||
	    kvd_ep_set(d, EPOLL_CTL_ADD, d->sigfd, EPOLLIN, KVD_EV_SIGNAL) ||
	    kvd_ep_set(d, EPOLL_CTL_ADD, d->tfd, EPOLLIN, KVD_EV_TIMER) ||
	    (kvd_events_fd(&d->g) >= 0 &&	/* ZMQ_FD signals edges */
	     kvd_ep_set(d, EPOLL_CTL_ADD, kvd_events_fd(&d->g), EPOLLIN | EPOLLET, KVD_EV_EVENTS))) {
		kvd_err("epoll: %s", strerror(errno));
		return -1;
	}
	for (lv = 1; lv < KVD_TIER_MAX; lv++) {
		int fd = kvd_tiers_fd(&d->g, (enum kvd_tier_level)lv);

		if (fd >= 0 && kvd_ep_set(d, EPOLL_CTL_ADD, fd, EPOLLIN, KVD_EV_TIER + (uint64_t)lv)) {
			kvd_err("epoll: %s", strerror(errno));
			return -1;
		}
	}
	return 0;
}

static bool peer_trusted(const struct kvd *d, int fd, const struct ucred *cr)
{
	gid_t groups[256];
	socklen_t gl = sizeof(groups);
	int i, j, ng;

	for (i = 0; i < d->cfg.n_allow_uid; i++)
		if (d->cfg.allow_uid[i] == cr->uid)
			return true;
	if (!d->cfg.n_allow_gid)
		return false;
	ng = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &gl) ? 0 :
	     (int)(gl / sizeof(gid_t));
	for (i = 0; i < d->cfg.n_allow_gid; i++) {
		if (d->cfg.allow_gid[i] == cr->gid)
			return true;
		for (j = 0; j < ng; j++)
			if (groups[j] == d->cfg.allow_gid[i])
				return true;
	}
	return false;
}

/* Best-effort error to a connection we are about to close. */
static void refuse(int fd, int err, const char *msg)
{
	struct kvproto_error e = { err, 1 };
	struct kvproto_hdr h = { KVPROTO_MAGIC, KVPROTO_ERROR, 0,
				 (uint32_t)(sizeof(e) + strlen(msg)), 1 };
	char buf[512];
	size_t n = 0;

	memcpy(buf, &h, sizeof(h));
	n += sizeof(h);
	memcpy(buf + n, &e, sizeof(e));
	n += sizeof(e);
	memcpy(buf + n, msg, strlen(msg));
	n += strlen(msg);
	if (send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		kvd_debug("refusal not delivered: %s", strerror(errno));
	kvd_closer_put(fd, true);	/* drained first: the peer gets the ERROR */
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77	/* Linux 6.5 (asm-generic/socket.h) */
#endif

/*
 * A pidfd for the peer: SO_PEERPIDFD names the process that connected,
 * with no window for its pid to be reused; before Linux 6.5, pidfd_open
 * of the SO_PEERCRED pid. -1 if neither works.
 */
static int peer_pidfd(int fd, pid_t pid)
{
	socklen_t l = sizeof(int);
	int pfd = -1;

	if (!getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &l) && pfd >= 0) {
		fcntl(pfd, F_SETFD, FD_CLOEXEC);
		return pfd;
	}
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

static void do_accept(struct kvd *d)
{
	for (;;) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		struct kvd_client *c = NULL, *peer;
		char msg[256];
		uint32_t i;
		int fd = accept4(d->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR)
				kvd_warn("accept: %s", strerror(errno));
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) {
			kvd_closer_put(fd, true);
			continue;
		}
		if (!peer_trusted(d, fd, &cr)) {
			kvd_stat_add(&kvshm_stats(d->h)->clients_refused, 1);
			kvd_warn("refused pid %d: uid %u gid %u is not in allow-users / allow-groups",
				 (int)cr.pid, cr.uid, cr.gid);
			snprintf(msg, sizeof(msg),
				 "kvcached does not trust uid %u gid %u (allow-users / allow-groups)",
				 cr.uid, cr.gid);
			refuse(fd, -EACCES, msg);
			continue;
		}
		peer = NULL;
		{
			uint32_t mine = 0;

			/* Rows of this process that hold something: a connection,
			 * or pins and pages kept after one ended. Once per
			 * connection, and its handles are linked from here on. */
			for (i = 0; i < d->cfg.max_clients; i++) {
				if (!d->clients[i].used || d->clients[i].pid != cr.pid)
					continue;
				peer = &d->clients[i];
				mine += !d->clients[i].lingering ||
					kvd_client_holds(d, &d->clients[i]);
			}
			if (mine >= d->cfg.max_per_process) {
				kvd_stat_add(&kvshm_stats(d->h)->clients_refused, 1);
				kvd_warn("refused pid %d: it has %u handles attached (max-per-process)",
					 (int)cr.pid, mine);
				snprintf(msg, sizeof(msg),
					 "this process has %u kvcached handles attached already (max-per-process)",
					 mine);
				refuse(fd, -EUSERS, msg);
				continue;
			}
		}
		for (i = 0; i < d->cfg.max_clients; i++) {
			if (!d->clients[i].used) {
				c = &d->clients[i];
				break;
			}
		}
		if (!c) {
			kvd_stat_add(&kvshm_stats(d->h)->clients_refused, 1);
			kvd_warn("refused pid %d: max-clients %u reached", (int)cr.pid,
				 d->cfg.max_clients);
			snprintf(msg, sizeof(msg), "kvcached has %u clients attached (max-clients)",
				 d->cfg.max_clients);
			refuse(fd, -EUSERS, msg);
			continue;
		}
		memset(c, 0, sizeof(*c));
		c->used = true;
		c->id = i;
		c->fd = fd;
		/* Tells us when the process is gone even if it has handed the
		 * socket on (a forked child) or closed it early: its exit
		 * releases everything it holds (see kvd_registry_exited). */
		c->pidfd = peer_pidfd(fd, cr.pid);
		c->pid = cr.pid;
		c->since_ms = kvd_now_ms();
		c->uid = cr.uid;
		c->gid = cr.gid;
		c->ledger.fd = -1;
		if (kvd_ep_set(d, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP, KVD_EV_CLIENT + i) ||
		    (c->pidfd >= 0 &&
		     kvd_ep_set(d, EPOLL_CTL_ADD, c->pidfd, EPOLLIN, KVD_EV_PIDFD + i))) {
			epoll_ctl(d->epfd, EPOLL_CTL_DEL, fd, NULL);
			kvd_closer_put(fd, true);
			if (c->pidfd >= 0)
				close(c->pidfd);
			c->used = false;
			continue;
		}
		if (peer) {	/* into its process's list of handles */
			c->proc_prev = peer->id + 1;
			c->proc_next = peer->proc_next;
			if (peer->proc_next)
				d->clients[peer->proc_next - 1].proc_prev = c->id + 1;
			peer->proc_next = c->id + 1;
		}
		d->n_clients++;
		kvd_debug("client %u: pid %d uid %u connected", i, (int)cr.pid, cr.uid);
	}
}

/* The handler column of the frame table (shm/proto.h), by type. */
#define KVD_FRAME_ROW(name, type, desc, size, bytes, check, hello, handler)               \
	[type] = { handler, KVPROTO_TAKE_##hello },

static const struct {
	kvd_frame_fn *handler;	/* NULL: a reply, no request */
	uint8_t take;		/* enum kvproto_take */
} frames[KVPROTO_TYPE_MAX + 1] = {
	KVPROTO_FRAMES(KVD_FRAME_ROW)
};

int kvd_server_frame(struct kvd *d, struct kvd_client *c, const uint8_t *in)
{
	struct kvproto_hdr h;
	const uint8_t *p = in + sizeof(h);
	const char *why = NULL;

	memcpy(&h, in, sizeof(h));
	if (kvproto_decode(&h, h.len ? p : NULL, c->bt, &why)) {
		kvd_reply_error(d, c, h.seq, -EBADMSG, true, "bad message: %s", why);
		return -1;
	}
	/* Decoded: a type of the table. */
	if (!c->hello && frames[h.type].take == KVPROTO_TAKE_AFTER) {
		kvd_reply_error(d, c, h.seq, -EPROTO, true, "expected HELLO first");
		return -1;
	}
	if (!frames[h.type].handler || (c->hello && frames[h.type].take == KVPROTO_TAKE_BEFORE)) {
		kvd_reply_error(d, c, h.seq, -EPROTO, true, "message type %u is not a request",
				h.type);
		return -1;
	}
	return frames[h.type].handler(d, c, &h, p);
}

/*
 * Receive into c->in. Descriptors are not part of the protocol: any that
 * come along are handed to a closer thread (their close may block for as
 * long as the sender likes) and *passed is set, for the caller to drop
 * the client. The control buffer takes the most a message can carry
 * (SCM_MAX_FD), since the kernel would close the excess right here.
 */
static ssize_t recv_some(struct kvd_client *c, uint32_t want, bool *passed)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 253)];
	struct iovec iov = { c->in + c->in_len, want };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	for (cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm)) {
		int fds[253], cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
		    cnt <= 0 || cnt > 253)
			continue;
		memcpy(fds, CMSG_DATA(cm), (size_t)cnt * sizeof(int));
		kvd_closer_passed(fds, cnt);
		*passed = true;
	}
	return n;
}

/* Frames one client may have handled per wake-up: a client that streams
 * requests gets served in turns with the others (epoll is level-triggered,
 * so what is left waits for the next round), never ahead of them. */
#define FRAMES_PER_WAKEUP 32

static void do_read(struct kvd *d, struct kvd_client *c)
{
	int frames = 0;

	for (;;) {
		struct kvproto_hdr h;
		uint32_t need = sizeof(h);
		ssize_t n;

		if (!c->used || c->lingering || c->closing)
			return;	/* a handler ended it */
		if (c->out_len || c->restore)
			return;	/* replies pending: wait for EPOLLOUT, or a
				 * parked restore (kvd_client_park) */
		if (c->in_len >= sizeof(h)) {
			memcpy(&h, c->in, sizeof(h));
			if (h.magic != KVPROTO_MAGIC || h.len > KVPROTO_MAX_LEN) {
				kvd_reply_error(d, c, h.seq, -EBADMSG, true,
						"bad frame header (magic %#x, length %u)",
						h.magic, h.len);
				return;
			}
			need += h.len;
		}
		if (need > c->in_cap) {
			uint8_t *nb = realloc(c->in, need);

			if (!nb) {
				kvd_registry_drop(d, c, "out of memory for a request");
				return;
			}
			c->in = nb;
			c->in_cap = need;
		}
		if (c->in_len < need) {
			bool passed = false;

			n = recv_some(c, need - c->in_len, &passed);
			if (passed) {
				kvd_reply_error(d, c, 0, -EBADMSG, true,
						"sent file descriptors, which are not part of the protocol");
				return;
			}
			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				return;
			if (n <= 0) {
				kvd_registry_drop(d, c, n ? strerror(errno) : "hung up");
				return;
			}
			c->in_len += (uint32_t)n;
			continue;	/* a finished header may raise `need` */
		}
		c->in_len = 0;
		if (kvd_server_frame(d, c, c->in))
			return;
		if (++frames == FRAMES_PER_WAKEUP)
			return;
		if (c->in_cap > (64u << 10)) {	/* do not keep a huge buffer */
			free(c->in);
			c->in = NULL;
			c->in_cap = 0;
		}
	}
}

static void handle_signal(struct kvd *d)
{
	struct signalfd_siginfo si;

	while (read(d->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			kvd_info("SIGHUP: reloading the settings");
			if (d->reload)
				d->reload(d);
			continue;
		}
		kvd_info("%s received: shutting down", strsignal((int)si.ssi_signo));
		d->stop = true;
	}
}

/* Ping systemd's watchdog at half its interval, from the tick: a stuck
 * event loop stops the pings, which is the point. */
static void watchdog(struct kvd *d)
{
	uint64_t now;

	if (!d->watchdog_usec)
		return;
	now = kvd_now_ns() / 1000u;
	if (now - d->watchdog_last >= d->watchdog_usec / 2) {
		kvd_notify("WATCHDOG=1");
		d->watchdog_last = now;
	}
}

/* Has the process that attached c exited (its pidfd readable now)? */
static bool process_gone(const struct kvd_client *c)
{
	struct pollfd p = { .fd = c->pidfd, .events = POLLIN };

	return c->used && c->pidfd >= 0 && poll(&p, 1, 0) == 1;
}

/* The periodic work, timed into the segment's tick histogram. Every part
 * does a bounded slice (or only what events queued), never a pass over
 * the pool, the index or every client row. */
static void tick(struct kvd *d)
{
	struct kvshm_stats *st = kvshm_stats(d->h);
	uint64_t t0 = kvd_now_ns(), ns;

	kvd_evict_tick(d);
	kvd_tiers_tick(&d->g);
	kvd_registry_tick(d);
	kvd_slice_tick(d);
	kvd_nsstat_tick(d);
	kvd_pin_tick(d);
	kvd_quota_tick(d);
	kvd_events_tick(&d->g);
	watchdog(d);
	ns = kvd_now_ns() - t0;
	kvd_stat_add(&st->ticks, 1);
	if (ns > (uint64_t)d->cfg.tick_ms * 1000000u)
		kvd_stat_add(&st->ticks_slow, 1);
	kvd_stat_add(&st->tick_hist[kvshm_tick_bucket(ns)], 1);
}

void kvd_server_drop_closing(struct kvd *d)
{
	while (d->closing) {
		struct kvd_client *c = d->closing;
		char why[sizeof(c->close_why)];
		bool bye = c->close_bye;

		d->closing = c->close_next;
		if (!d->closing)
			d->closing_tail = NULL;
		c->closing = false;
		c->close_next = NULL;
		memcpy(why, c->close_why, sizeof(why));
		if (bye)
			kvd_registry_bye(d, c);
		else
			kvd_registry_drop(d, c, why);
	}
}

int kvd_server_run(struct kvd *d)
{
	struct epoll_event ev[64];

	while (!d->stop) {
		int n = epoll_wait(d->epfd, ev, 64, -1), i;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			kvd_err("epoll_wait: %s", strerror(errno));
			return -1;
		}
		for (i = 0; i < n; i++) {
			uint64_t tag = ev[i].data.u64, x;
			struct kvd_client *c;

			if (tag == KVD_EV_LISTEN) {
				do_accept(d);
			} else if (tag == KVD_EV_SIGNAL) {
				handle_signal(d);
			} else if (tag >= KVD_EV_TIER && tag < KVD_EV_TIER + KVD_TIER_MAX) {
				kvd_tiers_reap(&d->g, (enum kvd_tier_level)(tag - KVD_EV_TIER));
			} else if (tag == KVD_EV_EVENTS) {
				kvd_events_service(&d->g);
			} else if (tag == KVD_EV_TIMER) {
				if (read(d->tfd, &x, sizeof(x)) == sizeof(x))
					tick(d);
			} else if (tag >= KVD_EV_PIDFD && tag - KVD_EV_PIDFD < d->cfg.max_clients) {
				/* The process that attached is gone, whoever
				 * holds its socket now; unless the row was
				 * ended and taken again earlier in this batch,
				 * which makes the event its old pidfd's. */
				c = &d->clients[tag - KVD_EV_PIDFD];
				if (process_gone(c))
					kvd_registry_exited(d, c);
			} else if (tag >= KVD_EV_CLIENT && tag - KVD_EV_CLIENT < d->cfg.max_clients) {
				c = &d->clients[tag - KVD_EV_CLIENT];
				if (!c->used || c->lingering)
					continue;	/* dropped earlier in this batch */
				if (c->restore) {
					/* Parked: only a hang-up matters now. */
					if (ev[i].events & (EPOLLHUP | EPOLLERR))
						kvd_registry_drop(d, c, "hung up");
					continue;
				}
				if ((ev[i].events & EPOLLOUT) && kvd_client_flush(d, c)) {
					kvd_registry_drop(d, c, "hung up");
					continue;
				}
				if (ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP | EPOLLERR))
					do_read(d, c);
			}
			/* The handler has returned: drop whom it ended. */
			kvd_server_drop_closing(d);
		}
	}
	return 0;
}

void kvd_server_close(struct kvd *d)
{
	uint32_t i;

	/* Shutting down: nobody's pins matter any more. */
	for (i = 0; d->clients && i < d->cfg.max_clients; i++) {
		if (d->clients[i].lingering)
			kvd_registry_exited(d, &d->clients[i]);
		else if (d->clients[i].used)
			kvd_registry_bye(d, &d->clients[i]);
	}
	if (d->lfd >= 0) {
		close(d->lfd);
		unlink(d->cfg.socket);
	}
	if (d->made_sock_dir) {	/* ours, and only if nothing else is in it */
		char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], *slash;

		strcpy(dir, d->cfg.socket);
		slash = strrchr(dir, '/');
		if (slash && slash != dir) {
			*slash = 0;
			rmdir(dir);
		}
	}
	if (d->sigfd >= 0)
		close(d->sigfd);
	if (d->tfd >= 0)
		close(d->tfd);
	if (d->epfd >= 0)
		close(d->epfd);
}
