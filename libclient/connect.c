// SPDX-License-Identifier: MIT
/*
 * connect.c - reaching kvcached and checking whom we reached (connect.h).
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../shm/proto.h"
#include "connect.h"

static int fail(char *err, size_t len, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && len) {
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return rc;
}

static void user_name(uid_t uid, char *out, size_t len)
{
	struct passwd pw, *res = NULL;
	char buf[1024];

	if (!getpwuid_r(uid, &pw, buf, sizeof(buf), &res) && res)
		snprintf(out, len, "%s", res->pw_name);
	else
		snprintf(out, len, "%u", (unsigned)uid);
}

static void group_name(gid_t gid, char *out, size_t len)
{
	struct group gr, *res = NULL;
	char buf[1024];

	if (!getgrgid_r(gid, &gr, buf, sizeof(buf), &res) && res)
		snprintf(out, len, "%s", res->gr_name);
	else
		snprintf(out, len, "%u", (unsigned)gid);
}

/* uid of a user given by name or number; -1 if none. */
static long uid_of(const char *s)
{
	struct passwd pw, *res = NULL;
	char buf[1024], *end;
	long v;

	if (!s || !*s)
		return -1;
	v = strtol(s, &end, 10);
	if (!*end && v >= 0)
		return v;
	if (!getpwnam_r(s, &pw, buf, sizeof(buf), &res) && res)
		return (long)res->pw_uid;
	return -1;
}

/* Whom we may talk to: ourselves, root, the service user, or the one
 * named in $KVCACHED_DAEMON_USER. */
static bool daemon_trusted(uid_t peer)
{
	long u;

	if (peer == geteuid() || peer == 0)
		return true;
	u = uid_of(getenv("KVCACHED_DAEMON_USER"));
	if (u >= 0 && (uid_t)u == peer)
		return true;
	u = uid_of("kvcached");
	return u >= 0 && (uid_t)u == peer;
}

/* The per-user fallback folder must be ours and closed to others. */
static int check_fallback(const char *path, char *err, size_t errlen)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], *slash, who[64];
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		return 0;
	*slash = 0;
	if (lstat(dir, &st))
		return 0;	/* nothing there: connect says so */
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
		user_name(st.st_uid, who, sizeof(who));
		return fail(err, errlen, -EKEYREJECTED,
			    "refusing socket folder %s: it is %s owned by %s (uid %u) with mode %04o, not this user's own folder closed to others (another user could serve there); set XDG_RUNTIME_DIR or KVCACHED_SOCKET",
			    dir, S_ISDIR(st.st_mode) ? "a folder" : "not a folder", who,
			    (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
	}
	return 0;
}

int kvc_connect_daemon(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char fallback[sizeof(sa.sun_path)], who[64], grp[64];
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	struct stat st;
	int fd, rc;

	if (path) {
		if (strlen(path) >= sizeof(sa.sun_path))
			return fail(err, errlen, -ENAMETOOLONG, "socket path too long: %s", path);
		strcpy(sa.sun_path, path);
	} else if (kvproto_client_socket_path(sa.sun_path, sizeof(sa.sun_path))) {
		return fail(err, errlen, -ENAMETOOLONG, "default socket path too long");
	}
	snprintf(fallback, sizeof(fallback), "/tmp/kvcached-%u/kvcached.sock",
		 (unsigned)geteuid());
	if (!path && !strcmp(sa.sun_path, fallback) &&
	    (rc = check_fallback(sa.sun_path, err, errlen)))
		return rc;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(err, errlen, -errno, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		rc = -errno;
		close(fd);
		if (rc == -EACCES && !stat(sa.sun_path, &st)) {
			user_name(st.st_uid, who, sizeof(who));
			group_name(st.st_gid, grp, sizeof(grp));
			return fail(err, errlen, rc,
				    "permission denied connecting to %s: the socket is mode %04o, owner %s:%s, and this process is uid %u gid %u (the daemon's socket-mode, or its folder, keeps this user out)",
				    sa.sun_path, (unsigned)(st.st_mode & 07777), who, grp,
				    (unsigned)geteuid(), (unsigned)getegid());
		}
		if (rc == -ENOENT)
			return fail(err, errlen, rc, "no kvcached socket at %s (is it running? set KVCACHED_SOCKET or the socket path)",
				    sa.sun_path);
		if (rc == -ECONNREFUSED)
			return fail(err, errlen, rc, "nothing accepts connections at %s (kvcached stopped?)",
				    sa.sun_path);
		return fail(err, errlen, rc, "cannot connect to %s: %s", sa.sun_path,
			    strerror(-rc));
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) {
		rc = -errno;
		close(fd);
		return fail(err, errlen, rc, "%s: cannot tell who serves it: %s", sa.sun_path,
			    strerror(-rc));
	}
	if (!daemon_trusted(cr.uid)) {
		close(fd);
		user_name(cr.uid, who, sizeof(who));
		return fail(err, errlen, -EKEYREJECTED,
			    "refusing the daemon at %s: it runs as %s (uid %u), not as this user, root or the kvcached service user; set KVCACHED_DAEMON_USER=%u to trust it",
			    sa.sun_path, who, (unsigned)cr.uid, (unsigned)cr.uid);
	}
	return fd;
}
